"""Schedule ``interleaved_zb``: interleaved 1F1B with split backward (torch's
``ScheduleInterleavedZeroBubble``; interleaving of Narayanan et al., SC'21, with the zero-bubble
split of Qi et al., ICLR'24).

Each rank holds ``v = chunks`` model chunks; stage ``c*P + r`` lives on rank r (the loop map of
``interleaved_1f1b``). Backward split into ``I`` (input gradient) and ``W`` (weight gradient).
The compute order is the greedy list schedule of :mod:`hexicore.pipeline.greedy` (``I`` first,
then ``F`` of the lowest micro-batch and chunk, ``W`` whenever nothing else is ready; no
admission cap, ``memory`` sets one).
Phases on rank r: 1. warm-up: forwards of chunk 0, then later chunks as micro-batches wrap
around the loop; 2. steady F / I over the chunks with W's filling the gaps; 3. cool-down: the
last I's with the deferred W's.
Memory: peak in-flight micro-batches (units of the rank's whole share) simulated; at most
``2P - 1`` on the tested grid (P in {2, 4, 8}, M in {P, 2P, 4P}), ``min(memory, ...)`` with a cap.
Bubble with T_F = T_I = T_W = T per rank (T/v per chunk), equal stages and free transfers:
makespan ``(3M + (P - 1)/v) T``, bubble ``((P - 1)/v) / (3M + (P - 1)/v)`` at M = P and M >= 2P,
elsewhere simulated (:func:`hexicore.pipeline.pricer.split_holds`) (the last rank's first
forward arrives ``(P - 1) T/v`` late and every rank is busy afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.greedy import greedy_lists
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need, positive_int, positive_memory
from hexicore.pipeline.pricer import split_bubble, split_closed_form, split_holds


@dataclass(frozen=True)
class InterleavedZeroBubble(ActionSchedule):
    chunks: int = 2
    memory: float | None = None
    name = "interleaved_zb"
    pricing = Pricing(peaks_grow=True)  # greedy per M: more micro-batches only add work

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", positive_int(self.chunks, self.name, "chunks"))
        object.__setattr__(self, "memory", positive_memory(self.memory, self.name))

    def params(self) -> dict:
        return {"chunks": self.chunks}

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M, v = spec.ranks, spec.micro_batches, self.chunks
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        s2r = loop_map(P, v)
        cap = None if self.memory is None else [float(self.memory)] * P
        lists = greedy_lists(spec, s2r, cap=cap, split_backward=True)
        return build(self.name, self.params(), spec, s2r, lists)

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        if self.memory is not None or not split_holds(len(stage_times), n_mb, chunked=True):
            return None
        return split_closed_form(stage_times, hop_times, n_mb, (len(stage_times) - 1) / self.chunks)

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        v = int(chosen.get("chunks", self.chunks))
        if self.memory is not None or not split_holds(spec.ranks, spec.micro_batches, chunked=True):
            return None
        return split_bubble(spec, (spec.ranks - 1) / v)


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="interleaved_zb", factory=InterleavedZeroBubble,
                     description="interleaved 1F1B with split backward: `chunks` chunks per rank, W fills bubbles")
