"""Solver ``cpsat``: exact plans with OR-Tools CP-SAT (HexiScale's MILP check, App. D / Table 6).

Decides which devices form each pipeline and stage (stages inside one machine, TP degree =
stage size), how many blocks each stage runs and how many micro-batches each pipeline takes;
minimises the analytic cost model's iteration time ``max_i PIPELINE-TIME(i) + COMM-DP``
(App. A) under per-device memory limits. The formulation and its simplifications are in
:mod:`.formulation`, the cost-model tables in :mod:`.tables`.

The plan's ``solver`` section (docs/formats.md) carries ``status`` (``OPTIMAL`` when CP-SAT proved
the model optimal, ``FEASIBLE`` when the time limit stopped it), ``objective`` (the model's value
of the returned plan, seconds, :func:`.evaluate.model_value`) and ``bound`` (CP-SAT's proven lower bound, seconds). Every
table entry and every simplification under-estimates the cost model, so ``bound`` is a valid
lower bound of the estimate of every plan in the modelled space (stages inside one machine,
power-of-two TP). With a cost model whose ``pipeline_timer`` replaces the 1F1B formula the
model prices another schedule than the estimate does: the status is then ``FEASIBLE`` and
``bound`` is null. Where the cost model prices the devices of one machine differently (a
per-device profile), the model sees each machine's devices as its fastest ones: ``bound`` stays
valid, the status is ``FEASIBLE`` (the plan is the model's optimum, not a proven optimal plan).
Under any schedule the model keeps what the runtime needs: a block per chunk the schedule runs
on each stage (Hanayo's 2W, the V schedules' two), and the head where the schedule keeps it
(the first stage of a V-shaped or wave schedule, :mod:`.ends`), so its plans fit and run.
Chimera's ranks keep two chains' blocks; the model prices one, and the plan's final memory check
refuses a plan the second chain overfills.

When the time limit stops CP-SAT before it reports any plan, the start plan it was given (the
warm start or the greedy plan of :mod:`.hint`) is returned as ``FEASIBLE`` with the bound proven
so far; without a start plan that is an error ("time limit ... reached with no plan").

``fix_groups=true`` with ``warm_start=PLAN``: the warm-start plan's pipelines and stage device
groups are kept (in their order) and only the block ranges and pipeline batches are
re-optimised, exactly; the bound is then over plans with those groups.

With ``train.vocab_parallel`` the tables still price the embedding and the head whole on every
TP rank (more than the estimate does): the status is then ``FEASIBLE`` and ``bound`` null.

The model is App. A's step-end sync, so its plans are planned and trained without the overlapped
data-parallel sync (``train.dp_overlap=false`` in the plan): their estimate is then the model's
value and the bound a bound of it (a run may still ask for the overlap, ``train.dp_overlap=true``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from hexicore.core import schema
from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.plan import Plan
from hexicore.planner.allocation.sub_clusters import TimeShares, allocate
from hexicore.planner.problem import Problem, Progress, no_progress

from .tables import Option, build_tables, stage_options, uneven_machines

log = logging.getLogger("hexicore")

DEFAULT_TIME_LIMIT = 60.0


def _fixed_groups(problem: Problem) -> tuple[list[Option], list[list[int]], list[list[tuple[str, ...]]]]:
    """Options, per-pipeline option ids and device groups of the warm-start plan."""
    plan = problem.warm_start
    if plan is None:
        raise HexicoreError("solver.fix_groups=true needs a plan to keep: pass warm_start=PLAN.json",
                            field="solver.fix_groups")
    options: list[Option] = []
    index: dict[tuple[str, int], int] = {}
    fixed, groups = [], []
    for i, p in enumerate(plan.pipelines):
        row, grow = [], []
        for j, s in enumerate(p.stages):
            for d in s.devices:
                if not problem.cluster.has_device(d):
                    raise HexicoreError(f"warm-start device {d!r} is not in the cluster", field="warm_start")
            machines = {problem.cluster.device(d).machine for d in s.devices}
            if len(machines) != 1:
                raise HexicoreError(f"fix_groups keeps stages inside one machine; pipelines[{i}].stages[{j}] "
                                    f"spans {', '.join(sorted(machines))}", field="warm_start")
            key = (machines.pop(), len(s.devices))
            if key not in index:
                options.append(Option(key[0], key[1], tuple(s.devices)))
                index[key] = len(options)
            row.append(index[key])
            grow.append(tuple(s.devices))
        fixed.append(row)
        groups.append(grow)
    return options, fixed, groups


@dataclass
class CpSatSolver:
    """CP-SAT over the formulation of :mod:`.formulation`; ``workers`` search threads (``auto``:
    the cores this process may use, :func:`~hexicore.planner.search.workers.available_cores`)."""

    workers: int | str = "auto"
    fix_groups: bool = False
    log: bool = False
    use_all_devices: bool = False
    allocation_exhaustive: int = 8
    name: str = "cpsat"

    def __post_init__(self) -> None:
        """Parameters from the config or a library call: wrong types and ranges are one line."""
        if self.workers == "auto":
            from hexicore.planner.search.workers import available_cores

            self.workers = available_cores()
        self.workers = schema.integer(self.workers, "solver cpsat", "solver.workers")
        self.allocation_exhaustive = schema.integer(self.allocation_exhaustive, "solver cpsat",
                                                    "solver.allocation_exhaustive", minimum=0)  # as hexiscale's
        for key in ("fix_groups", "log"):
            if not isinstance(getattr(self, key), bool):
                raise HexicoreError(f"expected true or false, got {getattr(self, key)!r}", source="solver cpsat",
                                    field=f"solver.{key}")

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        """Unless ``use_all_devices`` (or ``fix_groups``), the model is solved on sub-clusters of
        whole machines too, and the best plan under the problem's objective is returned
        (:func:`hexicore.planner.allocation.sub_clusters.allocate`), its ``bound`` the least over the
        sub-clusters and ``OPTIMAL`` only where no sub-cluster's bound is lower. ``time_limit``
        is CP-SAT's search time for the whole solve (building the models is not counted): the
        sub-clusters share it (:class:`TimeShares`); once it is spent no further sub-cluster is
        solved, and those left count in the bound by their FLOPs bound."""
        if not isinstance(self.use_all_devices, bool):
            raise HexicoreError(f"use_all_devices must be true or false, got {self.use_all_devices!r}",
                                field="solver.use_all_devices")
        problem = replace(problem, train=replace(problem.train, dp_overlap=False))  # App. A's sync (module docstring)
        limit = (schema.number(time_limit, "solver cpsat", "solver.time_limit") if time_limit is not None
                 else DEFAULT_TIME_LIMIT)
        shares = TimeShares(limit)  # one model: all of it
        if self.use_all_devices or self.fix_groups:
            return self._solve_all(problem, shares=shares, seed=seed, progress=progress)

        def one(sub: Problem, report: Progress) -> Plan:
            return self._solve_all(sub, shares=shares, seed=seed, progress=report)

        plan = allocate(problem, one, exhaustive=self.allocation_exhaustive, progress=progress, shares=shares)
        info = dict(plan.solver or {})
        info["params"] = {**info.get("params", {}), "time_limit": limit}
        return plan.with_solver(info)

    def _solve_all(self, problem: Problem, *, shares: TimeShares, seed: int = 0,
                   progress: Progress = no_progress) -> Plan:
        """long: one CP-SAT model over every device of ``problem.cluster``: tabulate, build,
        hint, solve, decode, and the plan's solver section (one linear story); CP-SAT searches
        its share of ``shares`` (taken once the tables are built, and what it took reported
        back: :class:`TimeShares`)."""
        from ortools.sat.python import cp_model

        from .decode import decode
        from .objective_value import model_value
        from .hint import plan_rows
        from .formulation import build, slot_counts

        t, L = problem.train, problem.model.layers
        n_mb = t.micro_batches
        machines: dict[str, int] = {}
        for d in problem.cluster.devices:
            machines[d.machine] = machines.get(d.machine, 0) + 1
        groups = None
        if self.fix_groups:
            options, fixed, groups = _fixed_groups(problem)
            slots = [len(r) for r in fixed]
            if len(slots) > n_mb or max(slots) > L:
                raise HexicoreError(f"no plan fits: the warm start's {len(slots)} pipelines / {max(slots)} stages "
                                    f"exceed {n_mb} micro-batches / {L} blocks", field="warm_start")
        else:
            options, fixed = stage_options(problem), None
            slots = slot_counts(len(problem.cluster.devices), min(len(problem.cluster.devices), n_mb), L)
        progress("cpsat: tabulating the cost model", 0.0)
        starts = self._starts(problem, options) if fixed is None else []
        # the tables price the embedding and head whole on every TP rank: under vocabulary
        # parallelism they over-price a TP stage's ends, so the model's optimum proves nothing
        exact = getattr(problem.cost, "pipeline_timer", None) is None and not problem.train.vocab_parallel
        # a start's estimate caps the tables only where the model prices plans as the cost model
        # does: a schedule's own timer (zero-bubble, ...) can price a plan below the model's
        # closed form, and that cap would then cut off every plan (INFEASIBLE)
        upper = min((problem.cost.estimate(plan).iteration_s for _, plan in starts), default=None) if exact else None
        tables = build_tables(problem, options, len(slots), max(slots), upper)
        form = build(tables, machines, n_mb, slots, fixed)
        hinted = self._hint(problem, form, options, starts)
        progress("cpsat: solving", 0.0)

        solver = cp_model.CpSolver()
        limit = shares.seconds()
        solver.parameters.max_time_in_seconds = limit
        solver.parameters.num_workers = int(self.workers)
        solver.parameters.random_seed = int(seed)
        solver.parameters.log_search_progress = bool(self.log)
        status = solver.solve(form.model, _callback(progress, limit, tables.unit))
        shares.spend(solver.wall_time)
        name = solver.status_name(status)
        where = f"{problem.model.name!r} on cluster {problem.cluster.name!r}"
        if status == cp_model.INFEASIBLE:
            chunks = any(k > 1 for row in tables.least or () for k in row)
            raise HexicoreError(f"no plan fits: no layout of {where} satisfies every device's memory "
                                + ("with a block per chunk its schedule runs on each stage " if chunks else "")
                                + "(stages inside one machine, power-of-two TP)", field="model")
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"cpsat: solver returned {name}")  # a bug in the formulation
        if status == cp_model.UNKNOWN:
            if not hinted:
                raise HexicoreError(f"time limit reached with no plan for {where} (CP-SAT ran {limit:.3g} s "
                                    "on it); raise solver.time_limit", field="solver.time_limit")
            # the search stopped before reporting any plan: the start plan it was given is the best known
            plan, name = next(p for src, p in starts if src == hinted), "FEASIBLE"
            rows = plan_rows(problem, plan, options)
        else:
            plan = decode(problem, form, solver, options, groups)
            rows = [(n, row) for n, row in ((solver.value(form.n[i]), [
                (o, int(solver.value(form.layers[i, j]))) for j in range(form.slots[i])
                for o in range(1, len(options) + 1) if solver.boolean_value(form.x[i, j, o])])
                for i in range(len(form.slots))) if n > 0]
        objective = model_value(tables, machines, n_mb, rows)
        uneven = uneven_machines(problem)
        if uneven and name == "OPTIMAL":
            log.warning("cpsat: the cost model prices the devices of %s differently; the model sees each machine's "
                        "devices as its fastest, so its optimum is a bound, not an optimal plan (status FEASIBLE)",
                        ", ".join(uneven))
        info: dict[str, Any] = {
            "status": name if exact and not uneven else "FEASIBLE",
            "objective": objective * tables.unit,
            "bound": solver.best_objective_bound * tables.unit if exact else None,
            "params": {"time_limit": limit, "workers": int(self.workers), "seed": int(seed),
                       "fix_groups": bool(self.fix_groups)},
            "wall_s": round(solver.wall_time, 3),
            "model": {"options": len(options), "pipelines": len(slots), "slots": sum(slots),
                      "time_unit_s": tables.unit, "hint": hinted},
        }
        return plan.with_solver(info)

    @staticmethod
    def _starts(problem: Problem, options) -> list[tuple[str, Plan]]:
        """Fitting plans of the model's space to start from: the warm start (re-homed on this
        problem's cluster, model and training setup, kept only if it is a valid plan there) and
        the greedy plan. Their estimates cap the model's tables, so they must be real plans."""
        from hexicore.core.plan import check_structure

        from hexicore.planner.stage_layout.pipeline_fit import holds_chunks

        from .hint import greedy_plan, plan_rows

        out = []
        warm = problem.warm_start
        if warm is not None:
            warm = Plan(problem.model, problem.cluster, problem.train, warm.pipelines)
        for source, plan in (("warm_start", warm), ("greedy", greedy_plan(problem))):
            if plan is None:
                continue
            try:
                check_structure(plan)
                if plan_rows(problem, plan, options) is not None and problem.cost.estimate(plan).fits \
                        and all(holds_chunks(problem.pricing, p) for p in plan.pipelines):
                    out.append((source, plan))
            except HexicoreError:
                continue  # a warm start for another cluster, model or batch: not a start here
        return out

    @staticmethod
    def _hint(problem: Problem, form, options, starts) -> str | bool:
        """Hint the best start plan (by estimate) that the model accepts."""
        from .hint import add_hint, plan_rows

        for source, plan in sorted(starts, key=lambda sp: problem.cost.estimate(sp[1]).iteration_s):
            if add_hint(form, plan_rows(problem, plan, options), len(options)):
                return source
        return False


def _callback(progress: Progress, limit: float, unit: float):
    """A CP-SAT solution callback that reports each improving plan to ``progress``."""
    from ortools.sat.python import cp_model

    class Callback(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            progress(f"cpsat: best {self.objective_value * unit:.6g} s, bound {self.best_objective_bound * unit:.6g} s",
                     min(1.0, self.wall_time / limit) if limit > 0 else 1.0)

    return Callback()


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="cpsat", factory=CpSatSolver,
                     description="exact CP-SAT plan search (OR-Tools): optimum or best plan + proven bound")
