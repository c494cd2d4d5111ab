"""What ``out/final/`` carries besides the weights: special token ids, generation config, tokenizer.

A run that fine-tunes a Hugging Face model leaves ``out/final/`` as ``Trainer.save_model`` plus
``tokenizer.save_pretrained`` would: ``transformers`` loads the model, its tokenizer and its
generation settings from it. Where each part comes from (docs/runtime.md):

* the *model sources*, in this order: ``model_file=`` when it is a Hugging Face ``config.json``
  (or its directory), then ``init_from=`` (without ``resume=``). Each part is taken from the
  first source that has it; a later source that has it too and disagrees is one warning line.
  A source's directory counts only for a directory or a file named ``config.json`` (another
  ``*.json`` may sit among unrelated files);
* special token ids (:class:`~hexicore.core.hf_config.SpecialTokens`): the source's
  ``config.json`` ``bos_token_id``/``eos_token_id``/``pad_token_id``, into ``final/config.json``;
* ``generation_config.json``: the source directory's, copied byte for byte (checked before
  launch: a JSON object whose token ids are ids); else one written from the ids when there are
  any; else none;
* tokenizer files (:data:`TOKENIZER_FILES`, those present): from the source directory, or — with
  ``runtime.data=tokens`` — the tokenizer ``prepare-data`` read (its sidecar names the file and
  its digest, :mod:`hexicore.core.token_file`), which wins over the source's (the model was
  trained on that data), with one warning line when the two differ.

The files carry no mark of their own, so ``final/hexicore_files.json`` lists what was written,
with digests (:func:`hexicore.core.ownership.written_by_us`): a rerun replaces them and removes
those it no longer writes, and never touches a file it did not write or that was changed since.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexicore.core import ownership, schema
from hexicore.core.hf_config import SpecialTokens, config_path, special_tokens

#: the tokenizer files ``transformers`` reads (``AutoTokenizer.from_pretrained``), copied when present
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
                   "chat_template.json")
#: a directory holds a tokenizer when it has one of these (the others only configure one)
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
GENERATION = "generation_config.json"
#: the only names :func:`write_extras` writes, and so the only ones it ever removes
MANAGED = (GENERATION, *TOKENIZER_FILES)
MANIFEST_FORMAT = "hexicore.final_files/1"
WARNING = "warning: "


@dataclass(frozen=True)
class TokenizerFiles:
    """A tokenizer to copy: ``files`` are ``(name in final/, path)``; ``origin`` names it in
    messages; ``digest`` tells two tokenizers apart (of ``tokenizer.json`` where there is one)."""

    origin: str
    files: tuple[tuple[str, str], ...]
    digest: str

    @classmethod
    def directory(cls, folder: str | Path) -> "TokenizerFiles | None":
        """The tokenizer files of ``folder``; None when it holds no vocabulary file."""
        d = Path(folder)
        present = [n for n in TOKENIZER_FILES if (d / n).is_file()]
        if not any(n in VOCABULARY_FILES for n in present):
            return None
        return cls(str(d), tuple((n, str(d / n)) for n in present), _digest(d, present))

    @classmethod
    def single(cls, path: str | Path) -> "TokenizerFiles":
        """One ``tokenizers`` file, copied as ``tokenizer.json``."""
        return cls(str(path), (("tokenizer.json", str(path)),), ownership.file_digest(path))


def _digest(d: Path, names: list[str]) -> str:
    if "tokenizer.json" in names:
        return ownership.file_digest(d / "tokenizer.json")
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode() + b"\0" + ownership.file_digest(d / n).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class FinalExtras:
    """What ``out/final/`` holds beside the weights and the model's config (module docstring)."""

    tokens: SpecialTokens = field(default_factory=SpecialTokens)
    generation: str | None = None  # a generation_config.json to copy
    tokenizer: TokenizerFiles | None = None

    def names(self) -> tuple[str, ...]:
        """The files written into ``final/`` besides config and weights."""
        gen = (GENERATION,) if self.generation or self.tokens else ()
        return gen + tuple(n for n, _ in (self.tokenizer.files if self.tokenizer else ()))

    def contents(self) -> dict[str, bytes]:
        """Each of :meth:`names` with its bytes (read now: copies of the source files)."""
        out: dict[str, bytes] = {}
        if self.generation:
            out[GENERATION] = Path(self.generation).read_bytes()
        elif self.tokens:
            out[GENERATION] = (json.dumps(self.tokens.to_json(), indent=2) + "\n").encode()
        for name, path in self.tokenizer.files if self.tokenizer else ():
            out[name] = Path(path).read_bytes()
        return out


def check_generation_config(path: str | Path, vocab: int | None) -> str:
    """A source's ``generation_config.json``: a JSON object whose token ids are ids (null, an
    integer below the vocabulary, a list for ``eos``); one line naming the file and field."""
    special_tokens(schema.load_json(path, "generation config"), str(path), vocab)
    return str(path)


@dataclass(frozen=True)
class _Source:
    label: str
    tokens: SpecialTokens
    generation: str | None
    tokenizer: TokenizerFiles | None


