"""Phase 1 of the HexiScale search (§4.2): the devices split into ``D_dp`` parts, one per pipeline.

The configured partitioner cuts the device graph (min-cut or max-cut), the refiner improves the
cut, and each part gets its number of groups ``k_i`` for phase 2 (the part's machines plus a
shift). On clusters above ``solver.machine_graph_above`` devices the machine graph is cut
instead (:meth:`hexicore.core.device_graph.DeviceGraph.machines_of`: whole machines per part),
whose size grows with the machines, not with the devices squared.
"""

from __future__ import annotations

from typing import Sequence

from hexicore.planner.search.context import SearchContext


def split(context: SearchContext, d_dp: int, objective: str, k_shift: Sequence[int],
          seed: int) -> tuple[list, list[int]]:
    """Phase 1 (§4.2): the parts (sorted) and each part's number of groups ``k_i``, cached in
    the search context ``context`` (:class:`hexicore.planner.search.context.SearchContext`)."""
    key = (d_dp, objective, tuple(k_shift), seed)
    hit = context.parts_cache.get(key)
    if hit is None:
        graph = context.graph
        coarse = len(graph) > context.config.machine_graph_above and d_dp <= len(context.machine_graph)
        if coarse:  # large clusters: whole machines are partitioned (machine graph), then expanded
            graph = context.machine_graph
        parts = context.partitioner.partition(graph, d_dp, objective=objective, balance=context.config.max_balance,
                                              seed=seed)
        if context.refiner is not None and d_dp > 1:
            parts = context.refiner.refine(graph, parts, objective=objective, balance=context.config.max_balance)
        if coarse:
            parts = [[d for m in p for d in graph.nodes[m]["devices"]] for p in parts]
        parts = sorted((sorted(p) for p in parts if p), key=lambda p: p[0])
        cl = context.problem.cluster
        ks = [min(len(p), max(1, len({cl.device(d).machine for d in p}) + k_shift[i % len(k_shift)]))
              for i, p in enumerate(parts)]
        hit = context.parts_cache[key] = (parts, ks)
    return hit
