"""Schedule ``looped_bfs``: breadth-first looped pipeline (Lamy-Poirier, "Breadth-First Pipeline
Parallelism", MLSys'23; torch's ``ScheduleLoopedBFS``).

Each rank holds ``v = chunks`` model chunks on the loop map (stage ``c*P + r`` on rank r).
Phases on rank r: 1. forward, chunk by chunk: every micro-batch through chunk 0, then chunk 1,
...; 2. backward, chunk by chunk in reverse, micro-batches in reverse order.
Memory: every rank holds all M micro-batches before its first backward (peak M, units of the
rank's whole share: v chunks of 1/v each).
Bubble with equal stages, free transfers and M >= P: makespan ``(M + (P - 1)/v)(T_F + T_B)``,
bubble ``((P - 1)/v) / (M + (P - 1)/v)`` — GPipe's fill and drain, each shortened v-fold (a
chunk's micro-batch 0 returns to rank 0 after ``P`` chunk-times, no later than rank 0 finishes
the chunk's M micro-batches when M >= P).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.pricer import looped_closed_form
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need, positive_int


def looped_bfs(rank: int, ranks: int, micro_batches: int, chunks: int) -> list[Action]:
    """Rank ``rank``'s list (phases in the module docstring)."""
    stages = [c * ranks + rank for c in range(chunks)]
    fwd = [Action("F", s, m) for s in stages for m in range(micro_batches)]
    return fwd + [Action("B", s, m) for s in reversed(stages) for m in reversed(range(micro_batches))]


@dataclass(frozen=True)
class LoopedBFS(ActionSchedule):
    pricing = Pricing(chained_gradients=True)  # each chunk's last B is the last micro-batch's
    chunks: int = 2
    name = "looped_bfs"

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", positive_int(self.chunks, self.name, "chunks"))

    def params(self) -> dict:
        return {"chunks": self.chunks}

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M, v = spec.ranks, spec.micro_batches, self.chunks
        need(P >= 1 and M >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        return build(self.name, self.params(), spec, loop_map(P, v), [looped_bfs(r, P, M, v) for r in range(P)])

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        return looped_closed_form(stage_times, hop_times, n_mb, self.chunks) if n_mb >= len(stage_times) else None

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Every rank holds all M micro-batches (module docstring)."""
        return (float(n_mb),) * ranks

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        P, M = spec.ranks, spec.micro_batches
        v = int(chosen.get("chunks", self.chunks))
        if len(set(spec.forward)) == 1 and len(set(spec.backward)) == 1 and not any(spec.hops) and M >= P:
            return ((P - 1) / v) / (M + (P - 1) / v)
        return None


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="looped_bfs", factory=LoopedBFS,
                     description="looped breadth-first: `chunks` chunks per rank, all forwards chunk by chunk")
