"""Hydra multirun summaries: one row per job in ``summary.csv`` and ``summary.md``.

Each job records its results with :func:`record` as ``job-N.json`` (N its job number) in the
sweep directory's ``.hexicore-sweep/rows/`` (works with any launcher whose jobs see the sweep
directory: local, joblib, submitit on a shared file system). :class:`SummaryCallback`
(configured in conf/config.yaml under ``hydra.callbacks``) clears that folder when a sweep
starts, so rows of an earlier sweep into the same directory (or of other sweeps below it) are
never summarised, and collects it when the sweep ends, on the launching machine. A job also
claims its output directory (:func:`claim_output_dir`): two jobs given one directory
(``hydra.sweep.subdir`` the same for both) would overwrite each other's files, so the second
fails with one line instead.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.core.schema import write_text_atomic
from hexicore.planner.allocation.objective import rate as money

#: this sweep's rows (``rows/job-N.json``) and output-directory claims (``dirs/``), in the sweep directory
STATE = ".hexicore-sweep"


def outside_job_dir(value: str) -> bool:
    """Whether an ``out=`` value would not lie inside a job's own directory: absolute, or a
    relative path that climbs out of it (``../x``)."""
    return Path(value).is_absolute() or os.path.normpath(value).split(os.sep)[0] == os.pardir


def check_out(line: str, values: Sequence[str]) -> None:
    """Before any job of a sweep runs: refuse an ``out=`` (the override ``line`` as written, its
    ``values``) outside the job's directory, as each job would (docs/formats.md, "Sweep
    summary"): a relative one is resolved under each job's directory, so one that climbs out of
    it (``../x``) is shared by the jobs, as an absolute one is."""
    if not any(outside_job_dir(v) for v in values):
        return
    written = line.split("=", 1)[-1]
    if len(values) == 1 and "${" not in written:
        message = f"every job of the sweep would write to the same {written}"
    elif any(Path(v).is_absolute() for v in values):
        message = f"an absolute out= ({written}) is refused in a sweep"
    else:
        message = f"an out= that leaves the job's directory ({written}) is refused in a sweep"
    raise HexicoreError(f"{message}; give a relative path (resolved under each job's directory) that stays inside it",
                        source="command line", field="out")


def _job() -> tuple[Path, int, str, Path] | None:
    """(sweep directory, job number, overrides, output directory) of the multirun job this
    process runs; None outside one (library use, a single run)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN or OmegaConf.is_missing(hc.runtime, "output_dir"):
            return None
        sweep_dir = Path(hc.runtime.cwd) / str(hc.sweep.dir)  # as launched (hydra.job.chdir moves a job)
        return (sweep_dir, int(hc.job.get("num", 0) or 0), " ".join(hc.overrides.task),
                Path(str(hc.runtime.output_dir)))
    except Exception:  # noqa: BLE001 - no Hydra job (library use), or a composed config seen earlier
        return None


def job_number() -> int | None:
    """The number of the multirun job this process runs; None outside one."""
    job = _job()
    return None if job is None else job[1]


def _row_file(sweep_dir: Path, job: int) -> Path:
    return sweep_dir / STATE / "rows" / f"job-{job}.json"


def begin(sweep_dir: Path) -> None:
    """A sweep starts: forget the rows and claims an earlier sweep into ``sweep_dir`` left."""
    shutil.rmtree(sweep_dir / STATE, ignore_errors=True)
    for sub in ("rows", "dirs"):
        (sweep_dir / STATE / sub).mkdir(parents=True, exist_ok=True)


def claim_output_dir() -> None:
    """In a multirun job, before it writes anything: make its output directory this job's; a
    directory another job of the sweep claimed is a one-line :class:`HexicoreError`."""
    job = _job()
    if job is None:
        return
    sweep_dir, num, _, out = job
    key = hashlib.sha1(str(out.resolve()).encode("utf-8")).hexdigest()[:20]
    claim = sweep_dir / STATE / "dirs" / key
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        other = claim.read_text(encoding="utf-8").strip()
        if other == str(num):  # the same job again (a launcher's retry)
            return
        raise HexicoreError(f"job {num}'s output directory {out} is also job {other or '?'}'s (every job needs its "
                            "own: hydra.sweep.subdir must differ between jobs, as ${hydra.job.num} does)",
                            source="command line", field="hydra.sweep.subdir") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(str(num))


