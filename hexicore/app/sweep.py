"""Hydra multirun summaries: one row per job in ``summary.csv`` and ``summary.md``.

Each command records its results with :func:`record` into ``result.json`` in the job's output
directory (works with any launcher: local, joblib, submitit — the file travels with the job's
directory). :class:`SummaryCallback` (configured in conf/config.yaml under ``hydra.callbacks``)
collects them when the sweep ends, on the launching machine.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hexicore.core.errors import HexicoreError
from hexicore.core.schema import write_text_atomic

RESULT = "result.json"


def check_out(line: str, values: Sequence[str]) -> None:
    """Before any job of a sweep runs: refuse an absolute ``out=`` (the override ``line`` as
    written, its ``values``), as each job would (docs/formats.md, "Sweep summary"): a relative
    one is resolved under each job's directory."""
    if not any(Path(v).is_absolute() for v in values):
        return
    written = line.split("=", 1)[-1]
    if len(values) == 1 and "${" not in written:
        message = f"every job of the sweep would write to the same {written}"
    else:
        message = f"an absolute out= ({written}) is refused in a sweep"
    raise HexicoreError(f"{message}; give a relative path (resolved under each job's directory)",
                        source="command line", field="out")


def record(row: Mapping[str, Any]) -> Path | None:
    """Write this job's result row (overrides are added); no-op outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
    except Exception:  # noqa: BLE001 - library use, no Hydra job
        return None
    if OmegaConf.is_missing(hc.runtime, "output_dir"):  # a composed config seen earlier in this process, no run
        return None
    out = Path(hc.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {"job": hc.job.get("num", 0), "overrides": " ".join(hc.overrides.task), "outcome": "ok", **row}
    return write_text_atomic(out / RESULT, json.dumps(data, indent=1, default=str) + "\n")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every job's result row under ``sweep_dir``, in job order."""
    rows = []
    for f in sweep_dir.rglob(RESULT):
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


class SummaryCallback(Callback):
    """At the end of a multirun, gather every job's ``result.json`` into one summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = collect(sweep_dir) or [{"job": None, "overrides": None, "outcome": "no job recorded a result"}]
        csv_path, md_path = write_summary(sweep_dir, rows)
        from hexicore.app.report import console, rows_table

        cols = list(dict.fromkeys(k for r in rows for k in r))
        console().print(rows_table(f"sweep summary ({len(rows)} jobs)", cols, [[_cell(r.get(c)) for c in cols]
                                                                                   for r in rows]))
        print(f"summary written to {csv_path} and {md_path}")
        failed = [r for r in rows if r.get("outcome") == "failed"]
        if failed:
            print(f"{len(failed)} of {len(rows)} jobs failed (see the error column)", file=sys.stderr)
            raise SystemExit(1)  # after the summary: the sweep as a whole failed
