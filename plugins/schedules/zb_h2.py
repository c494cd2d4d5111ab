"""Schedule ``zb_h2``: zero bubble ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24).

Linear stages (stage r on rank r), backward split into ``I`` (input gradient) and ``W`` (weight
gradient). The greedy list schedule of :mod:`hexicore.pipeline.greedy` with split backward and
ZB-H2's larger memory: rank r admits up to ``min(2(P - r) - 1, M)`` micro-batches (rank 0:
``2P - 1``, the paper's ZB-H2 budget), ``I`` before ``F`` and ``W`` whenever nothing else is ready,
with no bound on deferred W's (they fill the cool-down).
Phases on rank r: 1. warm-up: extra forwards (up to ``2(P - r) - 1`` in flight) fill the time
before the first input gradient arrives; 2. steady F / I with W filling gaps; 3. cool-down: the
last I's with the deferred W's.
Memory: peak in-flight micro-batches ``min(2(P - r) - 1, M)`` on rank r (at most ``2P - 1``).
Bubble with T_F = T_I = T_W = T, equal stages and free transfers, M >= P: the makespan is
``(3M + P - 1) T``, bubble ``(P - 1) / (3M + P - 1)`` (fewer micro-batches: simulated). This is a lower bound under this simulator's
rules (every rank starts the iteration together and ends it with ``STEP``; rank P-1 cannot
start before ``(P - 1) T`` and then has ``3M T`` of work). The paper's zero bubble for ZB-H2
needs its optimizer post-validation, which lets ranks overlap iterations (no ``STEP`` barrier);
under an iteration barrier ZB-H2 ties ZB-H1 at equal times and gains where ``T_W`` is short or
transfers cost time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.greedy import greedy_lists
from hexicore.pipeline.schedule import ActionSchedule, ScheduleSpec, build, loop_map, need
from hexicore.pipeline.pricer import split_bubble, split_closed_form, split_holds


@dataclass(frozen=True)
class ZeroBubbleH2(ActionSchedule):
    name = "zb_h2"

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        s2r = loop_map(P)
        lists = greedy_lists(spec, s2r, cap=[2 * (P - r) - 1 for r in range(P)], split_backward=True)
        return build(self.name, {}, spec, s2r, lists)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Rank r holds ``min(2 (P - r) - 1, M)`` micro-batches, its admission cap (reached in its
        steady state; tests/pipeline/test_simulate.py counts it along the lists)."""
        return tuple(float(min(2 * (ranks - r) - 1, n_mb)) for r in range(ranks))

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        if not split_holds(len(stage_times), n_mb):
            return None
        return split_closed_form(stage_times, hop_times, n_mb, len(stage_times) - 1)

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        return split_bubble(spec, spec.ranks - 1) if split_holds(spec.ranks, spec.micro_batches) else None


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="zb_h2", factory=ZeroBubbleH2,
                     description="zero bubble ZB-H2: split backward, up to 2P-1 micro-batches in flight")
