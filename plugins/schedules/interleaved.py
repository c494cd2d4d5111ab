"""Schedule ``interleaved_1f1b``: Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21).

Each rank holds ``v = chunks`` model chunks; stage ``c*P + r`` (chunk c) lives on rank r (loop
map). Micro-batches go in groups of G >= P (``groups``; G = P when P divides M); within a group every
micro-batch runs chunk 0, then chunk 1, ... (Megatron's ``get_schedule_table``); backward walks
the same table with the chunk mirrored (v-1-c).

Phases on rank r (warm-up ``w = min(2(P-r-1) + (v-1)G, M v)``, Megatron's warm-up count):
1. warm-up: the first w forward table entries;
2. steady: alternate the next forward entry and the next backward entry;
3. cool-down: the remaining backward entries.
Memory: rank r holds ``min(w + 1, M v) / v`` micro-batches at its peak (units of its whole share,
a chunk 1/v of it): after phase 1 and the first forward of phase 2 (``peak_rule``; counted along
the lists in tests/pipeline/test_simulate.py).
With equal stages, free transfers and M a multiple of P the bubble is ``(P-1)/v`` of
``M + (P-1)/v`` stage-rounds: v-fold less bubble time than 1F1B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.pipeline.pricer import looped_closed_form
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, loop_map, need, positive_int


def groups(ranks: int, micro_batches: int) -> list[int]:
    """Group sizes: ``max(1, M // P)`` groups as equal as possible (larger first), each >= P
    when M >= P (torch's rounds; Megatron's groups of P when P divides M)."""
    n = max(1, micro_batches // ranks)
    base, extra = divmod(micro_batches, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def schedule_table(ranks: int, micro_batches: int, chunks: int) -> list[tuple[int, int]]:
    """Forward order of (micro-batch, chunk): chunk-major inside each group."""
    table, g = [], 0
    for size in groups(ranks, micro_batches):
        table += [(g + i, c) for c in range(chunks) for i in range(size)]
        g += size
    return table


def warm_up(rank: int, ranks: int, micro_batches: int, chunks: int) -> int:
    """Forward table entries rank ``rank`` runs before its first backward (Megatron's warm-up
    count): ``w = min(2(P - r - 1) + (v - 1) G, M v)`` with G the first group's size."""
    return min(2 * (ranks - rank - 1) + (chunks - 1) * groups(ranks, micro_batches)[0], micro_batches * chunks)


def interleaved(rank: int, ranks: int, micro_batches: int, chunks: int) -> list[Action]:
    """Rank ``rank``'s interleaved 1F1B list (phases in the module docstring)."""
    fwd = schedule_table(ranks, micro_batches, chunks)
    bwd = [(m, chunks - 1 - c) for m, c in fwd]
    total = len(fwd)
    w = warm_up(rank, ranks, micro_batches, chunks)
    f = [Action("F", c * ranks + rank, m) for m, c in fwd]
    b = [Action("B", c * ranks + rank, m) for m, c in bwd]
    out = f[:w]
    for i in range(total - w):
        out += [f[w + i], b[i]]
    return out + b[total - w:]


@dataclass(frozen=True)
class Interleaved1F1B(ActionSchedule):
    pricing = Pricing(chained_gradients=True)  # each chunk's last B is the last micro-batch's (chunk v-1 down to 0)
    chunks: int = 2
    name = "interleaved_1f1b"

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", positive_int(self.chunks, self.name, "chunks"))

    def params(self) -> dict:
        return {"chunks": self.chunks}

    def order(self, spec: ScheduleSpec) -> ActionList:
        need(spec.ranks >= 1 and spec.micro_batches >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        P, M, v = spec.ranks, spec.micro_batches, self.chunks
        lists = [interleaved(r, P, M, v) for r in range(P)]
        return build(self.name, self.params(), spec, loop_map(P, v), lists)

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Rank r holds ``min(w + 1, M v) / v`` micro-batches (module docstring, "Memory"): its
        warm-up's forwards and phase 2's first, a chunk's share each."""
        v, total = self.chunks, n_mb * self.chunks
        return tuple(min(warm_up(r, ranks, n_mb, v) + 1, total) / v for r in range(ranks))

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        """Equal stages, free transfers, P dividing M: ``(M + (P-1)/v)(T_F + T_B)`` (Megatron's
        bubble ``(P-1)/v`` stage-rounds; checked against the simulator in the tests)."""
        divides = bool(stage_times) and n_mb % len(stage_times) == 0
        return looped_closed_form(stage_times, hop_times, n_mb, self.chunks) if divides else None


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="interleaved_1f1b", factory=Interleaved1F1B,
                     description="Megatron interleaved 1F1B: `chunks` model chunks per rank on a loop map")
