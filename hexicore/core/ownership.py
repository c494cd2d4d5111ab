"""Which files a command may replace: only its own kind of hexicore output.

Every file hexicore writes carries a mark of its kind: JSON files a ``format`` field
(``hexicore.plan/1``, ``hexicore.actions/1``, ``hexicore.summary/1``, ``hexicore.metrics/1``,
the final Hugging Face directory's ``hexicore.hf_config/1`` and ``hexicore.hf_index/1``, ...),
Chrome traces ``otherData.generator == "hexicore"``, PNG pictures a ``Software`` text chunk
starting with ``hexicore``, safetensors files ``generator: hexicore`` in their header's
``__metadata__``. Before any work, a command checks each path it will write:

* a path that does not exist, or a file of the same kind: fine;
* anything else (a text file, another tool's JSON, a directory where a file goes, a different
  hexicore kind): refused with one line naming the path — unless ``overwrite=true``;
* with ``overwrite=false`` every existing file is refused;
* a device, FIFO or socket (or a link to one) is refused whatever ``overwrite`` says, and is
  never opened: recognising a file reads at most a bounded head of a regular file.

:func:`check_writable` is the one rule; commands call it for the file and its documented
siblings (the plan's picture, the simulator's trace and timeline).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any, Iterable

from hexicore.core.errors import HexicoreError
from hexicore.core.schema import open_regular
from hexicore.core.writable import parent_is_a_folder, refuse_special, statable

#: the Software text written into every PNG hexicore draws
PNG_SOFTWARE = "hexicore"
#: bytes read to recognise a file (a plan or metrics file is identified by its first keys)
_HEAD = 1 << 20
#: a JSON file up to this size is parsed whole to find its kind; a larger one by its head and tail
_WHOLE = 256 << 20
_FORMAT = re.compile(rb'^\s*\{\s*"format"\s*:\s*"(hexicore\.[A-Za-z0-9_]+)')
_GENERATOR = re.compile(rb'"otherData"\s*:\s*\{\s*"generator"\s*:\s*"hexicore"\s*\}\s*\}\s*$')


def png_metadata(what: str) -> dict[str, str]:
    """``savefig(..., metadata=png_metadata("plan"))`` marks a picture as ours."""
    return {"Software": f"{PNG_SOFTWARE} {what}"}


def png_software(path: Path) -> str | None:
    """The ``Software`` tEXt chunk of a PNG (None if absent or not a PNG); reads chunk headers only."""
    fh = open_regular(path)
    if fh is None:
        return None
    try:
        with fh:
            if fh.read(8) != b"\x89PNG\r\n\x1a\n":
                return None
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT" or kind == b"IEND":
                    return None
                body = fh.read(min(length, _HEAD))
                fh.seek(4, 1)  # CRC
                if kind == b"tEXt" and b"\x00" in body:
                    key, _, value = body.partition(b"\x00")
                    if key == b"Software":
                        return value.decode("latin-1")
    except OSError:
        return None


def json_kind(path: Path) -> str | None:
    """A hexicore JSON file's kind (its ``format``, or ``trace`` for our Chrome traces). A file
    above :data:`_WHOLE` bytes is recognised by its head (a leading ``format``) and tail (our
    traces end with ``otherData``) alone, so memory stays bounded."""
    fh = open_regular(path)
    if fh is None:
        return None
    try:
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size > _WHOLE:
                head = _FORMAT.match(fh.read(_HEAD))
                if head:
                    return head.group(1).decode("ascii")
                fh.seek(size - 4096)
                return "hexicore.trace" if _GENERATOR.search(fh.read()) else None
            data: Any = json.loads(fh.read(_WHOLE + 1))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    fmt = data.get("format")
    if isinstance(fmt, str) and fmt.startswith("hexicore."):
        return fmt.split("/")[0]
    other = data.get("otherData")
    if isinstance(other, dict) and other.get("generator") == "hexicore":
        return "hexicore.trace"
    return None


#: the first line of a run's ``config.yaml`` (a config Hydra reads again, so its kind is a comment)
RUN_CONFIG_MARK = "# hexicore.run_config/1"


def yaml_kind(path: Path) -> str | None:
    """A hexicore YAML file's kind (its top-level ``format``, e.g. ``hexicore.profile/1``, or a
    run's ``config.yaml`` by its first line, :data:`RUN_CONFIG_MARK`)."""
    import yaml

    fh = open_regular(path)
    if fh is None:
        return None
    try:
        with fh:
            head = fh.read(_HEAD)
        if head.split(b"\n", 1)[0].decode("utf-8", "replace").startswith(RUN_CONFIG_MARK):
            return "hexicore.run_config"
        data: Any = yaml.safe_load(head)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None
    fmt = data.get("format") if isinstance(data, dict) else None
    return fmt.split("/")[0] if isinstance(fmt, str) and fmt.startswith("hexicore.") else None


