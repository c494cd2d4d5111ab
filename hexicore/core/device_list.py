"""A cluster's ``devices`` list (docs/formats.md, "Plan JSON"): one entry per usable device,
``{id, machine, gpu, tflops, memory_gb}``, as :meth:`hexicore.core.cluster.Cluster.to_dict`
writes it into every plan.

It is read in one of two ways, never ignored:

* without ``machines`` (a plan from another tool), the list *is* the cluster:
  :func:`machines_from_devices` derives the machines from it;
* beside ``machines`` (every plan ``hexicore plan`` writes) it is redundant, and
  :func:`check_devices` refuses any entry that does not agree with what the machines give, so an
  edited ``tflops`` or a dropped, duplicated or invented device is one error, not silently rebuilt.

Either way each entry's fields are checked (:func:`device_entry`): ``tflops`` and ``memory_gb``
within the ranges of docs/formats.md, "Limits", errors naming ``devices[i].<field>``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.gpus import GPU_CATALOG, parse_gpu_types

#: the fields of one ``devices`` entry (what ``Cluster.to_dict`` writes)
DEVICE_KEYS = frozenset({"id", "machine", "gpu", "tflops", "memory_gb"})
#: the per-GPU figures an entry may give, with their ranges (docs/formats.md, "Limits")
FIGURES = {"tflops": (limits.TFLOPS, "TFLOPS"), "memory_gb": (limits.MEMORY_GB, "GB")}


def device_entry(raw: Any, source: str | None, fp: str) -> dict[str, Any]:
    """One entry of a ``devices`` list, checked field by field (errors name ``fp.<field>``):
    ``id`` (required) ``<machine>.<index>``; ``machine``, if given, the id's machine; ``gpu`` a
    string; ``tflops``/``memory_gb`` within their ranges. Absent optional fields are None."""
    r = schema.as_mapping(raw, source, fp)
    schema.known_keys(r, DEVICE_KEYS, source, fp)
    did = schema.string(schema.get(r, "id", source, fp), source, schema.dotted(fp, "id"))
    mname, _, idx = did.rpartition(".")
    if not mname or not (idx.isascii() and idx.isdigit()):
        raise HexicoreError(f"device id {did!r} is not <machine>.<index>", source=source, field=schema.dotted(fp, "id"))
    if idx != str(int(idx)):  # M.01 would name device M.1 under another id
        raise HexicoreError(f"device id {did!r}: write the index without leading zeros ({mname}.{int(idx)})",
                            source=source, field=schema.dotted(fp, "id"))
    limits.check(int(idx) + 1, limits.MAX_DEVICES, "GPUs in one machine", source=source, field=schema.dotted(fp, "id"))
    if r.get("machine") is not None and str(r["machine"]) != mname:
        raise HexicoreError(f"device {did!r} names machine {r['machine']!r}", source=source,
                            field=schema.dotted(fp, "machine"))
    out: dict[str, Any] = {"id": did, "machine": mname, "index": int(idx), "gpu": None}
    if r.get("gpu") is not None:
        out["gpu"] = schema.string(r["gpu"], source, schema.dotted(fp, "gpu"))
    for key, (bounds, unit) in FIGURES.items():
        v = r.get(key)
        out[key] = None if v is None else limits.quantity(v, bounds, unit, source, schema.dotted(fp, key))
    return out


def machines_from_devices(d: Mapping[str, Any], source: str | None, prefix: str | None) -> dict[str, Any]:
    """A cluster given only as a ``devices`` list (plan JSON from another tool, docs/formats.md):
    machines are the devices' ``machine`` names, a GPU type per machine (its ``tflops`` and
    ``memory_gb`` override the catalog's; every device of one type must give the same figures),
    ids ``<machine>.<index>`` with missing indices excluded. Intra-machine links come from
    ``intra: {bandwidth_gbs, latency_us}`` when given, else from the catalog's typical figure for
    the GPU type (``GpuType.intra_gbs``). A duplicate id is refused."""
    dp = schema.dotted(prefix, "devices")
    raw = schema.as_list(d["devices"], source, dp)
    if not raw:
        raise HexicoreError("a cluster given as devices needs at least one device", source=source, field=dp)
    intra = _intra(d, source, schema.dotted(prefix, "intra"))
    machines: dict[str, dict[str, Any]] = {}
    present: dict[str, int] = {}
    section = schema.optional_mapping(d, "gpus", source, schema.dotted(prefix, "gpus"))
    gpus = dict(section)
    figures: dict[tuple[str, str], tuple[float, int]] = {}  # (gpu, figure) -> (value, the entry that gave it)
    first_of: dict[str, int] = {}  # gpu -> its first entry
    for i, r in enumerate(raw):
        fp = f"{dp}[{i}]"
        e = device_entry(r, source, fp)
        did, mname, gpu = e["id"], e["machine"], e["gpu"]
        if gpu is None:
            raise HexicoreError("missing required field", source=source, field=schema.dotted(fp, "gpu"))
        if did in present:
            raise HexicoreError(f"duplicate device {did!r} (also {dp}[{present[did]}])", source=source,
                                field=schema.dotted(fp, "id"))
        present[did] = i
        if "." in mname:  # the machine this id derives would be refused, naming a field the file lacks
            raise HexicoreError(f"machine name {mname!r} (the id up to its last '.') must not contain '.'",
                                source=source, field=schema.dotted(fp, "id"))
        m = machines.setdefault(mname, {"name": mname, "gpu": gpu, "count": 0})
        if m["gpu"] != gpu:
            raise HexicoreError(f"machine {mname!r} mixes GPU types {m['gpu']!r} and {gpu!r}", source=source,
                                field=schema.dotted(fp, "gpu"))
        m["count"] = max(m["count"], e["index"] + 1)
        first_of.setdefault(gpu, i)
        for key in FIGURES:
            if e[key] is None:
                continue
            first = figures.setdefault((gpu, key), (e[key], i))
            if not same(e[key], first[0]):
                raise HexicoreError(f"{e[key]:g} disagrees with {dp}[{first[1]}] of the same GPU type {gpu!r} "
                                    f"({first[0]:g})", source=source, field=schema.dotted(fp, key))
            spec = gpus.get(gpu) or {}
            gpus[gpu] = {**schema.as_mapping(spec, source, schema.dotted(prefix, f"gpus.{gpu}")), key: e[key]}
    for gpu, i in first_of.items():  # a new type needs its figures from the devices or gpus:
        for key in FIGURES:
            if gpu not in GPU_CATALOG and gpu not in section and (gpu, key) not in figures:
                raise HexicoreError(f"missing required field (GPU type {gpu!r} is not in the catalog nor under "
                                    "gpus:)", source=source, field=schema.dotted(f"{dp}[{i}]", key))
    limits.check(sum(m["count"] for m in machines.values()), limits.MAX_DEVICES, "GPUs", source=source, field=dp)
    catalog = parse_gpu_types(gpus, source, schema.dotted(prefix, "gpus"))
    for m in machines.values():
        m["bandwidth_gbs"] = intra.get("bandwidth_gbs", catalog[m["gpu"]].intra_gbs)
        m["latency_us"] = intra.get("latency_us", 0.0)
    out = {k: v for k, v in d.items() if k not in ("devices", "intra")}
    out["machines"] = list(machines.values())
    out["gpus"] = gpus
    missing = [f"{m['name']}.{i}" for m in machines.values() for i in range(m["count"])
               if f"{m['name']}.{i}" not in present]
    given = schema.optional_list(d, "excluded", source, schema.dotted(prefix, "excluded"))
    out["excluded"] = [*given, *(i for i in missing if i not in given)]  # Cluster.exclude checks each id
    return out


def _intra(d: Mapping[str, Any], source: str | None, ip: str) -> dict[str, float]:
    """``intra: {bandwidth_gbs, latency_us}`` (both optional), checked here so that an error names
    ``intra.<field>``, not a field of the machines derived from the list."""
    raw = schema.optional_mapping(d, "intra", source, ip)
    schema.known_keys(raw, {"bandwidth_gbs", "latency_us"}, source, ip)
    out: dict[str, float] = {}
    if raw.get("bandwidth_gbs") is not None:
        out["bandwidth_gbs"] = limits.bandwidth(raw["bandwidth_gbs"], source, schema.dotted(ip, "bandwidth_gbs"))
    if raw.get("latency_us") is not None:
        out["latency_us"] = limits.latency(raw["latency_us"], source, schema.dotted(ip, "latency_us"))
    return out


def same(a: float, b: float) -> bool:
    """Two figures agree: equal up to float formatting (relative 1e-9)."""
    return math.isclose(a, b, rel_tol=1e-9)


def check_devices(cluster: Any, raw: Any, source: str | None, prefix: str | None) -> None:
    """Refuse a ``devices`` list that disagrees with ``cluster`` (built from the machines): the
    ids must be exactly the cluster's usable devices (excluded ones are not listed), each once;
    each entry's ``machine``, ``gpu``, ``tflops`` and ``memory_gb``, where given, those of its
    machine's GPU type. One line naming ``devices[i].<field>`` (or ``devices`` for a missing id)."""
    dp = schema.dotted(prefix, "devices")
    entries = schema.as_list(raw, source, dp)
    want = {dev.id: dev for dev in cluster.devices}
    seen: dict[str, int] = {}
    for i, r in enumerate(entries):
        fp = f"{dp}[{i}]"
        e = device_entry(r, source, fp)
        did = e["id"]
        if did in seen:
            raise HexicoreError(f"duplicate device {did!r} (also {dp}[{seen[did]}])", source=source,
                                field=schema.dotted(fp, "id"))
        seen[did] = i
        dev = want.get(did)
        if dev is None:
            why = "is excluded" if did in cluster.excluded else "is not one of the machines' devices"
            raise HexicoreError(f"device {did!r} {why}", source=source, field=schema.dotted(fp, "id"))
        if e["gpu"] is not None and e["gpu"] != dev.gpu.name:
            raise HexicoreError(f"{e['gpu']!r} disagrees with machine {dev.machine}'s GPU type {dev.gpu.name!r}",
                                source=source, field=schema.dotted(fp, "gpu"))
        for key in FIGURES:
            if e[key] is not None and not same(e[key], getattr(dev, key)):
                raise HexicoreError(f"{e[key]:g} disagrees with machine {dev.machine}'s {dev.gpu.name} "
                                    f"({getattr(dev, key):g})", source=source, field=schema.dotted(fp, key))
    missing = [did for did in want if did not in seen]
    if missing:
        shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise HexicoreError(f"lacks device(s) {shown} that the machines give", source=source, field=dp)
