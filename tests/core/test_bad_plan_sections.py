"""A plan JSON's ``solver`` and ``schedule`` sections (docs/formats.md), and schedule options
on the command line: bad values are one line naming the file and the field, exit status 2,
no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

PLAN = Path(__file__).resolve().parents[1] / "data" / "plan_v1.json"  # one pipeline of 5 stages, 24 micro-batches
#: the fixture was planned before the runtime's block memory was counted (fp32 block inputs kept
#: under recomputation, the recomputed block's saved tensors and weight casts): its TP-2 RTX 4090
#: stage now needs 24.4 of 24 GB with the default 1 GB reserve and 0.5 GB of them with none, so
#: these format checks evaluate it without the reserve
RESERVE = "cost.reserve_gb=0"


def _evaluate(tmp_path, capsys, change):
    """``hexicore evaluate`` of plan_v1.json with ``change(data)`` applied: (status, stderr, out)."""
    data = json.loads(PLAN.read_text())
    change(data)
    path, out = tmp_path / "bad.json", tmp_path / "e.json"
    path.write_text(json.dumps(data))
    code = run_cli(["evaluate", f"plan_file={path}", f"out={out}", RESERVE, f"hydra.run.dir={tmp_path / 'h'}"])
    return code, capsys.readouterr().err.strip(), out


def _one_line(code, err, out, field):
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"bad.json: {field}:" in lines[0], err
    assert not out.exists()


@pytest.mark.parametrize("solver,field", [
    (5, "solver"), ("abc", "solver"), ([1], "solver"), ({"idle": 5}, "solver.idle"),
    ({"idle": [5]}, "solver.idle[0]"), ({"idle": [{"devices": "A.0"}]}, "solver.idle[0].devices"),
    ({"idle": [{"kind": [1]}]}, "solver.idle[0].kind"), ({"idle": [{"iteration_s": "x"}]}, "solver.idle[0].iteration_s"),
    ({"seconds": "x"}, "solver.seconds"), ({"bound": "x"}, "solver.bound"), ({"bound": -1}, "solver.bound"),
    ({"params": 3}, "solver.params"), ({"schedule_s": [1]}, "solver.schedule_s[0]"),
])
def test_bad_solver_section(solver, field, tmp_path, capsys):
    _one_line(*_evaluate(tmp_path, capsys, lambda d: d.update(solver=solver)), field)


def test_solver_section_may_be_null_or_sparse(tmp_path, capsys):
    for solver in (None, {"seconds": None, "note": "from another tool"}):
        code, err, out = _evaluate(tmp_path, capsys, lambda d: d.update(solver=solver))
        assert code == 0 and out.exists(), err


def _schedule(section):
    return lambda d: d["pipelines"][0].update(schedule=section)


@pytest.mark.parametrize("section,field,words", [
    ({"name": "hanayo", "waves": 2, "memory": "abc"}, "pipelines[0].schedule.memory", "positive number"),
    ({"name": "chimera", "memory": [2]}, "pipelines[0].schedule.memory", "positive number"),
    ({"name": "1f1b", "bogus": 1}, "pipelines[0].schedule.bogus", "has no option 'bogus'"),
    ({"waves": 2}, "pipelines[0].schedule.name", "missing required field"),  # parameters of which schedule?
    ({"name": "interleaved_1f1b", "memory": 2}, "pipelines[0].schedule.memory", "its options: chunks"),
    ({"name": "auto"}, "pipelines[0].schedule.name", "planner's choice"),
    ({"name": "nope"}, "pipelines[0].schedule", "unknown schedule 'nope'"),
    ({"name": "synth", "stage_times": ["a"] * 5}, "pipelines[0].schedule.stage_times", "positive numbers"),
    ({"name": "synth", "stage_times": [-1] * 5}, "pipelines[0].schedule.stage_times", "positive numbers"),
    ({"name": "synth", "stage_times": [1.0] * 4}, "pipelines[0].schedule.stage_times", "4 entries for 5 ranks"),
    ({"name": "synth", "stage_times": [1.0] * 5, "hop_times": "x"}, "pipelines[0].schedule.hop_times",
     "non-negative numbers"),
    ({"name": "synth", "stage_times": [1.0] * 5, "hop_times": [-0.1] * 4}, "pipelines[0].schedule.hop_times",
     "non-negative numbers"),
    ({"name": "synth", "stage_times": [1.0] * 5, "hop_times": [0.1] * 3}, "pipelines[0].schedule.hop_times",
     "one entry per hop"),
    # a float or a numeric string is a count too: neither slips past the limit (1e9 chunks hung)
    ({"name": "interleaved_1f1b", "chunks": 1e9}, "pipelines[0].schedule.chunks", "limit of 256"),
    ({"name": "interleaved_1f1b", "chunks": "1000000000"}, "pipelines[0].schedule.chunks", "limit of 256"),
    ({"name": "hanayo", "waves": "auto", "max_waves": 10**6}, "pipelines[0].schedule.max_waves", "limit of 256"),
])
def test_bad_schedule_section(section, field, words, tmp_path, capsys):
    code, err, out = _evaluate(tmp_path, capsys, _schedule(section))
    _one_line(code, err, out, field)
    assert words in err, err


@pytest.mark.parametrize("argv,field,words", [
    (["simulate", "schedule=hanayo", "schedule.memory=abc"], "schedule.memory", "positive number"),
    (["simulate", "schedule=chimera", "schedule.memory=abc"], "schedule.memory", "positive number"),
    (["simulate", "schedule=interleaved_zb", "+schedule.memory=abc"], "schedule.memory", "positive number"),
    (["plan", "model=tiny", "train.global_batch=8", "schedule=hanayo", "schedule.memory=abc"], "schedule.memory",
     "positive number"),
    (["plan", "model=tiny", "schedule=auto", "solver=megatron"], "schedule", "solver=hexiscale only"),
    (["plan", "model=tiny", "schedule=auto", "solver=cpsat"], "schedule", "solver=hexiscale only"),
    (["simulate", "schedule=hanayo", "schedule.waves=1e9"], "schedule.waves", "limit of 256"),  # was a MemoryError
    (["simulate", "schedule=looped_bfs", "schedule.chunks=inf"], "schedule.chunks", "limit of 256"),
    (["simulate", "schedule=hanayo", "schedule.waves=auto", "schedule.max_waves=100000"], "schedule.max_waves",
     "limit of 256"),
])
def test_bad_schedule_options_on_the_command_line(argv, field, words, tmp_path, capsys):
    out = tmp_path / "out.json" if argv[0] == "plan" else tmp_path / "sim"
    code = run_cli([*argv, f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{field}:" in err and words in err, err
    assert not out.exists()


def test_an_integer_of_too_many_digits_is_malformed_json(tmp_path, capsys):
    """Python refuses to convert an integer of over 4,300 digits (a ValueError, not a JSONDecodeError):
    one line naming the file, as any malformed JSON."""
    text = PLAN.read_text().replace('"global_batch": 24', '"global_batch": ' + "9" * 5000, 1)
    assert text != PLAN.read_text()
    path, out = tmp_path / "bad.json", tmp_path / "e.json"
    path.write_text(text)
    code = run_cli(["evaluate", f"plan_file={path}", f"out={out}", RESERVE, f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "bad.json: malformed JSON" in err and "set_int_max_str_digits" not in err, err
    assert not out.exists()


def test_an_integer_of_too_many_digits_is_malformed_yaml(tmp_path):
    from hexicore.core.errors import HexicoreError
    from hexicore.core.model import ModelSpec

    path = tmp_path / "m.yaml"
    path.write_text("name: m\nlayers: " + "9" * 5000 + "\n")
    with pytest.raises(HexicoreError, match="m.yaml: malformed YAML") as exc:
        ModelSpec.load(path)
    assert "set_int_max_str_digits" not in str(exc.value)


@pytest.mark.parametrize("where,value,field", [
    ("train", 0, "train"), ("train", False, "train"), ("train", "", "train"), ("train", [], "train"),
    ("schedule", "", "pipelines[0].schedule"), ("schedule", [], "pipelines[0].schedule"),
    ("schedule", 0, "pipelines[0].schedule"),
    ("excluded", False, "cluster.excluded"), ("links", "", "cluster.links"),
    ("estimate.oom", 0, "estimate.oom"), ("estimate.breakdown", [], "estimate.breakdown"),
])
def test_a_falsy_value_of_the_wrong_type_is_refused_not_taken_for_absent(where, value, field, tmp_path, capsys):
    """``"train": 0`` or ``"schedule": ""`` used to read as "absent" (the defaults); null and a
    missing key still are (but a pipeline's ``schedule``: only a missing key, below)."""
    def change(data):
        if where == "schedule":
            data["pipelines"][0]["schedule"] = value
        elif where in ("excluded", "links"):
            data["cluster"][where] = value
        elif where.startswith("estimate."):
            data.setdefault("estimate", {})[where.split(".")[1]] = value
        else:
            data[where] = value

    _one_line(*_evaluate(tmp_path, capsys, change), field)


@pytest.mark.parametrize("section, words", [
    ("1f1b", "got str '1f1b'"), ({}, "missing required field"), (None, "got null"),
    ({"name": ""}, "non-empty string"), ({"name": None, "chunks": 2}, "missing required field"),
])
def test_a_pipeline_schedule_is_an_object_with_a_name(section, words, tmp_path, capsys):
    """``"schedule": "1f1b"``, ``{}`` and ``null`` were read as 1F1B (the bare name, or the
    default); every plan hexicore writes has ``{"name": ...}``, and only a missing key is the
    format's default."""
    code, err, out = _evaluate(tmp_path, capsys, _schedule(section))
    field = "pipelines[0].schedule" + (".name" if isinstance(section, dict) else "")
    _one_line(code, err, out, field)
    assert words in err, err


def test_a_pipeline_without_a_schedule_runs_the_default(tmp_path, capsys):
    code, err, out = _evaluate(tmp_path, capsys, lambda d: [p.pop("schedule") for p in d["pipelines"]])
    assert code == 0, err
    assert [p["schedule"] for p in json.loads(out.read_text())["pipelines"]] == [{"name": "1f1b"}]


def test_a_plans_zero_is_a_stage_not_auto(tmp_path, capsys):
    """``"zero": "auto"`` was priced as ZeRO-0 (and written back as auto): a plan records the
    stage it was priced at; auto is a planning problem's, resolved by ``hexicore plan``."""
    code, err, out = _evaluate(tmp_path, capsys, lambda d: d["train"].update(zero="auto"))
    _one_line(code, err, out, "train.zero")
    assert "planner's choice" in err


@pytest.mark.parametrize("waves", [2, 2.0, "2", "2.0"])
def test_a_count_counts_by_its_value_whatever_its_spelling(waves, tmp_path, capsys):
    """Hanayo's W as an int, a whole float or a numeric string prices the same plan ("2.0" was
    refused while 2.0 was taken)."""
    code, err, out = _evaluate(tmp_path, capsys, _schedule({"name": "hanayo", "waves": waves}))
    assert code == 0, err
    assert json.loads(out.read_text())["estimate"]["iteration_s"] == pytest.approx(
        _priced_at_two_waves(tmp_path, capsys), rel=1e-12)


def _priced_at_two_waves(tmp_path, capsys):
    (tmp_path / "ref").mkdir()
    code, err, out = _evaluate(tmp_path / "ref", capsys, _schedule({"name": "hanayo", "waves": 2}))
    assert code == 0, err
    return json.loads(out.read_text())["estimate"]["iteration_s"]
