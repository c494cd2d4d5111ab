"""Schedule ``gpipe``: fill-drain (GPipe, Huang et al. 2019).

Phases per rank: 1. all forwards, micro-batches 0..M-1; 2. all backwards, 0..M-1.
Bubble ratio with equal stages and free transfers: ``(P-1)/(M+P-1)``; peak activations M on
every rank. Pricing: that closed form where it is exact, else the simulator; peaks by the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need
from hexicore.pipeline.pricer import uniform_bubble, uniform_closed_form


@dataclass(frozen=True)
class GPipe(ActionSchedule):
    name = "gpipe"
    pricing = Pricing(chained_gradients=True)  # each rank's last B is the last micro-batch's

    def order(self, spec: ScheduleSpec) -> ActionList:
        need(spec.ranks >= 1 and spec.micro_batches >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        M = spec.micro_batches
        lists = [[Action("F", r, m) for m in range(M)] + [Action("B", r, m) for m in range(M)]
                 for r in range(spec.ranks)]
        return build(self.name, {}, spec, loop_map(spec.ranks), lists)

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        return uniform_closed_form(stage_times, hop_times, n_mb)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Every rank holds all M micro-batches before its first backward."""
        return (float(n_mb),) * ranks

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        return uniform_bubble(spec)


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="gpipe", factory=GPipe,
                     description="GPipe fill-drain: all forwards, then all backwards")
