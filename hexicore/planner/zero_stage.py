"""``train.zero=auto``: the sharded-state stage (ZeRO 0-3, :mod:`hexicore.cost.precision`) as a
search dimension, per plan.

Any solver is run once per stage on the problem with that stage fixed (its memory caps and prices
then follow the stage); the fastest plan that fits is kept, ties going to the lower stage (less
traffic, simpler runtime). Stage 0 is among the choices, so ``auto`` is never slower than
``zero=0`` under the same cost model and solver, and a plan that fits only with sharding is found
when the solver finds it at that stage.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.problem import Problem, Progress, Solver, no_progress

STAGES = (0, 1, 2, 3)


def at_stage(problem: Problem, zero: int | None, *, field: str = "solver.zero") -> Problem:
    """``problem`` with the ZeRO stage fixed to ``zero`` (None: unchanged) — what a baseline's
    own ``zero`` option does (Megatron-LM's distributed optimizer is ZeRO-1; so are Metis' and
    Galvatron's optional sharded optimizers)."""
    if zero is None:
        return problem
    if isinstance(zero, bool) or zero not in STAGES:
        raise HexicoreError(f"must be one of 0, 1, 2, 3; got {zero!r}", field=field)
    p = replace(problem, train=replace(problem.train, zero=zero))
    if p.warm_start is not None:
        p = replace(p, warm_start=replace(p.warm_start, train=p.train))
    return p


def solved(solver: Solver, problem: Problem, **kwargs: Any) -> Plan:
    """``solver.solve(problem, **kwargs)``, which must return a :class:`Plan` (the solver
    interface, :class:`hexicore.planner.problem.Solver`); anything else (None, a plan's dict) is
    a one-line :class:`HexicoreError` about the solver, before anything reads it."""
    plan = solver.solve(problem, **kwargs)
    if not isinstance(plan, Plan):
        what = " (a mapping: build it with hexicore.Plan.from_dict)" if isinstance(plan, Mapping) else ""
        raise HexicoreError(f"solve() returned {type(plan).__name__}, not a hexicore Plan{what}")
    for what, mine, asked in (("cluster", plan.cluster, problem.cluster), ("model", plan.model, problem.model)):
        if mine != asked:
            raise HexicoreError(f"solve() returned a plan for {what} {getattr(mine, 'name', '?')!r}; the problem's is "
                                f"{getattr(asked, 'name', '?')!r}")
    return plan


def solve_zero(solver: Solver, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
               progress: Progress = no_progress) -> Plan:
    """``solver.solve(problem)``; with ``train.zero=auto`` the best over :data:`STAGES` (each
    stage gets ``time_limit / 4``); the plan's solver info gets ``zero_s``: per stage the
    estimated iteration seconds (``None``: nothing fits)."""
    if problem.train.zero != "auto":
        return solved(solver, problem, time_limit=time_limit, seed=seed, progress=progress)
    limit = None if time_limit is None else time_limit / len(STAGES)
    best, seen, error = None, {}, None
    for z in STAGES:
        p = at_stage(problem, z)
        try:
            plan = solved(solver, p, time_limit=limit, seed=seed, progress=progress)
        except HexicoreError as exc:
            seen[z], error = None, error or exc
            continue
        est = problem.cost.estimate(plan)
        seen[z] = round(est.iteration_s, 6) if est.fits else None
        if est.fits and (best is None or est.iteration_s < best[0] - 1e-12):
            best = (est.iteration_s, plan)
    if best is None:
        raise error or HexicoreError("no ZeRO stage gives a plan that fits", field="train.zero")
    plan = best[1]
    return plan.with_solver({**dict(plan.solver or {}), "zero_s": {str(k): v for k, v in seen.items()}})
