"""The two-phase iterative search of HexiScale §4.4: the loop (:mod:`.loop`), one candidate
(:mod:`.candidate`), the search's state (:mod:`.context`), its settings (:mod:`.search_config`), the
candidates laid out ahead (:mod:`.prefetch`) in worker processes (:mod:`.workers`)."""

#: what a solver plugin reuses (docs/plugins.md, "Writing a solver plugin"): the search's state and
#: a scored plan, the search's settings, a candidate's batch split + estimate, one pipeline's
#: phase-2 layout. Resolved on first use (PEP 562), so importing one of this package's modules
#: never imports the others.
PUBLIC = {"INF": "context", "Candidate": "context", "make_context": "context", "SearchConfig": "search_config",
          "assemble": "candidate", "phase2": "hexicore.planner.stage_layout.phase2"}


def __getattr__(name: str):
    import importlib

    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = PUBLIC[name]
    module = importlib.import_module(where if "." in where else f"{__name__}.{where}")
    return getattr(module, name)


__all__ = sorted(PUBLIC)
