"""Whether a pipeline fits its devices under its schedule: the schedule's exact peak in-flight
micro-batches (:meth:`hexicore.planner.pricing.ScheduleBook.peaks`) priced into each stage's
memory (``cost.stage_memory_gb`` of what the stage keeps under the schedule's placement), a
layer per chunk the schedule runs on a rank, no stage's blocks at two TP degrees; and, for a
schedule that builds within a memory cap, the cap each stage's devices hold.
"""

from __future__ import annotations

from typing import Any

from hexicore.core.plan import Pipeline, Plan
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost.base import BoundCostModel, CostModel


def fits(book: Any, cost: CostModel, plan: Plan, pipe: Pipeline) -> bool:
    """Every stage of ``pipe`` fits its devices with the schedule's exact peak activations (and
    the schedule keeps no stage's blocks at two TP degrees, :meth:`Placement.split_tp`)."""
    priced = BoundCostModel.of_plan(cost, plan)
    n = pipe.n_micro_batches(plan.train.micro_batch)
    if tp_split(cost, pipe, n) is not None or not holds_chunks(book, pipe):
        return False
    peaks = book.peaks(pipe.schedule, len(pipe.stages), n, pipe.stage_layers)
    for j, (s, held) in enumerate(zip(pipe.stages, stage_held(cost, pipe, n))):
        gb = priced.stage_memory_gb(s.devices, **held, in_flight=peaks[j], dp=len(plan.pipelines))
        if gb > min(plan.cluster.device(d).memory_gb for d in s.devices):
            return False
    return True


def holds_chunks(book: Any, pipe: Pipeline) -> bool:
    """Every stage of ``pipe`` holds at least a layer per chunk its schedule runs on its rank
    (a ``ScheduleBook``'s ``least``; the runtime refuses it otherwise). No book: one chunk each."""
    least = book.least(pipe.schedule, len(pipe.stages)) if book is not None else (1,) * len(pipe.stages)
    return all(s.n_layers >= k for s, k in zip(pipe.stages, least))


def memory_caps(cost: CostModel, plan: Plan, pipe: Pipeline, step: float = 0.5) -> tuple[float, ...]:
    """Per stage of ``pipe``: the most in-flight micro-batches (a multiple of ``step``, at most
    the pipeline's micro-batch count, at least ``step``) with which the stage's memory
    (``cost.stage_memory_gb``, the check of :func:`fits`) fits its
    smallest device. Bisection: the stage memory grows with the in-flight count."""
    priced = BoundCostModel.of_plan(cost, plan)
    n = pipe.n_micro_batches(plan.train.micro_batch)
    out = []
    for s, held in zip(pipe.stages, stage_held(cost, pipe, n)):
        limit = min(plan.cluster.device(d).memory_gb for d in s.devices)

        def ok(k: int) -> bool:
            return priced.stage_memory_gb(s.devices, **held, in_flight=k * step, dp=len(plan.pipelines)) <= limit

        lo, hi = 1, max(1, int(round(n / step)))
        if ok(hi):
            lo = hi
        while lo < hi - 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        out.append(lo * step)
    return tuple(out)


def capped(book: Any, cost: CostModel | None, plan: Plan, pipe: Pipeline, ref: ScheduleRef) -> ScheduleRef:
    """``ref`` with the pipeline's own per-rank cap (:func:`memory_caps`) as ``memory`` when the
    schedule builds within one (``Pricing.memory_cap``) and none is set."""
    if book.schedule(ref).pricing.memory_cap and ref.get("memory") is None and cost is not None \
            and hasattr(cost, "stage_memory_gb"):
        return ref.with_params(memory=list(memory_caps(cost, plan, pipe)))
    return ref


def tp_split(cost: CostModel, pipe: Pipeline, n_mb: int) -> tuple[int, int] | None:
    """Where the cost model's placement of ``pipe`` at ``n_mb`` micro-batches (its
    ``pipeline_placement``) keeps a stage's blocks at two TP degrees:
    :meth:`hexicore.core.placement.Placement.split_tp`'s ``(rank, source stage)``, else None."""
    placed = getattr(cost, "pipeline_placement", None)
    placement = None if placed is None else placed(pipe, n_mb)
    return None if placement is None else placement.split_tp([s.tp for s in pipe.stages])


def stage_held(cost: CostModel, pipe: Pipeline, n_mb: int) -> list[dict[str, Any]]:
    """Per stage the ``stage_memory_gb`` keywords of what it keeps at ``n_mb`` micro-batches: the cost
    model's ``held`` (its schedule's placement), else stage j's blocks with the embedding first, the
    head last."""
    held = getattr(cost, "held", None)
    if held is not None:
        return held(pipe, n_mb)
    last = len(pipe.stages) - 1
    return [{"n_layers": s.n_layers, "first": j == 0, "last": j == last} for j, s in enumerate(pipe.stages)]
