"""What ``out/final/`` carries besides the weights: special token ids, generation config, tokenizer.

A run that fine-tunes a Hugging Face model leaves ``out/final/`` as ``Trainer.save_model`` plus
``tokenizer.save_pretrained`` would: ``transformers`` loads the model, its tokenizer and its
generation settings from it. Where each part comes from (docs/runtime.md):

* the *model sources*, in this order: ``model_file=`` when it is a Hugging Face ``config.json``
  (or its directory), then ``init_from=`` (with ``resume=`` too: its weights are not read then,
  its config and tokenizer files are). Each part is taken from the
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
  trained on that data), with one warning line when the two differ. A ``tokenizer.json``
  without a ``tokenizer_config.json`` gets a minimal one (:func:`tokenizer_config`); where
  transformers would load the token file's tokenizer with another pipeline, the config asks it
  for the file as saved (:func:`keep_data_pipeline`).

The files carry no mark of their own, so ``final/hexicore_files.json`` lists what was written,
with digests (:func:`hexicore.core.ownership.written_by_us`): a rerun replaces them and removes
those it no longer writes, and never touches a file it did not write or that was changed since.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hexicore.core import ownership, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.hf_config import SpecialTokens, config_path, special_tokens

#: the tokenizer files ``transformers`` reads (``AutoTokenizer.from_pretrained``), copied when present
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
                   "chat_template.json")
#: a directory holds a tokenizer when it has one of these (the others only configure one)
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
GENERATION = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
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
    eos: int | None = None  # the end-of-document id prepare-data appended (a token file's tokenizer)

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
    tokenizer_config: str | None = None  # written (:func:`tokenizer_config`, :func:`as_saved`), over a copied one

    def names(self) -> tuple[str, ...]:
        """The files written into ``final/`` besides config and weights."""
        gen = (GENERATION,) if self.generation or self.tokens else ()
        written = (TOKENIZER_CONFIG,) if self.tokenizer_config else ()
        copied = tuple(n for n, _ in (self.tokenizer.files if self.tokenizer else ()) if n not in written)
        return gen + copied + written

    def contents(self) -> dict[str, bytes]:
        """Each of :meth:`names` with its bytes (read now: copies of the source files)."""
        out: dict[str, bytes] = {}
        if self.generation:
            out[GENERATION] = schema.read_bytes(self.generation, "generation config")
        elif self.tokens:
            out[GENERATION] = (json.dumps(self.tokens.to_json(), indent=2) + "\n").encode()
        for name, path in self.tokenizer.files if self.tokenizer else ():
            out[name] = schema.read_bytes(path, "tokenizer")
        if self.tokenizer_config:
            out[TOKENIZER_CONFIG] = self.tokenizer_config.encode()
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
    generation = first("generation", lambda a, b: schema.load_json(a, "generation config") ==
                       schema.load_json(b, "generation config"))
    tokenizer = first("tokenizer", lambda a, b: a.digest == b.digest)
    if data_tokenizer is not None:
        if tokenizer is not None and tokenizer.digest != data_tokenizer.digest:
            warnings.append(f"{WARNING}the token file's tokenizer {data_tokenizer.origin} differs from the model's "
                            f"{tokenizer.origin}; final/ takes the token file's (the data the model trained on)")
        if tokenizer is None or tokenizer.digest != data_tokenizer.digest:
            tokenizer = data_tokenizer
        elif tokenizer.eos is None:  # the same tokenizer: the model's set, the data's end-of-document id
            tokenizer = replace(tokenizer, eos=data_tokenizer.eos)
    return FinalExtras(tokens, generation, tokenizer, tokenizer_config(tokenizer, tokens)), warnings


def tokenizer_config(tokenizer: TokenizerFiles | None, tokens: SpecialTokens) -> str | None:
    """A minimal ``tokenizer_config.json`` for a ``tokenizer.json`` that comes without one (a
    ``tokenizers`` file as ``prepare-data`` takes it): without it ``AutoTokenizer`` loads no
    special tokens. ``PreTrainedTokenizerFast`` with ``eos_token`` the text of the token file's
    end-of-document id where there is one; ``bos_token``/``pad_token`` (and ``eos_token`` without
    a token file) of the model's ids where the tokenizer has a special token of that id; None
    when a config comes along or there is no ``tokenizer.json``."""
    names = dict(tokenizer.files) if tokenizer else {}
    if "tokenizer.json" not in names or TOKENIZER_CONFIG in names:
        return None
    texts, special = token_texts(names["tokenizer.json"])
    eos = tokens.eos[0] if isinstance(tokens.eos, tuple) else tokens.eos
    doc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, i in (("bos_token", tokens.bos), ("eos_token", eos), ("pad_token", tokens.pad)):
        if i in special:
            doc[key] = texts[i]
    if tokenizer.eos in texts:  # the id prepare-data ended every document with
        doc["eos_token"] = texts[tokenizer.eos]
    return json.dumps(doc, indent=2) + "\n"


def token_texts(path: str | Path) -> tuple[dict[int, str], set[int]]:
    """Id -> token text of a ``tokenizers`` file (its vocabulary and added tokens), and the ids
    of its special added tokens; empty for a file this cannot read (copied as it is either way)."""
    try:
        doc = schema.load_json(path, "tokenizer")
    except HexicoreError:
        return {}, set()
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    vocab = model.get("vocab")
    out: dict[int, str] = {}
    if isinstance(vocab, dict):
        out.update({i: t for t, i in vocab.items() if isinstance(i, int) and isinstance(t, str)})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        out.update({i: e[0] for i, e in enumerate(vocab) if isinstance(e, list) and e and isinstance(e[0], str)})
    special: set[int] = set()
    for added in doc.get("added_tokens") if isinstance(doc.get("added_tokens"), list) else ():
        if isinstance(added, dict) and isinstance(added.get("id"), int) and isinstance(added.get("content"), str):
            out[added["id"]] = added["content"]
            special |= {added["id"]} if added.get("special") else set()
    return out, special


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
    return replace(found or TokenizerFiles.single(p), eos=token_file.eos), []


#: text that tells tokenizer pipelines apart: composed and decomposed accents (normalizers), digit
#: runs, contractions, runs of spaces and newlines, punctuation and scripts (pre-tokenizers)
PROBE = ("Ünïcode café cafe\u0301 naïve 12345 67.89 1,000,000 don't  IT'S we'll\n\n  two spaces\there\r\n"
         "end!!! ... (x+y)=z; 日本語の文 Привет мир — \"quoted\" 🙂 https://example.org/a_b?c=1")


#: the ``tokenizer_config.json`` key under which transformers (5.x) loads ``tokenizer.json`` into
#: the tokenizer class it picks for the model type as the file is, instead of rebuilding that
#: class's own normalizer and pre-tokenizer around the file's vocabulary; the key enables no
#: code (there is no ``auto_map``), and transformers 4 keeps it as an unused setting
AS_SAVED = "trust_remote_code"
_UNCHECKED = "could not be checked"


def autotokenizer_mismatch(extras: FinalExtras, config: dict[str, Any], data_tokenizer: str | Path) -> str | None:
    """A warning when ``transformers.AutoTokenizer.from_pretrained(final/)`` — ``final/`` holding
    ``config`` and ``extras``' tokenizer files — would encode text otherwise than the token file's
    ``tokenizers`` file ``data_tokenizer`` did in ``prepare-data`` (transformers rebuilds some
    model types' tokenizers, Qwen2's among them, with their own normalizer and pre-tokenizer from
    the file's vocabulary); None when they agree on :data:`PROBE`, or without transformers."""
    import tempfile

    try:
        import transformers
        from tokenizers import Tokenizer
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        for name, data in extras.contents().items():
            (Path(folder) / name).write_bytes(data)
        try:
            loaded = transformers.AutoTokenizer.from_pretrained(folder)
            theirs = loaded(PROBE, add_special_tokens=False)["input_ids"]
            ours = Tokenizer.from_file(str(data_tokenizer)).encode(PROBE, add_special_tokens=False).ids
        except Exception as exc:  # noqa: BLE001 - another library's failure is a note, not the run's
            return f"{WARNING}AutoTokenizer.from_pretrained(final/) {_UNCHECKED}: {str(exc)[:160]}"
    if theirs == ours:
        return None
    return (f"{WARNING}AutoTokenizer.from_pretrained(final/) would split text otherwise than the token file: "
            f"transformers builds a {type(loaded).__name__} for model_type {config.get('model_type')!r}, with its "
            f"own normalizer and pre-tokenizer, not those of {data_tokenizer}; to get the ids the model trained on "
            "back from final/, prepare the data with the model's own tokenizer (a directory saved by transformers)")


def as_saved(extras: FinalExtras) -> FinalExtras:
    """``extras`` whose ``tokenizer_config.json`` (the one it writes, else the one it copies, else
    a minimal ``PreTrainedTokenizerFast`` one) also carries :data:`AS_SAVED`; ``extras`` itself
    when the copied one is not a JSON object (the file stays as it is)."""
    names = dict(extras.tokenizer.files) if extras.tokenizer else {}
    if extras.tokenizer_config:
        doc = json.loads(extras.tokenizer_config)
    elif TOKENIZER_CONFIG in names:
        try:
            doc = schema.load_json(names[TOKENIZER_CONFIG], "tokenizer config")
        except HexicoreError:
            return extras
    else:
        doc = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if not isinstance(doc, dict):
        return extras
    return replace(extras, tokenizer_config=json.dumps({**doc, AS_SAVED: True}, indent=2) + "\n")


def keep_data_pipeline(extras: FinalExtras, config: dict[str, Any],
                       data_tokenizer: str | Path) -> tuple[FinalExtras, str | None]:
    """``extras`` such that ``AutoTokenizer.from_pretrained(final/)`` encodes as the token file's
    tokenizer ``data_tokenizer`` did: as they are when it already does; else with their
    ``tokenizer_config.json`` asking for the file as saved (:func:`as_saved`) when that makes it
    do so; else as they are, with the warning of :func:`autotokenizer_mismatch`."""
    differs = autotokenizer_mismatch(extras, config, data_tokenizer)
    if differs is None or _UNCHECKED in differs:
        return extras, differs
    kept = as_saved(extras)
    if kept is not extras and autotokenizer_mismatch(kept, config, data_tokenizer) is None:
        return kept, None
    return extras, differs


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

