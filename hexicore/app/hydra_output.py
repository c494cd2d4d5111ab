"""Hydra's own outputs under hexicore's ownership rule (docs/cli.md, "Hydra's output folders").

Hydra writes, for every run, a run directory (``hydra.run.dir``), its ``.hydra/`` folder
(``hydra.output_subdir``: ``config.yaml``, ``hydra.yaml``, ``overrides.yaml``) and the job's log
``<command>.log``; for a multirun a sweep directory (``hydra.sweep.dir``) with one folder per job
(``hydra.sweep.subdir``), ``multirun.yaml`` and hexicore's ``summary.csv`` / ``summary.md``.
Before Hydra starts, :func:`prepare` resolves those paths once, pins them (Hydra then uses the
very paths checked) and refuses, with one line, any that is not hexicore's:

* a device, FIFO or socket anywhere Hydra would write, whatever ``overwrite`` says;
* a run directory that exists and holds a ``.hydra/`` that another program wrote (its
  ``hydra.yaml`` does not name the ``hexicore`` app), or a ``<command>.log`` that is not a
  hexicore job log (its first line is not a ``[time][logger][LEVEL] - `` record);
* an ``output_subdir`` or ``sweep.subdir`` that leaves its directory (absolute, or ``../``);
* a run directory of ``''``;
* a sweep directory that exists, is not empty, and holds no ``.hexicore-sweep/`` (the folder
  every hexicore sweep makes there); and any job's folder that a run's folder could not be,
  every job's ``hydra.sweep.subdir`` resolved as Hydra's launcher will (:func:`_job_folders`).

A command refused after Hydra started (its inputs are read inside the job) leaves nothing:
:func:`roll_back` removes the folders Hydra made, the files it created, and restores those it
replaced or appended to, from the state :func:`prepare` recorded.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.schema import open_regular
from hexicore.core.writable import check_creatable_dir, nearest_existing, refuse_special, statable

#: the files Hydra writes in ``hydra.output_subdir``
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
#: the files a hexicore sweep writes in its sweep directory
SWEEP_FILES = ("multirun.yaml", "summary.csv", "summary.md")
#: the folder every hexicore sweep makes in its sweep directory (hexicore.app.sweep.STATE)
SWEEP_MARK = ".hexicore-sweep"
#: the first line of a hexicore job log (conf/hydra/job_logging/hexicore.yaml's file format)
_LOG_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[[^\]\n]*\]\[[A-Z]+\] - ")
#: bytes of a Hydra file kept to restore it (Hydra's config files are a few KB)
_KEEP = 1 << 20


@dataclass(frozen=True)
class Restore:
    """What a refused run undoes: ``folders`` Hydra will make (deepest first), ``files`` it will
    write with their content now (None: absent), and its ``log`` with its size now (None: absent)."""

    folders: tuple[Path, ...]
    files: tuple[tuple[Path, bytes | None], ...]
    log: tuple[Path, int | None]


@dataclass(frozen=True)
class HydraOutput:
    """The override that pins Hydra's directory (``hydra.run.dir=...`` or ``hydra.sweep.dir=...``),
    and for a single run what :func:`roll_back` restores."""

    pin: str
    restore: Restore | None


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _relative_inside(value: Any, field: str) -> None:
    """A sub-path (``hydra.output_subdir``, ``hydra.sweep.subdir``) that stays in its directory."""
    if value is None:
        return
    text = str(value)
    if os.path.isabs(text) or os.path.normpath(text).split(os.sep)[0] == os.pardir:
        raise HexicoreError(f"{text} leaves the run's directory; give a relative path inside it", source="command line",
                            field=field)


def hexicore_hydra_file(path: Path) -> bool:
    """``path`` (a run's ``.hydra/hydra.yaml``, a sweep's ``multirun.yaml``) was written by Hydra
    for hexicore: its ``hydra.help.app_name`` is ``hexicore``."""
    import yaml

    fh = open_regular(path)
    if fh is None:
        return False
    try:
        with fh:
            data: Any = yaml.safe_load(fh.read(_KEEP))
        return data["hydra"]["help"]["app_name"] == "hexicore"
    except (OSError, ValueError, yaml.YAMLError, RecursionError, TypeError, KeyError):
        return False


def hexicore_log(path: Path) -> bool:
    """``path`` is a hexicore job log: a regular file whose first line is one of its records."""
    fh = open_regular(path)
    if fh is None:
        return False
    with fh:
        return _LOG_LINE.match(fh.read(256)) is not None


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first."""
    at = nearest_existing(folder) or Path(".")
    missing, p = [], folder
    while p != at and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing


