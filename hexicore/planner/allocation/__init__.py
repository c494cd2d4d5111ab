"""Which devices a plan uses: sub-clusters of whole machines solved and compared under an
objective (:mod:`.sub_clusters`, :mod:`.objective`)."""


def __getattr__(name: str):
    """``allocate`` (what a solver plugin wraps its search in, docs/plugins.md), resolved on first
    use (PEP 562) so that importing :mod:`.objective` does not import :mod:`.sub_clusters`."""
    if name == "allocate":
        from hexicore.planner.allocation.sub_clusters import allocate

        return allocate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
