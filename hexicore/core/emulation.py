"""Emulated device speed on one host (a cluster file's ``emulate:``), a test aid, never a default.

One CPU host can stand for a heterogeneous cluster: each machine's ranks are local processes,
and ``emulate`` makes that machine's devices slower than the host. Two modes, one per machine:

* ``emulate: {slowdown: K}`` (1 <= K <= 1000): every compute action and optimizer step lasts
  ``K`` times the host's own work on it (the rank's CPU seconds; CUDA: synchronised seconds). It
  follows the host: a busy or throttled host makes the emulated device slower too.
* ``emulate: {tflops: X}`` (1e-6 <= X <= 10000): a device of a fixed speed. Every compute action
  lasts its counted FLOPs (matrix products and attention, counted by torch's FLOP formulas as it
  runs: recomputation and a TP shard's own share included) divided by ``X`` TFLOP/s, or its own
  duration if the host needs longer. With ``X`` well below what the host sustains per rank, an
  action's time no longer depends on the host's load, so profile-plan-train checks on a shared
  CPU host repeat from run to run. An action without counted FLOPs (the optimizer step, an
  embedding) lasts its own duration.

The runtime enforces it (the torch runtime's ``launch/emulated_device.py``); ``hexicore profile`` measures it
like any device; the analytic cost model does not see it (it prices the catalog GPU).

Links too: a top-level ``emulate: {links: true}`` holds every link of the cluster (inside a
machine, between machines, ``links:`` overrides, zones) to its declared ``bandwidth_gbs`` and
``latency_us``: every point-to-point message and collective of the job lasts what the cost
model's formulas give on those links (:mod:`hexicore.cost.transfer`), or its own duration if
the host needs longer. The runtime enforces it (the torch runtime's ``launch/emulated_links.py``);
``hexicore profile`` measures such links like real ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexicore.core import schema
from hexicore.core.errors import HexicoreError

__all__ = ["EmulatedLinks", "Emulation", "parse_emulation", "parse_link_emulation"]

#: the accepted range of each mode's number
RANGES = {"slowdown": (1.0, 1000.0), "tflops": (1e-6, 10000.0)}


@dataclass(frozen=True)
class Emulation:
    """A machine's emulated speed: ``slowdown`` times the host's work, or a fixed ``tflops``
    (0: not emulated at a fixed rate). The default emulates nothing."""

    slowdown: float = 1.0
    tflops: float = 0.0

    @property
    def active(self) -> bool:
        return self.slowdown > 1.0 or self.tflops > 0.0

    def to_dict(self) -> dict[str, float]:
        """The cluster file's ``emulate`` mapping ({} when nothing is emulated)."""
        if self.tflops > 0.0:
            return {"tflops": self.tflops}
        return {"slowdown": self.slowdown} if self.slowdown != 1.0 else {}


def parse_emulation(raw: Any, source: str | None, fp: str) -> Emulation:
    """``emulate: {slowdown: K}`` or ``emulate: {tflops: X}`` (the key given; absent is
    :class:`Emulation`()); ``emulate: null`` is refused (it says nothing: leave the key out)."""
    if raw is None:
        raise HexicoreError("emulate: null says nothing; give {slowdown: K} or {tflops: X}, or leave the key out",
                            source=source, field=fp)
    e = schema.as_mapping(raw, source, fp)
    schema.known_keys(e, set(RANGES), source, fp)
    if len(e) != 1:
        raise HexicoreError("give one of slowdown (times the host's work) or tflops (a fixed speed)",
                            source=source, field=fp)
    (key, value), = e.items()
    k = schema.number(value, source, schema.dotted(fp, key))
    lo, hi = RANGES[key]
    if not lo <= k <= hi:
        raise HexicoreError(f"must be at least {lo:g} and at most {hi:g}, got {k}", source=source,
                            field=schema.dotted(fp, key))
    return Emulation(**{key: float(k)})


@dataclass(frozen=True)
class EmulatedLinks:
    """The links a job's processes are held to (a cluster file's ``emulate: {links: true}``):
    the cluster (a :class:`hexicore.core.cluster.Cluster`) whose declared links they obey and,
    per global rank, the device it stands for."""

    cluster: Any
    devices: tuple[str, ...]


#: the keys of the cluster file's top-level ``emulate``
LINK_KEYS = frozenset({"links"})


def parse_link_emulation(raw: Any, source: str | None, fp: str) -> bool:
    """The cluster file's top-level ``emulate: {links: true}`` (``links: false``: the links
    run at the host's speed, as without the key); ``emulate: null`` and an empty mapping are
    refused (they say nothing: leave the key out)."""
    if raw is None:
        raise HexicoreError("emulate: null says nothing; give {links: true}, or leave the key out",
                            source=source, field=fp)
    e = schema.as_mapping(raw, source, fp)
    schema.known_keys(e, set(LINK_KEYS), source, fp)
    if "links" not in e:
        raise HexicoreError("give links: true (every link held to its bandwidth_gbs and latency_us)",
                            source=source, field=fp)
    if not isinstance(e["links"], bool):
        raise HexicoreError(f"must be true or false, got {e['links']!r}", source=source,
                            field=schema.dotted(fp, "links"))
    return e["links"]
