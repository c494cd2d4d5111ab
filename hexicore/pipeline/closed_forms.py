"""Closed forms of the schedule plugins' makespans and bubble ratios under equal stages and free
transfers (each plugin's docstring states which it uses): fill-drain shapes (GPipe, 1F1B)
``(M + P - 1)(T_F + T_B)``, split-backward shapes (ZB-H2, ZB-V, interleaved ZB, DualPipeV)
``(3M + lag) T`` with the lag of the last rank's first forward. The split forms hold only
from enough micro-batches on (:func:`split_holds`); below that the schedules are simulated.
"""

from __future__ import annotations

from typing import Any, Sequence


def uniform_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
    """Makespan of a fill-drain-shaped schedule (every stage one F+B per micro-batch, no overlap
    gain) with equal stages and free transfers: ``(M + P - 1)(T_F + T_B)`` (exact)."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + len(stage_times) - 1) * stage_times[0]
    return None


def uniform_bubble(spec: Any) -> float | None:
    """The bubble ratio of :func:`uniform_closed_form`, ``(P-1)/(M+P-1)``, when ``spec`` has
    equal stages and free transfers; else None."""
    P, M = spec.ranks, spec.micro_batches
    if len(set(spec.forward)) == 1 and len(set(spec.backward)) == 1 and not any(spec.hops):
        return (P - 1) / (M + P - 1)
    return None


def split_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int,
                      lag: float) -> float | None:
    """Makespan ``(3M + lag) T`` of a split-backward schedule whose ranks stay busy after the
    last rank's first forward arrives ``lag`` forward-times late, with equal stages and free
    transfers (planner units: a stage time is ``T_F + T_B = 3T``, T_I = T_W = T); else None."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + lag / 3.0) * stage_times[0]
    return None


def split_bubble(spec: Any, lag: float) -> float | None:
    """The bubble ratio of :func:`split_closed_form`, ``lag / (3M + lag)``, when ``spec`` has
    T_F = T_I = T_W on every rank and free transfers; else None."""
    if spec.equal_split() is None:
        return None
    return lag / (3 * spec.micro_batches + lag)


def split_holds(ranks: int, n_mb: int, chunked: bool = False) -> bool:
    """Whether the split-backward greedy orders meet :func:`split_closed_form`: with one chunk
    per rank (ZB-H2) from M >= P on; with chunks (ZB-V, interleaved ZB) at M = P and from
    M >= 2P on. With fewer micro-batches the ranks idle after the last rank's first forward
    (ZB-H2 at P = 4, M = 3: 13 T, not 12 T), and between P and 2P the chunked warm-up leaves
    gaps (ZB-V at P = 5, M = 6); checked against the simulator."""
    if n_mb < ranks:
        return False
    return not chunked or n_mb == ranks or n_mb >= 2 * ranks
