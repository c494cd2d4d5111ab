"""The baselines under an objective: a baseline solver (Megatron, Metis, Galvatron, FSDP) lays
its plan out on every device it is given, as those systems do. Under the default objective
(least iteration time, no budget, no throughput floor) that is what it returns; under
``objective=cost``, ``budget_per_hour`` or ``min_tokens_per_s`` it is given the sub-clusters of
whole machines that :func:`hexicore.planner.allocation.allocate` tries, and the plan that best
meets the objective is returned, so a sweep over solvers compares like with like and no
baseline plan breaks a budget it was given.
"""

from __future__ import annotations

from typing import Callable

from hexicore.core.plan import Plan
from hexicore.planner.allocation import allocate
from hexicore.planner.objective import Objective
from hexicore.planner.problem import Problem, Progress, no_progress


def on_devices_for_objective(problem: Problem, solve_all: Callable[[Problem, Progress], Plan], *,
                             progress: Progress = no_progress) -> Plan:
    """``solve_all(problem, progress)`` under the default objective; otherwise the best of it
    over sub-clusters (module docstring)."""
    if problem.objective == Objective():
        return solve_all(problem, progress)
    return allocate(problem, solve_all, progress=progress)
