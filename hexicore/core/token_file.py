"""Tokenized corpora: a flat file of token ids plus a sidecar JSON (``hexicore.tokens/1``).

The nanoGPT / Megatron convention: ``X.bin`` holds the token ids of every document back to back
(an end-of-sequence id between documents), as little-endian ``uint16`` (vocabularies up to
65,536) or ``uint32``; ``X.bin.json`` says how to read it::

    {"format": "hexicore.tokens/1", "dtype": "uint16", "vocab": 32000, "tokens": 1048576,
     "documents": 812, "eos": 2, "tokenizer": "tok/tokenizer.json",
     "tokenizer_file": "/data/tok/tokenizer.json", "tokenizer_sha256": "9f86d0...",
     "max_id": 31998, "stamp": {"bytes": 2097152, "mtime_ns": 1700000000000000000}}

``tokenizer`` is the tokenizer as ``prepare-data`` was given it; ``tokenizer_file`` the file it
read (absolute) and ``tokenizer_sha256`` that file's digest, so that a run can tell whether the
file there is still the tokenizer of the data (:mod:`hexicore.core.hf_export` copies it into
``out/final/``). Older sidecars lack the last two.

``max_id`` (the largest id in the file) is trusted only while ``stamp`` (the data file's size and
modification time when it was written) still matches; otherwise, and for sidecars without them,
the ids are scanned (memory-mapped, in chunks) before training. The sidecar's ``vocab`` is never
trusted on its own: a sidecar that understates it lets no id through.

The file is memory-mapped, never read whole. Training samples seeded windows of ``seq_len + 1``
tokens (:func:`window_starts`), a pure function of ``(seed, step)``: any plan, a resumed run
and the one-process reference see the same rows. ``hexicore prepare-data`` writes these files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown

FORMAT = "hexicore.tokens/1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
#: ids are checked against the vocabulary in chunks of this many tokens (bounded memory)
CHECK_CHUNK = 1 << 24


def sidecar_path(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".json")


def dtype_for(vocab: int) -> str:
    """The smallest dtype that holds every id of a ``vocab``-sized vocabulary."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


@dataclass(frozen=True)
class TokenFile:
    """A memory-mapped token file and its sidecar's facts."""

    path: str
    dtype: str
    vocab: int
    tokens: int
    documents: int = 0
    eos: int | None = None
    max_id: int | None = None  # the sidecar's record, when its stamp still matches the file
    tokenizer: str | None = None  # the tokenizer prepare-data was given, as given
    tokenizer_file: str | None = None  # the tokenizer file it read, absolute (newer sidecars)
    tokenizer_sha256: str | None = None  # the SHA-256 of that file's bytes then

    @classmethod
    def open(cls, path: str | Path) -> "TokenFile":
        """Read the sidecar and check the data file's size against it (one-line errors)."""
        p = Path(path)
        side = sidecar_path(p)
        if not side.is_file():
            raise HexicoreError(f"no sidecar {side.name} next to the token file (it gives dtype and vocab; "
                                "hexicore prepare-data writes both)", source=str(p), field="runtime.data_file")
        meta = schema.load_json(side, "token file sidecar")
        src = str(side)
        fmt = meta.get("format")
        if fmt != FORMAT:
            raise HexicoreError(f"unsupported format {fmt!r}; expected {FORMAT!r}", source=src, field="format")
        dtype = meta.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise HexicoreError(f"dtype must be one of {', '.join(DTYPES)}, got {shown(dtype)}", source=src, field="dtype")
        vocab = schema.integer(meta.get("vocab"), src, "vocab")
        if p.is_dir():
            raise HexicoreError("is a directory, not a token file", source=str(p), field="runtime.data_file")
        if p.exists() and not p.is_file():  # a FIFO or device: never opened (it could block or never end)
            raise HexicoreError("not a regular file; a token file is read from a regular file", source=str(p),
                                field="runtime.data_file")
        try:
            size = p.stat().st_size
        except OSError as exc:
            raise HexicoreError(f"cannot read the token file: {exc.strerror}", source=str(p),
                                field="runtime.data_file") from None
        width = np.dtype(DTYPES[dtype]).itemsize
        if size % width:
            raise HexicoreError(f"{size} bytes is not a whole number of {dtype} ids", source=str(p))
        tokens = size // width
        if meta.get("tokens") is not None and schema.integer(meta["tokens"], src, "tokens", minimum=0) != tokens:
            raise HexicoreError(f"the sidecar says {meta['tokens']} tokens, the file holds {tokens}", source=src,
                                field="tokens")
        eos = None if meta.get("eos") is None else schema.integer(meta["eos"], src, "eos", minimum=0)
        if eos is not None and eos >= vocab:  # it was dropped from final/'s tokenizer files without a word
            raise HexicoreError(f"id {eos} is outside the vocabulary of {vocab}", source=src, field="eos")
        documents = schema.integer(meta.get("documents") or 0, src, "documents", minimum=0)
        names = {k: _text(meta.get(k), src, k) for k in ("tokenizer", "tokenizer_file", "tokenizer_sha256")}
        return cls(str(p), dtype, vocab, tokens, documents,
                   eos, _recorded_max(meta, p, src),
                   **names)

    def array(self) -> np.ndarray:
        """The ids, memory-mapped read-only."""
        return schema.map_regular(self.path, "token", "runtime.data_file", DTYPES[self.dtype], self.tokens)

    def check(self, model_vocab: int, seq_len: int, ids: bool = True) -> None:
        """Refuse files shorter than one window and (``ids``) ids the model cannot embed (one
        line each); the ids are scanned when the sidecar has no valid ``max_id``."""
        if self.tokens < seq_len + 1:  # one window: seq_len inputs and the label after them
            raise HexicoreError(f"the file holds {self.tokens} tokens, fewer than one window of {seq_len + 1}",
                                source=self.path, field="runtime.data_file")
        if not ids:
            return
        top = self.max_id if self.max_id is not None else self.scan_max()
        if top >= model_vocab:
            raise HexicoreError(f"token id {top} is outside the model's vocabulary of {model_vocab}",
                                source=self.path, field="runtime.data_file")

    def scan_max(self) -> int:
        """The largest id in the file (read in chunks of :data:`CHECK_CHUNK` ids)."""
        data = self.array()
        return int(max((int(data[i: i + CHECK_CHUNK].max()) for i in range(0, self.tokens, CHECK_CHUNK)), default=0))


