"""``hexicore prepare-data input=... tokenizer=PATH/tokenizer.json out=X.bin``: tokenize text.

Inputs are text files (``.txt``, one document per file) or JSON-lines files (``.jsonl``, one
document per line, its text under ``prepare.text_key``); ``input`` is a path, a glob or a list of
them. The Hugging Face ``tokenizers`` tokenizer encodes batches of ``prepare.batch_docs``
documents on every core (offline: the tokenizer is a local file), an end-of-document id is
appended after each document, and the ids stream into ``X.bin`` with the sidecar ``X.bin.json``
(:mod:`hexicore.core.token_file`). Both are written as unnamed files and named only when
complete (:func:`hexicore.core.schema.atomic_output`). Like every output, they replace only a previous token file (its sidecar a
``hexicore.tokens`` file) unless ``overwrite=true``, and never an input. Prints documents, tokens
and throughput.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from omegaconf import DictConfig, OmegaConf

from hexicore.app.progress_display import shown_progress
from hexicore.app.report import console, rows_table
from hexicore.core import schema
from hexicore.core.errors import HexicoreError
from hexicore.core.input_size import JSONL_LINE_BYTES, TOKENIZER_BATCH, TOKENIZER_PIECE
from hexicore.core.ownership import check_token_output
from hexicore.core.token_file import DTYPES, dtype_for, file_stamp, sidecar_path, write_sidecar

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")


def input_files(spec: Any) -> list[Path]:
    """``input=`` as files: each item a path or a glob; a missing match is an error. A file
    named twice (a glob and a path, two links to it) is read once, where it is first named."""
    items = spec if isinstance(spec, (list, tuple)) else [] if spec is None or str(spec) == "" else [spec]
    if not items:
        raise HexicoreError("needs at least one input file (input=PATH, a glob, or a list)", source="command line",
                            field="input")
    files: list[Path] = []
    for item in items:
        matches = sorted(glob.glob(str(item))) if any(c in str(item) for c in "*?[") else [str(item)]
        if not matches or not all(Path(m).is_file() for m in matches):
            raise HexicoreError(f"no such input file: {item}", source="command line", field="input")
        files += [Path(m) for m in matches]
    first = {}
    for f in files:
        first.setdefault(f.resolve(), f)
    return list(first.values())


def pieces(text: str, size: int | None = None) -> Iterator[str]:
    """``text`` cut into pieces of at most ``size`` characters (default
    :data:`~hexicore.core.input_size.TOKENIZER_PIECE`), each cut after a line break or before a
    space where the piece has one (so that words stay whole), for the tokenizer."""
    size = size or TOKENIZER_PIECE
    while len(text) > size:
        cut = text.rfind("\n", 0, size) + 1 or text.rfind(" ", 1, size)
        cut = cut if cut > 0 else size
        yield text[:cut]
        text = text[cut:]
    yield text


def documents(files: list[Path], text_key: str) -> Iterator[tuple[str, int, bool]]:
    """(piece of text, bytes read, whether the piece ends its document) in file order: a text
    file is one document, read in blocks (never whole); a JSON-lines file one document per
    line; every piece at most :data:`~hexicore.core.input_size.TOKENIZER_PIECE` characters. A
    ``.jsonl`` suffix in any case (``.JSONL``) is a JSON-lines file."""
    for f in files:
        if f.suffix.lower() == ".jsonl":
            for text, nbytes in _json_lines(f, text_key):
                parts = list(pieces(text))
                for i, part in enumerate(parts):
                    yield part, nbytes if i == 0 else 0, i == len(parts) - 1
        else:
            yield from _text_file(f)


def _text_file(f: Path) -> Iterator[tuple[str, int, bool]]:
    """A text file's pieces, decoded as UTF-8 block by block (a byte-order mark is no text)."""
    import codecs

    fh = schema.open_regular(f)
    if fh is None:
        raise HexicoreError("not a regular file", source=str(f), field="input")
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    held = ""
    with fh:
        while True:
            try:
                block = fh.read(TOKENIZER_PIECE)
                held += decoder.decode(block, final=not block)
            except (OSError, UnicodeDecodeError) as exc:
                raise HexicoreError(f"cannot read as UTF-8 text: {exc}", source=str(f), field="input") from None
            if not block:
                yield held, 0, True
                return
            *done, held = list(pieces(held))
            for i, part in enumerate(done):
                yield part, len(block) if i == 0 else 0, False
            if not done:
                yield "", len(block), False


