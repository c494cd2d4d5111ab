"""Other ways to write a cluster, expanded into the machines form :func:`hexicore.core.cluster.parse_cluster`
reads: a plain ``devices`` list (plan JSON from another tool, docs/formats.md) and a seeded
``synthetic:`` fleet for scale tests.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.gpus import GPU_CATALOG, GpuType, parse_gpu_types


def machines_from_devices(d: Mapping[str, Any], source: str | None, prefix: str | None) -> dict[str, Any]:
    """A cluster given only as a ``devices`` list (plan JSON from another tool, docs/formats.md):
    machines are the devices' ``machine`` names, a GPU type per machine (its ``tflops`` and
    ``memory_gb`` override the catalog's), ids ``<machine>.<index>`` with missing indices
    excluded. Intra-machine links come from ``intra: {bandwidth_gbs, latency_us}`` when given,
    else from the catalog's typical figure for the GPU type (``GpuType.intra_gbs``)."""
    dp = schema.dotted(prefix, "devices")
    raw = schema.as_list(d["devices"], source, dp)
    intra = schema.as_mapping(d.get("intra") or {}, source, schema.dotted(prefix, "intra"))
    machines: dict[str, dict[str, Any]] = {}
    present: set[str] = set()
    gpus = dict(schema.as_mapping(d.get("gpus") or {}, source, schema.dotted(prefix, "gpus")))
    for i, r in enumerate(raw):
        fp = f"{dp}[{i}]"
        r = schema.as_mapping(r, source, fp)
        schema.known_keys(r, {"id", "machine", "gpu", "tflops", "memory_gb"}, source, fp)
        did = schema.string(schema.get(r, "id", source, fp), source, schema.dotted(fp, "id"))
        mname, _, idx = did.rpartition(".")
        if not mname or not idx.isdigit():
            raise HexicoreError(f"device id {did!r} is not <machine>.<index>", source=source, field=schema.dotted(fp, "id"))
        if r.get("machine") is not None and str(r["machine"]) != mname:
            raise HexicoreError(f"device {did!r} names machine {r['machine']!r}", source=source,
                                field=schema.dotted(fp, "machine"))
        gpu = schema.string(schema.get(r, "gpu", source, fp), source, schema.dotted(fp, "gpu"))
        m = machines.setdefault(mname, {"name": mname, "gpu": gpu, "count": 0})
        if m["gpu"] != gpu:
            raise HexicoreError(f"machine {mname!r} mixes GPU types {m['gpu']!r} and {gpu!r}", source=source,
                                field=schema.dotted(fp, "gpu"))
        limits.check(int(idx) + 1, limits.MAX_DEVICES, "GPUs in one machine", source=source,
                     field=schema.dotted(fp, "id"))
        m["count"] = max(m["count"], int(idx) + 1)
        present.add(did)
        if r.get("tflops") is not None or r.get("memory_gb") is not None:
            spec = dict(gpus.get(gpu) or {})
            spec.update({k: r[k] for k in ("tflops", "memory_gb") if r.get(k) is not None})
            gpus[gpu] = spec
    catalog = parse_gpu_types(gpus, source, schema.dotted(prefix, "gpus"))
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
    machines of ``per_machine`` GPUs of one type, intra bandwidth from the catalog. Beside it a
    cluster file may give only ``name``, ``gpus`` and ``excluded`` (ids ``m<i>.<index>``)."""
    sp = schema.dotted(prefix, "synthetic")
    for k in d:  # the fleet draws its own machines and links: the other ways to give them are alternatives
        if k not in ("name", "synthetic", "gpus", "excluded"):
            raise HexicoreError(f"synthetic: and {k}: are alternatives (a synthetic fleet draws its own machines "
                                "and links); give one of them", source=source, field=schema.dotted(prefix, str(k)))
    s = schema.as_mapping(d["synthetic"], source, sp)
    schema.known_keys(s, {"gpus", "mix", "seed", "per_machine", "inter_gbs", "inter_latency_us"}, source, sp)
    n = schema.integer(schema.get(s, "gpus", source, sp), source, schema.dotted(sp, "gpus"))
    limits.check(n, limits.MAX_DEVICES, "GPUs", source=source, field=schema.dotted(sp, "gpus"))
    mix = schema.as_mapping(schema.get(s, "mix", source, sp), source, schema.dotted(sp, "mix"))
    seed = schema.integer(s.get("seed", 0), source, schema.dotted(sp, "seed"), minimum=0)
    per = schema.integer(s.get("per_machine", 8), source, schema.dotted(sp, "per_machine"))
    catalog = parse_gpu_types(d.get("gpus"), source, schema.dotted(prefix, "gpus"))
    weights = {}
    for g, w in mix.items():
        if g not in catalog:
            raise HexicoreError(f"unknown GPU type {g!r}", source=source, field=schema.dotted(sp, f"mix.{g}"))
        weights[g] = schema.number(w, source, schema.dotted(sp, f"mix.{g}"))
    fleet = synthetic_fleet(n, weights, seed=seed, per_machine=per,
                           inter_gbs=limits.bandwidth(s.get("inter_gbs", 0.7), source, schema.dotted(sp, "inter_gbs")),
                           inter_latency_us=limits.latency(s.get("inter_latency_us", 50.0), source,
                                                           schema.dotted(sp, "inter_latency_us")),
                           name=str(d.get("name", f"synthetic{n}")), catalog=catalog)
    return {**fleet, **{k: d[k] for k in ("gpus", "excluded") if d.get(k) is not None}}


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
