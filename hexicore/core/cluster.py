"""GPU catalog, machines, devices, links and the device graph (REFERENCE.md §1, DESIGN.md §4b).

A :class:`Cluster` is built from the cluster YAML contract: machines (GPU type, count,
intra-machine bandwidth/latency), a default inter-machine link, optional per-pair link overrides
and optional new or overridden GPU types. Devices are named ``<machine>.<index>``. Pairwise
``alpha(d, d')`` (seconds) and ``beta(d, d')`` (bytes/s) are the symbols of HexiScale App. A.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError

GB = 1e9  # bandwidths are GB/s of bytes, decimal (1 GB = 1e9 bytes)


@dataclass(frozen=True)
class GpuType:
    """One GPU model: peak dense BF16/FP16 tensor TFLOPS (no sparsity) and memory in GB.

    ``intra_gbs`` is the typical intra-machine bandwidth for the synthetic-fleet generator
    (NVLink per direction, or PCIe 4.0 x16 ~ 32 GB/s); cluster files always state their own.
    """

    name: str
    tflops: float
    memory_gb: float
    source: str = ""
    intra_gbs: float = 32.0

    def __post_init__(self) -> None:
        if self.tflops <= 0 or self.memory_gb <= 0:
            raise HexicoreError(f"GPU type {self.name!r} needs positive tflops and memory_gb")


def _g(name: str, tflops: float, memory_gb: float, source: str, intra_gbs: float = 32.0) -> tuple[str, GpuType]:
    return name, GpuType(name, tflops, memory_gb, source, intra_gbs)


# Peak dense BF16/FP16 tensor-core TFLOPS (FP32 accumulate, which BF16 training uses).
GPU_CATALOG: Mapping[str, GpuType] = MappingProxyType(dict([
    _g("a100-40g", 312.0, 40, "NVIDIA A100 datasheet (2021): 312 TFLOPS BF16 dense, 40 GB HBM2", 300),
    _g("a100-80g", 312.0, 80, "NVIDIA A100 datasheet (2021): 312 TFLOPS BF16 dense, 80 GB HBM2e", 300),
    _g("a800-80g-nvlink", 312.0, 80, "A800 = A100 compute with NVLink 400 GB/s bidir (200 GB/s/dir); NVIDIA A800 brief", 200),
    _g("a800-80g-pcie", 312.0, 80, "NVIDIA A800 PCIe 80GB product brief: 312 TFLOPS BF16 dense", 32),
    _g("h100-80g", 989.4, 80, "NVIDIA H100 SXM datasheet: 989.4 TFLOPS BF16 dense (1979 sparse)", 450),
    _g("h200", 989.0, 141, "NVIDIA H200 SXM datasheet: 989 TFLOPS BF16 dense, 141 GB HBM3e", 450),
    _g("rtx4090", 165.2, 24, "Ada whitepaper (RTX 4090): 165.2 TFLOPS FP16 tensor, FP32 accumulate, dense", 32),
    _g("rtx3090", 71.0, 24, "GA102 whitepaper (RTX 3090): 71 TFLOPS FP16 tensor, FP32 accumulate, dense", 16),
    _g("rtx3080ti", 68.2, 12, "GA102 whitepaper scaled to RTX 3080 Ti (80 SMs, 1.665 GHz): FP32-accumulate dense", 24),
    _g("v100-32g", 125.0, 32, "NVIDIA V100 SXM2 datasheet: 125 TFLOPS FP16 tensor, 32 GB HBM2", 150),
    _g("l40s", 362.05, 48, "NVIDIA L40S datasheet: 362.05 TFLOPS BF16 dense, 48 GB GDDR6", 32),
    _g("rtx-a6000", 154.8, 48, "NVIDIA RTX A6000 datasheet: 154.8 TFLOPS FP16 tensor dense, 48 GB GDDR6", 32),
]))


@dataclass(frozen=True)
class Machine:
    """A host with ``count`` GPUs of one type; bandwidth/latency are intra-machine."""

    name: str
    gpu: GpuType
    count: int
    bandwidth_gbs: float
    latency_us: float


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

    # ------------------------------------------------------------------ links
    def bandwidth_gbs(self, a: str, b: str) -> float:
        """One-direction bandwidth between two devices in GB/s (infinite for a device itself)."""
        da, db = self.device(a), self.device(b)
        if da.id == db.id:
            return float("inf")
        if da.machine == db.machine:
            return self._machines[da.machine].bandwidth_gbs
        link = self._links.get(frozenset((da.machine, db.machine)))
        return link.bandwidth_gbs if link else self.inter_bandwidth_gbs

    def latency_us(self, a: str, b: str) -> float:
        da, db = self.device(a), self.device(b)
        if da.id == db.id:
            return 0.0
        if da.machine == db.machine:
            return self._machines[da.machine].latency_us
        link = self._links.get(frozenset((da.machine, db.machine)))
        return link.latency_us if link else self.inter_latency_us

    def beta(self, a: str, b: str) -> float:
        """beta(d, d') of HexiScale App. A in bytes/s."""
        return self.bandwidth_gbs(a, b) * GB

    def alpha(self, a: str, b: str) -> float:
        """alpha(d, d') of HexiScale App. A in seconds."""
        return self.latency_us(a, b) * 1e-6

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

    @property
    def total_tflops(self) -> float:
        return sum(d.tflops for d in self.devices)

    def exclude(self, device_ids: Iterable[str], *, source: str | None = None) -> "Cluster":
        """A copy without ``device_ids``; unknown ids or excluding everything is an error."""
        ids = list(device_ids)
        for i in ids:
            if i not in self._by_id:
                raise HexicoreError(f"unknown device {i!r}; devices are {_brief(self._by_id)}",
                                    source=source, field="exclude")
        left = len(self.devices) - len(set(ids))
        if left <= 0:
            raise HexicoreError("excluding every device leaves nothing to plan on", source=source, field="exclude")
        return replace(self, excluded=tuple(sorted(set(self.excluded) | set(ids))))

    # ----------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """The cluster YAML contract (§4b) plus the resolved ``devices`` list (plan JSON §5)."""
        custom = {m.gpu.name for m in self.machines if GPU_CATALOG.get(m.gpu.name) != m.gpu}
        out: dict[str, Any] = {
            "name": self.name,
            "inter": {"bandwidth_gbs": self.inter_bandwidth_gbs, "latency_us": self.inter_latency_us},
            "machines": [
                {"name": m.name, "gpu": m.gpu.name, "count": m.count,
                 "bandwidth_gbs": m.bandwidth_gbs, "latency_us": m.latency_us}
                for m in self.machines
            ],
            "links": [
                {"between": list(l.between), "bandwidth_gbs": l.bandwidth_gbs, "latency_us": l.latency_us}
                for l in self.links
            ],
        }
        if custom:
            gpus = {m.gpu.name: m.gpu for m in self.machines}
            out["gpus"] = {n: {"tflops": gpus[n].tflops, "memory_gb": gpus[n].memory_gb} for n in sorted(custom)}
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


def _brief(ids: Iterable[str], n: int = 8) -> str:
    ids = list(ids)
    return ", ".join(ids[:n]) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


def _f(prefix: str | None, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_gpu_types(data: Any, source: str | None, prefix: str | None) -> dict[str, GpuType]:
    """The catalog with a file's ``gpus:`` section merged over it (new or overridden types)."""
    catalog = dict(GPU_CATALOG)
    if data is None:
        return catalog
    gpus = schema.as_mapping(data, source, prefix)
    for name, spec in gpus.items():
        fp = _f(prefix, str(name))
        spec = schema.as_mapping(spec, source, fp)
        base = catalog.get(str(name))
        tflops = spec.get("tflops", base.tflops if base else None)
        memory = spec.get("memory_gb", base.memory_gb if base else None)
        if tflops is None:
            raise HexicoreError("missing required field", source=source, field=_f(fp, "tflops"))
        if memory is None:
            raise HexicoreError("missing required field", source=source, field=_f(fp, "memory_gb"))
        catalog[str(name)] = GpuType(
            str(name),
            schema.number(tflops, source, _f(fp, "tflops")),
            schema.number(memory, source, _f(fp, "memory_gb")),
            str(spec.get("source", "cluster file")),
            schema.number(spec.get("intra_gbs", base.intra_gbs if base else 32.0), source, _f(fp, "intra_gbs")),
        )
    return catalog


def parse_cluster(data: Any, source: str | None, prefix: str | None = None) -> Cluster:
    """Validate a cluster mapping (DESIGN.md §4b) into a :class:`Cluster`.

    A mapping with a ``synthetic:`` section is expanded by :func:`synthetic_fleet` first.
    """
    d = schema.as_mapping(data, source, prefix)
    if d.get("synthetic") is not None:
        d = synthetic_fleet_dict(d, source, prefix)
    if d.get("machines") is None and d.get("devices") is not None:
        d = machines_from_devices(d, source, prefix)
    catalog = parse_gpu_types(d.get("gpus"), source, _f(prefix, "gpus"))
    name = schema.string(d.get("name", "cluster"), source, _f(prefix, "name"))
    raw_machines = schema.as_list(schema.get(d, "machines", source, prefix), source, _f(prefix, "machines"))
    if not raw_machines:
        raise HexicoreError("a cluster needs at least one machine", source=source, field=_f(prefix, "machines"))
    machines: list[Machine] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_machines):
        fp = _f(prefix, f"machines[{i}]")
        m = schema.as_mapping(raw, source, fp)
        mname = str(schema.string(schema.get(m, "name", source, fp), source, _f(fp, "name")))
        if mname in seen:
            raise HexicoreError(f"duplicate machine name {mname!r}", source=source, field=_f(fp, "name"))
        if "." in mname:
            raise HexicoreError(f"machine name {mname!r} must not contain '.'", source=source, field=_f(fp, "name"))
        seen.add(mname)
        gname = schema.string(schema.get(m, "gpu", source, fp), source, _f(fp, "gpu"))
        if gname not in catalog:
            raise HexicoreError(f"unknown GPU type {gname!r}; choose one of: {', '.join(sorted(catalog))} "
                                "(or add it under gpus:)", source=source, field=_f(fp, "gpu"))
        machines.append(Machine(
            mname, catalog[gname],
            schema.integer(schema.get(m, "count", source, fp), source, _f(fp, "count"), minimum=1),
            schema.number(schema.get(m, "bandwidth_gbs", source, fp), source, _f(fp, "bandwidth_gbs")),
            schema.number(m.get("latency_us", 0.0), source, _f(fp, "latency_us"), allow_zero=True),
        ))
    inter = d.get("inter")
    if inter is None:
        if len(machines) > 1:
            raise HexicoreError("missing required field (the default inter-machine link)", source=source,
                                field=_f(prefix, "inter"))
        inter = {"bandwidth_gbs": 1.0, "latency_us": 0.0}
    inter = schema.as_mapping(inter, source, _f(prefix, "inter"))
    ip = _f(prefix, "inter")
    inter_bw = schema.number(schema.get(inter, "bandwidth_gbs", source, ip), source, _f(ip, "bandwidth_gbs"))
    inter_lat = schema.number(inter.get("latency_us", 0.0), source, _f(ip, "latency_us"), allow_zero=True)
    links: list[Link] = []
    pairs: set[frozenset] = set()
    for i, raw in enumerate(schema.as_list(d.get("links") or [], source, _f(prefix, "links"))):
        fp = _f(prefix, f"links[{i}]")
        l = schema.as_mapping(raw, source, fp)
        between = schema.as_list(schema.get(l, "between", source, fp), source, _f(fp, "between"))
        if len(between) != 2 or between[0] == between[1]:
            raise HexicoreError("between must name two different machines", source=source, field=_f(fp, "between"))
        for mname in between:
            if str(mname) not in seen:
                raise HexicoreError(f"link names unknown machine {mname!r}", source=source, field=_f(fp, "between"))
        key = frozenset(map(str, between))
        if key in pairs:
            raise HexicoreError(f"duplicate link between {between[0]} and {between[1]}", source=source, field=fp)
        pairs.add(key)
        links.append(Link(
            (str(between[0]), str(between[1])),
            schema.number(schema.get(l, "bandwidth_gbs", source, fp), source, _f(fp, "bandwidth_gbs")),
            schema.number(l.get("latency_us", inter_lat), source, _f(fp, "latency_us"), allow_zero=True),
        ))
    cluster = Cluster(name, tuple(machines), inter_bw, inter_lat, tuple(links), gpus=catalog)
    excluded = d.get("excluded") or []
    if excluded:
        cluster = cluster.exclude(schema.as_list(excluded, source, _f(prefix, "excluded")), source=source)
    return cluster


def machines_from_devices(d: Mapping[str, Any], source: str | None, prefix: str | None) -> dict[str, Any]:
    """A cluster given only as a ``devices`` list (plan JSON from another tool, DESIGN.md §5):
    machines are the devices' ``machine`` names, a GPU type per machine (its ``tflops`` and
    ``memory_gb`` override the catalog's), ids ``<machine>.<index>`` with missing indices
    excluded. Intra-machine links come from ``intra: {bandwidth_gbs, latency_us}`` when given,
    else from the catalog's typical figure for the GPU type (``GpuType.intra_gbs``)."""
    dp = _f(prefix, "devices")
    raw = schema.as_list(d["devices"], source, dp)
    intra = schema.as_mapping(d.get("intra") or {}, source, _f(prefix, "intra"))
    machines: dict[str, dict[str, Any]] = {}
    present: set[str] = set()
    gpus = dict(schema.as_mapping(d.get("gpus") or {}, source, _f(prefix, "gpus")))
    for i, r in enumerate(raw):
        fp = f"{dp}[{i}]"
        r = schema.as_mapping(r, source, fp)
        did = schema.string(schema.get(r, "id", source, fp), source, _f(fp, "id"))
        mname, _, idx = did.rpartition(".")
        if not mname or not idx.isdigit():
            raise HexicoreError(f"device id {did!r} is not <machine>.<index>", source=source, field=_f(fp, "id"))
        if r.get("machine") is not None and str(r["machine"]) != mname:
            raise HexicoreError(f"device {did!r} names machine {r['machine']!r}", source=source,
                                field=_f(fp, "machine"))
        gpu = schema.string(schema.get(r, "gpu", source, fp), source, _f(fp, "gpu"))
        m = machines.setdefault(mname, {"name": mname, "gpu": gpu, "count": 0})
        if m["gpu"] != gpu:
            raise HexicoreError(f"machine {mname!r} mixes GPU types {m['gpu']!r} and {gpu!r}", source=source,
                                field=_f(fp, "gpu"))
        m["count"] = max(m["count"], int(idx) + 1)
        present.add(did)
        if r.get("tflops") is not None or r.get("memory_gb") is not None:
            spec = dict(gpus.get(gpu) or {})
            spec.update({k: r[k] for k in ("tflops", "memory_gb") if r.get(k) is not None})
            gpus[gpu] = spec
    catalog = parse_gpu_types(gpus, source, _f(prefix, "gpus"))
    for m in machines.values():
        if m["gpu"] not in catalog:
            raise HexicoreError(f"unknown GPU type {m['gpu']!r} without tflops/memory_gb", source=source, field=dp)
        m["bandwidth_gbs"] = intra.get("bandwidth_gbs", catalog[m["gpu"]].intra_gbs)
        m["latency_us"] = intra.get("latency_us", 0.0)
    out = {k: v for k, v in d.items() if k not in ("devices", "intra")}
    out["machines"] = list(machines.values())
    out["gpus"] = gpus
    missing = [f"{m['name']}.{i}" for m in machines.values() for i in range(m["count"])
               if f"{m['name']}.{i}" not in present]
    out["excluded"] = sorted(set(out.get("excluded") or []) | set(missing))
    return out


def synthetic_fleet_dict(d: Mapping[str, Any], source: str | None, prefix: str | None) -> dict[str, Any]:
    """Expand ``synthetic: {gpus, mix, seed, per_machine, inter_gbs, inter_latency_us}`` into a
    cluster mapping: ``gpus`` GPUs drawn from the ``mix`` weights with a seeded RNG, packed into
    machines of ``per_machine`` GPUs of one type, intra bandwidth from the catalog."""
    sp = _f(prefix, "synthetic")
    s = schema.as_mapping(d["synthetic"], source, sp)
    n = schema.integer(schema.get(s, "gpus", source, sp), source, _f(sp, "gpus"))
    mix = schema.as_mapping(schema.get(s, "mix", source, sp), source, _f(sp, "mix"))
    seed = schema.integer(s.get("seed", 0), source, _f(sp, "seed"), minimum=0)
    per = schema.integer(s.get("per_machine", 8), source, _f(sp, "per_machine"))
    catalog = parse_gpu_types(d.get("gpus"), source, _f(prefix, "gpus"))
    weights = {}
    for g, w in mix.items():
        if g not in catalog:
            raise HexicoreError(f"unknown GPU type {g!r}", source=source, field=_f(sp, f"mix.{g}"))
        weights[g] = schema.number(w, source, _f(sp, f"mix.{g}"))
    return synthetic_fleet(n, weights, seed=seed, per_machine=per,
                           inter_gbs=schema.number(s.get("inter_gbs", 0.7), source, _f(sp, "inter_gbs")),
                           inter_latency_us=schema.number(s.get("inter_latency_us", 50.0), source,
                                                          _f(sp, "inter_latency_us"), allow_zero=True),
                           name=str(d.get("name", f"synthetic{n}")), catalog=catalog)


def synthetic_fleet(n: int, mix: Mapping[str, float], *, seed: int = 0, per_machine: int = 8,
                    inter_gbs: float = 0.7, inter_latency_us: float = 50.0, name: str | None = None,
                    catalog: Mapping[str, GpuType] = GPU_CATALOG) -> dict[str, Any]:
    """A cluster mapping of ``n`` GPUs for scale tests: machine types drawn from ``mix``
    (relative weights) with ``random.Random(seed)``; each machine holds ``per_machine`` GPUs
    (the last may hold fewer). Deterministic for a given seed."""
    rng = random.Random(seed)
    types = sorted(mix)
    weights = [mix[t] for t in types]
    machines, left, i = [], n, 0
    while left > 0:
        gpu = rng.choices(types, weights)[0]
        count = min(per_machine, left)
        machines.append({"name": f"m{i}", "gpu": gpu, "count": count,
                         "bandwidth_gbs": catalog[gpu].intra_gbs, "latency_us": 5.0})
        left -= count
        i += 1
    return {"name": name or f"synthetic{n}", "inter": {"bandwidth_gbs": inter_gbs, "latency_us": inter_latency_us},
            "machines": machines}
