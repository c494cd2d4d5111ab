"""Which stage keeps the head: the schedule's placement in the CP-SAT model (docs/cost-model.md,
"Placement").

The plain placement keeps the embedding on a pipeline's first stage and the final norm + head on
its last. A V-shaped or wave schedule (zb_v, dualpipe_v, Hanayo) runs its chain back to rank 0,
so the first stage keeps both and the last stage neither; the stage time, the memory cap and the
head's data-parallel ring of the model then follow the head there. ``head[P][j]`` (1: stage j of
a P-stage pipeline keeps the head) is read off the cost model's ``pipeline_placement``. A
placement where a rank also keeps another stage's blocks (Chimera's two chains) is not linear in
the model's block counts: the model keeps the plain one, and the plan's final memory check
decides (:func:`hexicore_plugins.solvers.cpsat.CpSatSolver`).
"""

from __future__ import annotations

from typing import Any

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Stage


def plain_rows(width: int) -> tuple[tuple[int, ...], ...]:
    """``head[P][j]`` of the plain placement: the last stage, ``P`` from 0 to ``width``."""
    return tuple(tuple(int(j == p - 1) for j in range(width)) for p in range(width + 1))


def head_rows(problem: Any, width: int, n_mb: int) -> tuple[tuple[int, ...], ...]:
    """``head[P][j]`` under ``problem``'s schedule (module docstring); the plain rows where the
    cost model places nothing or the placement is not one chunk chain per rank."""
    rows = [list(r) for r in plain_rows(width)]
    placed = getattr(problem.cost, "pipeline_placement", None)
    if placed is None:
        return plain_rows(width)
    for p in range(1, width + 1):
        dummy = Pipeline(problem.train.micro_batch, tuple(Stage((), 0, (0, 0)) for _ in range(p)),
                         dict(problem.schedule))
        try:
            pl = placed(dummy, n_mb)
        except HexicoreError:
            continue  # not run at this length: the in-flight table blocks it
        if pl is None:
            continue
        own = all(c.source == j and (not c.embedding or j == 0) for j, r in enumerate(pl.ranks) for c in r)
        if own:
            rows[p] = [int(any(c.head for c in r)) for r in pl.ranks] + [0] * (width - p)
    return tuple(tuple(r) for r in rows)


def head_flags(m: Any, tab: Any, slots: list, last: dict, n_stages: dict) -> dict:
    """Per slot (i, j) a literal "keeps the head": ``last`` itself under the plain placement,
    else ``head[n_stages[i]][j]`` by an element constraint."""
    if tab.head is None or tab.head == plain_rows(len(tab.head) - 1):
        return last
    out = {}
    for i, n in enumerate(slots):
        for j in range(n):
            out[i, j] = m.new_bool_var(f"head{i}_{j}")
            idx = m.new_int_var(0, len(tab.head) - 1, f"iHd{i}_{j}")
            m.add(idx == n_stages[i])
            m.add_element(idx, [row[j] for row in tab.head], out[i, j])
    return out


def head_stage(tab: Any, p: int) -> int:
    """The stage of a ``p``-stage pipeline that keeps the head under ``tab.head`` (else the last)."""
    if tab.head is None or p >= len(tab.head) or 1 not in tab.head[p][:p]:
        return p - 1
    return tab.head[p].index(1)
