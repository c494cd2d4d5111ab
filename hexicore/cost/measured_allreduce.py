"""COMM-DP-LAYER from a profile's measured all-reduces (the ``profiled`` cost model).

App. A prices a layer's gradient all-reduce as a ring of point-to-point transfers
(:meth:`hexicore.cost.analytic.AnalyticCostModel.dp_layer_s`). Where the profile measured
all-reduces among the machines that hold the layer, the collective's own measured bus bandwidth
``busbw(g)`` (NCCL's convention, ``busbw = 2 (g - 1) / g x bytes / t``) prices it instead:

    COMM-DP-LAYER = max_holder (lcm(tp) / tp) x 2 (g - 1) / g x (P x B / lcm(tp)) / busbw(g)

with ``g`` the holders (one per pipeline), each device all-reducing the ``P / lcm(tp)`` chunks
of its TP shard (HexiScale §3.2). ``busbw(g)`` is interpolated linearly in ``g`` between the
measured group sizes of that machine pair (the same machine twice: inside it), the nearest
measured size outside them. Holders on more than two machines, or a machine pair without a
measured all-reduce: None (the caller keeps App. A's ring).
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def bus_bandwidth(points: Sequence[tuple[int, float]], g: int) -> float:
    """``busbw(g)`` in GB/s from measured ``(group, GB/s)``: linear inside, nearest outside."""
    pts = sorted(points)
    if g <= pts[0][0]:
        return pts[0][1]
    if g >= pts[-1][0]:
        return pts[-1][1]
    for (g0, b0), (g1, b1) in zip(pts, pts[1:]):
        if g0 <= g <= g1:
            return b0 + (b1 - b0) * (g - g0) / (g1 - g0) if g1 > g0 else b0
    return pts[-1][1]  # unreachable: g lies inside the range


def allreduce_layer_s(profile: Any, cluster: Any, holders: Sequence[Any], n_params: float,
                      dtype_bytes: int) -> float | None:
    """COMM-DP-LAYER of the module docstring, or None where the profile has no all-reduce for
    the holders' machines."""
    g = len(holders)
    if g <= 1:
        return 0.0
    machines = sorted({cluster.device(d).machine for s in holders for d in s.devices})
    if len(machines) > 2:
        return None
    key = (machines[0], machines[-1])
    points = [(a.group, a.bandwidth_gbs) for a in profile.allreduce if tuple(sorted(a.between)) == key]
    if not points:
        return None
    bw = bus_bandwidth(points, g) * 1e9
    chunks = math.lcm(*(s.tp for s in holders))
    chunk = n_params * dtype_bytes / chunks
    return max((chunks // s.tp) * 2.0 * (g - 1) / g * chunk / bw for s in holders)
