"""Schedule ``zb_h1``: zero bubble ZB-H1 (Qi et al., ICLR'24), backward split into I and W.

Linear stages (stage r on rank r). The greedy list schedule of :mod:`hexicore.pipeline.greedy` with
split backward: ``I`` (input gradient, on the critical path) first, then ``F``, and ``W``
(weight gradient) only when nothing else is ready, which fills the cool-down bubbles. Rank r
admits at most ``min(P - r, M)`` micro-batches, 1F1B's activation memory (ZB-H1's setting),
and defers at most P W's (beyond that the oldest W runs first).
Phases: 1. warm-up forwards; 2. steady F / I with W filling gaps; 3. cool-down I's with the
deferred W's. With T_F = T_I = T_W = T (T_B = 2T) and free transfers the makespan is ZB-H1's
``(3M + P - 1) T``: the bubble time ``(P-1) T`` is a third of 1F1B's ``(P-1) 3T``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexicore.cost.base import default_in_flight
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.greedy import greedy_lists
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.pipeline.schedule import ActionSchedule, ScheduleSpec, build, loop_map, need


@dataclass(frozen=True)
class ZeroBubbleH1(ActionSchedule):
    name = "zb_h1"

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        s2r = loop_map(P)
        lists = greedy_lists(spec, s2r, cap=[P - r for r in range(P)], split_backward=True, w_limit=[P] * P)
        return build(self.name, {}, spec, s2r, lists)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Rank r holds ``min(P - r, M)`` micro-batches, its admission cap (1F1B's rule, reached
        in its steady state; tests/pipeline/test_simulate.py counts it along the lists)."""
        return tuple(float(default_in_flight(ranks, r, n_mb)) for r in range(ranks))


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="zb_h1", factory=ZeroBubbleH1,
                     description="zero bubble ZB-H1: backward split into I and W, W fills the bubbles")
