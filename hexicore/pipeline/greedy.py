"""Greedy list scheduling of a stage layout into per-rank compute orders.

The order Hanayo (Liu et al., SC'23) is measured with ("earliest start, backward first, then
lowest micro-batch"), generalised to any stage->rank map, several chains (Chimera) and split backward
(zero bubble):

* a task is ready when its inputs are done (plus one link time from another rank);
* whenever a rank is free it starts, among the tasks ready by then, the best by
  ``(class, micro-batch, stage)`` with class 0 = B or I, 1 = F, 2 = W (``forward_first``
  swaps B/I and F); if none is ready it idles
  until the earliest one is (non-delay list scheduling, decided in global time order);
* deferred weight gradients: once a rank holds more than ``w_limit[r]`` ready W's, the oldest
  one runs before anything else (ZB-H1 keeps W's deferral bounded; default: unbounded);
* memory cap: a rank admits a micro-batch (runs the F of its first stage on that rank) only
  while fewer than ``cap[r]`` admitted micro-batches have not finished their last backward
  there. If every rank is stuck on the cap, the lowest waiting micro-batch is admitted anyway,
  so the order always completes;
* units (optional): micro-batches are admitted in units of ``unit``; a rank admits one of unit
  k only after all of unit k-1 finished their last backward there (repeated M = P blocks, the
  setting of Hanayo's closed form).

Pure and deterministic: ties break on (time, decision sequence).
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.arrays import CODE, ActionArrays
from hexicore.pipeline.chains import ChainLinks
from hexicore.pipeline.timing import Timing


def greedy_order(ranks: int, stage_rank: Sequence[int], chains: Sequence[Sequence[int]], mb_chain: Sequence[int],
                 timing: Timing, **kw) -> list[list[Action]]:
    """Per-rank compute lists; see the module docstring and :func:`greedy_tuples` for ``kw``."""
    return [[Action(op, s, mb) for op, s, mb in row]
            for row in greedy_tuples(ranks, stage_rank, chains, mb_chain, timing, **kw)]


def _entries(ranks: int, stage_rank: Sequence[int], chains: Sequence[Sequence[int]]) -> list[list[int | None]]:
    """Per chain and rank the first stage of the chain on that rank (where it admits a micro-batch)."""
    entry: list[list[int | None]] = [[None] * ranks for _ in chains]
    for c, chain in enumerate(chains):
        for s in chain:
            if entry[c][stage_rank[s]] is None:
                entry[c][stage_rank[s]] = s
    return entry


def greedy_tuples(ranks: int, stage_rank: Sequence[int], chains: Sequence[Sequence[int]], mb_chain: Sequence[int],
                  timing: Timing, *, cap: Sequence[float] | None = None,
                  split_backward: bool = False, w_limit: Sequence[float] | None = None,
                  unit: int | None = None, forward_first: bool = False) -> list[list[tuple[str, int, int]]]:
    """Per-rank compute lists as ``(op, stage, mb)`` tuples (no ``Action`` objects: the big
    schedules turn them into arrays). ``split_backward``: emit I and W.

    long: one event loop over every task of the schedule (~10^5 for Hanayo at P = 64, W = 8);
    its state lives in local lists and its successor updates are inlined: moving them into a
    function called per task made this loop ~6% slower (Hanayo P = 64, W = 8, M = 64)."""
    dur = timing.durations()
    links = [[timing.link(a, b) for b in range(ranks)] for a in range(ranks)]
    CF, CB = (0, 1) if forward_first else (1, 0)  # priority classes of F and B/I (W is 2)
    prev, nxt = ChainLinks.of(chains).lists()  # per chain: stage -> previous / next stage
    entry = _entries(ranks, stage_rank, chains)
    cap = list(cap) if cap is not None else [float("inf")] * ranks
    bop = "I" if split_backward else "B"
    free = [0.0] * ranks
    admitted = [0] * ranks
    released = [0] * ranks
    unit = unit or len(mb_chain) or 1
    pending: list[list] = [[] for _ in range(ranks)]  # (ready, cls, mb, stage, op)
    avail: list[list] = [[] for _ in range(ranks)]    # (cls, mb, stage, op) B/I/continuing F/W
    wq: list[list] = [[] for _ in range(ranks)]       # (mb, stage) ready W's
    w_limit = list(w_limit) if w_limit is not None else [float("inf")] * ranks
    newf: list[list] = [[] for _ in range(ranks)]     # (mb, stage) admissions waiting on the cap
    events: list[tuple[float, int, int]] = []
    seq = 0
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(ranks)]
    left = (3 if split_backward else 2) * sum(len(chains[c]) for c in mb_chain)
    force = [False] * ranks

    def wake(r: int, t: float) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (max(t, free[r]), seq, r))

    def ready(r: int, t: float, cls: int, mb: int, s: int, op: str) -> None:
        heapq.heappush(pending[r], (t, cls, mb, s, op))
        wake(r, t)

    push = heapq.heappush
    for mb, c in enumerate(mb_chain):
        s0 = chains[c][0]
        ready(stage_rank[s0], 0.0, CF, mb, s0, "F")

    while left:
        if not events:  # everyone waits on the cap: admit the lowest waiting micro-batch
            r = min((q for q in range(ranks) if newf[q]), key=lambda q: (newf[q][0], q))
            force[r] = True
            wake(r, free[r])
        t, _, r = heapq.heappop(events)
        if t < free[r]:
            continue
        pq, av, nf = pending[r], avail[r], newf[r]
        while pq and pq[0][0] <= t:
            _, cls, mb, s, op = heapq.heappop(pq)
            if op == "F" and entry[mb_chain[mb]][r] == s:
                heapq.heappush(nf, (mb, s))
            elif op == "W":
                heapq.heappush(wq[r], (mb, s))
            else:
                heapq.heappush(av, (cls, mb, s, op))
        best = av[0] if av else None
        if wq[r] and (len(wq[r]) > w_limit[r] or (best is None and not (nf and admitted[r] < cap[r]))):
            mb, s = heapq.heappop(wq[r])
            best = (2, mb, s, "W")
        elif nf and (force[r] or (admitted[r] < cap[r] and released[r] >= unit * (nf[0][0] // unit))) \
                and (best is None or (CF, nf[0][0]) < best[:2]):
            mb, s = heapq.heappop(nf)
            best, admitted[r], force[r] = (CF, mb, s, "F"), admitted[r] + 1, False
        elif best is not None:
            heapq.heappop(av)
        else:
            if pq:
                wake(r, pq[0][0])
            continue
        cls, mb, s, op = best
        end = t + dur[op][s]
        free[r] = end
        out[r].append((op, s, mb))
        left -= 1
        c = mb_chain[mb]
        # successors become ready (inlined ``ready``/``wake``: the hot loop of big schedules)
        if op == "F":
            n = nxt[c][s]
            if n is None:
                q, tq, item = r, end, (end, CB, mb, s, bop)
            else:
                q = stage_rank[n]
                tq = end + links[r][q]
                item = (tq, CF, mb, n, "F")
            push(pending[q], item)
            seq += 1
            fq = free[q]
            push(events, (tq if tq > fq else fq, seq, q))
        elif op in "BI":
            if entry[c][r] == s:
                admitted[r] -= 1
                released[r] += 1
            if op == "I":
                ready(r, end, 2, mb, s, "W")
            p = prev[c][s]
            if p is not None:
                q = stage_rank[p]
                tq = end + links[r][q]
                push(pending[q], (tq, CB, mb, p, bop))
                seq += 1
                fq = free[q]
                push(events, (tq if tq > fq else fq, seq, q))
        seq += 1
        push(events, (end, seq, r))
    return out


def greedy_lists(spec: Any, stage_rank: Sequence[int], **kw: Any) -> ActionArrays:
    """:func:`greedy_tuples` of one chain through ``stage_rank`` (stages in index order) under
    ``spec``'s times (a ``ScheduleSpec``), as :class:`~hexicore.pipeline.arrays.ActionArrays`
    (no ``Action`` objects: :func:`hexicore.pipeline.schedule.build` takes them as they are);
    ``kw`` as there (``cap``, ``split_backward``, ...)."""
    P, M, n = spec.ranks, spec.micro_batches, len(stage_rank)
    probe = ActionList({}, P, n, M, tuple(stage_rank), ((),) * P)
    rows = greedy_tuples(P, tuple(stage_rank), [tuple(range(n))], (0,) * M, spec.timing(probe), **kw)
    flat = [t for row in rows for t in row]
    return ActionArrays.build([CODE[op] for op, _, _ in flat], [s for _, s, _ in flat], [mb for _, _, mb in flat],
                              [-1] * len(flat), [len(row) for row in rows])
