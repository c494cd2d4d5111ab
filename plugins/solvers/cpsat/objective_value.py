"""The model's objective of one plan, computed directly from the tables (no solver).

CP-SAT only bounds some terms from below (per-block DP times, the DP maximum), so a FEASIBLE
solution may carry slack; the value reported as the plan's ``objective`` is this function's,
which is the least objective the model allows for the plan's decisions: exactly the solver's
objective at an OPTIMAL solution (tested), and a lower approximation of the cost model's
estimate of the plan (see :mod:`.formulation`).
"""

from __future__ import annotations

from typing import Sequence

from hexicore.cost.base import fill_drain_time

from .formulation import stage_slopes, throughput_bound
from .ends import head_stage
from .tables import Tables
from .tied import tied_value

Rows = Sequence[tuple[int, Sequence[tuple[int, int]]]]  # (micro-batches, [(option, blocks), ...])


def _peer_time(tab: Tables, pair, v: int, holders: Sequence[int]) -> int:
    """COMM-DP-LAYER of the model for one block held by ``holders`` (an option per pipeline)."""
    counts = {o: holders.count(o) for o in set(holders)}
    tps = {tab.options[o - 1].tp for o in counts}
    lat, g = tab.dp_latency, pair[v]
    best = 0
    for o in counts:
        t = tab.options[o - 1].tp
        for tau in [t, *(x for x in tps if x > t)]:
            extra = tau // t - 1
            val = sum((g[o][o2] + extra * lat[o][o2]) * n for o2, n in counts.items()) - g[o][o] - extra * lat[o][o]
            best = max(best, val)
    return best


def model_value(tab: Tables, machines: dict[str, int], n_mb: int, rows: Rows) -> int:
    """``T + DP`` of the formulation for the plan ``rows`` (integer time units)."""
    pipes = []
    for n, row in rows:
        stages, hops, hj = [], [], head_stage(tab, len(row))
        for j, (o, blocks) in enumerate(row):
            per, fixed, fixed_last = stage_slopes(tab, o, 1 if j == 0 else 0)
            stages.append(per * blocks + (fixed_last if j == hj else fixed))
            if j + 1 < len(row):
                hops.append(tab.hop[o][row[j + 1][0]])
        pipes.append(fill_drain_time(stages, hops, n))  # the cost model's PIPELINE-TIME, in table units
    T = max(max(pipes), throughput_bound(tab, machines, n_mb))
    v, tied = len(rows), tied_value(tab, rows)
    if v <= 1:
        return T + tied
    L = tab.layers
    holder = []
    for _, row in rows:
        h = []
        for o, blocks in row:
            h += [o] * blocks
        holder.append(h)
    D = [_peer_time(tab, tab.dp_pair, v, [h[k] for h in holder]) for k in range(L)]
    E = _peer_time(tab, tab.dp_pair_emb, v, [row[0][0] for _, row in rows])
    H = _peer_time(tab, tab.dp_pair_head, v, [row[head_stage(tab, len(row))][0] for _, row in rows])
    dp = 0
    for _, row in rows:
        lo, hj = 0, head_stage(tab, len(row))
        for j, (o, blocks) in enumerate(row):
            ends = j == 0 or j == hj
            t = sum(D[lo:lo + blocks]) + (E if j == 0 else 0) + (H if j == hj else 0) + (tied if ends else 0)
            dp = max(dp, t)
            lo += blocks
    return T + dp
