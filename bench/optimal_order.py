"""Exact compute-only schedules for small instances (CP-SAT): the optimum the heuristics are
measured against (bench/schedules_zb.py; tests/schedules/test_schedules.py and tests/pipeline/test_synth.py).

The model is the simulator's (:mod:`hexicore.pipeline.simulate`, compute only): every task
``(op, stage, mb)`` is an interval of its :class:`hexicore.pipeline.timing.Timing` duration on its
stage's rank; a rank runs one task at a time; ``F(s)`` starts after ``F`` of the previous stage
of the micro-batch's chain plus one transfer (:meth:`Timing.link`) between their ranks, the
chain's last stage's backward after its forward, a backward (``B`` or ``I``) after the next
stage's backward plus one transfer, ``W`` after its ``I``. The makespan is the latest end.
Durations are scaled to integers (``scale``), so the optimum is exact for durations that are
multiples of ``1/scale``. Memory caps are not modelled (a relaxation: the optimum is a lower
bound for capped schedules too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action
from hexicore.pipeline.chains import ChainLinks
from hexicore.pipeline.timing import Timing


@dataclass(frozen=True)
class Optimum:
    """CP-SAT's best makespan, its proven lower bound, whether they meet, and per-rank orders."""

    makespan: float
    bound: float
    proven: bool
    lists: tuple[tuple[Action, ...], ...]


def optimal_order(ranks: int, stage_rank: Sequence[int], chains: Sequence[Sequence[int]], mb_chain: Sequence[int],
                  timing: Timing, *, split_backward: bool = False, scale: int = 1000, time_limit: float = 10.0,
                  seed: int = 0, workers: int = 1) -> Optimum:
    """The CP-SAT optimum of the model in the module docstring (deterministic: one worker, ``seed``)."""
    from ortools.sat.python import cp_model

    dur = {k: [round(x * scale) for x in v] for k, v in timing.durations().items()}
    prev, nxt = ChainLinks.of(chains).lists()
    horizon = sum(sum(dur[o][s] for o in (("F", "I", "W") if split_backward else ("F", "B"))) + 2 * round(
        max(timing.hops or (0.0,)) * scale) * len(chains[c]) for c in mb_chain for s in chains[c]) + 1
    m = cp_model.CpModel()
    start, end, per_rank = {}, {}, [[] for _ in range(ranks)]
    ops = ("F", "I", "W") if split_backward else ("F", "B")
    for mb, c in enumerate(mb_chain):
        for s in chains[c]:
            for op in ops:
                st, en = m.NewIntVar(0, horizon, ""), m.NewIntVar(0, horizon, "")
                per_rank[stage_rank[s]].append((m.NewIntervalVar(st, dur[op][s], en, ""), (op, s, mb)))
                start[op, s, mb], end[op, s, mb] = st, en
    back = ops[1]
    for mb, c in enumerate(mb_chain):
        for s in chains[c]:
            p, n = prev[c][s], nxt[c][s]
            if p is not None:
                m.Add(start["F", s, mb] >= end["F", p, mb] + round(timing.link(stage_rank[p], stage_rank[s]) * scale))
            if n is None:
                m.Add(start[back, s, mb] >= end["F", s, mb])
            else:
                m.Add(start[back, s, mb] >= end[back, n, mb] + round(timing.link(stage_rank[n], stage_rank[s]) * scale))
            if split_backward:
                m.Add(start["W", s, mb] >= end["I", s, mb])
    for row in per_rank:
        m.AddNoOverlap([iv for iv, _ in row])
    mk = m.NewIntVar(0, horizon, "")
    m.AddMaxEquality(mk, list(end.values()))
    m.Minimize(mk)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no schedule within {time_limit} s")
    lists = []
    for row in per_rank:
        timed = sorted((solver.Value(start[k]), k[2], k[1], k) for _, k in row)
        lists.append(tuple(Action(*k) for *_, k in timed))
    return Optimum(solver.Value(mk) / scale, solver.BestObjectiveBound() / scale, status == cp_model.OPTIMAL,
                   tuple(lists))
