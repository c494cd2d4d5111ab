"""From a CP-SAT solution to a :class:`hexicore.core.plan.Plan`: device ids are assigned here.

The model decides per stage only ``(machine, tp)``; the devices of a machine are handed out
fastest first (:func:`.tables.machine_pools`; identical devices in cluster order, where any
assignment prices the same: one link per machine pair).
In fix_groups mode the warm-start plan's own device groups are kept instead.
"""

from __future__ import annotations

from typing import Sequence

from ortools.sat.python import cp_model

from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.planner.problem import Problem

from .formulation import Formulation
from .tables import Option, machine_pools


def decode(problem: Problem, form: Formulation, solver: cp_model.CpSolver, options: Sequence[Option],
           groups: Sequence[Sequence[tuple[str, ...]]] | None = None) -> Plan:
    """The plan of the solver's best solution (``groups``: fixed device groups per pipeline)."""
    pools = {m: list(ids) for m, ids in machine_pools(problem).items()}
    train = problem.train
    pipelines = []
    for i, n_slots in enumerate(form.slots):
        n = solver.value(form.n[i])
        if n == 0:
            continue
        stages, lo = [], 0
        for j in range(n_slots):
            chosen = [o for o in range(1, len(options) + 1) if solver.boolean_value(form.x[i, j, o])]
            if not chosen:
                break
            opt = options[chosen[0] - 1]
            hi = lo + int(solver.value(form.layers[i, j]))
            if groups is not None:
                devices = tuple(groups[i][j])
            else:
                devices = tuple(pools[opt.machine][:opt.tp])
                del pools[opt.machine][:opt.tp]
            stages.append(Stage(devices, len(devices), (lo, hi)))
            lo = hi
        pipelines.append(Pipeline(n * train.micro_batch, tuple(stages), dict(problem.schedule)))
    return Plan(problem.model, problem.cluster, train, tuple(pipelines))
