"""The GPU catalog: GPU types with their peak dense BF16/FP16 tensor TFLOPS and memory, and a
cluster file's ``gpus:`` section merged over it (the cluster YAML contract: docs/formats.md and
the files under conf/cluster/).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError


@dataclass(frozen=True)
class GpuType:
    """One GPU model: peak dense BF16/FP16 tensor TFLOPS (no sparsity) and memory in GB.

    ``intra_gbs`` is the typical intra-machine bandwidth for the synthetic-fleet generator
    (NVLink per direction, or PCIe 4.0 x16 ~ 32 GB/s); cluster files always state their own.
    ``price_per_hour``: on-demand US dollars per GPU-hour (None: unknown), used by
    ``objective=cost`` and ``budget_per_hour`` (:mod:`hexicore.planner.allocation.objective`);
    ``price_source`` says where the number comes from.
    """

    name: str
    tflops: float
    memory_gb: float
    source: str = ""
    intra_gbs: float = 32.0
    price_per_hour: float | None = None
    price_source: str = ""

    def __post_init__(self) -> None:
        if self.tflops <= 0 or self.memory_gb <= 0:
            raise HexicoreError(f"GPU type {self.name!r} needs positive tflops and memory_gb")
        if self.price_per_hour is not None and self.price_per_hour < 0:
            raise HexicoreError(f"GPU type {self.name!r} needs a non-negative price_per_hour")


def _g(name: str, tflops: float, memory_gb: float, source: str, intra_gbs: float = 32.0) -> tuple[str, GpuType]:
    price, where = PRICES[name]
    return name, GpuType(name, tflops, memory_gb, source, intra_gbs, price, where)


_LAMBDA = "Lambda on-demand cloud list price per GPU-hour (lambdalabs.com/service/gpu-cloud, 2024)"
_RUNPOD = "RunPod community-cloud on-demand list price per GPU-hour (runpod.io/pricing, 2024)"
#: On-demand US$ per GPU-hour and where it comes from. Cloud prices change often and differ by
#: provider and region: they are a starting point; a cluster file's ``gpus:`` section overrides
#: them (``price_per_hour``). Entries marked "estimate" have no public on-demand offer we know of.
PRICES: Mapping[str, tuple[float, str]] = MappingProxyType({
    "a100-40g": (1.29, _LAMBDA),
    "a100-80g": (1.79, _LAMBDA),
    "a800-80g-nvlink": (1.79, "estimate: priced as the A100 80GB SXM it derives from (Lambda, 2024)"),
    "a800-80g-pcie": (1.79, "estimate: priced as the A100 80GB (Lambda, 2024)"),
    "h100-80g": (2.99, _LAMBDA + ", H100 SXM in 8-GPU machines"),
    "h200": (3.99, "RunPod on-demand list price per GPU-hour for H200 SXM (runpod.io/pricing, 2024)"),
    "rtx4090": (0.69, "RunPod secure-cloud on-demand list price per GPU-hour (runpod.io/pricing, 2024)"),
    "rtx3090": (0.43, "RunPod secure-cloud on-demand list price per GPU-hour (runpod.io/pricing, 2024)"),
    "rtx3080ti": (0.25, "estimate: no on-demand offer known; about 0.6x the RTX 3090 price, as their "
                        "community-market prices compare"),
    "v100-32g": (0.55, _LAMBDA + ", V100 in 8-GPU machines"),
    "l40s": (0.86, "RunPod secure-cloud on-demand list price per GPU-hour (runpod.io/pricing, 2024)"),
    "rtx-a6000": (0.80, _LAMBDA),
})


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


#: the fields of a ``gpus:`` entry in a cluster file
GPU_KEYS = frozenset({"tflops", "memory_gb", "source", "intra_gbs", "price_per_hour", "price_source"})


def parse_gpu_types(data: Any, source: str | None, prefix: str | None) -> dict[str, GpuType]:
    """The catalog with a file's ``gpus:`` section merged over it (new or overridden types)."""
    catalog = dict(GPU_CATALOG)
    if data is None:
        return catalog
    gpus = schema.as_mapping(data, source, prefix)
    for name, spec in gpus.items():
        fp = schema.dotted(prefix, str(name))
        spec = schema.as_mapping(spec, source, fp)
        schema.known_keys(spec, GPU_KEYS, source, fp)
        base = catalog.get(str(name))
        tflops = spec.get("tflops", base.tflops if base else None)
        memory = spec.get("memory_gb", base.memory_gb if base else None)
        if tflops is None:
            raise HexicoreError("missing required field", source=source, field=schema.dotted(fp, "tflops"))
        if memory is None:
            raise HexicoreError("missing required field", source=source, field=schema.dotted(fp, "memory_gb"))
        catalog[str(name)] = GpuType(
            str(name),
            limits.quantity(tflops, limits.TFLOPS, "TFLOPS", source, schema.dotted(fp, "tflops")),
            limits.quantity(memory, limits.MEMORY_GB, "GB", source, schema.dotted(fp, "memory_gb")),
            _note(spec, "source", source, fp),
            limits.bandwidth(spec.get("intra_gbs", base.intra_gbs if base else 32.0), source, schema.dotted(fp, "intra_gbs")),
            *_price(spec, base, source, fp),
        )
    return catalog


def _price(spec: Mapping[str, Any], base: GpuType | None, source: str | None, fp: str | None) -> tuple:
    """``price_per_hour`` (and its source) of a ``gpus:`` entry: its own, else the catalog's."""
    if spec.get("price_per_hour") is None:
        if spec.get("price_source") is not None:  # it would be dropped: a plan writes it only beside a price
            raise HexicoreError("is the source of price_per_hour, which this entry does not give", source=source,
                                field=schema.dotted(fp, "price_source"))
        return (base.price_per_hour, base.price_source) if base else (None, "")
    price = schema.number(spec["price_per_hour"], source, schema.dotted(fp, "price_per_hour"), allow_zero=True)
    return price, _note(spec, "price_source", source, fp)


def _note(spec: Mapping[str, Any], key: str, source: str | None, fp: str | None) -> str:
    """A provenance note (``source``, ``price_source``): text, ``cluster file`` when absent."""
    if spec.get(key) is None:
        return "cluster file"
    return schema.string(spec[key], source, schema.dotted(fp, key))
