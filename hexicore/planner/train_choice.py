"""The training settings the planner chooses per plan: ``train.zero=auto`` (the sharded-state
stage, ZeRO 0-3, :mod:`hexicore.cost.precision`) and ``train.micro_batch=auto`` (the micro-batch
size, among :data:`MICRO_BATCH_SIZES` those that divide the global batch; Sailor and Metis also
choose it per plan). Both change a stage's memory (shards, activations) and prices (DP traffic,
per-micro-batch efficiency, the number of micro-batches), so they are search dimensions.

* :func:`train_choices` lists the concrete settings a problem allows (the product of the two);
* :func:`solve_choices` solves over them: a solver that declares ``chooses_train`` (hexiscale)
  gets them all in one problem (``Problem.train`` the first, ``Problem.train_options`` the rest)
  and prices every candidate layout under each in one search, the first's walk being the one
  it takes alone; any other solver is run once per choice (the time limit shared) and the
  fastest plan that fits is kept, ties to the earlier choice (a lower ZeRO stage: less traffic,
  a simpler runtime). The first choice is ZeRO 0 at the smallest size, so ``auto`` is never
  slower than that choice under the same cost model (a time budget aside).

The plan's solver info records per dimension the best iteration seconds found for each value
(``zero_s`` per stage, ``micro_batch_s`` per size; None: nothing fits).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.core.settings import AUTO, TrainSettings
from hexicore.planner.problem import Problem, Progress, Solver, no_progress

STAGES = (0, 1, 2, 3)
#: the micro-batch sizes ``train.micro_batch=auto`` chooses from (those dividing the global batch)
MICRO_BATCH_SIZES = (1, 2, 4, 8)


def at_stage(problem: Problem, zero: int | None, *, field: str = "solver.zero") -> Problem:
    """``problem`` with the ZeRO stage fixed to ``zero`` (None: unchanged) — what a baseline's
    own ``zero`` option does (Megatron-LM's distributed optimizer is ZeRO-1; so are Metis' and
    Galvatron's optional sharded optimizers)."""
    if zero is None:
        return problem
    if isinstance(zero, bool) or zero not in STAGES:
        raise HexicoreError(f"must be one of 0, 1, 2, 3; got {zero!r}", field=field)
    return with_train(problem, replace(problem.train, zero=zero))


def with_train(problem: Problem, train: TrainSettings) -> Problem:
    """``problem`` under ``train`` (its warm start too), with no other choices."""
    p = replace(problem, train=train, train_options=())
    if p.warm_start is not None:
        p = replace(p, warm_start=replace(p.warm_start, train=train))
    return p


def train_choices(train: TrainSettings) -> tuple[TrainSettings, ...]:
    """The concrete settings ``train`` allows: every ZeRO stage where ``zero`` is ``auto``, every
    size of :data:`MICRO_BATCH_SIZES` dividing the global batch where ``micro_batch`` is ``auto``
    (by size, then stage: the first is the least traffic at the smallest size); ``(train,)`` when
    neither is."""
    stages = STAGES if train.zero == AUTO else (train.zero,)
    sizes = (tuple(b for b in MICRO_BATCH_SIZES if train.global_batch % b == 0) or (1,)
             if train.micro_batch == AUTO else (train.micro_batch,))
    return tuple(replace(train, zero=z, micro_batch=b) for b in sizes for z in stages)


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


def choice_seconds(asked: TrainSettings, found: Sequence[tuple[TrainSettings, float | None]]) -> dict[str, dict]:
    """The solver info's ``zero_s`` / ``micro_batch_s`` (only for the dimensions ``asked`` leaves
    to the planner): per value, the least seconds over the choices with that value (None: none fits)."""
    out: dict[str, dict] = {}
    for key, name in (("zero", "zero_s"), ("micro_batch", "micro_batch_s")):
        if getattr(asked, key) != AUTO:
            continue
        best: dict[str, float | None] = {}
        for train, secs in found:
            k = str(getattr(train, key))
            if secs is not None and (best.get(k) is None or secs < best[k]):
                best[k] = round(secs, 6)
            else:
                best.setdefault(k, None)
        out[name] = best
    return out


def solve_choices(solver: Solver, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
                  progress: Progress = no_progress) -> Plan:
    """``solver.solve(problem)`` over :func:`train_choices` (module docstring); the plan's solver
    info gets :func:`choice_seconds`."""
    choices = train_choices(problem.train)
    if len(choices) == 1:
        return solved(solver, with_train(problem, choices[0]) if choices[0] != problem.train else problem,
                      time_limit=time_limit, seed=seed, progress=progress)
    if getattr(solver, "chooses_train", False):
        p = replace(with_train(problem, choices[0]), train_options=choices[1:])
        plan = solved(solver, p, time_limit=time_limit, seed=seed, progress=progress)
        found = [(TrainSettings.from_dict(t), s) for t, s in (plan.solver or {}).get("train_s", [])]
        info = {k: v for k, v in dict(plan.solver or {}).items() if k != "train_s"}
        return plan.with_solver({**info, **choice_seconds(problem.train, found)})
    limit = None if time_limit is None else time_limit / len(choices)
    best, found, error = None, [], None
    for train in choices:
        try:
            plan = solved(solver, with_train(problem, train), time_limit=limit, seed=seed, progress=progress)
        except HexicoreError as exc:
            found.append((train, None))
            error = error or exc
            continue
        est = problem.cost.estimate(plan)
        found.append((train, est.iteration_s if est.fits else None))
        if est.fits and (best is None or est.iteration_s < best[0] - 1e-12):
            best = (est.iteration_s, plan)
    if best is None:
        raise error or HexicoreError("no training setting gives a plan that fits", field="train")
    plan = best[1]
    return plan.with_solver({**dict(plan.solver or {}), **choice_seconds(problem.train, found)})
