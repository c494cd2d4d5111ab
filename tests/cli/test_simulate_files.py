"""``simulate.files``: every file for small schedules; above the size where recording and writing
every event costs far more than simulating, summary.json and a summary timeline unless more is
asked for; the library call skips the recording when it writes nothing."""

from __future__ import annotations

import json

import pytest

from hexicore.app.commands import simulate as sim
from hexicore.core.ownership import kind_of
from tests.conftest import run_cli

SIM = ["simulate", "schedule=hanayo", "schedule.waves=2", "pipeline.ranks=4", "pipeline.micro_batches=8"]
ALL = {"actions.json", "summary.json", "trace.json", "timeline.png"}


def files(out):
    return {p.name for p in out.iterdir() if p.is_file()}


def test_small_schedules_write_every_file(tmp_path, capsys):
    assert run_cli([*SIM, f"out={tmp_path}"]) == 0
    assert files(tmp_path) == ALL and "written when asked" not in capsys.readouterr().out


def test_large_schedules_write_a_summary_unless_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim, "FULL_FILES_MAX", 50)  # this schedule has more actions than that
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert run_cli([*SIM, f"out={a}"]) == 0
    assert files(a) == {"summary.json", "timeline.png"} and kind_of(a / "timeline.png") == "hexicore.png"
    assert "simulate.files=all" in capsys.readouterr().out
    assert run_cli([*SIM, f"out={b}", "simulate.files=all"]) == 0
    assert files(b) == ALL
    assert run_cli([*SIM, f"out={c}", "simulate.files=[trace]"]) == 0
    assert files(c) == {"trace.json"}
    trace = json.loads((c / "trace.json").read_text())
    full = json.loads((b / "trace.json").read_text())
    assert trace == full and len(trace["traceEvents"]) > 50
    summary = json.loads((a / "summary.json").read_text())
    assert summary == json.loads((b / "summary.json").read_text())  # same simulation, with or without events
    capsys.readouterr()


def test_unknown_file_name_is_one_line(tmp_path, capsys):
    assert run_cli([*SIM, f"out={tmp_path}", "simulate.files=[trace,picture]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "simulate.files" in err and "picture" in err


def test_library_call_records_events_only_when_it_writes(tmp_path, monkeypatch):
    import hexicore

    monkeypatch.setattr(sim, "FULL_FILES_MAX", 50)
    r = hexicore.simulate("hanayo", ranks=4, micro_batches=8, overrides=["schedule.waves=2"])
    assert not r.sim.events and r.makespan > 0
    w = hexicore.simulate("hanayo", ranks=4, micro_batches=8, overrides=["schedule.waves=2"], out=tmp_path)
    assert w.sim.events and w.makespan == pytest.approx(r.makespan) and files(tmp_path) == ALL
