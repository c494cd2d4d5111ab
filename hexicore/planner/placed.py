"""The search's stage rows and memory caps under a schedule's placement (which blocks,
embeddings and heads each rank holds, :class:`hexicore.core.placement.Placement`), for
:func:`hexicore.planner.stages.stage_rows`."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def placed_rows(table: Any, stages: Sequence[tuple[str, ...]], flights: Sequence[float], pl: Any) -> tuple:
    """:func:`hexicore.planner.stages.stage_rows` under a schedule's placement:
    stage j's row ``sum_c traffic_c x STAGE(l, embedding_c, head_c)`` over the copies it runs,
    each priced at its own l (the search's approximation: a copy of another stage's blocks as
    many as its own; the final plan is priced exactly, :meth:`AnalyticCostModel.stage_terms`);
    its cap the most l such that every stage keeping a copy of its blocks fits with each of
    its copies at l (a bound the exact placement always meets: a stage's copies are each at
    most l, so its memory is at most the one checked). Stages whose blocks would be kept at two
    TP degrees (:meth:`Placement.split_tp`) get cap -1: no layout of them exists."""
    rows, own, hops = [], [], []
    for j, g in enumerate(stages):
        rows.append(sum(c.traffic * table.times(g, c.embedding, c.head) for c in pl.ranks[j]))
        own.append(table.cap(g, pl.embeddings(j), pl.heads(j), flights[j], pl.copies(j), pl.lone_heads(j)))
        if j + 1 < len(stages):
            hops.append(table.hop(g, stages[j + 1]))
    caps = [min(own[r] for r in pl.holders(j)) for j in range(len(stages))]
    if pl.split_tp([len(g) for g in stages]) is not None:
        caps = [-1] * len(stages)
    out = np.array(rows)
    out[:-1] += np.array(hops)[:, None]
    return out, caps, hops