def _run_dir(run_dir: str, subdir: Any, job: str, *, field: str = "hydra.run.dir") -> Restore:
    """Check a single run's directory and record what a refusal restores."""
    if not run_dir.strip():
        raise HexicoreError("is empty; give a folder for the run's log and .hydra/ (or leave the default)",
                            source="command line", field=field)
    d = Path(run_dir)
    statable(d, field, "command line")
    refuse_special(d, field)
    check_creatable_dir(run_dir, source="command line", field=field)
    _relative_inside(subdir, "hydra.output_subdir")
    folders = _missing_folders(d)
    files: list[tuple[Path, bytes | None]] = []
    if subdir is not None:
        hydra_dir = d / str(subdir)
        refuse_special(hydra_dir, "hydra.output_subdir")
        if hydra_dir.exists() and not hydra_dir.is_dir():
            raise HexicoreError("is a file; Hydra writes its folder of config files here", source=str(hydra_dir),
                                field="hydra.output_subdir")
        folders = [f for f in _missing_folders(hydra_dir) if f not in folders] + folders
        present = [hydra_dir / n for n in HYDRA_FILES if (hydra_dir / n).exists() or (hydra_dir / n).is_symlink()]
        for f in present:
            refuse_special(f, "hydra.output_subdir")
        if present and not hexicore_hydra_file(hydra_dir / "hydra.yaml"):
            raise HexicoreError(f"holds Hydra files another program wrote; refusing to replace them (choose another "
                                f"{field})", source=str(hydra_dir), field=field)
        for name in HYDRA_FILES:
            f = hydra_dir / name
            kept = None
            if f.exists():
                fh = open_regular(f)
                if fh is None:
                    raise HexicoreError("is not a regular file", source=str(f), field="hydra.output_subdir")
                with fh:
                    kept = fh.read(_KEEP + 1)
                if len(kept) > _KEEP:
                    raise HexicoreError(f"is larger than {_KEEP:,} bytes; not a Hydra file of hexicore's",
                                        source=str(f), field="hydra.output_subdir")
            files.append((f, kept))
    log = d / f"{job}.log"
    refuse_special(log, field)
    size = None
    if log.exists() or log.is_symlink():
        if not hexicore_log(log):
            raise HexicoreError(f"exists and is not a hexicore job log; refusing to append to it (choose another "
                                f"{field})", source=str(log), field=field)
        size = log.stat().st_size
    return Restore(tuple(folders), tuple(files), (log, size))


def _sweep_dir(sweep_dir: str, subdirs: Sequence[str], output_subdir: Any, job: str) -> None:
    """Check a multirun's sweep directory: its files (``multirun.yaml``, the summaries) absent or
    an earlier hexicore sweep's, and each job's folder (``subdirs``, those that resolve before the
    sweep starts) as a run's (:func:`_run_dir`)."""
    field = "hydra.sweep.dir"
    if not sweep_dir.strip():
        raise HexicoreError("is empty; give a folder for the sweep (or leave the default)", source="command line",
                            field=field)
    d = Path(sweep_dir)
    statable(d, field, "command line")
    refuse_special(d, field)
    check_creatable_dir(sweep_dir, source="command line", field=field)
    for sub in subdirs:
        _relative_inside(sub, "hydra.sweep.subdir")
    _relative_inside(output_subdir, "hydra.output_subdir")
    if not d.is_dir():
        return
    for name in (*SWEEP_FILES, SWEEP_MARK):
        refuse_special(d / name, field)
    ours = (d / SWEEP_MARK).is_dir()
    for name in SWEEP_FILES:
        f = d / name
        if (f.exists() or f.is_symlink()) and not (ours and (name != "multirun.yaml" or hexicore_hydra_file(f))):
            raise HexicoreError(f"exists and is not a file an earlier hexicore sweep wrote here; refusing to replace it "
                                "(choose another hydra.sweep.dir)", source=str(f), field=field)
    for sub in subdirs:
        _run_dir(str(d / sub), output_subdir, job, field=field)


