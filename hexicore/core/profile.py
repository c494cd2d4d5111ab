"""Measured costs of a cluster's devices and links: the profile file (``hexicore.profile/2``;
``hexicore.profile/1`` files are still read).

Written by ``hexicore profile`` (or by hand, or by another tool) and read by the ``profiled``
cost model (:mod:`hexicore.cost.profiled`). YAML::

    format: hexicore.profile/2
    environment: {torch: 2.13.0, backend: gloo, dtype: fp32, attention: sdpa, date: 2026-12-01}
    step_overhead_s: 0.0004       # a step's fixed cost beyond its stages (the loss and norm all-reduces)
    devices:                      # per GPU type (or per device id, when profiled one by one)
      rtx4090:
        blocks:                   # one transformer block, one micro-batch
          - {micro_batch: 1, tp: 1, seq_len: 4096, hidden: 4096, ffn: 11008, heads: 32,
             kv_heads: 32, head_dim: 128, forward_s: 0.0101, backward_s: 0.0198, recompute_s: 0.0101,
             activation_bytes: 33554432, optimizer_s: 0.0004, action_s: 0.0}
        heads:                    # norm + output projection + loss, per micro-batch and TP degree
          - {micro_batch: 1, tp: 1, seq_len: 4096, hidden: 4096, vocab: 32000, forward_s: 0.004,
             backward_s: 0.008, activation_bytes: 524288000}
        embeddings:               # the token embedding, per micro-batch and TP degree
          - {micro_batch: 1, tp: 1, seq_len: 4096, hidden: 4096, vocab: 32000, forward_s: 0.0003,
             backward_s: 0.0009, activation_bytes: 0}
    links:                        # point to point, fitted as latency + bytes / bandwidth
      - {between: [A, A], latency_s: 5.0e-06, bandwidth_gbs: 180.0}
      - {between: [A, B], latency_s: 4.0e-05, bandwidth_gbs: 1.9,
         points: [[4096, 4.2e-05], [1048576, 0.00059], [16777216, 0.0089]]}   # measured (bytes, s)
    allreduce:                    # bus bandwidth per group size, message size and link class
      - {between: [A, A], group: 2, bandwidth_gbs: 150.0, bytes: 4194304}

Seconds are wall seconds of one micro-batch (``optimizer_s``: of one optimizer step over the
block's parameters, optional; ``action_s``: the fixed cost of a forward and a backward action
included in ``forward_s + backward_s``, optional); ``between`` names the profiled cluster's machines
(the same machine twice is the link inside it). A head or embedding entry is the time and the
bytes kept for backward (``activation_bytes``, optional; the logits for a head) of that part of
the model as the runtime runs it on one rank of a TP group of ``tp`` (the runtime keeps the
head and the embedding whole on every TP rank). A link's ``points`` (optional) are its measured
one-way seconds per message size, which price a message of a measured size range by
interpolation (the fit outside it); an all-reduce's ``bytes`` (optional) is the message size
it was measured at.

Version 1 (``hexicore.profile/1``) has one ``head`` mapping per device instead of ``heads`` (read
as a one-entry list at TP 1) and none of ``step_overhead_s``, ``embeddings``, ``points``,
``bytes``; those are refused in a /1 file (one line naming the field). Every field is checked on
reading; an error names the file and the field. A profile holds at least one device, every
device at least one block, no two blocks of a device at the same point (micro-batch, TP,
sequence, shape), nor two heads or embeddings at the same (micro-batch, TP, sequence), no
machine pair twice among ``links`` (nor pair, group and size among ``allreduce``); forward and
backward seconds are > 0; times, sizes, bandwidths and latencies lie within the ranges of
docs/formats.md ("Limits"); an all-reduce group has at least two GPUs; a block's heads divide
its hidden size and its kv heads and TP degree its heads; ``environment.dtype``, where given, is
a dtype hexicore trains. The file does not list the profiled cluster's machines: that
``between`` names machines of the cluster priced is checked where the profile meets it
(:meth:`hexicore.cost.profiled.ProfiledCostModel.check_cluster`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.model import DTYPE_BYTES

FORMAT = "hexicore.profile/2"
#: the versions read: /1 lacks what :data:`V2_ONLY` names
FORMATS = ("hexicore.profile/1", FORMAT)
_SHAPE = ("hidden", "ffn", "heads", "kv_heads", "head_dim")
_KEYS = ("format", "environment", "devices", "links", "allreduce", "step_overhead_s")
#: fields a /1 file may not have (a /1 reader would not know them)
V2_ONLY = ("step_overhead_s", "heads", "embeddings", "points", "bytes")
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
    """The norm, output projection and loss of one micro-batch on one rank of a TP group of ``tp``
    (the runtime keeps the head whole on every TP rank); ``activation_bytes``: what its forward
    keeps for backward (the logits; 0: not measured)."""

    micro_batch: int
    seq_len: int
    forward_s: float
    backward_s: float
    hidden: int = 0
    vocab: int = 0
    tp: int = 1
    activation_bytes: float = 0.0


@dataclass(frozen=True)
class EmbeddingTiming(HeadTiming):
    """The token embedding of one micro-batch on one rank of a TP group of ``tp`` (fields as
    :class:`HeadTiming`)."""


@dataclass(frozen=True)
class LinkTiming:
    """``latency_s + bytes / (bandwidth_gbs * 1e9)`` between two machines (or inside one);
    ``points``: measured ``(bytes, one-way seconds)``, in increasing bytes (empty: the fit only)."""

    between: tuple[str, str]
    latency_s: float
    bandwidth_gbs: float
    points: tuple[tuple[int, float], ...] = ()

    def seconds(self, nbytes: float) -> float:
        """One message of ``nbytes``: linear between the two measured points around it; the fit
        outside the measured sizes (or without points)."""
        pts = self.points
        if len(pts) < 2 or not pts[0][0] <= nbytes <= pts[-1][0]:
            return self.latency_s + nbytes / (self.bandwidth_gbs * 1e9)
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if b0 <= nbytes <= b1:
                return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0) if b1 > b0 else t0
        return pts[-1][1]  # unreachable: nbytes lies inside the range


@dataclass(frozen=True)
class AllReduceTiming:
    """Bus bandwidth of an all-reduce among ``group`` GPUs of ``between`` (``bytes``: the size
    measured, 0: not recorded)."""

    between: tuple[str, str]
    group: int
    bandwidth_gbs: float
    bytes: int = 0


@dataclass(frozen=True)
class DeviceProfile:
    blocks: tuple[BlockTiming, ...] = ()
    heads: tuple[HeadTiming, ...] = ()
    embeddings: tuple[EmbeddingTiming, ...] = ()

    @property
    def head(self) -> HeadTiming | None:
        """The first measured head (what a /1 file has), None without one."""
        return self.heads[0] if self.heads else None


@dataclass(frozen=True)
class Profile:
    """A whole profile file."""

    devices: Mapping[str, DeviceProfile]
    links: tuple[LinkTiming, ...] = ()
    allreduce: tuple[AllReduceTiming, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="profile", compare=False)  # the file it was read from (for errors)
    step_overhead_s: float = 0.0  # a step's fixed cost beyond its stages (0: not measured)

    def link(self, a: str, b: str) -> LinkTiming | None:
        """The measured link between machines ``a`` and ``b`` (either order)."""
        key = tuple(sorted((a, b)))
        return next((ln for ln in self.links if tuple(sorted(ln.between)) == key), None)

    def to_dict(self) -> dict[str, Any]:
        """The /2 file's mapping (optional fields at their "not measured" value left out)."""
        def clean(obj: Any) -> dict[str, Any]:
            unset = {"head_dim": 0, "points": (), "bytes": 0}
            return {k: ([list(p) for p in v] if k == "points" else list(v) if isinstance(v, tuple) else v)
                    for k, v in obj.__dict__.items() if not (k in unset and v == unset[k])}

        def device(dev: DeviceProfile) -> dict[str, Any]:
            return {"blocks": [clean(b) for b in dev.blocks],
                    **({"heads": [clean(h) for h in dev.heads]} if dev.heads else {}),
                    **({"embeddings": [clean(e) for e in dev.embeddings]} if dev.embeddings else {})}

        return {"format": FORMAT, "environment": dict(self.environment),
                **({"step_overhead_s": self.step_overhead_s} if self.step_overhead_s else {}),
                "devices": {name: device(dev) for name, dev in self.devices.items()},
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


def _v2_only(m: Mapping[str, Any], version: str, source: str, where: str | None) -> None:
    """Refuse, in a /1 file, a field only /2 has (:data:`V2_ONLY`)."""
    if version != FORMAT:
        extra = [k for k in m if k in V2_ONLY]
        if extra:
            raise HexicoreError(f"only in {FORMAT} files; this one is {version}", source=source,
                                field=schema.dotted(where, str(extra[0])))


def _parts(cls: type, raw: list, source: str, where: str) -> tuple:
    """Head or embedding entries of one device, each at its own (micro-batch, TP, sequence)."""
    out = tuple(_record(cls, h, source, f"{where}[{i}]", ("micro_batch", "seq_len", "hidden", "vocab", "tp"),
                        ("forward_s", "backward_s", "activation_bytes"),
                        optional=("hidden", "vocab", "tp", "activation_bytes")) for i, h in enumerate(raw))
    _unique(list(out), lambda h: (h.micro_batch, h.tp, h.seq_len), source, where, "this micro-batch, TP degree and sequence")
    return out


def _device(name: str, dev: Any, version: str, source: str) -> DeviceProfile:
    where = f"devices.{name}"
    dev = schema.as_mapping(dev, source, where)
    schema.known_keys(dev, ("blocks", "head", "heads", "embeddings"), source, where)
    _v2_only(dev, version, source, where)
    raw = schema.as_list(schema.get(dev, "blocks", source, where), source, f"{where}.blocks")
    if not raw:
        raise HexicoreError("a device needs at least one measured block", source=source, field=f"{where}.blocks")
    blocks = tuple(_record(BlockTiming, b, source, f"{where}.blocks[{i}]", ("micro_batch", "tp", "seq_len") + _SHAPE,
                           ("forward_s", "backward_s", "recompute_s", "activation_bytes", "optimizer_s", "action_s"),
                           optional=_SHAPE + ("recompute_s", "activation_bytes", "optimizer_s", "action_s"))
                   for i, b in enumerate(raw))
    for i, b in enumerate(blocks):  # the fixed cost is part of the block's own forward + backward
        if b.action_s > b.forward_s + b.backward_s:
            raise HexicoreError(f"must be at most forward_s + backward_s ({b.forward_s + b.backward_s:g}), "
                                f"got {b.action_s:g}", source=source, field=f"{where}.blocks[{i}].action_s")
    _unique(list(blocks), lambda b: (b.micro_batch, b.tp, b.seq_len) + tuple(getattr(b, k) for k in _SHAPE),
            source, f"{where}.blocks", "this micro-batch, TP degree, sequence length and shape")
    if dev.get("head") is not None and dev.get("heads") is not None:
        raise HexicoreError("give heads (a list) or head (one entry), not both", source=source, field=f"{where}.head")
    if dev.get("head") is not None:  # /1's single head: one entry of the list
        m = schema.as_mapping(dev["head"], source, f"{where}.head")
        schema.known_keys(m, ("micro_batch", "seq_len", "hidden", "vocab", "forward_s", "backward_s"), source,
                          f"{where}.head")
        heads = (_parts(HeadTiming, [m], source, f"{where}.head")[0],)
    else:
        heads = _parts(HeadTiming, schema.optional_list(dev, "heads", source, f"{where}.heads"), source, f"{where}.heads")
    embeddings = _parts(EmbeddingTiming, schema.optional_list(dev, "embeddings", source, f"{where}.embeddings"),
                        source, f"{where}.embeddings")
    return DeviceProfile(blocks, heads, embeddings)


def _links(d: Mapping[str, Any], version: str, source: str) -> tuple[LinkTiming, ...]:
    links = []
    for i, ln in enumerate(schema.optional_list(d, "links", source, "links")):
        where = f"links[{i}]"
        m = schema.as_mapping(ln, source, where)
        _v2_only(m, version, source, where)
        pts = []
        for k, pt in enumerate(schema.optional_list(m, "points", source, f"{where}.points")):
            pair = schema.as_list(pt, source, f"{where}.points[{k}]")
            if len(pair) != 2:
                raise HexicoreError("expected [bytes, seconds]", source=source, field=f"{where}.points[{k}]")
            pts.append((schema.integer(pair[0], source, f"{where}.points[{k}]"),
                        limits.quantity(schema.number(pair[1], source, f"{where}.points[{k}]"), limits.PROFILED_S, "s",
                                        source, f"{where}.points[{k}]")))
        if any(a[0] >= b[0] for a, b in zip(pts, pts[1:])):
            raise HexicoreError("points must be in increasing bytes, each size once", source=source,
                                field=f"{where}.points")
        links.append(LinkTiming(_between(m, source, where, ("latency_s", "bandwidth_gbs", "points")),
                                limits.quantity(schema.get(m, "latency_s", source, where),
                                                (limits.LATENCY_US[0] / 1e6, limits.LATENCY_US[1] / 1e6), "s", source,
                                                f"{where}.latency_s"),
                                limits.bandwidth(schema.get(m, "bandwidth_gbs", source, where), source,
                                                 f"{where}.bandwidth_gbs"), tuple(pts)))
    _unique(links, lambda ln: frozenset(ln.between), source, "links", "this machine pair")
    return tuple(links)


def _allreduce(d: Mapping[str, Any], version: str, source: str) -> tuple[AllReduceTiming, ...]:
    out = []
    for i, a in enumerate(schema.optional_list(d, "allreduce", source, "allreduce")):
        where = f"allreduce[{i}]"
        m = schema.as_mapping(a, source, where)
        _v2_only(m, version, source, where)
        out.append(AllReduceTiming(_between(m, source, where, ("group", "bandwidth_gbs", "bytes")),
                                   _group(schema.get(m, "group", source, where), source, f"{where}.group"),
                                   limits.bandwidth(schema.get(m, "bandwidth_gbs", source, where), source,
                                                    f"{where}.bandwidth_gbs"),
                                   schema.integer(m["bytes"], source, f"{where}.bytes") if "bytes" in m else 0))
    _unique(out, lambda a: (frozenset(a.between), a.group, a.bytes), source, "allreduce",
            "this machine pair, group and size")
    return tuple(out)


def parse_profile(data: Any, source: str = "profile") -> Profile:
    """Validate a profile mapping, /2 or /1 (module docstring)."""
    d = schema.as_mapping(data, source, None)
    version = d.get("format")
    if version not in FORMATS:
        raise HexicoreError(f"unsupported format {version!r}; expected {FORMAT!r} (or {FORMATS[0]!r})", source=source,
                            field="format")
    schema.known_keys(d, _KEYS, source, None)
    _v2_only(d, version, source, None)
    raw_devices = schema.as_mapping(schema.get(d, "devices", source, None), source, "devices")
    if not raw_devices:
        raise HexicoreError("a profile needs at least one device", source=source, field="devices")
    devices = {str(name): _device(str(name), dev, version, source) for name, dev in raw_devices.items()}
    env = dict(schema.optional_mapping(d, "environment", source, "environment"))
    if env.get("dtype") is not None and str(env["dtype"]) not in DTYPE_BYTES:
        raise HexicoreError(f"unknown dtype {env['dtype']!r}; choose one of: {', '.join(DTYPE_BYTES)}", source=source,
                            field="environment.dtype")
    overhead = 0.0
    if d.get("step_overhead_s") is not None:
        overhead = limits.quantity(schema.number(d["step_overhead_s"], source, "step_overhead_s", allow_zero=True),
                                   limits.PROFILED_S, "s", source, "step_overhead_s")
    return Profile(devices, _links(d, version, source), _allreduce(d, version, source), env, source, overhead)
