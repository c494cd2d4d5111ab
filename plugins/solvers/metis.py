"""Partitioners ``metis`` (HexiScale §4.2 phase 1 and §4.3 phase 2 (i)) and ``random`` (the
baseline of the paper's Fig. 8).

``metis`` runs METIS (pymetis) on the device graph: vertex weight = TFLOPS, edge weight =
bandwidth, both scaled to integers (METIS takes ints only). METIS is multilevel exactly as §4.2
describes: heavy-edge-matching coarsening, recursive bisection of the coarse graph under the
balance constraint, projection and Kernighan-Lin/FM refinement. The balance factor limit
``balance`` (>= 1) becomes METIS' ``ufactor`` (:func:`ufactor`).

Max-cut: METIS only minimises. For ``objective="max_cut"`` it partitions the complemented graph
(edge weight ``w_max + w_min - w``, see :func:`hexicore.planner.partition.cut.objective_matrix`), which on a
complete graph with fixed part sizes turns the minimum cut into the maximum bandwidth cut.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from dataclasses import dataclass

import numpy as np

from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.planner.partition.cut import (Parts, balance_limit, check_objective, check_parts, objective_matrix, parts_of, weight_matrix)

INT_LIMIT = 2**30  # METIS idx_t is 32-bit: keep the summed edge weights below this


def integer_weights(w: np.ndarray, *, limit: int = INT_LIMIT, resolution: int = 10_000) -> np.ndarray:
    """Scale non-negative edge weights to integers >= 1 on edges (0 elsewhere), largest edge =
    ``min(resolution, limit / (number of adjacency entries))`` so METIS' sums cannot overflow."""
    edges = w > 0
    if not edges.any():
        return np.zeros_like(w, dtype=np.int64)
    top = max(1, min(resolution, limit // max(1, int(edges.sum()))))
    return np.where(edges, np.maximum(1, np.rint(w / w[edges].max() * top)), 0).astype(np.int64)


def vertex_weights(tflops: np.ndarray, *, limit: int = INT_LIMIT) -> np.ndarray:
    """TFLOPS as integers with 0.1-TFLOPS resolution (>= 1); coarser when their sum would pass
    ``limit`` (METIS sums them in its 32-bit ``idx_t``)."""
    scale = min(10.0, limit / max(float(tflops.sum()), 1.0))
    return np.maximum(1, np.rint(tflops * scale)).astype(np.int64)


def ufactor(balance: float, parts: int, recursive: bool) -> int:
    """METIS' ``ufactor`` (allowed imbalance in 1/1000) for a balance factor limit. k-way: the
    limit itself. Recursive bisection applies it at each of ``ceil(log2 k)`` levels and the
    imbalances multiply, so each level gets ``balance ** (1 / levels)`` (large per-level
    factors also let METIS produce empty sides)."""
    levels = max(1, math.ceil(math.log2(parts))) if recursive else 1
    return max(1, int(round(1000 * (balance ** (1.0 / levels) - 1))))


def repair_empty(labels: np.ndarray, k: int, vw: np.ndarray) -> np.ndarray:
    """METIS may leave a part empty on tiny graphs; move the lightest vertex of the heaviest
    multi-vertex part into each empty part (deterministic)."""
    labels = labels.copy()
    for part in range(k):
        if (labels == part).any():
            continue
        sizes = np.bincount(labels, minlength=k)
        loads = np.bincount(labels, weights=vw, minlength=k)
        donor = max((p for p in range(k) if sizes[p] > 1), key=lambda p: (loads[p], -p))
        members = np.flatnonzero(labels == donor)
        labels[members[np.argmin(vw[members])]] = part
    return labels


@contextlib.contextmanager
def quiet_c_output():
    """Silence what the METIS C library prints on file descriptors 1 and 2 (``***Cannot bisect
    a graph with 0 vertices!`` when recursive bisection meets an empty side; the result is still
    usable and :func:`repair_empty` fixes empty parts) so it never reaches the user's terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


@dataclass(frozen=True)
class MetisPartitioner:
    """k-way METIS partition of the device graph (§4.2); ``recursive`` selects recursive
    bisection (the paper's step (ii)); ``contig`` asks METIS for connected parts."""

    recursive: bool = True
    contig: bool = False
    name: str = "metis"

    def partition(self, graph, parts: int, *, objective: str = "min_cut", balance: float = 1.1,
                  seed: int = 0) -> Parts:
        import pymetis

        check_objective(objective)
        nodes = list(graph.nodes)
        check_parts(len(nodes), parts)
        if parts == 1:
            return [nodes]
        if parts == len(nodes):
            return [[v] for v in nodes]
        w = integer_weights(objective_matrix(weight_matrix(graph, nodes), objective))
        vw = vertex_weights(np.array([float(graph.nodes[v].get("tflops", 1.0)) for v in nodes]))
        rows, cols = np.nonzero(w)
        xadj = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(nodes)))]).astype(np.int64)
        opts = pymetis.Options(seed=int(seed) % (2**31), ufactor=ufactor(balance, parts, self.recursive),
                               contig=int(self.contig))
        with quiet_c_output():
            res = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(adj_starts=xadj,
                                                                            adjacent=cols.astype(np.int64)),
                                     eweights=w[rows, cols], vweights=vw, options=opts, recursive=self.recursive)
        labels = repair_empty(np.asarray(res.vertex_part, dtype=np.int64), parts, vw)
        return parts_of(nodes, labels, parts)


@dataclass(frozen=True)
class RandomPartitioner:
    """Random balanced partition (HexiScale Fig. 8 baseline): devices in a seeded random order,
    each to a random part whose load stays within the balance limit (else the lightest part).
    The objective is ignored: that is the point of the baseline."""

    name: str = "random"

    def partition(self, graph, parts: int, *, objective: str = "min_cut", balance: float = 1.1,
                  seed: int = 0) -> Parts:
        check_objective(objective)
        nodes = list(graph.nodes)
        check_parts(len(nodes), parts)
        rng = random.Random(seed)
        order = nodes[:]
        rng.shuffle(order)
        tf = {v: float(graph.nodes[v].get("tflops", 1.0)) for v in nodes}
        weights = np.array([tf[v] for v in nodes])
        limit = balance_limit(weights, balance, parts, weights.max())
        out: Parts = [[v] for v in order[:parts]]
        loads = [tf[v] for v in order[:parts]]
        for v in order[parts:]:
            ok = [i for i in range(parts) if loads[i] + tf[v] <= limit]
            i = rng.choice(ok) if ok else min(range(parts), key=lambda p: loads[p])
            out[i].append(v)
            loads[i] += tf[v]
        return out


def _metis(recursive: bool = True, contig: bool = False) -> MetisPartitioner:
    from hexicore.core.errors import HexicoreError

    if not isinstance(recursive, bool) or not isinstance(contig, bool):
        raise HexicoreError("metis: recursive and contig must be true or false", field="solver.partitioner")
    return MetisPartitioner(recursive, contig)


@hookimpl
def hexicore_partitioners():
    yield PluginSpec(kind="partitioner", name="metis", factory=_metis,
                     description="METIS k-way partition (pymetis): TFLOPS vertices, bandwidth edges, min/max cut")
    yield PluginSpec(kind="partitioner", name="random", factory=RandomPartitioner,
                     description="random balanced partition (HexiScale Fig. 8 baseline)")
