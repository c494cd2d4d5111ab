"""A sweep's summary holds exactly its own jobs, each with its own output directory; library calls
refuse the keys they would ignore."""

import csv
import json

import pytest

import hexicore
from tests.conftest import run_cli

SIM = ["simulate", "-m", "pipeline.ranks=2", "pipeline.micro_batches=4"]
TINY = {"cluster": "tight8", "model": "tiny", "solver": "megatron", "overrides": ["train.global_batch=8"]}


def rows(sweep_dir):
    return list(csv.DictReader((sweep_dir / "summary.csv").open()))


def test_a_sweep_into_a_used_directory_summarises_only_its_own_jobs(tmp_path, capsys):
    """Rows an earlier sweep left in the same directory, or other sweeps below it, are not
    this sweep's jobs (the summary listed a job that never ran in it)."""
    sweep = tmp_path / "s"
    assert run_cli([*SIM, "schedule=gpipe,1f1b", f"hydra.sweep.dir={sweep}"]) == 0
    assert [r["schedule"] for r in rows(sweep)] == ["gpipe", "1f1b"]
    assert run_cli([*SIM, "schedule=hanayo", f"hydra.sweep.dir={sweep}"]) == 0
    assert [(r["job"], r["schedule"]) for r in rows(sweep)] == [("0", "hanayo")]
    assert run_cli([*SIM, "schedule=zb_h1", f"hydra.sweep.dir={tmp_path}"]) == 0  # the earlier sweep lies below
    assert [(r["job"], r["schedule"], r["out"]) for r in rows(tmp_path)] == [("0", "zb_h1", str(tmp_path / "0"))]
    capsys.readouterr()


def test_jobs_that_change_directory_still_reach_the_summary(tmp_path, monkeypatch, capsys):
    """hydra.job.chdir=true under a relative sweep directory: each job runs in its own directory."""
    monkeypatch.chdir(tmp_path)
    assert run_cli([*SIM, "schedule=gpipe,1f1b", "hydra.sweep.dir=sw", "hydra.job.chdir=true", "out=sim"]) == 0
    assert [(r["schedule"], r["out"]) for r in rows(tmp_path / "sw")] == [
        ("gpipe", str(tmp_path / "sw" / "0" / "sim")), ("1f1b", str(tmp_path / "sw" / "1" / "sim"))]
    capsys.readouterr()


def test_two_jobs_given_one_directory(tmp_path, capsys):
    """A subdir shared by two jobs: the second would overwrite the first's files (and its row,
    which dropped the first job from the summary); it fails with one line, the first stays."""
    code = run_cli([*SIM, "schedule=gpipe,1f1b", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=same"])
    assert code == 1 and "1 of 2 jobs failed" in capsys.readouterr().err
    got = rows(tmp_path)
    assert [(r["job"], r["outcome"]) for r in got] == [("0", "ok"), ("1", "failed")]
    assert f"job 1's output directory {tmp_path / 'same'} is also job 0's" in got[1]["error"]
    assert "hydra.sweep.subdir" in got[1]["error"]
    assert json.loads((tmp_path / "same" / "summary.json").read_text())["schedule"]["name"] == "gpipe"


def test_evaluate_sweep_rows_carry_the_estimate(tmp_path, capsys):
    """``hexicore evaluate -m`` rows hold the re-estimate (they had only ``command``)."""
    plan = hexicore.plan(cluster="tight8", model="tiny", solver="megatron", overrides=["train.global_batch=8"])
    path = plan.save(tmp_path / "p.json")
    code = run_cli(["evaluate", "-m", f"plan_file={path}", "cost.default_efficiency=0.55,0.05",
                    f"hydra.sweep.dir={tmp_path / 's'}"])
    capsys.readouterr()
    got = rows(tmp_path / "s")
    assert code == 0 and [r["command"] for r in got] == ["evaluate", "evaluate"]
    assert all(r["solver"] == "megatron" and r["cluster"] == "tight8" and r["plan"] == str(path) for r in got)
    fast, slow = (float(r["iteration_s"]) for r in got)
    assert fast == pytest.approx(plan.estimate.iteration_s, rel=1e-5) and slow > fast
    assert float(got[0]["mfu"]) > float(got[1]["mfu"]) > 0 and float(got[0]["peak_memory_gb"]) > 0


@pytest.mark.parametrize("call,key", [
    (lambda o: hexicore.plan(cluster="tight8", model="tiny", overrides=["train.global_batch=8", o]), "out"),
    (lambda o: hexicore.simulate("1f1b", ranks=2, micro_batches=2, overrides=[o]), "out"),
    (lambda o: hexicore.evaluate(hexicore.plan(**TINY), overrides=[o]), "plan_file"),
])
def test_library_refuses_keys_it_would_ignore(call, key, tmp_path):
    """``hexicore.plan(overrides=["out=p.json"])`` returned a plan and wrote nothing, silently."""
    target = tmp_path / "x.json"
    with pytest.raises(hexicore.HexicoreError, match=f"{key}= is not read by this call") as info:
        call(f"{key}={target}")
    assert info.value.field.startswith("overrides[") and not target.exists()


@pytest.mark.parametrize("call,key,argument", [
    (lambda o: hexicore.simulate("1f1b", ranks=4, overrides=[o]), "pipeline.ranks=3", "ranks"),
    (lambda o: hexicore.simulate("1f1b", overrides=[o]), "timing.comm=0.5", "comm"),  # its default is an argument too
    (lambda o: hexicore.simulate("1f1b", overrides=[o]), "schedule=gpipe", "schedule"),
    (lambda o: hexicore.plan(cluster="tight8", model="tiny", overrides=[o]), "cluster=hetero1", "cluster"),
    (lambda o: hexicore.plan(model="tiny", solver="megatron", overrides=[o]), "+solver=hexiscale", "solver"),
])
def test_library_refuses_an_override_of_its_own_argument(call, key, argument):
    """``hexicore.simulate(ranks=4, overrides=["pipeline.ranks=3"])`` simulated 3 ranks, the
    argument replaced without a word."""
    with pytest.raises(hexicore.HexicoreError, match=f"is this call's {argument}= argument") as info:
        call(key)
    assert info.value.field == "overrides[0]"


def test_library_overrides_beside_arguments_left_unset_are_read():
    """An override of a key whose argument the call leaves at None is the call's value."""
    plan = hexicore.plan(model="tiny", overrides=["cluster=tight8", "train.global_batch=8", "solver=megatron"])
    assert plan.cluster.name == "tight8" and plan.solver["name"] == "megatron"


@pytest.mark.parametrize("call,field,text", [
    (lambda: hexicore.plan(cluster="nope"), "cluster", "unknown cluster 'nope'"),
    (lambda: hexicore.simulate("1f1b", overrides=["train.global_batch=abc"]), "train.global_batch",
     "could not be converted"),
    (lambda: hexicore.evaluate(hexicore.plan(**TINY), overrides=["cost=nope"]), "cost", "unknown cost model 'nope'"),
])
def test_library_errors_name_the_argument_not_the_command_line(call, field, text):
    """A library call's bad argument was reported as ``command line: cluster: ...``."""
    with pytest.raises(hexicore.HexicoreError) as info:
        call()
    assert info.value.source is None and info.value.field == field and text in info.value.message
    assert str(info.value).startswith(f"{field}: ") and "command line" not in str(info.value)
