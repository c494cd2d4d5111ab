"""The two-phase iterative search of HexiScale §4.4: the loop (:mod:`.loop`), one candidate
(:mod:`.candidate`), the search's state (:mod:`.context`), its settings (:mod:`.search_config`), the
candidates laid out ahead (:mod:`.prefetch`) in worker processes (:mod:`.workers`)."""