#: :func:`fingerprint` hashes this many blocks of :data:`PRINT_BLOCK` bytes, evenly spread
PRINT_BLOCKS, PRINT_BLOCK = 64, 4096


def fingerprint(path: str | Path) -> str:
    """A digest of a data file's contents that costs at most 256 KiB of reads, whatever its
    size: the size and 64 blocks of 4 KiB at evenly spread offsets (the whole file when it is
    smaller). A checkpoint records it, so resuming on another file of the same name and size
    (regenerated, shuffled) is refused; a copy of the same file resumes."""
    import hashlib

    p = Path(path)
    try:
        size = p.stat().st_size
        h = hashlib.blake2b(str(size).encode(), digest_size=16)
        with p.open("rb") as f:
            if size <= PRINT_BLOCKS * PRINT_BLOCK:
                h.update(f.read())
            else:
                for i in range(PRINT_BLOCKS):
                    f.seek((size - PRINT_BLOCK) * i // (PRINT_BLOCKS - 1))
                    h.update(f.read(PRINT_BLOCK))
    except OSError as exc:
        raise HexicoreError(f"cannot read the data file: {exc.strerror}", source=str(p),
                            field="runtime.data_file") from None
    return h.hexdigest()


def file_stamp(path: str | Path) -> dict[str, int]:
    """The data file's size and modification time, recorded next to ``max_id``."""
    st = Path(path).stat()
    return {"bytes": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def _text(value: Any, src: str, field: str) -> str | None:
    """A sidecar's optional text field: absent, null or empty is None; another type is refused."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HexicoreError(f"expected text, got {shown(value)}"[:200], source=src, field=field)
    return value


def _recorded_max(meta: dict[str, Any], path: Path, src: str) -> int | None:
    """The sidecar's ``max_id`` when its ``stamp`` matches the data file as it is now, else None
    (the ids are then scanned)."""
    if meta.get("max_id") is None or not isinstance(meta.get("stamp"), dict):
        return None
    top = schema.integer(meta["max_id"], src, "max_id", minimum=0)
    try:
        same = meta["stamp"] == file_stamp(path)
    except OSError:
        return None
    return top if same else None


def window_starts(seed: int, step: int, rows: int, n_tokens: int, width: int) -> np.ndarray:
    """Start offsets of the ``rows`` windows of ``width`` tokens a step uses: a pure function of
    ``(seed, step)`` (numpy's PCG64 seeded by both). Every seed draws its own windows: a seed
    outside ``[0, 2**32)`` (negative, or wider than 32 bits) adds its sign and magnitude to the
    entropy, so it never repeats the windows of its low 32 bits; seeds inside keep theirs."""
    seed = int(seed)
    wide = [] if 0 <= seed < 1 << 32 else [2 if seed < 0 else 1, abs(seed)]  # non-zero 4th word
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, int(step) & 0xFFFFFFFF, 0x68657869, *wide]))
    return rng.integers(0, n_tokens - width + 1, size=rows, dtype=np.int64)


def windows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``[len(starts), width]`` int64 rows read from the memory-mapped ids."""
    out = np.empty((len(starts), width), dtype=np.int64)
    for i, s in enumerate(starts.tolist()):
        out[i] = data[s: s + width]
    return out


def write_sidecar(path: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``X.bin.json`` atomically."""
    return schema.write_text_atomic(sidecar_path(path), json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
