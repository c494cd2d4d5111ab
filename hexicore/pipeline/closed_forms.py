"""Closed forms of the schedule plugins' makespans and bubble ratios under equal stages and free
transfers (each plugin's docstring states which it uses): fill-drain shapes (GPipe, 1F1B)
``(M + P - 1)(T_F + T_B)``, split-backward shapes (ZB-H2, ZB-V, interleaved ZB, DualPipeV)
``(3M + lag) T`` with the lag of the last rank's first forward.
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
