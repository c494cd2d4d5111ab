"""What a simulation of action lists takes and gives: per-stage :class:`Timing`, the stages'
:func:`shares` of their rank, and the :class:`SimResult` (with its :class:`Event` timeline).

Shared by both paths of :func:`hexicore.pipeline.simulate.simulate` (the event loop and the
array engine of :mod:`hexicore.pipeline.simulate_fast`) and by the greedy scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList


def shares(al: ActionList) -> tuple[float, ...]:
    """Fraction of its rank's share each stage is: ``1 / (#stages of the same chain on that rank)``."""
    out = [1.0] * al.stages
    for chain in al.chains:
        count: dict[int, int] = {}
        for s in chain:
            count[al.stage_rank[s]] = count.get(al.stage_rank[s], 0) + 1
        for s in chain:
            out[s] = 1.0 / count[al.stage_rank[s]]
    return tuple(out)


@dataclass(frozen=True)
class Timing:
    """Per-stage compute times and per-link transfer times (seconds or any unit).

    ``hops[r]`` is one transfer between ranks ``r`` and ``r+1`` (either direction); a transfer
    between non-adjacent ranks (the loop wrap of interleaved 1F1B) costs ``max(hops)``.
    ``input_grad``/``weight_grad`` (zero-bubble ``I``/``W``) default to half of ``backward``.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    hops: tuple[float, ...] = ()
    input_grad: tuple[float, ...] | None = None
    weight_grad: tuple[float, ...] | None = None
    reduce: float = 0.0

    def link(self, a: int, b: int) -> float:
        if a == b or not self.hops:
            return 0.0
        lo, hi = min(a, b), max(a, b)
        return self.hops[lo] if hi == lo + 1 and lo < len(self.hops) else max(self.hops)

    def durations(self) -> dict[str, tuple[float, ...]]:
        half = tuple(b / 2 for b in self.backward)
        return {"F": self.forward, "B": self.backward, "I": self.input_grad or half, "W": self.weight_grad or half}

    @classmethod
    def from_ranks(cls, al: ActionList, forward: Sequence[float], backward: Sequence[float],
                   hops: Sequence[float] = (), reduce: float = 0.0, *, input_grad: Sequence[float] = (),
                   weight_grad: Sequence[float] = ()) -> "Timing":
        """Per-rank times of one micro-batch through the rank's whole share (Hanayo's T_F, T_B;
        optionally the split backward's T_I, T_W, else half of T_B each): a stage takes its
        share of its rank's time (Hanayo, SC'23: T_F/(2W) per stage on a wave)."""
        sh = shares(al)

        def per_stage(per_rank: Sequence[float]) -> tuple[float, ...] | None:
            if not per_rank:
                return None
            return tuple(per_rank[al.stage_rank[s]] * sh[s] for s in range(al.stages))

        return cls(per_stage(forward), per_stage(backward), tuple(hops), per_stage(input_grad),
                   per_stage(weight_grad), reduce=reduce)

    @classmethod
    def uniform(cls, al: ActionList, forward: float = 1.0, backward: float = 2.0, comm: float = 0.0) -> "Timing":
        """Every rank T_F = ``forward``, T_B = ``backward``; every transfer ``comm``."""
        p = al.ranks
        return cls.from_ranks(al, [forward] * p, [backward] * p, [comm] * (p - 1))


@dataclass(frozen=True)
class Event:
    """One executed action: compute spans [start, end) on its rank; a send spans until arrival."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    """Makespan, per-rank busy time and peak in-flight activations (units: the module docstring
    of :mod:`hexicore.pipeline.simulate`); ``events`` when recorded."""

    makespan: float
    busy: tuple[float, ...]
    peak_activations: tuple[float, ...]
    events: tuple[Event, ...] = ()

    @property
    def bubble_ratio(self) -> float:
        n = len(self.busy)
        return 1.0 - sum(self.busy) / (n * self.makespan) if self.makespan > 0 else 0.0
