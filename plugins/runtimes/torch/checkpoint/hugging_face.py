"""Hugging Face checkpoint directories in and out: lazy safetensors reads, header checks, writers.

A Hugging Face checkpoint directory holds ``config.json`` and either ``model.safetensors`` or
shards ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json`` (its
``weight_map`` names the file of every tensor). :class:`SafeTensors` opens such a set (or any
set of safetensors files) and reads a tensor's TP slice with ``safe_open(...).get_slice(name)``,
so a rank reads only the bytes of the tensors of its own chunks and of its own shard; it records
every read (name, bytes) so tests can check what each rank touched.

:func:`header_shapes` reads only the JSON headers (the safetensors layout: an 8-byte little-endian
header length, then the JSON header) — no torch, no tensor data — and :func:`check_shapes`
compares them with the shapes a :class:`~hexicore.core.model.ModelSpec` implies, before any
worker starts. A tied checkpoint may omit ``lm_head.weight``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any, Iterable

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.input_size import file_bytes

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def weight_files(folder: str | Path, field: str = "init_from") -> dict[str, Path]:
    """Tensor name -> file of a checkpoint directory (single file or sharded with its index): the
    one resolution both the pre-launch checks and the workers' reads use. A directory holding
    both layouts is read as transformers reads it: ``model.safetensors`` first. An index must
    map tensor names to file names inside the directory."""
    d = Path(folder)
    if d.is_file():  # one safetensors file (a checkpoint's optim.safetensors)
        return {n: d for n in header_shapes(d, field)}
    if (d / SINGLE).is_file():
        return {n: d / SINGLE for n in header_shapes(d / SINGLE, field)}
    if (d / INDEX).is_file():
        return _index_files(d, field)
    what = "no such directory" if not d.is_dir() else f"neither {SINGLE} nor {INDEX} in this directory"
    raise HexicoreError(what, source=str(d), field=field)


def _index_files(d: Path, field: str) -> dict[str, Path]:
    src = str(d / INDEX)
    raw = schema.read_bytes(d / INDEX, "safetensors index", field=field)
    try:
        wm = json.loads(raw)["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise HexicoreError("unreadable index: no weight_map", source=src, field=field) from None
    if not isinstance(wm, dict) or not wm:
        raise HexicoreError("weight_map must be a non-empty mapping of tensor name -> shard file name", source=src,
                            field=f"{field}.weight_map")
    root, out = d.resolve(), {}
    for n, f in wm.items():
        if not isinstance(f, str) or not f:
            raise HexicoreError(f"the file of tensor {shown(n)} must be a file name, got {shown(f)}", source=src,
                                field=f"{field}.weight_map")
        p = d / f
        if Path(f).is_absolute() or not p.resolve().is_relative_to(root):
            raise HexicoreError(f"the file of tensor {n!r} ({f!r}) is outside the checkpoint directory", source=src,
                                field=f"{field}.weight_map")
        out[n] = p
    return out


FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def read_header(path: str | Path, field: str = "init_from") -> dict[str, Any]:
    """The JSON header of a safetensors file (reads the first ``8 + n`` bytes only), checked:
    every entry has a dtype, a shape and data offsets, and the data the header declares is the
    rest of the file (a truncated or padded file is refused here, not in a worker)."""
    p = Path(path)
    fh = schema.open_regular(p)
    if fh is None:
        raise HexicoreError("not a regular file" if p.exists() else "no such file", source=str(p), field=field)
    try:
        with fh as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > file_bytes("safetensors header"):
                raise ValueError(f"a header of {n:,} bytes is above the limit of {file_bytes('safetensors header'):,}")
            head = json.loads(f.read(n))
        size = p.stat().st_size
        if not isinstance(head, dict):
            raise ValueError("the header is not a mapping")
        meta = head.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(x, str) for x in meta.values())):
            raise ValueError("__metadata__ must map names to strings")
        end = _contiguous_end(head)
    except (OSError, ValueError, TypeError, IndexError, struct.error) as exc:
        raise HexicoreError(f"not a readable safetensors file ({exc})", source=str(p), field=field) from None
    if size != 8 + n + end:
        raise HexicoreError(f"the header declares {end} bytes of tensor data, the file holds {size - 8 - n} "
                            f"(truncated or corrupt)", source=str(p), field=field)
    return head


#: bytes per element of the safetensors dtypes
WIDTHS = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
          "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry_end(name: str, v: Any) -> int:
    """The end offset of one header entry, checked as safetensors checks it when a worker opens
    the file: a dtype name, a shape of whole numbers, and data offsets ``[begin, end]`` spanning
    exactly the tensor's bytes for the common dtypes (so no malformed entry reaches a worker)."""
    if not isinstance(v, dict) or not {"dtype", "shape", "data_offsets"} <= set(v):
        raise ValueError(f"tensor {shown(name)} has no dtype, shape and data_offsets")
    dtype, shape, offsets = v["dtype"], v["shape"], v["data_offsets"]
    if not isinstance(dtype, str):
        raise ValueError(f"tensor {shown(name)} has dtype {shown(dtype)}, not a name")
    if not isinstance(shape, list) or not all(_whole(x) for x in shape):
        raise ValueError(f"tensor {shown(name)} has shape {shown(shape)}, not a list of whole numbers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(x) for x in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {shown(name)} has data_offsets {shown(offsets)}, not [begin, end]")
    need = WIDTHS.get(dtype, 0) * math.prod(shape)
    if dtype in WIDTHS and offsets[1] - offsets[0] != need:
        raise ValueError(f"tensor {shown(name)} spans {shown(offsets[1] - offsets[0])} bytes, its dtype and shape need "
                         f"{shown(need)}")
    return offsets[1]


