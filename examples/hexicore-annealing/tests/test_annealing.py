"""The example plugin, tested the way a third party would: through hexicore's public surface."""

import json

import pytest

import hexicore
from hexicore.app.cli import main
from hexicore.planner.plan_check import validate_plan
from hexicore.registry import Registry


def test_listed_by_hexicore_plugins(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "annealing" in out and "hexicore-annealing" in out


def test_plans_a_valid_plan_from_the_cli(tmp_path, capsys):
    try:
        main(["plan", "solver=annealing", "solver.steps=40", "cluster=paper_case", "model=llama2_7b",
              f"out={tmp_path / 'p.json'}", f"hydra.run.dir={tmp_path}"])
    except SystemExit as e:
        assert not e.code
    capsys.readouterr()
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["solver"]["name"] == "annealing" and data["solver"]["params"]["steps"] == 40
    plan = hexicore.load_plan(tmp_path / "p.json")
    cost = Registry.default().create("cost_model", "analytic")
    est, _ = validate_plan(plan, cost)
    assert est.fits


def test_never_worse_than_megatron_and_seeded():
    a = hexicore.plan(cluster="paper_case", model="llama2_7b", solver="annealing", overrides=["solver.steps=30"])
    b = hexicore.plan(cluster="paper_case", model="llama2_7b", solver="annealing", overrides=["solver.steps=30"])
    m = hexicore.plan(cluster="paper_case", model="llama2_7b", solver="megatron")
    assert a.estimate.iteration_s <= m.estimate.iteration_s + 1e-9
    assert a.pipelines == b.pipelines


def test_bad_parameter_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "solver=annealing", "solver.cooling=3", f"hydra.run.dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cooling" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value,text", [("0", "d_dp must be a positive integer or null"),
                                        ("-1", "d_dp must be a positive integer or null"),
                                        ("99", "d_dp=99 pipelines need as many devices and micro-batches")])
def test_a_pipeline_count_it_cannot_deal_is_one_line(value, text, tmp_path, capsys):
    """0 fell back on 1..4 silently, -1 was an IndexError traceback, more pipelines than devices
    looped forever dealing devices into the empty ones."""
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as e:
        main(["plan", "solver=annealing", f"solver.d_dp={value}", "solver.steps=2", "cluster=tight8", "model=tiny",
              "train.global_batch=8", f"out={out}", f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and text in err[0] and "solver.d_dp" in err[0] and not out.exists()
