"""Schedule ``grouped_gpipe``: GPipe that flushes every ``group`` micro-batches.

The example of docs/plugins.md, "Writing a schedule plugin" (this file is shown there in full).
Micro-batches run in groups of G; per group every rank does all forwards, then all backwards
(GPipe's fill-drain), so a rank holds at most G micro-batches of activations. ``group=auto``
takes the largest G within ``memory`` micro-batches (default: P, the pipeline's ranks).
With equal stages and free transfers, ceil(M/G) fill-drains take ``(M + ceil(M/G)(P-1)) (T_F + T_B)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from hexicore.core.schedule_ref import ScheduleRef
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.schedule import (BLOCKS, ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need,
                                        positive_int)


@dataclass(frozen=True)
class GroupedGPipe(ActionSchedule):
    group: Any = "auto"
    memory: Any = None
    name = "grouped_gpipe"
    pricing = Pricing(growth=BLOCKS)

    def __post_init__(self) -> None:
        if self.group != "auto":
            object.__setattr__(self, "group", positive_int(self.group, self.name, "group", "or 'auto'"))
        if self.memory is not None:
            object.__setattr__(self, "memory", positive_int(self.memory, self.name, "memory"))

    def size(self, ranks: int, micro_batches: int) -> int:
        """G: the configured group, or the largest within ``memory`` (default P), at most M."""
        group = self.group if self.group != "auto" else (self.memory or ranks)
        return min(group, micro_batches)

    def order(self, spec: ScheduleSpec) -> ActionList:
        """Compute only: per rank r and group, F(r, m) for its micro-batches, then B(r, m)."""
        P, M = spec.ranks, spec.micro_batches
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        G = self.size(P, M)
        lists = []
        for r in range(P):
            acts = []
            for first in range(0, M, G):
                group = range(first, min(first + G, M))
                acts += [Action("F", r, m) for m in group] + [Action("B", r, m) for m in group]
            lists.append(acts)
        return build(self.name, {"group": G}, spec, loop_map(P), lists)

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        """Exact with equal stages and free transfers (module docstring); else None: simulated."""
        P = len(stage_times)
        if len(set(stage_times)) == 1 and not any(hop_times):
            return (n_mb + math.ceil(n_mb / self.size(P, n_mb)) * (P - 1)) * stage_times[0]
        return None

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Every rank holds one whole group before its first backward."""
        return (float(self.size(ranks, n_mb)),) * ranks

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        """``ceil(M/G)(P-1) / (M + ceil(M/G)(P-1))`` with equal stages and free transfers."""
        if len(set(spec.forward)) > 1 or len(set(spec.backward)) > 1 or any(spec.hops):
            return None
        idle = math.ceil(spec.micro_batches / int(chosen["group"])) * (spec.ranks - 1)
        return idle / (spec.micro_batches + idle)

    def resolve(self, ref: ScheduleRef, stage_times: Sequence[float], hop_times: Sequence[float],
                n_mb: int) -> tuple[ScheduleRef, float]:
        """What a plan records: ``group=auto`` becomes the G it stands for on this pipeline."""
        chosen = ScheduleRef(self.name, {"group": self.size(len(stage_times), n_mb)})
        return chosen, self.pipeline_time(stage_times, hop_times, n_mb)


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="grouped_gpipe", factory=GroupedGPipe,
                     description="GPipe flushing every `group` micro-batches (at most `group` in flight)",
                     config={"group": "auto", "memory": None})
