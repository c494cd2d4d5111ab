"""Solution hints: a plan (the warm start, or a simple greedy one) handed to CP-SAT as a start.

A hint only steers the search (CP-SAT repairs or drops it); it never changes the optimum or the
bound. The greedy plan is the best fitting one of a few simple layouts: one pipeline through every
machine in cluster order (a stage per TP group of the machine's largest degree, or per device),
or one stage on one TP group; blocks split in proportion to stage speed.
"""

from __future__ import annotations

from typing import Sequence

from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.planner.problem import Problem
from hexicore.planner.baselines.symmetric import least_layers

from .formulation import Formulation
from .tables import Option, machine_pools, tp_degrees


def plan_rows(problem: Problem, plan: Plan, options: Sequence[Option]) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """``[(micro-batches, [(option id, blocks), ...]), ...]`` of ``plan``, pipelines ordered as
    the model's symmetry breaking wants (stages, then micro-batches, non-increasing); None when a
    stage is no option of the model (spans machines, other TP degree)."""
    index = {(o.machine, o.tp): k for k, o in enumerate(options, start=1)}
    rows = []
    for p in plan.pipelines:
        row = []
        for s in p.stages:
            machines = {problem.cluster.device(d).machine for d in s.devices}
            key = (next(iter(machines)), len(s.devices))
            if len(machines) != 1 or key not in index:
                return None
            row.append((index[key], s.n_layers))
        rows.append((p.batch // problem.train.micro_batch, row))
    return sorted(rows, key=lambda r: (-len(r[1]), -r[0]))


def _split(total: int, weights: Sequence[float], least: Sequence[int]) -> list[int]:
    """``total`` blocks in proportion to ``weights``, part i >= ``least[i]`` (largest remainders)."""
    raw = [max(w, 1e-12) / sum(max(v, 1e-12) for v in weights) * (total - sum(least)) for w in weights]
    parts = [k + int(r) for k, r in zip(least, raw)]
    order = sorted(range(len(weights)), key=lambda i: -(raw[i] - int(raw[i])))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _one_pipeline(problem: Problem, groups: Sequence[tuple[str, ...]]) -> Plan | None:
    """One pipeline through ``groups`` (as many as have blocks for their chunks), else None."""
    c, m, t = problem.cluster, problem.model, problem.train
    groups, least = list(groups)[: m.layers], ()
    while groups:
        least = least_layers(problem, len(groups))
        if sum(least) <= m.layers:
            break
        groups.pop()
    if not groups:
        return None
    priced = problem.bound_cost()
    speed = [1.0 / max(priced.stage_s(g, 1), 1e-30) for g in groups]
    stages, lo = [], 0
    for g, n in zip(groups, _split(m.layers, speed, least)):
        stages.append(Stage(tuple(g), len(g), (lo, lo + n)))
        lo += n
    return Plan(m, c, t, (Pipeline(t.global_batch, tuple(stages), dict(problem.schedule)),))


def greedy_plan(problem: Problem) -> Plan | None:
    """The best fitting plan among: one pipeline through every machine (largest TP groups, or
    single devices), and one stage on one TP group of one machine; None if none fits."""
    pools = machine_pools(problem)
    candidates = []
    for prefer_tp in (True, False):
        groups = []
        for devs in pools.values():
            size = max(tp_degrees(problem, len(devs))) if prefer_tp else 1
            groups += [tuple(devs[k:k + size]) for k in range(0, len(devs) - size + 1, size)]
        candidates.append(_one_pipeline(problem, groups))
    for devs in pools.values():
        candidates += [_one_pipeline(problem, [tuple(devs[:t])]) for t in tp_degrees(problem, len(devs))]
    candidates = [p for p in candidates if p is not None]
    scored = [(est.iteration_s, k) for k, est in enumerate(map(problem.cost.estimate, candidates)) if est.fits]
    return candidates[min(scored)[1]] if scored else None


def _decisions(form: Formulation, rows, n_options: int) -> list[tuple[object, int]]:
    """(variable, value) for every decision the rows fix: micro-batches, options, blocks."""
    out = []
    for i, n_slots in enumerate(form.slots):
        n, row = rows[i] if i < len(rows) else (0, [])
        out.append((form.n[i], n))
        lo = 0
        for j in range(n_slots):
            chosen, blocks = row[j] if j < len(row) else (0, 0)
            out += [(form.x[i, j, o], int(o == chosen)) for o in range(1, n_options + 1)]
            out += [(form.z[i, j, k], int(lo <= k < lo + blocks)) for k in range(form.n_blocks)]
            lo += blocks
    return out


def add_hint(form: Formulation, rows: Sequence[tuple[int, Sequence[tuple[int, int]]]], n_options: int,
             *, seconds: float = 5.0) -> bool:
    """Hint every model variable from ``rows``: the decisions are fixed in a copy of the model,
    which CP-SAT completes (a complete hint is what its search can start from); False when the
    rows do not fit the model's slots or the copy finds no completion in ``seconds``."""
    from ortools.sat.python import cp_model

    if len(rows) > len(form.slots) or any(len(r) > form.slots[i] for i, (_, r) in enumerate(rows)):
        return False
    copy = form.model.clone()
    for var, value in _decisions(form, rows, n_options):
        copy.add(copy.get_int_var_from_proto_index(var.index) == value)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    if solver.solve(copy) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    form.model.clear_hints()
    for k, value in enumerate(solver.response_proto.solution):
        form.model.add_hint(form.model.get_int_var_from_proto_index(k), value)
    return True
