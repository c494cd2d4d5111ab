"""``hexicore simulate`` (docs/cli.md): the four files, the summary, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.validate import validate_actions


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hexicore.app.cli", "simulate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_writes_four_files(tmp_path):
    out = tmp_path / "sim"
    p = cli("schedule=hanayo", "schedule.waves=2", "pipeline.ranks=4", "pipeline.micro_batches=4",
            "timing.forward=1", "timing.backward=2", "timing.comm=0", f"out={out}")
    assert p.returncode == 0, p.stderr
    assert {f.name for f in out.iterdir()} >= {"actions.json", "summary.json", "trace.json", "timeline.png"}
    s = json.loads((out / "summary.json").read_text())
    assert s["bubble_ratio"] == pytest.approx(0.2, abs=1e-9)
    assert s["closed_form_bubble"] == pytest.approx(6 / 27)
    assert len(s["peak_activations"]) == 4 and s["makespan"] == pytest.approx(15.0)
    al = ActionList.load(out / "actions.json")
    assert al.schedule == {"name": "hanayo", "waves": 2} and al.stages == 16
    validate_actions(al, comm=True)
    trace = json.loads((out / "trace.json").read_text())
    x = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "computation"]
    assert len(x) == 2 * 4 * 16 and max(e["ts"] + e["dur"] for e in x) == pytest.approx(15.0e6)
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "bubble ratio 0.2000" in p.stdout


def test_waves_auto_shows_the_choice(tmp_path):
    p = cli("schedule=hanayo", "schedule.waves=auto", "schedule.max_waves=3", "pipeline.ranks=3",
            "pipeline.micro_batches=3", f"out={tmp_path}")
    assert p.returncode == 0, p.stderr
    assert "waves=auto chose W=" in p.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["schedule"]["waves"] in (1, 2, 3)


def test_default_output_dir_is_hydras(tmp_path):
    p = cli("schedule=chimera", "pipeline.ranks=2", "pipeline.micro_batches=2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert list(tmp_path.glob("outputs/*/*/summary.json"))


def test_no_closed_form_below_p_micro_batches(tmp_path):
    """ZB-H2's ``(P-1)/(3M+P-1)`` needs M >= P: at P = 4, M = 3 only the simulated bubble is shown."""
    p = cli("schedule=zb_h2", "pipeline.ranks=4", "pipeline.micro_batches=3", f"out={tmp_path}")
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bubble_ratio"] == pytest.approx(4 / 13) and s["closed_form_bubble"] is None
    assert "closed form" not in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["schedule=hanayo", "pipeline.ranks=1"], "needs pipeline.ranks >= 2"),
    (["schedule=nope"], "unknown schedule 'nope'"),
    (["schedule=auto"], "command line: schedule: schedule=auto is for hexicore plan only (it picks a schedule per "
                        "pipeline); hexicore simulate takes one of: 1f1b, chimera, "),
    (["schedule=hanayo", "schedule.waves=0"], "command line: schedule.waves: schedule 'hanayo': waves must be"),
    (["schedule=dualpipe_v", "pipeline.ranks=4", "pipeline.micro_batches=3"],
     "command line: pipeline.micro_batches: schedule 'dualpipe_v': needs micro_batches >= 2 x ranks = 8, got 3"),
    (["schedule=hanayo", "schedule.waves=two"], "waves must be a positive integer or 'auto'"),
    (["pipeline.micro_batches=0"], "pipeline.micro_batches"),
    (["schedule=hanayo", "schedule.memory=abc"], "schedule.memory: schedule 'hanayo': memory must be a positive"),
    (["schedule=chimera", "schedule.memory=abc"], "schedule.memory: schedule 'chimera': memory must be a positive"),
    # 1e308 overflowed the makespan (inf) and crashed drawing the timeline after writing three files
    (["timing.forward=1e308"], "timing.forward: 1e+308 s is outside hexicore's range of 1e-09 to 1e+09 s"),
    (["timing.backward=1e303"], "timing.backward: 1e+303 s is outside"),
    (["timing.comm=1e10"], "timing.comm: 1e+10 s is outside hexicore's range of 0 to 1e+09 s"),
    # waves=auto builds and simulates every W up to max_waves: it ran unbounded past the limit
    (["schedule=hanayo", "schedule.waves=auto", "schedule.max_waves=256", "pipeline.ranks=8",
      "pipeline.micro_batches=2048"], "schedule.max_waves: 6,467,616,768 actions (about, over every W that waves=auto"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, needle):
    from tests.conftest import run_cli

    code = run_cli(["simulate", *args, f"out={tmp_path}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_bad_input_in_a_fresh_process_is_one_line_exit_2(tmp_path):
    """The same through ``python -m hexicore.app.cli``: nothing else reaches stderr (no import-time
    warning or traceback) and the process's exit status is 2."""
    p = cli("schedule=hanayo", "schedule.waves=two", f"out={tmp_path}")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "waves must be a positive integer or 'auto'" in lines[0], p.stderr
    assert not any(tmp_path.iterdir())  # nothing written
