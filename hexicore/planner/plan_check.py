"""The full plan check shared by ``plan``, ``evaluate`` and the runtime (docs/formats.md, plan JSON).

Structure (devices, TP, layer coverage, batches) comes from :func:`hexicore.core.plan.check_structure`;
memory from the cost model. Both raise :class:`hexicore.core.errors.PlanError` with the file and the
field; warnings (e.g. a TP group spanning machines) are returned for the caller to show.
"""

from __future__ import annotations

from hexicore.core.errors import HexicoreError, PlanError
from hexicore.core.plan import Plan, check_structure
from hexicore.cost import CostModel, Estimate
from hexicore.cost.base import check_estimate
from hexicore.planner.pricing import AUTO, ScheduleBook
from hexicore.planner.stage_layout.pipeline_fit import tp_split


def validate_plan(plan: Plan, cost: CostModel, source: str | None = None, book: ScheduleBook | None = None) -> tuple[Estimate, list[str]]:
    """Check ``plan`` completely; return the cost model's estimate and the warnings. ``book``
    (a :class:`hexicore.planner.pricing.ScheduleBook`) checks each pipeline's micro-batches
    against what its schedule needs."""
    warnings = check_structure(plan, source)
    for i, p in enumerate(plan.pipelines):
        if book is not None:
            _check_micro_batches(book, plan, p, i, source)
        _check_placement(cost, plan, p, i, source)
    est = cost.estimate(plan)
    check_estimate(est, cost)
    for i, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            for dev in s.devices:
                need, cap = est.memory_gb[dev], plan.cluster.device(dev).memory_gb
                if need > cap:
                    raise PlanError(f"device {dev} needs {need:.1f} GB but has {cap:g} GB "
                                    f"({s.n_layers} layers, tp={s.tp}{_placed(cost, plan, p, j)})", source=source,
                                    field=f"pipelines[{i}].stages[{j}]")
    return est, warnings


def check_schedules(plan: Plan, book: ScheduleBook, source: str | None = None) -> None:
    """Every pipeline's schedule builds from ``book`` (a :class:`hexicore.planner.pricing.ScheduleBook`)
    with its parameters and places its ranks (a schedule that records per-rank times checks
    their count there, and records them: :meth:`~hexicore.pipeline.schedule.ActionSchedule.unrecorded`);
    else a one-line error naming ``source`` and ``pipelines[i].schedule...``.
    ``auto`` is the planner's keyword, not a schedule a plan runs."""
    placed = book.placement()
    for i, p in enumerate(plan.pipelines):
        where = f"pipelines[{i}]"
        if p.schedule.name == AUTO:
            raise PlanError("'auto' is the planner's choice among schedules, not a schedule a plan runs; name the "
                            "schedule this pipeline runs (a plan from hexicore plan schedule=auto records it)",
                            source=source, field=f"{where}.schedule.name")
        try:
            schedule = book.priced(p.schedule, len(p.stages))
            placed(p, p.n_micro_batches(plan.train.micro_batch))
        except HexicoreError as exc:
            raise exc.located(source, where) from None
        missing = getattr(schedule, "unrecorded", lambda: None)()
        if missing:
            raise PlanError(f"a plan's {p.schedule.name} schedule records its {missing}; this one lacks them (a plan "
                            "hexicore plan writes has them)", source=source, field=f"{where}.schedule")


def _placed(cost: CostModel, plan: Plan, pipe, j: int) -> str:
    """What stage j keeps where its schedule places more or other pieces than its own layers,
    the embedding first and the head last (the cost model's ``held``), as a clause; else ''."""
    held = getattr(cost, "held", None)
    if held is None:
        return ""
    h = held(pipe, pipe.n_micro_batches(plan.train.micro_batch))[j]
    if (h["n_layers"], int(h["first"]), int(h["last"])) == (pipe.stages[j].n_layers, int(j == 0),
                                                            int(j == len(pipe.stages) - 1)):
        return ""
    return (f"; its schedule places {h['n_layers']} blocks, {int(h['first'])} embedding(s) and "
            f"{int(h['last'])} head(s) on it")


def _check_micro_batches(book: ScheduleBook, plan: Plan, pipe, i: int, source: str | None) -> None:
    """A schedule that needs more micro-batches than the pipeline runs (``Pricing.micro_batches_per_rank``:
    DualPipeV needs two per rank)."""
    n, ranks = pipe.n_micro_batches(plan.train.micro_batch), len(pipe.stages)
    try:
        least = book.min_micro_batches(pipe.schedule, ranks)
    except HexicoreError:
        return  # an unknown schedule or bad parameters: reported where the plan is priced
    if n < least:
        raise PlanError(f"schedule {pipe.schedule.name!r} needs at least {least} micro-batches on {ranks} stages, "
                        f"got {n} (batch {pipe.batch} / micro-batch {plan.train.micro_batch})", source=source,
                        field=f"pipelines[{i}].batch")


def _check_placement(cost: CostModel, plan: Plan, pipe, i: int, source: str | None) -> None:
    """A schedule that keeps a copy of stage k's blocks on rank j (Chimera: stage P-1-k) needs
    both at one TP degree (:func:`hexicore.planner.stage_layout.pipeline_fit.tp_split`)."""
    hit = tp_split(cost, pipe, pipe.n_micro_batches(plan.train.micro_batch))
    if hit is not None:
        j, k = hit
        raise PlanError(f"schedule {pipe.schedule.name!r} keeps a copy of stage {k}'s blocks (tp={pipe.stages[k].tp}) "
                        f"on stage {j} (tp={pipe.stages[j].tp}); both need one TP degree", source=source,
                        field=f"pipelines[{i}].stages[{j}].tp")