#: most jobs whose folders are checked before a sweep (a folder per job; more is no real sweep)
MAX_JOBS = 4096
#: the job's own keys a sweep's subdir may name without composing each job's configuration
_JOB_KEYS = re.compile(r"\$\{hydra\.job\.(?:num|id|name|override_dirname)\}")


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """Each job's overrides of a multirun's command-line ``overrides``, in the order Hydra's
    basic sweeper runs them (the product of the sweeps' values; Hydra's own keys apart)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = [o for o in OverridesParser.create().parse_overrides(list(overrides))
            if not o.key_or_group.startswith("hydra")]
    return BasicSweeper.split_arguments(task, None)[0]


def _job_folders(cfg: Any, jobs: Sequence[Sequence[str]], lines: Sequence[str]) -> list[str]:
    """``hydra.sweep.subdir`` of each job (``jobs``: each one's overrides; ``lines``: the first
    job's, Hydra's keys included), as Hydra's launcher resolves it: ``hydra.job.num`` and
    ``hydra.job.id`` the job's index, ``hydra.job.override_dirname`` its overrides joined as
    ``hydra.job.config.override_dirname`` says; a subdir that names any other key is resolved
    from each job's own composed configuration."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    raw = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir"))
    composed = _JOB_KEYS.sub("", raw).find("${") >= 0
    how = cfg.hydra.job.config.override_dirname
    found = []
    for num, job in enumerate(list(jobs)[:MAX_JOBS]):
        if composed:
            cfg = _compose([*(x for x in lines if _hydra_key(x)), *job])
        parsed = OverridesParser.create().parse_overrides(list(job))
        OmegaConf.update(cfg, "hydra.job.override_dirname", get_overrides_dirname(
            parsed, list(how.exclude_keys), how.item_sep, how.kv_sep), force_add=True)
        OmegaConf.update(cfg, "hydra.job.num", num, force_add=True)
        OmegaConf.update(cfg, "hydra.job.id", num, force_add=True)
        found.append(str(OmegaConf.select(cfg, "hydra.sweep.subdir", throw_on_missing=True)))
    return found


def _hydra_key(line: str) -> bool:
    return line.split("=", 1)[0].lstrip("+~").startswith("hydra")


def _compose(lines: Sequence[str]) -> Any:
    from hydra import compose

    return compose(config_name="config", overrides=list(lines), return_hydra_config=True)


def prepare(overrides: Sequence[str], command: str, *, multirun: bool,
            jobs: Sequence[Sequence[str]] = ()) -> HydraOutput:
    """Resolve Hydra's output paths for ``overrides`` (one job's ``key=value`` list, Hydra's keys
    included; for a multirun, ``jobs`` holds every job's overrides, :func:`sweep_jobs`), check
    them (module docstring: every job's folder before any job runs) and return the pinning
    override and what a refusal restores. Every problem is one :class:`HexicoreError`."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import setup_globals
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    setup_globals()
    job = command.replace("-", "_")
    lines = [o for o in overrides if not o.startswith("hydra.job.name=")] + [f"hydra.job.name={job}"]
    gh = GlobalHydra.instance()
    outer, gh.hydra = gh.hydra, None
    try:
        with initialize_config_module(config_module="hexicore.conf", version_base="1.3"):
            cfg = _compose(lines)
            key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
            subdir = OmegaConf.select(cfg, "hydra.output_subdir")
            subdirs = _job_folders(cfg, jobs or [[x for x in lines if not _hydra_key(x)]], lines) if multirun else []
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        first = (str(cause).strip().splitlines() or [type(exc).__name__])[0]
        raise HexicoreError(f"cannot resolve Hydra's output folder: {first}", source="command line",
                            field="hydra") from None
    finally:
        GlobalHydra.instance().hydra = outer
    value = "" if value is None else str(value)
    if multirun:
        _sweep_dir(value, subdirs, subdir, job)
        return HydraOutput(f"hydra.sweep.dir={_quoted(value)}", None)
    restore = _run_dir(str(Path(value).absolute()) if value.strip() else value, subdir, job)  # a job may chdir
    return HydraOutput(f"hydra.run.dir={_quoted(value)}", restore)


def roll_back(restore: Restore) -> None:
    """Undo what Hydra wrote for a refused run (:class:`Restore`): close and remove or truncate
    the job log, restore or remove the config files, remove the folders it made (when empty)."""
    log, size = restore.log
    target = os.path.abspath(log)
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == target:
            logging.root.removeHandler(handler)
            handler.close()
    try:
        if size is None:
            log.unlink(missing_ok=True)
        else:
            os.truncate(log, size)
    except OSError:
        pass
    for path, content in restore.files:
        try:
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(content)
        except OSError:
            pass
    for folder in restore.folders:
        try:
            folder.rmdir()
        except OSError:
            pass
