"""Schedule ``1f1b``: one-forward-one-backward (PipeDream-Flush / DAPPLE).

Phases on rank r of P, M micro-batches (w = min(P - r - 1, M) warm-up forwards):
1. warm-up: F of micro-batches 0..w-1;
2. steady: for i in 0..M-w-1: F(w + i), then B(i);
3. cool-down: B of the remaining w micro-batches.
Same bubble as GPipe, ``(P-1)/(M+P-1)`` with equal stages and free transfers; rank r holds at
most ``min(P - r, M)`` micro-batches of activations (its warm-up forwards and the one in
flight).

Pricing: the closed form above where it is exact, else the simulator; the cost model's own
closed PIPELINE-TIME (HexiScale App. A) is 1F1B's, so a plan configured with ``schedule=1f1b``
keeps that formula (``Pricing.cost_model_time``); peak activations by the rule above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.cost.base import default_in_flight
from hexicore.pipeline.actions import Action, ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need
from hexicore.pipeline.pricer import uniform_bubble, uniform_closed_form


def one_f_one_b(rank: int, ranks: int, micro_batches: int, stage: int | None = None) -> list[Action]:
    """Rank ``rank``'s 1F1B list (phases in the module docstring)."""
    s = rank if stage is None else stage
    w = min(ranks - rank - 1, micro_batches)
    out = [Action("F", s, m) for m in range(w)]
    for i in range(micro_batches - w):
        out += [Action("F", s, w + i), Action("B", s, i)]
    return out + [Action("B", s, m) for m in range(micro_batches - w, micro_batches)]


@dataclass(frozen=True)
class OneFOneB(ActionSchedule):
    name = "1f1b"
    pricing = Pricing(cost_model_time=True, chained_gradients=True)  # each rank ends on the last micro-batch's B

    def order(self, spec: ScheduleSpec) -> ActionList:
        need(spec.ranks >= 1 and spec.micro_batches >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        lists = [one_f_one_b(r, spec.ranks, spec.micro_batches) for r in range(spec.ranks)]
        return build(self.name, {}, spec, loop_map(spec.ranks), lists)

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        return uniform_closed_form(stage_times, hop_times, n_mb)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Rank j holds ``min(P - j, M)`` micro-batches (module docstring): the cost model's
        default rule, :func:`hexicore.cost.base.default_in_flight`."""
        return tuple(float(default_in_flight(ranks, j, n_mb)) for j in range(ranks))

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        return uniform_bubble(spec)


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="1f1b", factory=OneFOneB,
                     description="1F1B (DAPPLE): warm-up, steady one-forward-one-backward, cool-down")
