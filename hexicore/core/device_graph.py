"""The device graph of HexiScale §4.2 held as per-machine-pair matrices.

The graph is complete (vertex weight ``tflops``, edge weight ``bandwidth`` in GB/s, also
``latency_us``), and every edge weight is a property of the two devices' machines: inside a
machine its intra link, between two machines their per-pair override or the default
inter-machine link. :class:`DeviceGraph` therefore stores one ``machines x machines`` matrix per
attribute and hands out device-level weight matrices only for the nodes asked for
(:meth:`DeviceGraph.matrix`). A networkx complete graph holds one attribute dict per edge:
8.4 M of them at 4096 devices, several GB; this holds 2 x 512^2 floats for 512 machines.

It offers the part of networkx's ``Graph`` API the partitioner, refiner and orderer plugins
use (``nodes`` with attribute dicts, ``edges``, ``number_of_nodes``/``number_of_edges``,
``has_edge``, ``graph``) and :meth:`DeviceGraph.view` for sub-graphs; :func:`hexicore.planner.
partition.weight_matrix` asks it for matrices directly. ``to_networkx`` builds the full graph
for code that needs networkx itself (small clusters only).
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator, Mapping, Sequence

import numpy as np

ATTRS = ("bandwidth", "latency_us")


class DeviceGraph:
    """Nodes (device ids, in order) with attribute dicts, and per machine-pair edge weights."""

    def __init__(self, nodes: Mapping[str, dict[str, Any]], machine_of: np.ndarray,
                 pair: Mapping[str, np.ndarray], index: Mapping[str, int] | None = None) -> None:
        self.nodes = dict(nodes)  # device id -> {"tflops", "memory_gb", "machine"}, in graph order
        self._machine_of = machine_of  # per node of the root graph: its machine's row in ``pair``
        self._pair = pair  # attribute -> machines x machines matrix
        self._index = index if index is not None else {v: i for i, v in enumerate(self.nodes)}
        self.graph: dict[str, Any] = {}

    @classmethod
    def from_cluster(cls, cluster: Any) -> "DeviceGraph":
        """Built from a :class:`hexicore.core.cluster.Cluster`'s machines and links."""
        row_of, bw, lat = cluster.link_matrices
        devs = cluster.devices
        nodes = {d.id: {"tflops": d.tflops, "memory_gb": d.memory_gb, "machine": d.machine} for d in devs}
        machine_of = np.fromiter((row_of[d.id] for d in devs), dtype=np.int64, count=len(devs))
        return cls(nodes, machine_of, {"bandwidth": bw, "latency_us": lat})

    @classmethod
    def machines_of(cls, cluster: Any) -> "DeviceGraph":
        """The machine graph: one node per machine with usable devices (``tflops``: their sum,
        ``devices``: their ids), edge weight = the total over the device pairs of the two
        machines (``n_a * n_b * bandwidth``, so a cut weighs what the device graph's does)."""
        row_of, bw, lat = cluster.link_matrices
        members: dict[str, list] = {}
        for d in cluster.devices:
            members.setdefault(d.machine, []).append(d)
        names = list(members)
        rows = np.array([row_of[members[m][0].id] for m in names], dtype=np.int64)
        size = np.array([len(members[m]) for m in names], dtype=float)
        pair = {"bandwidth": bw[np.ix_(rows, rows)] * np.outer(size, size), "latency_us": lat[np.ix_(rows, rows)]}
        nodes = {m: {"tflops": sum(d.tflops for d in members[m]), "devices": [d.id for d in members[m]],
                     "machine": m} for m in names}
        return cls(nodes, np.arange(len(names), dtype=np.int64), pair)

    # ------------------------------------------------------------------ weights
    def matrix(self, attr: str, nodes: Sequence[Hashable] | None = None) -> np.ndarray:
        """The symmetric ``attr`` matrix over ``nodes`` (all by default), 0 on the diagonal."""
        nodes = list(self.nodes) if nodes is None else list(nodes)
        idx = self._machine_of[np.fromiter((self._index[v] for v in nodes), dtype=np.int64, count=len(nodes))]
        out = self._pair[attr][np.ix_(idx, idx)]
        np.fill_diagonal(out, 0.0)
        return out

    def weight(self, a: Hashable, b: Hashable, attr: str = "bandwidth") -> float:
        return float(self._pair[attr][self._machine_of[self._index[a]], self._machine_of[self._index[b]]])

    def view(self, nodes: Sequence[Hashable]) -> "DeviceGraph":
        """The sub-graph on ``nodes`` sharing this graph's weights. Node order follows
        networkx's ``subgraph_view`` with an order-keeping filter
        (:func:`hexicore.planner.partition.cut.ordered_subgraph`): ``nodes``' own order when they
        are fewer than half the graph's nodes, else the graph's order."""
        keep = dict.fromkeys(nodes)
        if 2 * len(keep) < len(self.nodes):
            order = [v for v in keep if v in self.nodes]
        else:
            order = [v for v in self.nodes if v in keep]
        out = DeviceGraph({v: self.nodes[v] for v in order}, self._machine_of, self._pair, self._index)
        out.graph = self.graph
        return out

    # ------------------------------------------------------- networkx's API, in part
    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node: Hashable) -> bool:
        return node in self.nodes

    def number_of_nodes(self) -> int:
        return len(self.nodes)

    def number_of_edges(self) -> int:
        n = len(self.nodes)
        return n * (n - 1) // 2

    def has_edge(self, a: Hashable, b: Hashable) -> bool:
        return a != b and a in self.nodes and b in self.nodes

    def edges(self, data: bool = False) -> Iterator[tuple]:
        """Every edge once (node order); with ``data`` each with its attribute dict."""
        order = list(self.nodes)
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                if data:
                    yield a, b, {k: self.weight(a, b, k) for k in ATTRS}
                else:
                    yield a, b

    def to_networkx(self):
        """The same graph as a networkx ``Graph`` (a complete graph: small clusters only)."""
        import networkx as nx

        g = nx.Graph()
        for v, attrs in self.nodes.items():
            g.add_node(v, **attrs)
        for a, b, d in self.edges(data=True):
            g.add_edge(a, b, **d)
        return g