def recorded() -> bool:
    """Whether this multirun job has recorded its row (True outside a multirun)."""
    job = _job()
    return job is None or _row_file(job[0], job[1]).is_file()


def record(row: Mapping[str, Any]) -> Path | None:
    """Write this job's result row (job number, overrides and outcome ``ok`` are added);
    no-op outside a multirun job."""
    job = _job()
    if job is None:
        return None
    sweep_dir, num, overrides, _ = job
    data = {"job": num, "overrides": overrides, "outcome": "ok", **row}
    path = _row_file(sweep_dir, num)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def summary_row(plan: Plan, command: str, path: str | Path) -> dict[str, Any]:
    """A sweep's row for a plan (``plan`` solved it, ``evaluate`` re-estimated it; ``path`` the
    plan file it wrote or read): who made it, where, and the estimate's figures."""
    est, sol = plan.estimate, plan.solver or {}
    return {"command": command, "solver": sol.get("name"), "cluster": plan.cluster.name, "model": plan.model.name,
            "global_batch": plan.train.global_batch, "pipelines": len(plan.pipelines),
            "iteration_s": est.iteration_s if est else None, "mfu": est.mfu if est else None,
            "peak_memory_gb": est.peak_memory_gb if est else 0, **money(plan),
            "gpus_used": len(plan.devices), "gpus_idle": len(plan.cluster.devices) - len(plan.devices),
            "solver_s": sol.get("seconds"), "status": sol.get("status"), "plan": str(path)}


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every row this sweep's jobs recorded in ``sweep_dir``, in job order."""
    rows = []
    for f in (sweep_dir / STATE / "rows").glob("job-*.json"):
        try:
            rows.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(rows, key=lambda r: (int(r.get("job", 0) or 0), str(r.get("overrides"))))


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return "" if v is None else str(v)


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """``summary.csv`` and ``summary.md`` with the union of the rows' columns."""
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    csv_path, md_path = sweep_dir / "summary.csv", sweep_dir / "summary.md"
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in columns])
    write_text_atomic(csv_path, buf.getvalue())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)).replace("|", "\\|") for c in columns) + " |" for r in rows]
    write_text_atomic(md_path, "\n".join(lines) + "\n")
    return csv_path, md_path


#: columns the terminal table always shows (when any row has them)
ALWAYS_SHOWN = ("job", "overrides", "outcome")


def terminal_columns(rows: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """The sweep table a terminal shows: the columns whose values differ between jobs (and
    :data:`ALWAYS_SHOWN`), so that none is cut to a few letters; the columns the same in every
    job, with their value, for one line under it (empty ones left out). ``summary.csv`` and
    ``summary.md`` keep every column."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    if len(rows) < 2:
        return columns, {}
    shown, same = [], {}
    for c in columns:
        values = {_cell(r.get(c)) for r in rows}
        if c in ALWAYS_SHOWN or len(values) > 1:
            shown.append(c)
        elif values != {""}:
            same[c] = values.pop()
    return shown, same


class SummaryCallback(Callback):
    """At the start of a multirun, clear the rows of an earlier one; at its end, gather every
    job's row into one summary."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        begin(Path(str(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = collect(sweep_dir) or [{"job": None, "overrides": None, "outcome": "no job recorded a result"}]
        csv_path, md_path = write_summary(sweep_dir, rows)
        from hexicore.app.report import console, rows_table

        cols, same = terminal_columns(rows)
        console().print(rows_table(f"sweep summary ({len(rows)} jobs)", cols, [[_cell(r.get(c)) for c in cols]
                                                                                   for r in rows]))
        if same:
            print("the same in every job: " + ", ".join(f"{k}={v}" for k, v in same.items()))
        print(f"summary written to {csv_path} and {md_path}")
        failed = [r for r in rows if r.get("outcome") == "failed"]
        if failed:
            print(f"{len(failed)} of {len(rows)} jobs failed (see the error column)", file=sys.stderr)
            raise SystemExit(1)  # after the summary: the sweep as a whole failed