def _json_lines(f: Path, text_key: str) -> Iterator[tuple[str, int]]:
    """(text, bytes read) per line of a JSON-lines file (a byte-order mark before the first is
    skipped); a line that is not UTF-8, or whose text escapes a lone surrogate (no UTF-8 text),
    is an error naming it, like any other bad line; so is a line longer than
    :data:`~hexicore.core.input_size.JSONL_LINE_BYTES` (never read beyond that)."""
    fh = schema.open_regular(f)
    if fh is None:
        raise HexicoreError("not a regular file", source=str(f), field="input")
    with fh:
        for n, raw in enumerate(iter(lambda: fh.readline(JSONL_LINE_BYTES + 1), b""), 1):
            if len(raw) > JSONL_LINE_BYTES:
                raise HexicoreError(f"the line is longer than hexicore's limit of {JSONL_LINE_BYTES:,} bytes "
                                    "(docs/formats.md, Limits)", source=str(f), field=f"line {n}")
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise HexicoreError(f"cannot read as UTF-8 text: {exc}", source=str(f), field=f"line {n}") from None
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                text = doc[text_key]
            except (json.JSONDecodeError, KeyError, TypeError, RecursionError):
                raise HexicoreError(f"expected a JSON object with a string {text_key!r}", source=str(f),
                                    field=f"line {n}") from None
            if not isinstance(text, str):
                raise HexicoreError(f"{text_key!r} is not a string", source=str(f), field=f"line {n}")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise HexicoreError(f"{text_key!r} is not UTF-8 text: {exc.reason} at character {exc.start}",
                                    source=str(f), field=f"line {n}") from None
            yield text, len(raw)


def tokenizer_file(path: Any) -> Path:
    """``tokenizer=`` as the file read: a ``tokenizer.json``, or the directory holding one."""
    if not path:
        raise HexicoreError("prepare-data needs tokenizer=PATH/tokenizer.json", source="command line",
                            field="tokenizer")
    p = Path(str(path))
    return p / "tokenizer.json" if p.is_dir() else p


def load_tokenizer(path: Any) -> Any:
    from tokenizers import Tokenizer

    p = tokenizer_file(path)
    text = schema.read_bytes(p, "tokenizer", field="tokenizer")  # regular, within its size limit
    try:
        return Tokenizer.from_str(text.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise HexicoreError(f"cannot load the tokenizer: {str(exc).splitlines()[0]}", source=str(p),
                            field="tokenizer") from None


def eos_id(tok: Any, eos: Any) -> int:
    """The end-of-document id: ``prepare.eos`` (a token or an id below the tokenizer's vocabulary,
    so the output dtype holds it) or the tokenizer's own."""
    if eos is not None:
        if isinstance(eos, int) and not isinstance(eos, bool):
            vocab = tok.get_vocab_size(with_added_tokens=True)
            if not 0 <= eos < vocab:
                raise HexicoreError(f"id {eos} is outside the tokenizer's vocabulary of {vocab} (0..{vocab - 1})",
                                    source="command line", field="prepare.eos")
            return eos
        if not isinstance(eos, (str, int)) or isinstance(eos, bool):  # [SEP] on a command line is a list to Hydra
            raise HexicoreError(f"expected a token or an id, got {type(eos).__name__} {eos!r} (a token in brackets: "
                                f"quote it, prepare.eos=\"'[SEP]'\")", source="command line", field="prepare.eos")
        found = tok.token_to_id(str(eos))
        if found is None:
            raise HexicoreError(f"the tokenizer has no token {eos!r}", source="command line", field="prepare.eos")
        return found
    for cand in EOS_CANDIDATES:
        found = tok.token_to_id(cand)
        if found is not None:
            return found
    raise HexicoreError("the tokenizer has none of the usual end-of-text tokens; set prepare.eos",
                        source="command line", field="prepare.eos")


def _batches(parts: Iterator[tuple[str, int, bool]], size: int) -> Iterator[tuple[list[tuple[str, bool]], int]]:
    """Pieces (text, ends its document) in batches of at most ``size`` pieces and
    :data:`~hexicore.core.input_size.TOKENIZER_BATCH` characters, with the bytes they read."""
    batch: list[tuple[str, bool]] = []
    nbytes = chars = 0
    for text, b, last in parts:
        batch.append((text, last))
        nbytes, chars = nbytes + b, chars + len(text)
        if len(batch) >= size or chars >= TOKENIZER_BATCH:
            yield batch, nbytes
            batch, nbytes, chars = [], 0, 0
    if batch:
        yield batch, nbytes


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While the token file is written, SIGTERM leaves through Python's exit path (``finally``
    blocks remove the temporary file), as Ctrl-C does; the handler before is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def tokenize(files: list[Path], tok: Any, eos: int, out: Path, *, text_key: str, batch_docs: int,
             progress: Any = None) -> tuple[dict[str, Any], int]:
    """Stream every document's ids (+ eos) into ``out`` (:func:`hexicore.core.schema.atomic_output`:
    a killed run leaves no file behind); the stats and the number of documents skipped as empty.
    A document with no tokens (an empty or
    blank file or ``text``) is skipped, as Megatron's preprocessing skips it: a lone end-of-text
    token is no document. Blank (whitespace only) text is skipped before encoding, since a
    byte-level tokenizer would give it whitespace tokens; input with no tokens at all is refused
    and nothing is written."""
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = DTYPES[dtype_for(vocab)]
    n_docs = n_tokens = skipped = 0
    top = -1
    held: list[int] = []  # ids of the document being read while it has no text yet (blank so far)
    text_seen = False  # whether that document has any non-blank piece (its ids are then written at once)
    with _sigterm_exits(), schema.atomic_output(out) as fh:
        for batch, nbytes in _batches(documents(files, text_key), batch_docs):
            encs = tok.encode_batch([t for t, _ in batch], add_special_tokens=False)
            written: list[int] = []
            for (text, last), enc in zip(batch, encs):
                if text_seen or text.strip():
                    written += held + enc.ids
                    held, text_seen = [], True
                else:
                    held += enc.ids
                if not last:
                    continue
                if text_seen:  # blank text is no document, whatever the tokenizer gives it
                    written.append(eos)
                    n_docs += 1
                else:
                    skipped += 1
                held, text_seen = [], False
            del encs
            arr = np.asarray(written, dtype=np.int64)
            fh.write(arr.astype(dtype).tobytes())
            top = max(top, int(arr.max(initial=-1)))
            n_tokens += len(arr)
            if progress is not None:
                progress(nbytes)
        if not n_tokens:  # the block raises: nothing is written
            where = str(files[0]) if len(files) == 1 else "command line"
            raise HexicoreError(f"no document has any text ({skipped} empty): nothing to write", source=where,
                                field="input")
    stats = {"dtype": dtype_for(vocab), "vocab": vocab, "tokens": n_tokens, "documents": n_docs, "eos": eos}
    if top >= 0:  # trusted by training while the file's stamp matches (hexicore.core.token_file)
        stats.update(max_id=top, stamp=file_stamp(out))
    return stats, skipped


