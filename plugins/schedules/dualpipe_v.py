"""Schedule ``dualpipe_v``: DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, and its
"cut-in-half" DualPipe; torch's ``ScheduleDualPipeV``).

One model copy in a V: chunk 0 = stages 0..P-1 on ranks 0..P-1, chunk 1 = stages P..2P-1 on
ranks P-1..0 (rank 0 holds the first and the last stage). Each micro-batch runs chunk 0 then
chunk 1. DualPipeV overlaps a forward of one chunk with a backward of the other on one device;
here every overlap pair is two separate actions, the forward first (runtimes and the simulator
run one computation at a time). A backward is ``B`` (full) or, where DualPipeV uses its
zero-bubble split, ``I`` now and ``W`` later (weight gradients in FIFO order).
Phases on rank r of P (M micro-batches, M >= 2P; F0/F1 forward of chunk 0/1, B0/B1 backward):
1. ``2(P - r - 1)`` x F0;  2. ``r + 1`` x (F0, F1);  3. ``P - r - 1`` x (I1, W, F1);
4. ``M - 2P + r + 1`` x (F0 + B1, F1 + B0) overlap pairs;  5. ``P - r - 1`` x (B1, F1 + B0);
6. ``r + 1`` x (B1, B0), the second half split (I, W deferred);  7. ``P - r - 1`` x (W, I0);
8. ``r + 1`` x W.
Memory: peak in-flight micro-batches (units of the rank's whole share) ``P + 1/2`` on rank 0
(2P + 1 chunk activations of half a share each, after phase 2's last forward).
Bubble with T_F = T_I = T_W = T per rank (T/2 per chunk), equal stages and free transfers:
makespan ``(3M + (P - 1)/2) T``, bubble ``(P - 1) / (6M + P - 1)`` — ZB-V's, the lower bound
under an iteration barrier. DualPipeV's published bubble ``(P/2 - 1)(T_{F&B} + T_B - 3 T_W)``
counts the overlapped pair as cheaper than its parts, which one computation at a time cannot.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hexicore.pipeline.actions import Action, ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from typing import Sequence

from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, need, wave_map
from hexicore.pipeline.pricer import split_bubble, split_closed_form


class _Rank:
    """One rank's emitter: per-chunk forward/backward counters and the deferred-W queue."""

    def __init__(self, rank: int, ranks: int) -> None:
        self.stage = (rank, 2 * ranks - 1 - rank)
        self.fwd, self.bwd = [0, 0], [0, 0]
        self.wq: deque = deque()
        self.out: list[Action] = []

    def f(self, c: int) -> None:
        self.out.append(Action("F", self.stage[c], self.fwd[c]))
        self.fwd[c] += 1

    def b(self, c: int, split: bool = False) -> None:
        s, m = self.stage[c], self.bwd[c]
        self.bwd[c] += 1
        self.out.append(Action("I" if split else "B", s, m))
        if split:
            self.wq.append((s, m))

    def w(self) -> None:
        s, m = self.wq.popleft()
        self.out.append(Action("W", s, m))


def dualpipe_v(rank: int, ranks: int, micro_batches: int) -> list[Action]:
    """Rank ``rank``'s list: the eight phases of the module docstring."""
    P, r, x = ranks, rank, _Rank(rank, ranks)
    for _ in range(2 * (P - r - 1)):
        x.f(0)
    for _ in range(r + 1):
        x.f(0), x.f(1)
    for _ in range(P - r - 1):
        x.b(1, True), x.w(), x.f(1)
    for _ in range(micro_batches - 2 * P + r + 1):
        x.f(0), x.b(1), x.f(1), x.b(0)
    for _ in range(P - r - 1):
        x.b(1), x.f(1), x.b(0)
    n, split = r + 1, False
    for i in range(n):
        if i == n // 2 and r % 2 == 1:
            split = True
        x.b(1, split)
        if i == n // 2 and r % 2 == 0:
            split = True
        x.b(0, split)
    for _ in range(P - r - 1):
        x.w(), x.b(0, True)
    while x.wq:
        x.w()
    return x.out


@dataclass(frozen=True)
class DualPipeV(ActionSchedule):
    name = "dualpipe_v"
    pricing = Pricing(micro_batches_per_rank=2, peaks_grow=True)  # more micro-batches only lengthen phase 4

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        need(P >= 1, self.name, "needs ranks >= 1")
        need(M >= 2 * P, self.name, f"needs micro_batches >= 2 x ranks = {2 * P}, got {M}", "micro_batches")
        return build(self.name, {}, spec, wave_map(P, 1), [dualpipe_v(r, P, M) for r in range(P)])

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        if n_mb < 2 * len(stage_times):
            return None
        return split_closed_form(stage_times, hop_times, n_mb, (len(stage_times) - 1) / 2)

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        return split_bubble(spec, (spec.ranks - 1) / 2) if spec.micro_batches >= 2 * spec.ranks else None


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="dualpipe_v", factory=DualPipeV,
                     description="DualPipeV: one copy in a V, forward/backward overlap pairs as separate actions")
