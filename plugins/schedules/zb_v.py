"""Schedule ``zb_v``: zero bubble ZB-V (Qi et al., "Pipeline Parallelism with Controllable
Memory", NeurIPS'24; torch's ``ScheduleZBVZeroBubble``).

Two chunks per rank in a V: stages 0..P-1 on ranks 0..P-1, stages P..2P-1 on ranks P-1..0
(:func:`hexicore.pipeline.schedule.wave_map` with one wave), so rank 0 holds the first and the
last stage. Backward split into ``I`` and ``W``. The compute order is the greedy list schedule of
:mod:`hexicore.pipeline.greedy` (``I`` first, then ``F``, ``W`` whenever nothing else is ready)
with each rank admitting at most ``min(P, M)`` micro-batches, 1F1B's activation memory (ZB-V's
setting).
Phases on rank r: 1. warm-up: forwards of the down chunk, then of the up chunk as micro-batches
come back; 2. steady F / I on both chunks with W filling gaps; 3. cool-down: the remaining
I's and the deferred W's.
Memory: peak in-flight micro-batches ``min(P, M)`` (units of the rank's whole share).
Bubble with T_F = T_I = T_W = T (per rank; T/2 per chunk), equal stages and free transfers:
makespan ``(3M + (P - 1)/2) T``, bubble ``(P - 1) / (6M + P - 1)`` at M = P and M >= 2P
(elsewhere simulated: :func:`hexicore.pipeline.pricer.split_holds`) — the last rank's first
forward arrives ``(P - 1) T/2`` late and every rank is busy afterwards (a lower bound under an
iteration barrier; the paper's near-zero bubble counts steady state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.greedy import greedy_lists
from hexicore.pipeline.schedule import ActionSchedule, ScheduleSpec, build, need, wave_map
from hexicore.pipeline.pricer import split_bubble, split_closed_form, split_holds


@dataclass(frozen=True)
class ZeroBubbleV(ActionSchedule):
    name = "zb_v"

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        s2r = wave_map(P, 1)
        lists = greedy_lists(spec, s2r, cap=[min(P, M)] * P, split_backward=True)
        return build(self.name, {}, spec, s2r, lists)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Rank r holds ``min((min(M, P) + 1 + r) / 2, M)`` of its whole share at its peak (its two
        chunks hold half a share each; counted along its lists for P up to 12 and M up to 5P + 1
        and at P = 24 in tests/pipeline/test_simulate.py)."""
        return tuple(float(min((min(n_mb, ranks) + 1 + r) / 2, n_mb)) for r in range(ranks))

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        if not split_holds(len(stage_times), n_mb, chunked=True):
            return None
        return split_closed_form(stage_times, hop_times, n_mb, (len(stage_times) - 1) / 2)

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        if not split_holds(spec.ranks, spec.micro_batches, chunked=True):
            return None
        return split_bubble(spec, (spec.ranks - 1) / 2)


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="zb_v", factory=ZeroBubbleV,
                     description="zero bubble ZB-V: two chunks per rank in a V, split backward, 1F1B memory")