def safetensors_generator(path: Path) -> str | None:
    """``__metadata__.generator`` of a safetensors file (reads its JSON header only)."""
    fh = open_regular(path)
    if fh is None:
        return None
    try:
        with fh:
            n = int.from_bytes(fh.read(8), "little")
            head: Any = json.loads(fh.read(n)) if 2 <= n <= _HEAD else None
    except (OSError, ValueError, RecursionError):
        return None
    meta = head.get("__metadata__") if isinstance(head, dict) else None
    gen = meta.get("generator") if isinstance(meta, dict) else None
    return gen if isinstance(gen, str) else None


def kind_of(path: Path) -> str | None:
    """``hexicore.<kind>`` of an existing hexicore output, else None."""
    if path.suffix.lower() in (".yaml", ".yml"):
        return yaml_kind(path)
    if path.suffix == ".safetensors":
        return "hexicore.safetensors" if safetensors_generator(path) == PNG_SOFTWARE else None
    if path.suffix.lower() == ".png":
        sw = png_software(path)
        return "hexicore.png" if sw and sw.startswith(PNG_SOFTWARE) else None
    return json_kind(path)


def check_writable(path: str | Path, kind: str, *, overwrite: bool | None = None,
                   field: str = "out") -> Path:
    """Refuse (one line) to replace ``path`` unless it is absent or a hexicore ``kind`` output
    (``hexicore.plan``, ``hexicore.png``, ...); ``overwrite`` True allows any file, False none."""
    p = Path(path)
    statable(p, field)
    refuse_special(p, field)
    if p.is_dir():
        raise HexicoreError("is a directory; a file goes here", source=str(p), field=field)
    if not p.exists() and not p.is_symlink():
        parent_is_a_folder(p, field)
        return p
    if overwrite is True:
        return p
    if overwrite is False:
        raise HexicoreError("exists and overwrite=false", source=str(p), field=field)
    found = kind_of(p)
    if found != kind:
        what = a_file(found) if found else "not a hexicore output"
        raise HexicoreError(f"exists and is {what}; refusing to replace it with {a_file(kind)} "
                            "(choose another path, or overwrite=true)", source=str(p), field=field)
    return p


def a_file(kind: str) -> str:
    """``hexicore.<name>`` as "a <name> file" with the article its sound takes ("an actions file",
    "an hf_config file", "a plan file")."""
    name = kind.split(".", 1)[-1]
    article = "an" if name[:1].lower() in "aeiou" or name.lower().startswith("hf") else "a"
    return f"{article} {name} file"


def check_all(items: Iterable[tuple[str | Path, str]], *, overwrite: bool | None = None, field: str = "out") -> None:
    """:func:`check_writable` for every ``(path, kind)`` before anything is written."""
    for path, kind in items:
        check_writable(path, kind, overwrite=overwrite, field=field)


def check_dir(path: str | Path, items: Iterable[tuple[str, str]], *, overwrite: bool | None = None,
              field: str = "out") -> Path:
    """A command's output directory: not a file, and each ``(name, kind)`` it will write inside
    passes :func:`check_writable` (``overwrite=false`` refuses any of them that exists)."""
    d = Path(path)
    statable(d, field)
    refuse_special(d, field)
    if d.exists() and not d.is_dir():
        raise HexicoreError("is a file; an output directory goes here", source=str(d), field=field)
    check_all(((d / name, kind) for name, kind in items), overwrite=overwrite, field=field)
    return d


