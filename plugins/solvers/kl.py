"""Refiner ``kl``: k-way Kernighan-Lin / Fiduccia-Mattheyses refinement (HexiScale §4.2 step iv).

For every pair of parts (on many parts: each part with the few it is most connected to), one KL pass (best pair swap first, swapped vertices locked, the best
prefix of the sequence kept if it gains) followed by FM single-vertex moves with positive gain;
sweeps repeat while the cut improves. Every swap and move keeps every part's TFLOPS load within
the balance limit (``balance`` x average, :func:`hexicore.planner.partition.cut.balance_limit`) — or does not
make an already-violating pair worse — and no part is ever emptied.

Objective: the gains are computed on ``sign * w`` with ``sign = +1`` for ``min_cut`` and ``-1``
for ``max_cut`` (maximising the bandwidth cut = minimising its negative), so both objectives are
exact for swaps and moves alike.

Symmetry: a pass between two parts whose devices are all interchangeable (every weight among
them one value, the devices of one machine) is skipped (:func:`interchangeable`): there every
swap's gain is exactly 0, in floating point too, so the pass would keep both parts as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hexicore.core.fields import is_whole
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.planner.partition.cut import Parts, balance_limit, check_objective, labels_of, parts_of, weight_matrix

EPS = 1e-9


def kl_pass(w: np.ndarray, vw: np.ndarray, a: np.ndarray, b: np.ndarray, limit: float,
            max_steps: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One Kernighan-Lin pass between index sets ``a`` and ``b`` (cut minimised on ``w``).

    ``D[v]`` = external - internal weight; swapping (x, y) gains ``D[x] + D[y] - 2 w[x, y]``.
    Returns the new sets and the realised gain (>= 0)."""
    a, b = a.copy(), b.copy()
    d_a = w[np.ix_(a, b)].sum(1) - w[np.ix_(a, a)].sum(1)
    d_b = w[np.ix_(b, a)].sum(1) - w[np.ix_(b, b)].sum(1)
    load_a, load_b = vw[a].sum(), vw[b].sum()
    free_a, free_b = np.ones(len(a), bool), np.ones(len(b), bool)
    swaps, gains = [], []
    for _ in range(min(max_steps, len(a), len(b))):
        g = d_a[:, None] + d_b[None, :] - 2 * w[np.ix_(a, b)]
        new_a = load_a - vw[a][:, None] + vw[b][None, :]
        new_b = load_b - vw[b][None, :] + vw[a][:, None]
        ok = free_a[:, None] & free_b[None, :] & (np.maximum(new_a, new_b) <= max(limit, load_a, load_b) + EPS)
        if not ok.any():
            break
        g = np.where(ok, g, -np.inf)
        i, j = np.unravel_index(int(np.argmax(g)), g.shape)
        x, y = a[i], b[j]
        swaps.append((i, j))
        gains.append(g[i, j])
        free_a[i] = free_b[j] = False
        load_a, load_b = new_a[i, j], new_b[i, j]
        d_a += 2 * w[a, x] - 2 * w[a, y]
        d_b += 2 * w[b, y] - 2 * w[b, x]
    if not gains:
        return a, b, 0.0
    cum = np.cumsum(gains)
    best = int(np.argmax(cum))
    if cum[best] <= EPS:
        return a, b, 0.0
    for i, j in swaps[:best + 1]:
        a[i], b[j] = b[j], a[i]
    return a, b, float(cum[best])


