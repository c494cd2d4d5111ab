"""A seeded ``synthetic:`` fleet for scale tests, expanded into the machines form
:func:`hexicore.core.cluster.parse_cluster` reads (the other way, a plain ``devices`` list, is
:mod:`hexicore.core.device_list`).
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.gpus import GPU_CATALOG, GpuType, parse_gpu_types


def synthetic_fleet_dict(d: Mapping[str, Any], source: str | None, prefix: str | None) -> dict[str, Any]:
    """Expand ``synthetic: {gpus, mix, seed, per_machine, inter_gbs, inter_latency_us}`` into a
    cluster mapping: ``gpus`` GPUs drawn from the ``mix`` weights with a seeded RNG, packed into
    machines of ``per_machine`` GPUs of one type, intra bandwidth from the catalog. Beside it a
    cluster file may give only ``name``, ``gpus``, ``excluded`` (ids ``m<i>.<index>``) and the
    top-level ``emulate`` (emulated links)."""
    sp = schema.dotted(prefix, "synthetic")
    for k in d:  # the fleet draws its own machines and links: the other ways to give them are alternatives
        if k not in ("name", "synthetic", "gpus", "excluded", "emulate"):
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
    if not weights:
        raise HexicoreError("needs at least one GPU type and its weight", source=source, field=schema.dotted(sp, "mix"))
    fleet = synthetic_fleet(n, weights, seed=seed, per_machine=per,
                           inter_gbs=limits.bandwidth(s.get("inter_gbs", 0.7), source, schema.dotted(sp, "inter_gbs")),
                           inter_latency_us=limits.latency(s.get("inter_latency_us", 50.0), source,
                                                           schema.dotted(sp, "inter_latency_us")),
                           name=str(d.get("name", f"synthetic{n}")), catalog=catalog)
    return {**fleet, **{k: d[k] for k in ("gpus", "excluded") if d.get(k) is not None},
            **({"emulate": d["emulate"]} if "emulate" in d else {})}


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