def check_token_output(path: str | Path, *, overwrite: bool | None = None, field: str = "out") -> Path:
    """``prepare-data``'s ``X.bin`` and its sidecar ``X.bin.json``: the sidecar passes
    :func:`check_writable` as a ``hexicore.tokens`` file, and an existing ``X.bin`` is ours only
    when that sidecar is (a raw id file carries no mark of its own)."""
    p = Path(path)
    side = p.with_name(p.name + ".json")
    check_writable(side, "hexicore.tokens", overwrite=overwrite, field=field)
    refuse_special(p, field)
    if p.is_dir():
        raise HexicoreError("is a directory; give the token file's path", source=str(p), field=field)
    if (not p.exists() and not p.is_symlink()) or overwrite is True:
        return p
    if overwrite is False:
        raise HexicoreError("exists and overwrite=false", source=str(p), field=field)
    if kind_of(side) != "hexicore.tokens":
        raise HexicoreError(f"exists and is not a hexicore token file (no hexicore.tokens sidecar {side.name}); "
                            "refusing to replace it (choose another path, or overwrite=true)", source=str(p),
                            field=field)
    return p


#: the list of the files in ``out/final/`` that carry no mark of their own (tokenizer files,
#: ``generation_config.json``) which ``train`` wrote there: name -> the SHA-256 of each content
#: it may hold (two while a rerun replaces them)
FINAL_MANIFEST = "hexicore_files.json"
#: what ``train`` writes in ``out/final/`` (a Hugging Face directory), by name: its kind
FINAL_FILES = {"config.json": "hexicore.hf_config", "model.safetensors": "hexicore.safetensors",
               "model.safetensors.index.json": "hexicore.hf_index", FINAL_MANIFEST: "hexicore.final_files"}
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def check_final_dir(path: str | Path, *, overwrite: bool | None = None, field: str = "out") -> None:
    """``out/final/``: a folder (or absent) whose files of the names ``train`` writes there
    (:data:`FINAL_FILES`, ``model-K-of-N.safetensors`` shards) pass :func:`check_writable`; other
    files there are left alone."""
    d = Path(path)
    if not d.is_dir():
        return
    for f in sorted(d.iterdir()):
        kind = FINAL_FILES.get(f.name) or ("hexicore.safetensors" if _SHARD.fullmatch(f.name) else None)
        if kind is not None:
            check_writable(f, kind, overwrite=overwrite, field=field)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (read in blocks), hex."""
    import hashlib

    h = hashlib.sha256()
    fh = open_regular(Path(path))
    if fh is None:
        return ""
    with fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def final_manifest(folder: str | Path) -> dict[str, list[str]]:
    """``folder/hexicore_files.json`` (:data:`FINAL_MANIFEST`) as ``{name: [sha256, ...]}``; empty
    when absent or not ours; malformed entries are left out (their files are then not ours)."""
    p = Path(folder) / FINAL_MANIFEST
    fh = open_regular(p) if json_kind(p) == "hexicore.final_files" else None
    if fh is None:
        return {}
    with fh:
        files = json.loads(fh.read(_WHOLE)).get("files")
    if not isinstance(files, dict):
        return {}
    return {n: [x for x in v if isinstance(x, str)] for n, v in files.items()
            if isinstance(n, str) and "/" not in n and isinstance(v, list)}


def written_by_us(folder: str | Path, name: str, manifest: dict[str, list[str]] | None = None) -> bool:
    """``folder/name`` is a file hexicore wrote there and nobody changed since: the manifest
    lists it with its current content's digest."""
    p = Path(folder) / name
    listed = (final_manifest(folder) if manifest is None else manifest).get(name)
    return bool(listed) and p.is_file() and not p.is_symlink() and file_digest(p) in listed


def check_final_extras(folder: str | Path, names: Iterable[str], *, overwrite: bool | None = None,
                       field: str = "out") -> None:
    """The files of ``names`` a run writes in ``out/final/`` beside the weights (tokenizer files,
    ``generation_config.json``; they carry no mark): an absent one, or one that hexicore wrote
    there unchanged since (:func:`written_by_us`), is replaced; another (a user's own tokenizer)
    is refused with one line unless ``overwrite=true``; ``overwrite=false`` refuses any."""
    d = Path(folder)
    listed = final_manifest(d)
    for name in names:
        p = d / name
        refuse_special(p, field)
        if p.is_dir():
            raise HexicoreError("is a directory; a file goes here", source=str(p), field=field)
        if not p.exists() and not p.is_symlink():
            continue
        if overwrite is False:
            raise HexicoreError("exists and overwrite=false", source=str(p), field=field)
        if overwrite is not True and not written_by_us(d, name, listed):
            raise HexicoreError("exists and is not a file an earlier run wrote here (or was changed since); "
                                "refusing to replace it (choose another out=, or overwrite=true)", source=str(p),
                                field=field)


