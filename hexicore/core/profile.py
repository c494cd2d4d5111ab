"""Measured costs of a cluster's devices and links: the profile file (``hexicore.profile/1``).

Written by ``hexicore profile`` (or by hand, or by another tool) and read by the ``profiled``
cost model (:mod:`hexicore.cost.profiled`). YAML::

    format: hexicore.profile/1
    environment: {torch: 2.13.0, backend: gloo, dtype: fp32, attention: sdpa, date: 2026-12-01}
    devices:                      # per GPU type (or per device id, when profiled one by one)
      rtx4090:
        blocks:                   # one transformer block, one micro-batch
          - {micro_batch: 1, tp: 1, seq_len: 4096, hidden: 4096, ffn: 11008, heads: 32,
             kv_heads: 32, head_dim: 128, forward_s: 0.0101, backward_s: 0.0198, recompute_s: 0.0101,
             activation_bytes: 33554432, optimizer_s: 0.0004, action_s: 0.0}
        head: {micro_batch: 1, seq_len: 4096, hidden: 4096, vocab: 32000, forward_s: 0.004, backward_s: 0.008}
    links:                        # point to point, fitted as latency + bytes / bandwidth
      - {between: [A, A], latency_s: 5.0e-06, bandwidth_gbs: 180.0}
      - {between: [A, B], latency_s: 4.0e-05, bandwidth_gbs: 1.9}
    allreduce:                    # bus bandwidth per group size and link class
      - {between: [A, A], group: 2, bandwidth_gbs: 150.0}

Seconds are wall seconds of one micro-batch (``optimizer_s``: of one optimizer step over the
block's parameters, optional; ``action_s``: the fixed cost of a forward and a backward action
included in ``forward_s + backward_s``, optional); ``between`` names the profiled cluster's machines
(the same machine twice is the link inside it). Every field is checked on reading; an error
names the file and the field. A profile holds at least one device, every device at least one
block, no two blocks of a device at the same point (micro-batch, TP, sequence, shape), no machine
pair twice among ``links`` (nor pair and group among ``allreduce``); forward and backward seconds
are > 0; times, sizes, bandwidths and latencies lie within the ranges of docs/formats.md
("Limits"); an all-reduce group has at least two GPUs; a block's heads divide its hidden size and
its kv heads and TP degree its heads; ``environment.dtype``, where given, is a dtype hexicore trains. The file does not list the profiled cluster's machines: that ``between`` names machines
of the cluster priced is checked where the profile meets it
(:meth:`hexicore.cost.profiled.ProfiledCostModel.check_cluster`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.model import DTYPE_BYTES

FORMAT = "hexicore.profile/1"
_SHAPE = ("hidden", "ffn", "heads", "kv_heads", "head_dim")
_KEYS = ("format", "environment", "devices", "links", "allreduce")
#: measured times that are never 0 (the others: 0 = not measured)
_POSITIVE = ("forward_s", "backward_s")
#: the sizes a measurement was made at, bounded as the plans it prices are (docs/formats.md, Limits)
_SIZES = {"micro_batch": (limits.MAX_GLOBAL_BATCH, "sequences"), "tp": (limits.MAX_DEVICES, "GPUs"),
          "seq_len": (limits.MAX_SEQ_LEN, "tokens")}


@dataclass(frozen=True)
class BlockTiming:
    """One transformer block measured at ``micro_batch`` x ``seq_len`` on a TP group of ``tp``."""

    micro_batch: int
    tp: int
    seq_len: int
    forward_s: float
    backward_s: float
    recompute_s: float = 0.0
    hidden: int = 0
    ffn: int = 0
    heads: int = 0
    kv_heads: int = 0
    activation_bytes: float = 0.0
    #: the optimizer step (AdamW + zero_grad) over the block's parameters on one TP rank
    #: (0: not measured; independent of ``micro_batch``)
    optimizer_s: float = 0.0
    #: the fixed cost of one forward and one backward action beyond their blocks, included in
    #: ``forward_s + backward_s`` (0: none or not measured): a stage running ``n`` blocks in one
    #: action pays it once, not ``n`` times
    action_s: float = 0.0
    #: width of one attention head (0: not recorded, ``hidden // heads``); Hugging Face configs
    #: may set another, which changes the block's attention FLOPs
    head_dim: int = 0


@dataclass(frozen=True)
class HeadTiming:
    """The output projection (+ loss) of one micro-batch."""

    micro_batch: int
    seq_len: int
    forward_s: float
    backward_s: float
    hidden: int = 0
    vocab: int = 0


@dataclass(frozen=True)
class LinkTiming:
    """``latency_s + bytes / (bandwidth_gbs * 1e9)`` between two machines (or inside one)."""

    between: tuple[str, str]
    latency_s: float
    bandwidth_gbs: float


@dataclass(frozen=True)
class AllReduceTiming:
    between: tuple[str, str]
    group: int
    bandwidth_gbs: float


@dataclass(frozen=True)
class DeviceProfile:
    blocks: tuple[BlockTiming, ...] = ()
    head: HeadTiming | None = None


@dataclass(frozen=True)
class Profile:
    """A whole profile file."""

    devices: Mapping[str, DeviceProfile]
    links: tuple[LinkTiming, ...] = ()
    allreduce: tuple[AllReduceTiming, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="profile", compare=False)  # the file it was read from (for errors)

    def link(self, a: str, b: str) -> LinkTiming | None:
        """The measured link between machines ``a`` and ``b`` (either order)."""
        key = tuple(sorted((a, b)))
        return next((ln for ln in self.links if tuple(sorted(ln.between)) == key), None)

    def to_dict(self) -> dict[str, Any]:
        def clean(obj: Any) -> dict[str, Any]:  # an unrecorded head_dim (0) is left out, as it was read
            return {k: (list(v) if isinstance(v, tuple) else v) for k, v in obj.__dict__.items()
                    if not (k == "head_dim" and not v)}

        return {"format": FORMAT, "environment": dict(self.environment),
                "devices": {name: {"blocks": [clean(b) for b in dev.blocks],
                                   **({"head": clean(dev.head)} if dev.head else {})}
                            for name, dev in self.devices.items()},
                "links": [clean(ln) for ln in self.links], "allreduce": [clean(a) for a in self.allreduce]}

    def save(self, path: str | Path) -> Path:
        import yaml

        return schema.write_text_atomic(path, yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return parse_profile(schema.load_yaml(path, "profile"), str(path))


def _record(cls: type, d: Any, source: str, where: str, ints: tuple[str, ...], floats: tuple[str, ...],
            optional: tuple[str, ...] = ()) -> Any:
    m = schema.as_mapping(d, source, where)
    known = set(ints) | set(floats)
    unknown = sorted(set(m) - known)
    if unknown:
        raise HexicoreError(f"unknown field; fields are: {', '.join(sorted(known))}", source=source,
                            field=f"{where}.{unknown[0]}")
    kw: dict[str, Any] = {}
    for k in ints:
        if k in m or k not in optional:
            kw[k] = schema.integer(schema.get(m, k, source, where), source, f"{where}.{k}")
            if k in _SIZES:
                limits.check(kw[k], *_SIZES[k], source=source, field=f"{where}.{k}")
    for k in floats:
        if k in m or k not in optional:
            kw[k] = v = schema.number(schema.get(m, k, source, where), source, f"{where}.{k}",
                                      allow_zero=k not in _POSITIVE)
            if k == "activation_bytes":
                limits.quantity(v, (0.0, limits.MEMORY_GB[1] * 1e9), "bytes", source, f"{where}.{k}")
            else:
                limits.quantity(v, limits.PROFILED_S, "s", source, f"{where}.{k}")
    _shape(kw, source, where)
    return cls(**kw)


def _shape(kw: Mapping[str, Any], source: str, where: str) -> None:
    """A measured block's shape is one a model can have: heads divide ``hidden``, ``kv_heads``
    and the TP degree divide ``heads`` (where both are given)."""
    for big, small in (("hidden", "heads"), ("heads", "kv_heads"), ("heads", "tp")):  # TP splits the heads
        if kw.get(big) and kw.get(small) and kw[big] % kw[small]:
            raise HexicoreError(f"{big} {kw[big]} is not divisible by {small} {kw[small]}", source=source,
                                field=f"{where}.{small}")


def _between(d: Mapping[str, Any], source: str, where: str, keys: tuple[str, ...]) -> tuple[str, str]:
    schema.known_keys(d, ("between",) + keys, source, where)
    pair = schema.as_list(schema.get(d, "between", source, where), source, f"{where}.between")
    if len(pair) != 2:
        raise HexicoreError("expected two machine names", source=source, field=f"{where}.between")
    return (schema.string(pair[0], source, f"{where}.between"), schema.string(pair[1], source, f"{where}.between"))


def _unique(items: list[Any], key: Any, source: str, where: str, what: str) -> None:
    """Refuse two entries of ``items`` with the same ``key`` (two measurements of one point)."""
    seen: dict[Any, int] = {}
    for i, item in enumerate(items):
        k = key(item)
        if k in seen:
            raise HexicoreError(f"{what} is already measured at {where}[{seen[k]}]", source=source, field=f"{where}[{i}]")
        seen[k] = i


def _group(value: Any, source: str, field: str) -> int:
    """An all-reduce's group size: at least two GPUs (one has nothing to reduce), at most a cluster's."""
    g = schema.integer(value, source, field, minimum=2)
    limits.check(g, limits.MAX_DEVICES, "GPUs", source=source, field=field)
    return g


def parse_profile(data: Any, source: str = "profile") -> Profile:
    """Validate a profile mapping (module docstring)."""
    d = schema.as_mapping(data, source, None)
    if d.get("format") != FORMAT:
        raise HexicoreError(f"unsupported format {d.get('format')!r}; expected {FORMAT!r}", source=source,
                            field="format")
    schema.known_keys(d, _KEYS, source, None)
    devices = {}
    raw_devices = schema.as_mapping(schema.get(d, "devices", source, None), source, "devices")
    if not raw_devices:
        raise HexicoreError("a profile needs at least one device", source=source, field="devices")
    for name, dev in raw_devices.items():
        where = f"devices.{name}"
        dev = schema.as_mapping(dev, source, where)
        schema.known_keys(dev, ("blocks", "head"), source, where)
        raw = schema.as_list(schema.get(dev, "blocks", source, where), source, f"{where}.blocks")
        if not raw:
            raise HexicoreError("a device needs at least one measured block", source=source, field=f"{where}.blocks")
        blocks = tuple(_record(BlockTiming, b, source, f"{where}.blocks[{i}]", ("micro_batch", "tp", "seq_len") + _SHAPE,
                               ("forward_s", "backward_s", "recompute_s", "activation_bytes", "optimizer_s",
                                "action_s"),
                               optional=_SHAPE + ("recompute_s", "activation_bytes", "optimizer_s", "action_s"))
                       for i, b in enumerate(raw))
        for i, b in enumerate(blocks):  # the fixed cost is part of the block's own forward + backward
            if b.action_s > b.forward_s + b.backward_s:
                raise HexicoreError(f"must be at most forward_s + backward_s ({b.forward_s + b.backward_s:g}), "
                                    f"got {b.action_s:g}", source=source, field=f"{where}.blocks[{i}].action_s")
        _unique(list(blocks), lambda b: (b.micro_batch, b.tp, b.seq_len) + tuple(getattr(b, k) for k in _SHAPE),
                source, f"{where}.blocks", "this micro-batch, TP degree, sequence length and shape")
        head = None if dev.get("head") is None else _record(
            HeadTiming, dev["head"], source, f"{where}.head", ("micro_batch", "seq_len", "hidden", "vocab"),
            ("forward_s", "backward_s"), optional=("hidden", "vocab"))
        devices[str(name)] = DeviceProfile(blocks, head)
    links = []
    for i, ln in enumerate(schema.optional_list(d, "links", source, "links")):
        m = schema.as_mapping(ln, source, f"links[{i}]")
        links.append(LinkTiming(_between(m, source, f"links[{i}]", ("latency_s", "bandwidth_gbs")),
                                limits.quantity(schema.get(m, "latency_s", source, f"links[{i}]"),
                                                (limits.LATENCY_US[0] / 1e6, limits.LATENCY_US[1] / 1e6), "s", source,
                                                f"links[{i}].latency_s"),
                                limits.bandwidth(schema.get(m, "bandwidth_gbs", source, f"links[{i}]"), source,
                                                 f"links[{i}].bandwidth_gbs")))
    _unique(links, lambda ln: frozenset(ln.between), source, "links", "this machine pair")
    allreduce = []
    for i, a in enumerate(schema.optional_list(d, "allreduce", source, "allreduce")):
        m = schema.as_mapping(a, source, f"allreduce[{i}]")
        allreduce.append(AllReduceTiming(_between(m, source, f"allreduce[{i}]", ("group", "bandwidth_gbs")),
                                         _group(schema.get(m, "group", source, f"allreduce[{i}]"), source,
                                                f"allreduce[{i}].group"),
                                         limits.bandwidth(schema.get(m, "bandwidth_gbs", source, f"allreduce[{i}]"),
                                                          source, f"allreduce[{i}].bandwidth_gbs")))
    _unique(allreduce, lambda a: (frozenset(a.between), a.group), source, "allreduce", "this machine pair and group")
    env = dict(schema.optional_mapping(d, "environment", source, "environment"))
    if env.get("dtype") is not None and str(env["dtype"]) not in DTYPE_BYTES:
        raise HexicoreError(f"unknown dtype {env['dtype']!r}; choose one of: {', '.join(DTYPE_BYTES)}", source=source,
                            field="environment.dtype")
    return Profile(devices, tuple(links), tuple(allreduce), env, source)
