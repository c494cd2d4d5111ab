"""Graph-partitioning interfaces and helpers of the HexiScale scheduler (§4.2; docs/design.md, extension points).

The device graph is :meth:`hexicore.core.cluster.Cluster.graph`: a complete graph, vertex weight
``tflops`` (c_d) and edge weight ``bandwidth`` (beta(d, d') in GB/s). A partition is a list of
parts, each a list of device ids. Two objectives (§4.4):

* ``min_cut`` — minimise the bandwidth crossing parts: parts are well connected inside and the
  traffic *between* parts (DP across pipelines, or hops between stage groups) takes the slow links;
* ``max_cut`` — maximise it: the traffic between parts takes the fast links.

The balance factor of §4.2 is ``max_i sum_{d in D_i} c_d / (sum_d c_d / k)`` (>= 1).
This module holds only pure helpers; the implementations are plugins (``metis``, ``random``,
``kl``, ``top_tau``) found through the registry.
"""

from __future__ import annotations

from typing import Hashable, Protocol, Sequence

import numpy as np

from hexicore.core.fields import is_whole
from hexicore.core.errors import HexicoreError

OBJECTIVES = ("min_cut", "max_cut")
Parts = list[list[Hashable]]


class Partitioner(Protocol):
    def partition(self, graph, parts: int, *, objective: str = "min_cut", balance: float = 1.1,
                  seed: int = 0) -> Parts: ...


class Refiner(Protocol):
    def refine(self, graph, parts: Parts, *, objective: str = "min_cut", balance: float = 1.1) -> Parts: ...


class StageOrderer(Protocol):
    def order(self, groups: Sequence[Sequence[Hashable]], graph) -> list[list[Hashable]]: ...


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise HexicoreError(f"unknown objective {objective!r}; choose one of: {', '.join(OBJECTIVES)}",
                            field="solver.objective")
    return objective


def check_parts(n_nodes: int, parts: int) -> None:
    if not is_whole(parts) or not 1 <= parts <= n_nodes:
        raise HexicoreError(f"cannot split {n_nodes} devices into {parts!r} parts (need 1..{n_nodes})",
                            field="solver.parts")


class _Shown:
    """A node filter that keeps ``nodes`` in their given order (networkx's own filter keeps a
    ``set``, so a small view's node order would follow the string hash seed)."""

    def __init__(self, nodes: Sequence[Hashable]) -> None:
        self.nodes = dict.fromkeys(nodes)

    def __call__(self, node: Hashable) -> bool:
        return node in self.nodes


def ordered_subgraph(graph, nodes: Sequence[Hashable]):
    """A read-only view of ``graph`` on ``nodes`` whose node order never depends on
    ``PYTHONHASHSEED``: ``nodes``' own order when the view is small, else the graph's order
    (``networkx.subgraph_view``; the view shares ``graph.graph``, so :func:`weight_matrix`'s
    cache is shared too). Partitioners list a graph's nodes in its order, so a plan is the same
    under every hash seed."""
    if hasattr(graph, "view"):  # a DeviceGraph: the same node order rule
        return graph.view(nodes)
    import networkx as nx

    return nx.subgraph_view(graph, filter_node=_Shown(nodes))


def weight_matrix(graph, nodes: Sequence[Hashable], attr: str = "bandwidth") -> np.ndarray:
    """Symmetric matrix of an edge attribute over ``nodes`` (0 where there is no edge).

    The first call on a graph stores the matrix over all its nodes in the graph's attribute
    dict (``graph.graph``, which networkx shares with subgraph views); later calls on the graph
    or its views slice it. The device graph is treated as immutable once partitioned. A
    :class:`hexicore.core.device_graph.DeviceGraph` builds the slice from its per-machine
    matrices (the same values, no full matrix kept)."""
    import networkx as nx

    if hasattr(graph, "matrix"):
        return graph.matrix(attr, nodes)
    nodes = list(nodes)
    cache = graph.graph.setdefault("_hexicore_weights", {}) if hasattr(graph, "graph") else {}
    hit = cache.get(attr)
    if hit is None or not all(v in hit[0] for v in nodes):
        full = list(graph.nodes)
        w = nx.to_numpy_array(graph, nodelist=full, weight=attr, nonedge=0.0)
        np.fill_diagonal(w, 0.0)
        hit = cache[attr] = ({v: i for i, v in enumerate(full)}, w)
    idx = np.fromiter((hit[0][v] for v in nodes), dtype=np.int64, count=len(nodes))
    return hit[1][np.ix_(idx, idx)]


def objective_matrix(w: np.ndarray, objective: str) -> np.ndarray:
    """The weights a *minimum*-cut partitioner sees for ``objective``.

    ``min_cut``: the bandwidths themselves. ``max_cut``: the complement ``w_max + w_min - w`` on
    every existing edge. On a complete graph the number of cut edges is fixed by the part sizes
    (``sum_{i<j} |D_i||D_j|``), so for parts of given sizes ``cut'(P) = |cut| (w_max + w_min) -
    cut(P)``: minimising the complemented cut is exactly maximising the bandwidth cut. (HexiScale's
    code minimises over ``1/bw`` instead, which is monotone but not exact.)
    """
    check_objective(objective)
    if objective == "min_cut":
        return w
    edges = w > 0
    if not edges.any():
        return w
    hi, lo = w[edges].max(), w[edges].min()
    out = np.where(edges, hi + lo - w, 0.0)
    np.fill_diagonal(out, 0.0)
    return out


def labels_of(nodes: Sequence[Hashable], parts: Parts) -> np.ndarray:
    where = {v: i for i, p in enumerate(parts) for v in p}
    return np.array([where[v] for v in nodes])


def parts_of(nodes: Sequence[Hashable], labels: Sequence[int], k: int) -> Parts:
    out: Parts = [[] for _ in range(k)]
    for v, lab in zip(nodes, labels):
        out[int(lab)].append(v)
    return out


def cut_weight(graph, parts: Parts, attr: str = "bandwidth") -> float:
    """Sum of ``attr`` over edges whose ends lie in different parts."""
    where = {v: i for i, p in enumerate(parts) for v in p}
    return sum(float(d.get(attr, 1.0)) for a, b, d in graph.edges(data=True)
               if a in where and b in where and where[a] != where[b])


def balance_factor(graph, parts: Parts, attr: str = "tflops") -> float:
    """HexiScale §4.2: ``max_i c(D_i) / (c(D) / k)``; 1.0 is perfect balance."""
    loads = [sum(float(graph.nodes[v].get(attr, 1.0)) for v in p) for p in parts]
    total = sum(loads)
    return max(loads) / (total / len(parts)) if total > 0 else 1.0


def balance_limit(loads: np.ndarray, balance: float, k: int, heaviest: float) -> float:
    """The largest part load a balance factor allows, loosened so that a partition exists at
    all (a single vertex heavier than the average is its own lower bound)."""
    return max(balance * loads.sum() / k, heaviest)
