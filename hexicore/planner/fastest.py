"""The fastest fitting plan of a list of candidates, priced exactly only where it could win.

A baseline solver builds a handful of complete plans and keeps the fastest that fits in memory.
Pricing one exactly can cost seconds (a schedule synthesised for the pipeline's own times, its
peaks simulated), so:

* the candidates are taken in order of a floor on their iteration time that holds under every
  schedule — each rank runs its stage's work for every micro-batch of its pipeline (the cost
  model's ``work_bound_s``; 0 for a cost model without one) — and a candidate whose floor lies
  above the fastest fitting time found so far is not priced: it can neither win nor tie;
* a candidate's memory is checked before its time (the cost model's ``memory_gb``, where it has
  one): one that does not fit is not timed.

The choice is the one pricing every candidate makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from hexicore.core.estimate import Estimate
from hexicore.core.plan import Plan


@dataclass(frozen=True)
class Priced:
    """``fitting``: ``(key, plan, estimate)`` of the candidates that fit and could win, in the
    candidates' order (ties then break as over all of them); ``unfit``: the keys of those found
    not to fit in memory; ``priced``: how many were priced (memory or time)."""

    fitting: list[tuple[Any, Plan, Estimate]]
    unfit: list[Any]
    priced: int


def work_bound_s(problem: Any, plan: Plan) -> float:
    """The problem's cost model's floor on ``plan``'s iteration time (0 without one)."""
    bound = getattr(problem.cost, "work_bound_s", None)
    return float(bound(plan)) if bound is not None else 0.0


def fits(problem: Any, plan: Plan) -> bool:
    """Whether every device's peak memory fits (the cost model's ``memory_gb``; True without one:
    the estimate then says)."""
    memory = getattr(problem.cost, "memory_gb", None)
    if memory is None:
        return True
    return all(gb <= plan.cluster.device(d).memory_gb for d, gb in memory(plan).items())


def priced_where_it_could_win(problem: Any, cands: Sequence[tuple[Any, Plan]]) -> Priced:
    """The candidates that could be the fastest fitting one, priced (module docstring)."""
    floors = [work_bound_s(problem, plan) for _, plan in cands]
    best, priced, unfit, seen = math.inf, {}, [], 0
    for i in sorted(range(len(cands)), key=lambda i: (floors[i], i)):
        if floors[i] > best:
            break  # every later floor is higher still
        seen += 1
        est = problem.evaluate(cands[i][1]) if fits(problem, cands[i][1]) else None
        if est is None or not est.fits:
            unfit.append(i)
            continue
        priced[i] = est
        best = min(best, est.iteration_s)
    return Priced([(cands[k][0], cands[k][1], priced[k]) for k in sorted(priced)],
                  [cands[k][0] for k in sorted(unfit)], seen)