def _contiguous_end(head: dict[str, Any]) -> int:
    """The end of the data, the tensors (each checked by :func:`_entry_end`) laid back to back
    from offset 0 with no gap or overlap, as safetensors requires."""
    end = 0
    ends = {n: _entry_end(n, v) for n, v in head.items()}  # each entry checked before its offsets are read
    for begin, stop, name in sorted((head[n]["data_offsets"][0], stop, n) for n, stop in ends.items()):
        if begin != end:
            raise ValueError(f"tensor {shown(name)} starts at byte {shown(begin)}, the previous data ends at {shown(end)}")
        end = stop
    return end


def header_shapes(path: str | Path, field: str = "init_from") -> dict[str, tuple[int, ...]]:
    return {n: tuple(int(x) for x in v["shape"]) for n, v in read_header(path, field).items()}


def checkpoint_headers(folder: str | Path, field: str = "init_from") -> dict[str, dict[str, Any]]:
    """Every tensor's header entry (dtype, shape) in a checkpoint directory, resolved as the
    workers resolve them (:func:`weight_files`): an index entry whose file lacks the tensor is
    refused, a tensor of a shard the index does not name is not the checkpoint's."""
    files = weight_files(folder, field)
    heads: dict[Path, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for name, f in files.items():
        if f not in heads:
            if not f.is_file():
                raise HexicoreError("the index names a file that does not exist", source=str(f), field=field)
            heads[f] = read_header(f, field)
        if name not in heads[f]:
            raise HexicoreError(f"the index maps tensor {name!r} to {f.name}, which does not hold it",
                                source=str(Path(folder) / INDEX), field=f"{field}.weight_map")
        out[name] = heads[f][name]
    return out


def checkpoint_shapes(folder: str | Path, field: str = "init_from") -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a checkpoint directory, from the headers only."""
    return {n: tuple(int(x) for x in v["shape"]) for n, v in checkpoint_headers(folder, field).items()}


def check_shapes(expected: dict[str, tuple[int, ...]], folder: str | Path, *, tied: bool,
                 field: str = "init_from", prefix: str = "") -> None:
    """Refuse a checkpoint whose tensors are missing, extra, of other shapes or not floating
    point (one line naming the first such tensor). ``expected``: standard name -> full shape of
    the model's parameters; ``prefix`` (``exp_avg.``): the stored names carry it."""
    heads = {n[len(prefix):]: v for n, v in checkpoint_headers(folder, field).items() if n.startswith(prefix)}
    have = {n: tuple(int(x) for x in v["shape"]) for n, v in heads.items()}
    src = str(folder)
    for name, shape in expected.items():
        if name not in have:
            raise HexicoreError(f"tensor {prefix + name!r} is missing from the checkpoint", source=src, field=field)
        if tuple(have[name]) != tuple(shape):
            raise HexicoreError(f"tensor {prefix + name!r} has shape {list(have[name])} in the checkpoint, the model "
                                f"needs {list(shape)}", source=src, field=field)
        if heads[name]["dtype"] not in FLOATS:
            raise HexicoreError(f"tensor {prefix + name!r} has dtype {heads[name]['dtype']}, weights must be floating "
                                f"point ({', '.join(FLOATS)})", source=src, field=field)
    extra = sorted(n for n in have if n not in expected and not (tied and n == HEAD) and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise HexicoreError(f"tensor {prefix + extra[0]!r} in the checkpoint is not a parameter of the model",
                            source=src, field=field)


#: the model fields a checkpoint's weights are only right for (sizes are also in the headers)
ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tied_embeddings", "qkv_bias",
               "o_bias", "norm_eps", "rope_theta", "rope_scaling")


def check_config(folder: str | Path, model: Any, field: str = "init_from") -> None:
    """Refuse a checkpoint directory whose ``config.json`` describes another model than
    ``model`` (a :class:`~hexicore.core.model.ModelSpec`) in a field the weights depend on
    (rope base, norm epsilon, tied embeddings, ...): its weights would train as another
    network than the one transformers builds from that directory. One line naming every
    difference. A directory without a config, or with one the runtime does not read, is judged
    by its tensors alone."""
    from hexicore.core.hf_config import load_hf_config

    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return
    try:
        theirs = load_hf_config(cfg)
    except HexicoreError:
        return
    diff = [f"{f}: {getattr(theirs, f)!r} there, {getattr(model, f)!r} here" for f in ARCH_FIELDS
            if getattr(theirs, f) != getattr(model, f)]
    if diff:
        raise HexicoreError(f"the checkpoint's config describes another model ({'; '.join(diff)}); give "
                            f"model_file={folder} to train that model", source=str(cfg), field=field)


class SafeTensors:
    """A set of safetensors files read lazily, slice by slice (a :class:`~..model.stage_module.TensorSource`).

    ``prefix`` is prepended to names (optimizer moments live as ``exp_avg.NAME`` in a
    checkpoint). ``reads`` lists ``(name, bytes)`` of every read, in order."""

    def __init__(self, files: dict[str, Path], prefix: str = "", field: str = "init_from"):
        self.files, self.prefix, self.field = files, prefix, field
        self.reads: list[tuple[str, int]] = []

    @classmethod
    def directory(cls, folder: str | Path, prefix: str = "", field: str = "init_from") -> "SafeTensors":
        return cls(weight_files(folder, field), prefix, field)

    def with_prefix(self, prefix: str) -> "SafeTensors":
        other = SafeTensors(self.files, prefix, self.field)
        other.reads = self.reads
        return other

    def has(self, name: str) -> bool:
        return self.prefix + name in self.files

    def read(self, name: str, shape: tuple[int, ...], dim: int | None, rank: int, size: int):
        """Shard ``rank`` of ``size`` along ``dim`` of tensor ``name`` (only those bytes are read)."""
        key = self.prefix + name
        if key not in self.files:
            raise KeyError(f"tensor {key!r} is not in the checkpoint")
        from safetensors import SafetensorError, safe_open

        try:
            return self._read(key, shape, dim, rank, size, safe_open)
        except SafetensorError as exc:  # whatever the header check let through, one line here
            raise HexicoreError(f"tensor {key!r} cannot be read: {exc}", source=str(self.files[key]),
                                field=self.field) from None

    def _read(self, key: str, shape: tuple[int, ...], dim: int | None, rank: int, size: int, safe_open: Any):
        # a fresh handle per tensor: its memory map (and the file pages the slice touched) goes
        # away with it, so a rank's resident memory stays its shard plus one tensor in flight
        with safe_open(str(self.files[key]), framework="pt") as f:
            sl = f.get_slice(key)
            full = tuple(int(x) for x in sl.get_shape())
            if full != tuple(shape):
                raise ValueError(f"tensor {key!r} has shape {list(full)}, expected {list(shape)}")
            if dim is None or size == 1:
                t = sl[:]
            else:
                from ..parallel.tensor import shard_range

                lo, hi = shard_range(full[dim], rank, size)
                index = tuple(slice(None) for _ in range(dim)) + (slice(lo, hi),)
                t = sl[index]
            if not t.is_floating_point():
                raise HexicoreError(f"tensor {key!r} has dtype {t.dtype}, weights must be floating point",
                                    source=str(self.files[key]), field=self.field)
            t = t.float()
            if not bool(t.isfinite().all()):
                raise HexicoreError(f"tensor {key!r} holds NaN or infinite values", source=str(self.files[key]),
                                    field=self.field)
        self.reads.append((key, t.numel() * t.element_size()))
        return t

    def close(self) -> None:
        """Nothing stays open between reads (kept for callers that close sources)."""


def shard_name(k: int, n: int) -> str:
    return f"model-{k + 1:05d}-of-{n:05d}.safetensors"


def remove_stale_weights(folder: str | Path, keep: Iterable[str]) -> list[Path]:
    """Remove the weight files of the other layout (``model.safetensors``, the index, shards)
    that a directory holds besides ``keep``, so that a reader never mixes two runs: transformers
    and hexicore read ``model.safetensors`` first. The caller vouches for them (a run's
    ``final/`` is checked to hold only hexicore's files, or ``overwrite=true`` was given)."""
    keep = set(keep)
    gone = [f for f in Path(folder).iterdir() if f.name not in keep
            and (f.name in (SINGLE, INDEX) or re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f.name))]
    for f in gone:
        f.unlink(missing_ok=True)
    return gone


def write_index(folder: str | Path, weight_map: dict[str, str], total_bytes: int) -> Path:
    """``model.safetensors.index.json`` (Hugging Face's sharded layout)."""
    p = Path(folder) / INDEX
    doc = {"format": "hexicore.hf_index/1", "metadata": {"total_size": int(total_bytes)},
           "weight_map": dict(sorted(weight_map.items()))}
    return schema.write_text_atomic(p, json.dumps(doc, indent=2) + "\n")


def save_tensors(path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file atomically (contiguous CPU copies; never a pickle), marked
    ``generator: hexicore`` in its metadata (:mod:`hexicore.core.ownership`)."""
    from safetensors.torch import save_file

    data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return schema.write_with(path, lambda tmp: save_file(data, str(tmp), metadata={"format": "pt", "generator": "hexicore",
                                                                             **(metadata or {})}))


def nbytes(tensors: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
