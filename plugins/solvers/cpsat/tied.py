"""A tied embedding's group sync in the CP-SAT model (docs/cost-model.md, "Tied embeddings").

With ``tied_embeddings`` every pipeline's embedding stage and head stage keeps a copy of the
``vocab x hidden`` matrix, and the cost model prices one all-reduce of it among every rank of
those stages (:func:`hexicore.cost.sharding.tied_sync_s`: App. A's ring over ``n`` members, each
moving the whole matrix; no sync when one stage holds the only copy). Its term, seen by a member
device of option ``o``::

    TIED >= sum_{o'} tp(o') * M[o'] * g_n[o][o'] - g_n[o][o]

where ``M[o']`` counts the group's stages running option ``o'`` (first stages, and last stages
of pipelines with two or more stages), ``n = sum tp(o') M[o']`` the group's ranks and
``g_n[o][o'] = 2 (alpha + V H B / (n beta))`` one peer's share, read from the cost model's
``dp_layer_s`` on two single-device holders (rounded down, like every table). The term joins the
DP time of the embedding and head stages, and replaces the embedding's own DP ring for the
``vocab x hidden`` part (:mod:`.tables` prices only the rest of the embedding there).
"""

from __future__ import annotations

from typing import Any, Sequence

from hexicore.core.plan import Stage
from hexicore.cost.precision import sync_bytes

from .ends import head_stage


def tied_pairs(problem: Any, options: Sequence[Any], pools: dict[str, list[str]], max_pipelines: int,
               to_us: Any) -> tuple | None:
    """``g_n[o][o2]`` (options from 1, index 0 unused) for ``n = 0 ..`` the most ranks the group
    can have; None for an untied model."""
    m = problem.model
    if not m.tied_embeddings or not options:
        return None
    top = min(sum(len(p) for p in pools.values()), 2 * max_pipelines * max(o.tp for o in options))
    names = sorted({o.machine for o in options})
    rows = {}
    for a in names:
        for b in names:
            da = pools[a][0]
            db = pools[b][0] if a != b else pools[a][1 % len(pools[a])]
            holders = [Stage((da,), 1, (0, 1)), Stage((db,), 1, (0, 1))]
            # dp_layer_s prices 2 (alpha + P'B / (2 beta)); P' = 2 V H / n gives one peer's g_n
            rows[a, b] = [0, 0] + [to_us(problem.cost.dp_layer_s(problem.cluster, holders, 2.0 * m.vocab * m.hidden / n,
                                                                 sync_bytes(problem.cost, problem.train)))
                            for n in range(2, top + 1)]
    opts = [None, *options]
    return tuple(tuple(tuple(0 if a is None or b is None else rows[a.machine, b.machine][n] for b in opts)
                       for a in opts) for n in range(top + 1))


def tied_term(m: Any, tab: Any, f: Any, used: dict, last: dict) -> Any:
    """The TIED variable of the module docstring (None for an untied model)."""
    g = tab.tied_pair
    if g is None:
        return None
    P, K = len(f.slots), len(tab.options)
    opts = range(1, K + 1)
    tp = {o: tab.options[o - 1].tp for o in opts}
    heads = {}
    for i in range(P):  # heads[i, o]: pipeline i keeps its head off its first stage, on option o
        for o in opts:
            heads[i, o] = m.new_bool_var(f"th{i}_{o}")
            for j in range(1, f.slots[i]):
                m.add(heads[i, o] >= last[i, j] + f.x[i, j, o] - 1)
        m.add(sum(heads[i, o] for o in opts) == used[i, 0] - last[i, 0])
    members = {o: sum(f.x[i, 0, o] for i in range(P)) + sum(heads[i, o] for i in range(P)) for o in opts}
    top = len(g) - 1
    shared = m.new_bool_var("tshared")  # two or more stages keep a copy: the group syncs
    m.add(sum(members.values()) >= 2).only_enforce_if(shared)
    m.add(sum(members.values()) <= 1).only_enforce_if(~shared)
    size = {n: m.new_bool_var(f"tn{n}") for n in range(top + 1)}
    m.add_exactly_one(size.values())
    m.add(sum(n * b for n, b in size.items()) == sum(tp[o] * members[o] for o in opts))
    term = m.new_int_var(0, tied_bound(tab), "TIED")
    for o in opts:
        present = m.new_bool_var(f"tp{o}")
        m.add(members[o] <= 2 * P * present)
        for n in range(2, top + 1):
            m.add(term >= sum(g[n][o][o2] * tp[o2] * members[o2] for o2 in opts) - g[n][o][o]).only_enforce_if(
                [size[n], present, shared])
    return term


def tied_bound(tab: Any) -> int:
    """An upper bound of TIED (0 for an untied model): ``n`` peers of the largest entry."""
    g = tab.tied_pair
    return 0 if g is None else max(1, max(n * max(v for row in g[n] for v in row) for n in range(len(g))))


def tied_value(tab: Any, rows: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> int:
    """TIED for the plan ``rows`` (``(micro-batches, [(option, blocks), ...])`` per pipeline):
    the least value the model allows; 0 without a group sync."""
    g = tab.tied_pair
    ends = [(row, head_stage(tab, len(row))) for _, row in rows]  # the head: where the schedule keeps it
    members = [o for row, hj in ends for o in ([row[0][0], row[hj][0]] if hj else [row[0][0]])]
    if g is None or len(members) < 2:
        return 0
    n = sum(tab.options[o - 1].tp for o in members)
    return max(sum(g[n][o][o2] * tab.options[o2 - 1].tp for o2 in members) - g[n][o][o] for o in set(members))