def interchangeable(w: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether :func:`kl_pass` between ``a`` and ``b`` is a no-op: every weight among them is one
    value ``c`` (0 on the diagonal), so every swap gains ``D[x] + D[y] - 2c = 0``, and every sum
    the pass forms (at most ``4 |a u b|`` multiples of ``c``) is exact in float64, so the computed
    gains are exactly 0 too and no prefix of swaps gains more than ``EPS``."""
    u = np.concatenate([a, b])
    sub = w[np.ix_(u, u)]
    c = float(sub[0, 1]) if len(u) > 1 else 0.0
    if not math.isfinite(c) or not (sub.diagonal() == 0.0).all():
        return False
    if np.count_nonzero(sub != c) != (len(u) if c != 0.0 else 0):
        return False
    num, _ = abs(c).as_integer_ratio()  # c = num / 2**s: its multiples up to 2**53 / num are exact
    return 4 * len(u) * num < 2 ** 53


def fm_moves(w: np.ndarray, vw: np.ndarray, labels: np.ndarray, pa: int, pb: int, limit: float) -> float:
    """Greedy FM moves between parts ``pa`` and ``pb`` while a move gains and keeps balance;
    edits ``labels`` in place and returns the gain."""
    total = 0.0
    while True:
        best, move = EPS, None
        for src, dst in ((pa, pb), (pb, pa)):
            s, t = np.flatnonzero(labels == src), np.flatnonzero(labels == dst)
            if len(s) <= 1:
                continue
            gain = w[np.ix_(s, t)].sum(1) - w[np.ix_(s, s)].sum(1)
            fits = vw[t].sum() + vw[s] <= limit + EPS
            gain = np.where(fits, gain, -np.inf)
            i = int(np.argmax(gain))
            if gain[i] > best:
                best, move = gain[i], (s[i], dst)
        if move is None:
            return total
        labels[move[0]] = move[1]
        total += best


def partner_pairs(w: np.ndarray, labels: np.ndarray, k: int, partners: int) -> list[tuple[int, int]]:
    """The part pairs worth refining: every pair when ``k <= partners + 1``, else each part with
    the ``partners`` parts it is most connected to on ``w`` (where swaps can gain most)."""
    if k <= partners + 1:
        return [(a, b) for a in range(k) for b in range(a + 1, k)]
    onehot = np.eye(k)[labels]
    conn = onehot.T @ w @ onehot
    np.fill_diagonal(conn, -np.inf)
    pairs = {tuple(sorted((a, int(b)))) for a in range(k) for b in np.argsort(-conn[a], kind="stable")[:partners]}
    return sorted(pairs)


@dataclass(frozen=True)
class KernighanLinRefiner:
    """Pairwise KL + FM refinement of a k-way partition under a balance limit."""

    max_sweeps: int = 2
    max_steps: int = 16
    max_partners: int = 3
    name: str = "kl"

    def refine(self, graph, parts: Parts, *, objective: str = "min_cut", balance: float = 1.1) -> Parts:
        check_objective(objective)
        k = len(parts)
        if k <= 1:
            return [list(p) for p in parts]
        nodes = [v for p in parts for v in p]
        sign = 1.0 if objective == "min_cut" else -1.0
        w = sign * weight_matrix(graph, nodes)
        vw = np.array([float(graph.nodes[v].get("tflops", 1.0)) for v in nodes])
        limit = balance_limit(vw, balance, k, vw.max())
        labels = labels_of(nodes, parts)
        for _ in range(self.max_sweeps):
            gained = 0.0
            for pa, pb in partner_pairs(w, labels, k, self.max_partners):
                a, b = np.flatnonzero(labels == pa), np.flatnonzero(labels == pb)
                g = 0.0
                if not interchangeable(w, a, b):
                    a, b, g = kl_pass(w, vw, a, b, limit, self.max_steps)
                labels[a], labels[b] = pa, pb
                gained += g + fm_moves(w, vw, labels, pa, pb, limit)
            if gained <= EPS:
                break
        return parts_of(nodes, labels, k)


def _kl(max_sweeps: int = 2, max_steps: int = 16, max_partners: int = 3) -> KernighanLinRefiner:
    from hexicore.core.errors import HexicoreError

    for key, v in (("max_sweeps", max_sweeps), ("max_steps", max_steps), ("max_partners", max_partners)):
        if not is_whole(v) or v < 1:
            raise HexicoreError(f"kl: {key} must be a positive integer, got {v!r}", field="solver.refiner")
    return KernighanLinRefiner(max_sweeps, max_steps, max_partners)


@hookimpl
def hexicore_refiners():
    yield PluginSpec(kind="refiner", name="kl", factory=_kl,
                     description="k-way Kernighan-Lin / FM refinement under the balance limit, min or max cut")