def read_source(path: str | Path, label: str, vocab: int | None) -> _Source:
    """What one model source carries (``label``: ``model_file`` or ``init_from``)."""
    p = Path(path)
    cfg = config_path(p)
    tokens = SpecialTokens()
    if cfg.is_file():
        tokens = special_tokens(schema.load_json(cfg, "model config"), str(cfg), vocab)
    folder = p if p.is_dir() else (p.parent if p.name == "config.json" else None)
    if folder is None:
        return _Source(label, tokens, None, None)
    gen = folder / GENERATION
    return _Source(label, tokens, check_generation_config(gen, vocab) if gen.is_file() else None,
                   TokenizerFiles.directory(folder))


def resolve(sources: list[tuple[str, str]], data_tokenizer: TokenizerFiles | None,
            vocab: int | None) -> tuple[FinalExtras, list[str]]:
    """The run's :class:`FinalExtras` from its model sources (``(label, path)``, in order of
    preference) and the token file's tokenizer; and the warning lines (module docstring)."""
    read = [read_source(path, label, vocab) for label, path in sources]
    warnings: list[str] = []

    def first(part: str, same: Any) -> Any:
        have = [s for s in read if getattr(s, part)]
        for other in have[1:]:
            if not same(getattr(have[0], part), getattr(other, part)):
                warnings.append(f"{WARNING}{have[0].label}={_where(have[0], part)} and {other.label}="
                                f"{_where(other, part)} carry different {_WHAT[part]}; final/ takes {have[0].label}'s")
        return getattr(have[0], part) if have else None

    tokens = first("tokens", lambda a, b: a == b) or SpecialTokens()
    generation = first("generation", lambda a, b: json.loads(Path(a).read_bytes()) == json.loads(Path(b).read_bytes()))
    tokenizer = first("tokenizer", lambda a, b: a.digest == b.digest)
    if data_tokenizer is not None:
        if tokenizer is not None and tokenizer.digest != data_tokenizer.digest:
            warnings.append(f"{WARNING}the token file's tokenizer {data_tokenizer.origin} differs from the model's "
                            f"{tokenizer.origin}; final/ takes the token file's (the data the model trained on)")
        if tokenizer is None or tokenizer.digest != data_tokenizer.digest:
            tokenizer = data_tokenizer
    return FinalExtras(tokens, generation, tokenizer), warnings


_WHAT = {"tokens": "special token ids", "generation": "generation configs", "tokenizer": "tokenizers"}


def _where(s: _Source, part: str) -> str:
    if part == "tokens":
        return str(s.tokens.to_json())
    return s.generation if part == "generation" else s.tokenizer.origin


def data_tokenizer(token_file: Any) -> tuple[TokenizerFiles | None, list[str]]:
    """The tokenizer a :class:`~hexicore.core.token_file.TokenFile`'s sidecar names: the file
    ``prepare-data`` read while its digest still matches (a changed or missing file is a warning,
    and no tokenizer); for older sidecars, the ``tokenizer`` they record (relative to the current
    directory) when it is there. A ``tokenizer.json`` brings its directory's other tokenizer files."""
    given = token_file.tokenizer_file or token_file.tokenizer
    if not given:
        return None, []
    p = Path(given)
    p = p / "tokenizer.json" if p.is_dir() else p
    side = f"{token_file.path}.json"
    if not p.is_file():
        return None, [f"{WARNING}{side}: the tokenizer {p} is gone; final/ gets no tokenizer from the token file"]
    if token_file.tokenizer_sha256 and ownership.file_digest(p) != token_file.tokenizer_sha256:
        return None, [f"{WARNING}{side}: the tokenizer {p} changed since prepare-data read it; final/ gets no "
                      "tokenizer from the token file"]
    found = TokenizerFiles.directory(p.parent) if p.name == "tokenizer.json" else None
    return found or TokenizerFiles.single(p), []


def write_extras(folder: str | Path, extras: FinalExtras | None) -> None:
    """Write ``extras`` into ``folder`` (rank 0, after the weights) and keep the manifest: first
    listing the old and the new digest of every name (a writer killed midway leaves files a
    rerun still recognises), then the new ones only. Files an earlier run wrote that this one
    does not, unchanged since, are removed; with nothing to write and nothing of ours there,
    nothing is touched (no manifest)."""
    d = Path(folder)
    old = ownership.final_manifest(d)
    files = extras.contents() if extras else {}
    if not files and not old:
        return
    new = {n: [hashlib.sha256(b).hexdigest()] for n, b in files.items()}
    _write_manifest(d, {n: sorted(set(old.get(n, [])) | set(new.get(n, []))) for n in {*old, *new}})
    for name, data in files.items():
        schema.write_bytes_atomic(d / name, data)
    for name in set(old) - set(files):
        if name in MANAGED and ownership.written_by_us(d, name, old):
            (d / name).unlink()
    if new:
        _write_manifest(d, new)
    else:
        (d / ownership.FINAL_MANIFEST).unlink(missing_ok=True)


def _write_manifest(d: Path, files: dict[str, list[str]]) -> None:
    doc = {"format": MANIFEST_FORMAT, "files": dict(sorted(files.items()))}
    schema.write_text_atomic(d / ownership.FINAL_MANIFEST, json.dumps(doc, indent=2) + "\n")

