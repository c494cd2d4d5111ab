"""How long one transfer lasts on a cluster's links: the alpha/beta terms of HexiScale App. A.

``alpha(d, d')`` (seconds) and ``beta(d, d')`` (bytes/s) are a device pair's declared latency and
bandwidth (:class:`hexicore.core.cluster.Cluster`). The analytic cost model prices the TP
all-reduces and the pipeline hops with these functions, and emulated links
(``emulate: {links: true}``, :mod:`hexicore.core.emulation`) hold each message and collective of
a run to them, so a run on emulated links obeys the very links the planner priced.

* a message from ``a`` to ``b``: ``alpha(a, b) + bytes / beta(a, b)``;
* one ring pass (a reduce-scatter of a ``bytes`` buffer, or an all-gather into one) among the
  devices ``D``: ``max_d sum_{d' != d} (alpha(d, d') + bytes / (|D| beta(d, d')))``: each device
  exchanges a ``1 / |D|`` piece with every other, paying each link's own latency and bandwidth;
* an all-reduce: two passes (App. A's factor 2: a reduce-scatter, then an all-gather);
* a broadcast from ``root``: its slowest direct message to another device.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["allreduce_s", "broadcast_s", "ring_pass_s", "send_s"]


def send_s(cluster: Any, a: str, b: str, nbytes: float) -> float:
    """``alpha(a, b) + bytes / beta(a, b)``: one message from device ``a`` to device ``b``."""
    return cluster.alpha(a, b) + nbytes / cluster.beta(a, b)


def ring_pass_s(cluster: Any, devices: Sequence[str], nbytes: float) -> float:
    """``max_d sum_{d' != d} (alpha(d, d') + bytes / (|D| beta(d, d')))`` among ``devices``: a
    reduce-scatter of a ``bytes`` buffer or an all-gather into one (0 for one device)."""
    n = len(devices)
    return max((sum(cluster.alpha(d, e) + nbytes / (n * cluster.beta(d, e)) for e in devices if e != d)
                for d in devices), default=0.0)


def allreduce_s(cluster: Any, devices: Sequence[str], nbytes: float) -> float:
    """``2 x`` :func:`ring_pass_s`: an all-reduce of ``bytes`` among ``devices``."""
    return 2.0 * ring_pass_s(cluster, devices, nbytes)


def broadcast_s(cluster: Any, root: str, devices: Sequence[str], nbytes: float,
                message: Callable[[Any, str, str, float], float] = send_s) -> float:
    """``max_{d != root} message(root, d)``: ``bytes`` from ``root`` to every other device
    (``message``: one message's seconds, :func:`send_s` unless a cost model measured them)."""
    return max((message(cluster, root, e, nbytes) for e in devices if e != root), default=0.0)