def check_run_folders(d: Path, folders: Iterable[str], *, overwrite: bool | None = None, field: str = "out") -> None:
    """The folders ``train`` writes inside ``out`` (``final``, and ``checkpoints`` or ``reads``
    when the run writes them) are not files; ``final/`` and ``reads/`` hold only our files."""
    for name in folders:
        p = d / name
        refuse_special(p, field)
        if p.exists() and not p.is_dir():
            raise HexicoreError(f"is a file; train writes the folder {name}/ here", source=str(p), field=field)
    check_final_dir(d / "final", overwrite=overwrite, field=field)
    if "reads" in folders and (d / "reads").is_dir():
        check_all(((f, "hexicore.reads") for f in sorted((d / "reads").glob("rank_*.json"))), overwrite=overwrite,
                  field=field)


def _step_entries(folder: Path) -> list[Path]:
    """A run directory's checkpoints: ``step_N.pt`` files or ``step_N/`` folders, here and under
    ``checkpoints/``, ordered by N."""
    found = []
    for base in (folder, folder / "checkpoints"):
        if base.is_dir():
            for p in base.glob("step_*"):
                n = p.name[5:].split(".")[0]
                if n.isdigit() and (p.is_dir() or p.suffix == ".pt"):
                    found.append((int(n), p))
    return [p for _, p in sorted(found)]


def _owned_checkpoint(p: Path) -> bool:
    """A checkpoint hexicore wrote: a folder of safetensors and JSON files (and temporary files)
    whose ``meta.json``, where present (it is written last), has a ``hexicore.checkpoint``
    format; or a ``step_N.pt`` file of the single-file form."""
    if p.is_dir():
        meta = p / "meta.json"
        return (not meta.exists() or json_kind(meta) == "hexicore.checkpoint") and all(
            f.is_file() and f.suffix in (".json", ".safetensors", ".tmp", ".hexicore-tmp") for f in p.iterdir())
    return p.is_file() and p.suffix == ".pt"


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def check_run_dir(path: str | Path, *, resume: str | None = None, overwrite: bool | None = None,
                  field: str = "out", folders: Iterable[str] = ("final",)) -> list[Path]:
    """``train``'s output directory. Refused (one line) when it is a file, when its
    ``metrics.json`` is not a hexicore metrics file, when one of ``folders`` is a file or
    ``final/`` holds a foreign file (:func:`check_run_folders`), or when it already holds another run's
    checkpoints — unless ``resume`` continues that run (``resume`` lies in this directory) or
    ``overwrite=true``, which clears hexicore's own checkpoints (returned; nothing else goes).
    ``overwrite=false`` refuses any existing metrics or checkpoint. A directory inside the
    checkpoint ``resume`` names (``resume=.../step_1 out=.../step_1``) is refused."""
    d = check_dir(path, [("metrics.json", "hexicore.metrics"), ("config.yaml", "hexicore.run_config")],
                  overwrite=overwrite, field=field)
    if resume and _inside(d, Path(resume)) and re.fullmatch(r"step_\d+(\.pt)?", Path(resume).resolve().name):
        raise HexicoreError(f"lies inside the checkpoint it resumes from ({resume}); a run never writes into its "
                            "own checkpoint: give out= the run's folder (the one holding checkpoints/) or another",
                            source=str(d), field=field)
    check_run_folders(d, tuple(folders), overwrite=overwrite, field=field)
    steps = _step_entries(d)
    if not steps:
        return []
    if resume and _inside(Path(resume), d) and overwrite is not False:
        return []
    if overwrite is not True:
        names = ", ".join(p.name for p in steps[-3:])
        raise HexicoreError(f"already holds another run's checkpoints ({names}); continue that run with "
                            f"resume={d}, choose another out=, or overwrite=true to clear them",
                            source=str(d), field=field)
    foreign = [p for p in steps if not _owned_checkpoint(p)]
    if foreign:
        raise HexicoreError("holds a step_* entry that is not a hexicore checkpoint; not clearing it",
                            source=str(foreign[0]), field=field)
    return steps


def clear_checkpoints(steps: Iterable[Path]) -> None:
    """Remove checkpoints :func:`check_run_dir` found to be hexicore's (files, or folders of
    our own files)."""
    import shutil

    for p in steps:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
