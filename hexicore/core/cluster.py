"""Machines, devices, links and the device graph of a cluster (the cluster YAML contract:
docs/formats.md and the files under conf/cluster/).

A :class:`Cluster` is built from the cluster YAML contract: machines (GPU type, count,
intra-machine bandwidth/latency), a default inter-machine link, optional per-pair link overrides
and optional new or overridden GPU types. Devices are named ``<machine>.<index>``. Pairwise
``alpha(d, d')`` (seconds) and ``beta(d, d')`` (bytes/s) are the symbols of HexiScale App. A.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.zones import fill_zone_links, parse_inter, parse_links, parse_zones
from hexicore.core.device_list import check_devices, machines_from_devices
from hexicore.core.emulation import EmulatedLinks, Emulation, parse_emulation, parse_link_emulation
from hexicore.core.fleet import synthetic_fleet, synthetic_fleet_dict
from hexicore.core.gpus import GPU_CATALOG, GpuType, parse_gpu_types

__all__ = ["GB", "GPU_CATALOG", "Cluster", "Device", "GpuType", "Link", "Machine", "machines_from_devices",
           "parse_cluster", "parse_gpu_types", "synthetic_fleet", "synthetic_fleet_dict"]

GB = 1e9  # bandwidths are GB/s of bytes, decimal (1 GB = 1e9 bytes)


@dataclass(frozen=True)
class Machine:
    """A host with ``count`` GPUs of one type; bandwidth/latency are intra-machine.

    ``emulate`` (the cluster file's ``emulate: {slowdown: K}`` or ``{tflops: X}``) is a test aid,
    never a default: the runtime makes this machine's devices slower than the host
    (:mod:`hexicore.core.emulation`), so one host can stand for devices of different speeds
    (docs/runtime.md). The analytic cost model does not see it; ``hexicore profile`` measures it
    like any device."""

    name: str
    gpu: GpuType
    count: int
    bandwidth_gbs: float
    latency_us: float
    emulate: Emulation = Emulation()
    zone: str | None = None  # the zone/region it stands in (None: the cluster's single default zone)
    max_tp: int | None = None  # the largest TP group its GPUs may form (None: no cap of its own)

    @property
    def slowdown(self) -> float:
        return self.emulate.slowdown


@dataclass(frozen=True)
class Device:
    """One GPU, id ``<machine>.<index>``."""

    id: str
    machine: str
    index: int
    gpu: GpuType

    @property
    def tflops(self) -> float:
        return self.gpu.tflops

    @property
    def memory_gb(self) -> float:
        return self.gpu.memory_gb


@dataclass(frozen=True)
class Link:
    """A per-machine-pair override of the default inter-machine link."""

    between: tuple[str, str]
    bandwidth_gbs: float
    latency_us: float


@dataclass(frozen=True)
class Cluster:
    """Machines and links; ``excluded`` device ids are dropped (e.g. after a failure)."""

    name: str
    machines: tuple[Machine, ...]
    inter_bandwidth_gbs: float
    inter_latency_us: float
    links: tuple[Link, ...] = ()
    excluded: tuple[str, ...] = ()
    gpus: Mapping[str, GpuType] = field(default_factory=dict, compare=False)
    inter_zone: tuple[float, float] | None = None  # (GB/s, us) between machines of different zones
    zone_links: tuple[Link, ...] = ()  # per zone-pair overrides of inter_zone
    emulate_links: bool = False  # the cluster file's ``emulate: {links: true}`` (a test aid)

    @property
    def zones(self) -> tuple[str, ...]:
        """The zone names, in machine order (empty when no machine names one)."""
        return tuple(dict.fromkeys(m.zone for m in self.machines if m.zone is not None))

    # ----------------------------------------------------------------- devices
    @cached_property
    def devices(self) -> tuple[Device, ...]:
        """All usable devices in machine order, then index order (the Megatron rank order)."""
        gone = set(self.excluded)
        return tuple(
            Device(f"{m.name}.{i}", m.name, i, m.gpu)
            for m in self.machines
            for i in range(m.count)
            if f"{m.name}.{i}" not in gone
        )

    @cached_property
    def _by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}

    @cached_property
    def _machines(self) -> dict[str, Machine]:
        return {m.name: m for m in self.machines}

    @cached_property
    def _links(self) -> dict[frozenset, Link]:
        return {frozenset(l.between): l for l in self.links}

    def device(self, device_id: str) -> Device:
        try:
            return self._by_id[device_id]
        except KeyError:
            raise HexicoreError(f"unknown device {device_id!r} in cluster {self.name!r}") from None

    def has_device(self, device_id: str) -> bool:
        return device_id in self._by_id

    def machine(self, name: str) -> Machine:
        return self._machines[name]

    def slowdown(self, device_id: str) -> float:
        """The emulated slowdown of a device's machine (1.0 unless the cluster file says ``emulate``)."""
        return self._machines[self.device(device_id).machine].slowdown

    def max_tp(self, devices: Iterable[str]) -> int | None:
        """The largest TP group ``devices`` may form: the smallest ``max_tp`` of their machines
        (None: no machine caps it)."""
        names = {self.device(d).machine for d in devices}  # (by name: a machine's hash is dear)
        caps = [self._machines[n].max_tp for n in names if self._machines[n].max_tp is not None]
        return min(caps) if caps else None

    def emulation(self, device_id: str) -> Emulation:
        """How a device's machine is emulated (nothing unless the cluster file says ``emulate``)."""
        return self._machines[self.device(device_id).machine].emulate

    def emulated_links(self, devices: Iterable[str]) -> EmulatedLinks | None:
        """The links a job whose global ranks stand for ``devices`` (in rank order) is held to
        (:mod:`hexicore.core.emulation`); None unless the cluster file says ``emulate: {links: true}``."""
        # a copy without this one's caches (the cost model's memo may hold what cannot be pickled)
        return EmulatedLinks(replace(self), tuple(devices)) if self.emulate_links else None

    # ------------------------------------------------------------------ links
    @cached_property
    def _pair_cache(self) -> dict[tuple[str, str], tuple[float, float]]:
        return {}

    def _pair(self, a: str, b: str) -> tuple[float, float]:
        """(bandwidth GB/s, latency us) between two devices, cached per machine pair (the
        search asks millions of times)."""
        by_id = self._by_id
        da, db = by_id.get(a) or self.device(a), by_id.get(b) or self.device(b)
        if a == b:
            return (float("inf"), 0.0)
        key = (da.machine, db.machine)
        hit = self._pair_cache.get(key)
        if hit is None:
            if da.machine == db.machine:
                m = self._machines[da.machine]
                hit = (m.bandwidth_gbs, m.latency_us)
            else:
                link = self._links.get(frozenset(key))
                hit = (link.bandwidth_gbs, link.latency_us) if link else self._between_machines(*key)
            self._pair_cache[key] = hit
        return hit

    def _between_machines(self, a: str, b: str) -> tuple[float, float]:
        """Two machines without a pair override: the zone-pair link or ``inter_zone`` when their
        zones differ, else ``inter``."""
        za, zb = self._machines[a].zone, self._machines[b].zone
        if za != zb:
            zl = next((l for l in self.zone_links if set(l.between) == {za, zb}), None)
            if zl is not None:
                return (zl.bandwidth_gbs, zl.latency_us)
            if self.inter_zone is not None:
                return self.inter_zone
        return (self.inter_bandwidth_gbs, self.inter_latency_us)

    @cached_property
    def link_matrices(self) -> tuple[dict[str, int], "Any", "Any"]:
        """(device id -> its machine's row, bandwidth GB/s and latency us per machine pair):
        inside a machine its intra link, between two its per-pair override, else between zones
        their zone link (or ``inter_zone``), else the default (as :meth:`_pair`)."""
        import numpy as np

        row = {m.name: i for i, m in enumerate(self.machines)}
        k = len(row)
        bw, lat = np.full((k, k), float(self.inter_bandwidth_gbs)), np.full((k, k), float(self.inter_latency_us))
        fill_zone_links(self, bw, lat)
        for link in self.links:
            a, b = (row[x] for x in link.between)
            bw[a, b] = bw[b, a] = link.bandwidth_gbs
            lat[a, b] = lat[b, a] = link.latency_us
        for i, m in enumerate(self.machines):
            bw[i, i], lat[i, i] = m.bandwidth_gbs, m.latency_us
        return {d.id: row[d.machine] for d in self.devices}, bw, lat

    @cached_property
    def memo(self) -> dict:
        """Cost-model values that depend only on this cluster's links (keys chosen by the cost
        model, e.g. per machine rows of :attr:`link_matrices`); lives and dies with the cluster."""
        return {}

    def bandwidth_gbs(self, a: str, b: str) -> float:
        """One-direction bandwidth between two devices in GB/s (infinite for a device itself)."""
        return self._pair(a, b)[0]

    def latency_us(self, a: str, b: str) -> float:
        return self._pair(a, b)[1]

    def beta(self, a: str, b: str) -> float:
        """beta(d, d') of HexiScale App. A in bytes/s."""
        return self._pair(a, b)[0] * GB

    def alpha(self, a: str, b: str) -> float:
        """alpha(d, d') of HexiScale App. A in seconds."""
        return self._pair(a, b)[1] * 1e-6

    # ------------------------------------------------------------------ graph
    def graph(self):
        """The device graph of HexiScale §4.2: complete graph, vertex weight ``tflops``,
        edge weight ``bandwidth`` (GB/s); nodes also carry ``machine`` and ``memory_gb``."""
        import networkx as nx

        g = nx.Graph()
        for d in self.devices:
            g.add_node(d.id, tflops=d.tflops, memory_gb=d.memory_gb, machine=d.machine)
        devs = self.devices
        for i, a in enumerate(devs):
            for b in devs[i + 1:]:
                g.add_edge(a.id, b.id, bandwidth=self.bandwidth_gbs(a.id, b.id),
                           latency_us=self.latency_us(a.id, b.id))
        return g

    def device_graph(self):
        """The same graph held as per-machine-pair matrices
        (:class:`hexicore.core.device_graph.DeviceGraph`): what the planner partitions, in
        memory proportional to machines^2 rather than devices^2 edge objects."""
        from hexicore.core.device_graph import DeviceGraph

        return DeviceGraph.from_cluster(self)

    @property
    def total_tflops(self) -> float:
        return sum(d.tflops for d in self.devices)

    def exclude(self, device_ids: Iterable[str], *, source: str | None = None, field: str = "exclude") -> "Cluster":
        """A copy without ``device_ids``; unknown ids or excluding everything is an error naming
        ``field`` (the command line's ``exclude``, a cluster file's ``excluded``), an id listed
        twice one naming ``field[i]``, its second place."""
        ids = list(device_ids)
        first: dict[str, int] = {}
        for k, i in enumerate(ids):
            if not isinstance(i, str) or i not in self._by_id:
                raise HexicoreError(f"unknown device {i!r}; devices are {_brief(self._by_id)}", source=source, field=field)
            if i in first:
                raise HexicoreError(f"device {i!r} is listed twice (also {field}[{first[i]}])", source=source,
                                    field=f"{field}[{k}]")
            first[i] = k
        left = len(self.devices) - len(set(ids))
        if left <= 0:
            raise HexicoreError("excluding every device leaves nothing to plan on", source=source, field=field)
        return replace(self, excluded=tuple(sorted(set(self.excluded) | set(ids))))

    # ----------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """The cluster YAML contract plus the resolved ``devices`` list (plan JSON, docs/formats.md)."""
        custom = {m.gpu.name for m in self.machines if GPU_CATALOG.get(m.gpu.name) != m.gpu}
        out: dict[str, Any] = {
            "name": self.name,
            "inter": {"bandwidth_gbs": self.inter_bandwidth_gbs, "latency_us": self.inter_latency_us},
            "machines": [
                {"name": m.name, "gpu": m.gpu.name, "count": m.count,
                 "bandwidth_gbs": m.bandwidth_gbs, "latency_us": m.latency_us,
                 **({"emulate": m.emulate.to_dict()} if m.emulate.active else {}),
                 **({"zone": m.zone} if m.zone is not None else {}),
                 **({"max_tp": m.max_tp} if m.max_tp is not None else {})}
                for m in self.machines
            ],
            "links": [
                {"between": list(l.between), "bandwidth_gbs": l.bandwidth_gbs, "latency_us": l.latency_us}
                for l in self.links
            ],
        }
        if self.inter_zone is not None:
            out["inter_zone"] = {"bandwidth_gbs": self.inter_zone[0], "latency_us": self.inter_zone[1]}
        if self.zone_links:
            out["zone_links"] = [{"between": list(l.between), "bandwidth_gbs": l.bandwidth_gbs,
                                  "latency_us": l.latency_us} for l in self.zone_links]
        if self.emulate_links:
            out["emulate"] = {"links": True}
        if custom:
            gpus = {m.gpu.name: m.gpu for m in self.machines}
            out["gpus"] = {n: _gpu_entry(gpus[n]) for n in sorted(custom)}
        if self.excluded:
            out["excluded"] = list(self.excluded)
        out["devices"] = [
            {"id": d.id, "machine": d.machine, "gpu": d.gpu.name, "tflops": d.tflops, "memory_gb": d.memory_gb}
            for d in self.devices
        ]
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, prefix: str | None = None) -> "Cluster":
        return parse_cluster(data, source, prefix)

    @classmethod
    def load(cls, path: str | Path) -> "Cluster":
        return parse_cluster(schema.load_yaml(path, "cluster"), str(path), None)