def tokenizer_record(given: Any) -> dict[str, str]:
    """The sidecar's account of the tokenizer: as given, the file read (absolute) and its digest,
    so a run can copy exactly this tokenizer into ``out/final/`` (docs/formats.md)."""
    from hexicore.core.ownership import file_digest

    p = tokenizer_file(given).resolve()
    return {"tokenizer": str(given), "tokenizer_file": str(p), "tokenizer_sha256": file_digest(p)}


def check_out(out: Path, files: list[Path], overwrite: Any) -> list[Path]:
    """Before any work: ``out`` and its sidecar are not an input, not another tool's files
    (:func:`hexicore.core.ownership.check_token_output`), and their folder can be made; the
    folders made, deepest first (removed again if the run writes nothing)."""
    side = sidecar_path(out)
    for f in files:
        for p in (out, side):
            if p.exists() and os.path.samefile(p, f):
                raise HexicoreError(f"is the input {f}; the token file goes elsewhere", source=str(p), field="out")
    check_token_output(out, overwrite=overwrite)
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
        raise HexicoreError(f"cannot create the folder {out.parent}: {why}", source=str(out), field="out") from None
    return made


def run(cfg: DictConfig) -> int:
    prep = OmegaConf.to_container(cfg.get("prepare") or {}, resolve=True)
    files = input_files(OmegaConf.to_container(cfg.input, resolve=True) if OmegaConf.is_list(cfg.get("input"))
                        else cfg.get("input") or "")
    batch_docs = schema.integer(prep.get("batch_docs", 1024), "command line", "prepare.batch_docs")
    tok = load_tokenizer(cfg.get("tokenizer"))
    record = tokenizer_record(cfg.tokenizer)  # the bytes just read, before the corpus takes minutes
    eos = eos_id(tok, prep.get("eos"))
    if not cfg.get("out"):
        raise HexicoreError("prepare-data needs out=PATH.bin", source="command line", field="out")
    out = Path(str(cfg.out))
    made = check_out(out, files, cfg.get("overwrite"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    total = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    done = 0  # bytes read
    try:
        with shown_progress("prepare-data", "tokenizing") as progress:
            def read(nbytes: int) -> None:
                nonlocal done
                done += nbytes
                progress("tokenizing", done / total if total else 1.0)

            stats, skipped = tokenize(files, tok, eos, out, text_key=str(prep.get("text_key", "text")),
                                      batch_docs=batch_docs, progress=read)
    except BaseException:  # nothing written: the folders made for it go too
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    secs = time.perf_counter() - t0
    write_sidecar(out, {**stats, **record})
    console().print(rows_table("hexicore prepare-data", ("files", "documents", "tokens", "dtype", "seconds", "tokens/s"),
                               [(str(len(files)), str(stats["documents"]), str(stats["tokens"]), stats["dtype"],
                                 f"{secs:.2f}", f"{stats['tokens'] / max(secs, 1e-9):,.0f}")]))
    if skipped:
        console().print(f"skipped {skipped} empty document{'s' if skipped != 1 else ''} (no tokens)")
    console().print(f"token file written to {out} (sidecar {out.name}.json)")
    return 0
