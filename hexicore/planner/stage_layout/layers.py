"""Layer allocation across the stages of one pipeline (HexiScale §4.3; docs/background.md).

Given, for every stage j, its time ``t_j(l)`` for ``l = 0..L`` layers (STAGE + HOP of App. A,
one micro-batch) and the most layers ``cap_j`` its devices hold in memory, choose integer layer
counts ``l_j`` with ``sum_j l_j = L`` and ``1 <= l_j <= cap_j`` that minimise the slowest stage
``max_j t_j(l_j)`` — the term that multiplies ``n_mb - 1`` in PIPELINE-TIME. Among the minimisers
it then minimises ``sum_j t_j(l_j)`` (the fill/drain term), exactly when the ``t_j`` are convex
(the analytic model's are affine).

Exact, not rounded proportions: the optimum is one of the values ``t_j(l)``: the smallest ``T``
at which the stages can hold ``L`` layers, where stage j holds at most
``max {l <= cap_j : t_j(l) <= T}`` — an order statistic of the values (:func:`allocate_layers`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def max_layers_within(capped: np.ndarray, bound: float) -> np.ndarray:
    """Per stage, the most layers with ``t_j(l) <= bound`` (-1: not even zero); ``capped`` holds
    each nondecreasing row with ``inf`` beyond the stage's memory cap."""
    return (capped <= bound).sum(axis=1) - 1


def allocate_layers(times: Sequence[Sequence[float]], caps: Sequence[int], n_layers: int,
                    least: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """Exact min-max layer allocation; ``times[j][l]`` for ``l = 0..n_layers``; ``None`` when no
    allocation fits (``sum cap_j < L`` or a stage cannot hold even one layer). ``least``: the
    fewest layers each stage may hold (a schedule running ``k`` chunks on a rank needs ``k``;
    default one each): the same allocation over ``l_j - least_j + 1`` (:func:`_at_least`).

    Rows are made nondecreasing (``t_j(l) := max_{l' <= l} t_j(l')``) — a stage can always run
    fewer layers no slower — which changes nothing for a monotone cost model."""
    if least is not None and any(k > 1 for k in least):
        return _at_least(times, caps, n_layers, [max(1, int(k)) for k in least])
    t = np.maximum.accumulate(np.asarray(times, dtype=float), axis=1)
    p = len(t)
    if p == 0 or p > n_layers:
        return None
    caps = np.minimum(np.asarray(caps, dtype=int), n_layers - (p - 1))
    if (caps < 1).any() or caps.sum() < n_layers:
        return None
    ls = np.arange(t.shape[1])
    capped = np.where(ls[None, :] <= caps[:, None], t, np.inf)
    # the smallest value T at which L layers fit with one layer at least per stage: every
    # t_j(1) <= T, and at bounds T >= max_j t_j(1) stage j holds #{l >= 1 : t_j(l) <= T} layers
    # (rows nondecreasing), so T = max(max_j t_j(1), the L-th smallest t_j(l), l >= 1)
    bound = max(capped[:, 1].max(), np.partition(capped[:, 1:].ravel(), n_layers - 1)[n_layers - 1])
    alloc = max_layers_within(capped, bound)
    excess = int(alloc.sum()) - n_layers
    if excess > 0:  # give back the layers that cost most (min-sum tie-break; greedy = exact for convex rows)
        ls_ = np.arange(1, t.shape[1])
        marginal = np.where((ls_[None, :] <= alloc[:, None]) & (ls_[None, :] >= 2), t[:, 1:] - t[:, :-1], -np.inf)
        flat = np.argsort(-marginal, axis=None, kind="stable")[:excess]
        alloc = alloc - np.bincount(flat // marginal.shape[1], minlength=p)
    return tuple(alloc.tolist())


def _at_least(times: Sequence[Sequence[float]], caps: Sequence[int], n_layers: int,
              least: Sequence[int]) -> tuple[int, ...] | None:
    """:func:`allocate_layers` with stage j holding ``least_j`` layers at least: stage j's row
    shifted by ``least_j - 1`` (its ``l = 1`` is ``least_j`` layers), ``L`` less the shifts."""
    shift = [k - 1 for k in least]
    rest = n_layers - sum(shift)
    if rest < len(least) or any(c < k for c, k in zip(caps, least)):
        return None
    t = np.asarray(times, dtype=float)
    rows = [np.append(t[j, s:s + rest + 1], [t[j, -1]] * max(0, rest + 1 - len(t[j, s:s + rest + 1])))
            for j, s in enumerate(shift)]
    alloc = allocate_layers(rows, [c - s for c, s in zip(caps, shift)], rest)
    return None if alloc is None else tuple(a + s for a, s in zip(alloc, shift))


def layer_ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` ranges of consecutive stages (plan JSON §5)."""
    out, lo = [], 0
    for c in counts:
        out.append((lo, lo + int(c)))
        lo += int(c)
    return out
