"""Library API (DESIGN.md §4) and Hydra multirun summaries (issue 9 item 1)."""

import csv
import csv

import pytest

import hexicore
from hexicore.app.cli import main
from hexicore.core.errors import HexicoreError


def test_plan_round_trips_through_json(tmp_path):
    plan = hexicore.plan(cluster="paper_case", model="llama2_7b", solver="megatron",
                         overrides=["train.global_batch=32"])
    assert plan.train.global_batch == 32 and plan.estimate["iteration_s"] > 0
    path = plan.save(tmp_path / "p.json")
    again = hexicore.load_plan(path)
    assert again.to_dict() == plan.to_dict()
    assert hexicore.evaluate(path).estimate["iteration_s"] == pytest.approx(plan.estimate["iteration_s"])
    assert callable(hexicore.plan)  # the function, not the hexicore.core.plan module


def test_api_matches_cli(tmp_path, capsys):
    main(["plan", "model=tiny", "cluster=hetero2", f"out={tmp_path / 'cli.json'}", f"hydra.run.dir={tmp_path}"])
    capsys.readouterr()
    cli = hexicore.load_plan(tmp_path / "cli.json")
    lib = hexicore.plan(cluster="hetero2", model="tiny")
    assert cli.pipelines == lib.pipelines


def test_api_bad_input_raises():
    with pytest.raises(HexicoreError, match="unknown solver 'zzz'"):
        hexicore.plan(solver="zzz")


def test_two_job_multirun_writes_summary(tmp_path, capsys):
    try:
        main(["plan", "-m", "model=tiny", "cluster=paper_case,hetero1", f"hydra.sweep.dir={tmp_path}"])
    except SystemExit as e:
        assert not e.code
    capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["cluster"] for r in rows] == ["paper_case", "hetero1"]
    assert all(float(r["iteration_s"]) > 0 and r["solver"] and r["model"] == "tiny" for r in rows)
    md = (tmp_path / "summary.md").read_text().splitlines()
    assert len(md) == 4 and "iteration_s" in md[0]


def test_simulate_api(tmp_path):
    s = hexicore.simulate("1f1b", ranks=4, micro_batches=8, out=tmp_path)
    assert s["bubble_ratio"] == pytest.approx(3 / 11)
    assert s["action_list"].ranks == 4 and (tmp_path / "timeline.png").is_file()
    w = hexicore.simulate("hanayo", ranks=4, micro_batches=4, overrides=["schedule.waves=2"])
    assert w["schedule"]["waves"] == 2 and w["bubble_ratio"] < s["bubble_ratio"]


def test_simulate_multirun_summary(tmp_path, capsys):
    try:
        main(["simulate", "-m", "schedule=gpipe,1f1b", "pipeline.ranks=4", "pipeline.micro_batches=4",
              f"hydra.sweep.dir={tmp_path}"])
    except SystemExit as e:
        assert not e.code
    capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["schedule"] for r in rows] == ["gpipe", "1f1b"]
    assert all(float(r["bubble_ratio"]) == pytest.approx(3 / 7) for r in rows)


def test_a_failing_job_does_not_end_the_sweep(tmp_path, capsys):
    from tests.conftest import run_cli

    code = run_cli(["plan", "-m", "model=llama2_70b,tiny", "cluster=paper_case", "out=plan.json",
                    f"hydra.sweep.dir={tmp_path}"])
    assert code == 1
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["outcome"] for r in rows] == ["failed", "ok"]
    assert "fits" in rows[0]["error"] or "memory" in rows[0]["error"]
    assert (tmp_path / "1" / "plan.json").is_file() and not (tmp_path / "0" / "plan.json").exists()
    assert "Traceback" not in capsys.readouterr().err


def test_absolute_out_in_a_sweep_is_refused(tmp_path, capsys):
    from tests.conftest import run_cli

    code = run_cli(["plan", "-m", "model=tiny", "cluster=paper_case,hetero1", f"out={tmp_path / 'same.json'}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert code == 1 and not (tmp_path / "same.json").exists()
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert all(r["outcome"] == "failed" and "absolute out=" in r["error"] for r in rows)
