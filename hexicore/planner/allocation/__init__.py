"""Which devices a plan uses: sub-clusters of whole machines solved and compared under an
objective (:mod:`.sub_clusters`, :mod:`.objective`)."""
