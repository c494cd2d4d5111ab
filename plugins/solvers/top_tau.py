"""Stage orderer ``top_tau`` (HexiScale §4.3 step iii): top-tau greedy path search.

The groups of one pipeline become consecutive stage blocks. Between two groups the activation
hop uses the best link (the leaders, §3.2), so the group graph's edge weight is the *maximum*
bandwidth between their devices. Every group is tried as the start; a path is extended
recursively through the ``tau`` not yet visited neighbours with the highest bandwidth; a path's
cost is ``sum 1/bandwidth`` over its hops (the transfer time of one activation, up to a factor)
and the cheapest complete path is kept; ``orders`` returns the few cheapest (ties included) so
the planner's cost model can choose among equally connected orders (memory favours some ends). Branch-and-bound (partial cost + remaining hops x the
cheapest hop) and an expansion budget keep it fast on large pipelines; ties keep the first path
found, so the result is deterministic.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from hexicore.core.fields import is_whole
from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.planner.partition.cut import weight_matrix


def group_bandwidth(groups: Sequence[Sequence[Hashable]], graph) -> np.ndarray:
    """``bw[a, b]`` = max bandwidth between a device of group a and one of group b."""
    nodes = [v for g in groups for v in g]
    w = weight_matrix(graph, nodes)
    k = len(groups)
    sizes = [len(g) for g in groups]
    if k and all(sizes):  # the groups are consecutive blocks of ``nodes``: block maxima
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.maximum.reduceat(np.maximum.reduceat(w, starts, axis=0), starts, axis=1)
        np.fill_diagonal(out, 0.0)
        return out
    idx = np.repeat(np.arange(k), sizes)
    out = np.zeros((k, k))
    for a in range(k):
        rows = w[idx == a]
        for b in range(k):
            if a != b:
                out[a, b] = rows[:, idx == b].max() if rows.size else 0.0
    return out


@dataclass(frozen=True)
class TopTauOrderer:
    """Top-tau greedy stage ordering; ``budget`` caps path extensions per call."""

    tau: int = 2
    budget: int = 2_000
    name: str = "top_tau"

    def order(self, groups: Sequence[Sequence[Hashable]], graph) -> list[list[Hashable]]:
        """The cheapest path (the orderer interface, docs/design.md)."""
        return self.orders(groups, graph, 1)[0]

    def orders(self, groups: Sequence[Sequence[Hashable]], graph, limit: int = 8) -> list[list[list[Hashable]]]:
        """Up to ``limit`` distinct paths of the top-tau search, cheapest first (ties in discovery
        order), so a caller can let the cost model pick among equally connected orders."""
        groups = [list(g) for g in groups]
        k = len(groups)
        if k <= 1:
            return [groups]
        bw = group_bandwidth(groups, graph)
        hop = np.where(bw > 0, 1.0 / np.where(bw > 0, bw, 1.0), np.inf)
        cheapest = hop[np.isfinite(hop)].min() if np.isfinite(hop).any() else 0.0
        by_bw = [sorted((b for b in range(k) if b != a), key=lambda b: (-bw[a, b], b)) for a in range(k)]
        ranked = [row[:self.tau] for row in by_bw]
        found: list[tuple[float, int, list[int]]] = []
        left = [self.budget]
        counter = [0]

        def bound() -> float:
            return found[-1][0] if len(found) >= limit else np.inf

        def extend(path: list[int], seen: set[int], cost: float) -> None:
            if len(path) == k:
                bisect.insort(found, (cost, counter[0], path[:]))
                counter[0] += 1
                del found[limit:]
                return
            if left[0] <= 0 or cost + (k - len(path)) * cheapest > bound() * (1 + 1e-12):
                return
            nxt = [b for b in ranked[path[-1]] if b not in seen]
            if not nxt:  # the tau best are used up: fall back to the best remaining neighbour
                nxt = [next(b for b in by_bw[path[-1]] if b not in seen)]
            for b in nxt:
                left[0] -= 1
                path.append(b)
                seen.add(b)
                extend(path, seen, cost + hop[path[-2], b])
                seen.discard(b)
                path.pop()

        for start in range(k):
            extend([start], {start}, 0.0)
        paths = [f[2] for f in found] or [list(range(k))]
        return [[groups[i] for i in p] for p in paths]


def _top_tau(tau: int = 2, budget: int = 2_000) -> TopTauOrderer:
    for key, v in (("tau", tau), ("budget", budget)):
        if not is_whole(v) or v < 1:
            raise HexicoreError(f"top_tau: {key} must be an integer >= 1, got {v!r}", field=f"solver.{key}")
    return TopTauOrderer(tau, budget)


@hookimpl
def hexicore_orderers():
    yield PluginSpec(kind="orderer", name="top_tau", factory=_top_tau,
                     description="top-tau greedy stage ordering by inter-group bandwidth (HexiScale §4.3)")
