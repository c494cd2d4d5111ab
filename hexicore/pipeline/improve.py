"""Improving per-rank compute orders by double justification (forward-backward improvement,
Li & Willis, "An iterative scheduling technique for resource-constrained project scheduling",
EJOR 1992; Valls et al., "Justification and RCPSP", EJOR 2005).

The tasks and precedences are the simulator's (:mod:`hexicore.pipeline.simulate`, compute only;
bench/optimal_order.py states them): each rank runs one task at a time. One round:

1. backward pass: in decreasing order of end time, place each task as LATE as its successors
   (plus transfers) allow, in the latest gap of its rank that fits it (insertion);
2. forward pass: in increasing order of those start times, place each task as EARLY as its
   predecessors allow, in the earliest gap that fits.

A pass never lengthens the schedule (each task keeps a place at least as good as its old one),
and tasks may move past each other through gaps, which reorders a rank's list. Rounds repeat
while the makespan falls. The result is a list order (tasks by start time per rank) that the
simulator reproduces. No memory cap is enforced: callers check peaks (``simulate``).
"""

from __future__ import annotations

import bisect
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.chains import ChainLinks
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.timing import Timing

_COMPUTE = ("F", "B", "I", "W")


def _graph(al: ActionList, timing: Timing):
    """Tasks (op, stage, mb), their ranks, durations and predecessor lists [(task index, lag)]."""
    dur = timing.durations()
    prev, nxt = ChainLinks.of(al.chains, al.stages).lists()
    tasks = [(a.op.value, a.stage, a.mb) for acts in al.actions for a in acts if a.op in _COMPUTE]
    index = {t: i for i, t in enumerate(tasks)}
    rank = [al.stage_rank[s] for _, s, _ in tasks]
    d = [dur[op][s] for op, s, _ in tasks]
    split = any(op == "I" for op, _, _ in tasks)
    back = "I" if split else "B"
    preds: list[list[tuple[int, float]]] = [[] for _ in tasks]
    for i, (op, s, mb) in enumerate(tasks):
        c = al.mb_chain[mb]
        if op == "F":
            p = prev[c][s]
            if p is not None:
                preds[i].append((index["F", p, mb], timing.link(al.stage_rank[p], al.stage_rank[s])))
        elif op == "W":
            preds[i].append((index["I", s, mb], 0.0))
        else:
            n = nxt[c][s]
            if n is None:
                preds[i].append((index["F", s, mb], 0.0))
            else:
                preds[i].append((index[back, n, mb], timing.link(al.stage_rank[n], al.stage_rank[s])))
    return tasks, rank, d, preds


def _place(busy: list[tuple[float, float]], ready: float, length: float) -> float:
    """Earliest start >= ready of a gap of ``length`` in the sorted disjoint intervals ``busy``
    (inserted there)."""
    k = bisect.bisect_right(busy, (ready, float("inf")))
    if k > 0 and busy[k - 1][1] > ready:
        ready = busy[k - 1][1]
    while k < len(busy) and busy[k][0] < ready + length - 1e-12:
        ready = max(ready, busy[k][1])
        k += 1
    busy.insert(k, (ready, ready + length))
    return ready


def _pass(order: Sequence[int], rank: Sequence[int], d: Sequence[float], preds, ranks: int) -> list[float]:
    """Serial schedule generation with insertion: tasks in ``order`` (topological), each at the
    earliest gap after its predecessors; start times."""
    start = [0.0] * len(d)
    busy: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]
    for i in order:
        ready = 0.0
        for p, lag in preds[i]:
            t = start[p] + d[p] + lag
            if t > ready:
                ready = t
        start[i] = _place(busy[rank[i]], ready, d[i])
    return start


def justify(al: ActionList, timing: Timing, rounds: int = 20) -> ActionList:
    """``al``'s compute tasks reordered by double justification (module docstring); ``REDUCE``
    and ``STEP`` stay at the end of each rank in their order. Returns ``al`` itself if no round
    shortens it."""
    tasks, rank, d, preds = _graph(al, timing)
    n = len(tasks)
    succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p, lag in ps:
            succs[p].append((i, lag))
    index = {t: i for i, t in enumerate(tasks)}
    began = [0.0] * n
    for e in simulate(al, timing, record=True, comm=False).events:
        if e.action.op in _COMPUTE:
            began[index[(e.action.op.value, e.action.stage, e.action.mb)]] = e.start
    start = _pass(sorted(range(n), key=lambda i: (began[i], -d[i])), rank, d, preds, al.ranks)
    best = max((start[i] + d[i] for i in range(n)), default=0.0)
    base, improved = best, None
    for _ in range(rounds):
        end = [start[i] + d[i] for i in range(n)]
        rev = _pass(sorted(range(n), key=lambda i: -end[i]), rank, d, succs, al.ranks)  # reversed time
        start = _pass(sorted(range(n), key=lambda i: -(rev[i] + d[i])), rank, d, preds, al.ranks)
        span = max(start[i] + d[i] for i in range(n))
        if span < best - 1e-12:
            best, improved = span, list(start)
        else:
            break
    if improved is None or best >= base - 1e-12:
        return al
    rows: list[list[tuple[float, int]]] = [[] for _ in range(al.ranks)]
    for i in range(n):
        rows[rank[i]].append((improved[i], i))
    lists = []
    for r, acts in enumerate(al.actions):
        rest = [a for a in acts if a.op not in _COMPUTE]
        lists.append(tuple(Action(*tasks[i]) for _, i in sorted(rows[r])) + tuple(rest))
    return ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank, tuple(lists),
                      al.chains, al.mb_chain, al.meta)