def _gpu_entry(g: GpuType) -> dict[str, Any]:
    """A ``gpus:`` entry that reads back as the same :class:`GpuType` (sources included)."""
    out = {"tflops": g.tflops, "memory_gb": g.memory_gb, "source": g.source, "intra_gbs": g.intra_gbs}
    if g.price_per_hour is not None:
        out.update(price_per_hour=g.price_per_hour, price_source=g.price_source)
    return out


def _brief(ids: Iterable[str], n: int = 8) -> str:
    ids = list(ids)
    return ", ".join(ids[:n]) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


#: the cluster file's fields (docs/formats.md); ``devices`` is the resolved list a plan JSON carries
CLUSTER_KEYS = frozenset({"name", "machines", "inter", "links", "gpus", "excluded", "devices", "intra", "synthetic",
                          "inter_zone", "zone_links", "emulate"})
MACHINE_KEYS = frozenset({"name", "gpu", "count", "bandwidth_gbs", "latency_us", "emulate", "zone", "max_tp"})


def parse_cluster(data: Any, source: str | None, prefix: str | None = None) -> Cluster:
    """Validate a cluster mapping (the cluster YAML contract) into a :class:`Cluster`.

    A mapping with a ``synthetic:`` section is expanded by :func:`synthetic_fleet` first; one with
    only ``devices`` by :func:`machines_from_devices`. A ``devices`` list is always checked against
    the cluster built (:func:`check_devices`): beside ``machines`` it must agree with them.
    """
    d = schema.as_mapping(data, source, prefix)
    schema.known_keys(d, CLUSTER_KEYS, source, prefix)
    if d.get("synthetic") is not None:
        d = synthetic_fleet_dict(d, source, prefix)
    raw_devices = d.get("devices")
    if d.get("machines") is not None and d.get("intra") is not None:
        raise HexicoreError("applies only to a cluster given as devices; beside machines give each machine's "
                            "bandwidth_gbs/latency_us", source=source, field=schema.dotted(prefix, "intra"))
    if d.get("machines") is None and raw_devices is not None:
        d = machines_from_devices(d, source, prefix)
    catalog = parse_gpu_types(d.get("gpus"), source, schema.dotted(prefix, "gpus"))
    name = schema.string(d.get("name", "cluster"), source, schema.dotted(prefix, "name"))
    raw_machines = schema.as_list(schema.get(d, "machines", source, prefix), source, schema.dotted(prefix, "machines"))
    if not raw_machines:
        raise HexicoreError("a cluster needs at least one machine", source=source, field=schema.dotted(prefix, "machines"))
    machines: list[Machine] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_machines):
        fp = schema.dotted(prefix, f"machines[{i}]")
        m = schema.as_mapping(raw, source, fp)
        schema.known_keys(m, MACHINE_KEYS, source, fp)
        mname = str(schema.string(schema.get(m, "name", source, fp), source, schema.dotted(fp, "name")))
        if mname in seen:
            raise HexicoreError(f"duplicate machine name {mname!r}", source=source, field=schema.dotted(fp, "name"))
        if "." in mname:
            raise HexicoreError(f"machine name {mname!r} must not contain '.'", source=source, field=schema.dotted(fp, "name"))
        seen.add(mname)
        gname = schema.string(schema.get(m, "gpu", source, fp), source, schema.dotted(fp, "gpu"))
        if gname not in catalog:
            raise HexicoreError(f"unknown GPU type {gname!r}; choose one of: {', '.join(sorted(catalog))} "
                                "(or add it under gpus:)", source=source, field=schema.dotted(fp, "gpu"))
        machines.append(Machine(
            mname, catalog[gname],
            schema.integer(schema.get(m, "count", source, fp), source, schema.dotted(fp, "count"), minimum=1),
            limits.bandwidth(catalog[gname].intra_gbs if m.get("bandwidth_gbs") is None else m["bandwidth_gbs"],
                             source, schema.dotted(fp, "bandwidth_gbs")),
            limits.latency(m.get("latency_us", 0.0), source, schema.dotted(fp, "latency_us")),
            parse_emulation(m["emulate"], source, schema.dotted(fp, "emulate")) if "emulate" in m else Emulation(),
            None if m.get("zone") is None else str(schema.string(m["zone"], source, schema.dotted(fp, "zone"))),
            None if m.get("max_tp") is None else schema.integer(m["max_tp"], source, schema.dotted(fp, "max_tp"),
                                                                minimum=1),
        ))
    limits.check(sum(m.count for m in machines), limits.MAX_DEVICES, "GPUs", source=source,
                 field=schema.dotted(prefix, "machines"))
    inter_bw, inter_lat = parse_inter(d, len(machines), source, prefix)
    inter_zone, zone_pairs = parse_zones(d, {m.zone for m in machines if m.zone is not None}, (inter_bw, inter_lat),
                                         source, prefix)
    emulate_links = parse_link_emulation(d["emulate"], source, schema.dotted(prefix, "emulate")) if "emulate" in d \
        else False
    base = Cluster(name, tuple(machines), inter_bw, inter_lat, gpus=catalog, inter_zone=inter_zone,
                   zone_links=tuple(Link(*z) for z in zone_pairs), emulate_links=emulate_links)
    # a pair override without latency_us keeps the latency of the link it replaces (docs/formats.md)
    links = parse_links(d, seen, lambda a, b: base._between_machines(a, b)[1], source, prefix)
    cluster = replace(base, links=tuple(Link(*x) for x in links))
    ep = schema.dotted(prefix, "excluded")
    excluded = schema.optional_list(d, "excluded", source, ep)
    if excluded:
        cluster = cluster.exclude(excluded, source=source, field=ep)
    if raw_devices is not None:
        check_devices(cluster, raw_devices, source, prefix)
    return cluster


