"""The example plugin, tested the way a third party would: through hexicore's public surface."""

import json

import pytest

import hexicore
from hexicore.app.cli import main
from hexicore.registry import Registry
from hexicore.planner.validate import validate_plan


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
