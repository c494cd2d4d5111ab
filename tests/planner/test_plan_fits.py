"""Every plan the search returns passes the check ``hexicore evaluate`` makes (it validates and
fits under its schedules' exact peak memory), for every installed schedule; the TP degrees the
search and its seeds price stay within ``solver.max_tp``; ``solver.use_all_devices`` gives every
device a stage."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest

from hexicore.core.settings import TrainSettings
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import hexicore.app.api as api
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.baselines.symmetric import legal
from hexicore.planner.problem import Problem
from hexicore.cost.analytic import AnalyticCostModel
from tests.conftest import CONF, ROOT, cluster_preset, model_preset

#: every installed schedule (conf/schedule), auto included
SCHEDULES = sorted(p.stem for p in (CONF / "schedule").glob("*.yaml"))
GPUS = ("a100-40g", "rtx4090", "rtx3090", "v100-32g")


def evaluated(plan: Plan) -> Plan:
    """``plan`` written as JSON and checked as ``hexicore evaluate plan_file=...`` checks it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(plan.to_json())
        return api.evaluate(path)


def write_cluster(folder: Path, machines: list[tuple[str, int]], name: str = "drawn") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "inter": {"bandwidth_gbs": 10, "latency_us": 20}, "machines": [
        {"name": f"M{i}", "gpu": gpu, "count": count, "bandwidth_gbs": 32, "latency_us": 10}
        for i, (gpu, count) in enumerate(machines)]}))
    return path


def test_gpipe_plan_of_the_readme_case_fits_its_exact_peaks():
    """`hexicore plan schedule=gpipe` on the default case (paper_case, Llama-2 13B, batch 24):
    GPipe holds all M micro-batches' activations; the search used to price it at 2P - 1 and
    returned a plan its own check refused (B.0 needs 31.6 GB of 24)."""
    plan = api.plan(schedule="gpipe")
    assert plan.estimate.fits
    again = evaluated(plan)
    assert again.estimate.fits
    assert again.estimate.iteration_s == pytest.approx(plan.estimate.iteration_s)


@pytest.mark.parametrize("schedule", SCHEDULES)
@settings(max_examples=2, deadline=None)
@given(machines=st.lists(st.tuples(st.sampled_from(GPUS), st.integers(1, 3)), min_size=1, max_size=3),
       batch=st.sampled_from([4, 8, 16]), model=st.sampled_from(["tiny", "gpt3_1.3b"]))
def test_every_returned_plan_passes_evaluate(schedule, machines, batch, model):
    """Random clusters of 1-3 machines, small models, every installed schedule: a plan the search
    returns validates and fits as ``hexicore evaluate`` checks it; nothing fitting is a one-line
    error, never a plan that does not fit."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = write_cluster(Path(tmp), machines)
        overrides = [f"train.global_batch={batch}", "solver.iterations=6"] + \
            (["train.seq_len=512"] if model != "tiny" else []) + \
            (["schedule.effort=quick"] if schedule == "synth" else [])  # synth: a few times faster
        try:
            plan = api.plan(cluster_file=cluster, model=model, schedule=schedule, overrides=overrides)
        except HexicoreError as exc:
            assert "fits on no plan" in str(exc) or "needs at least" in str(exc), str(exc)
            return
    assert plan.estimate.fits
    assert evaluated(plan).estimate.fits


def test_seeds_lay_out_within_max_tp(caplog, tmp_path):
    """One machine of 16 H200 under the profiled model (measured at TP 1): with solver.max_tp=8 no
    TP degree above 8 is priced — the megatron seed used to lay out TP 16 — and the plan keeps
    every stage at TP <= 8."""
    cluster = tmp_path / "h200x16.yaml"
    cluster.write_text(yaml.safe_dump({"name": "h200x16", "inter": {"bandwidth_gbs": 50, "latency_us": 10},
                                       "machines": [{"name": "H", "gpu": "h200", "count": 16,
                                                     "bandwidth_gbs": 400, "latency_us": 5}]}))
    profile = ROOT / "docs" / "profiles" / "h200-llama2_7b-2026-12-04.yaml"
    with caplog.at_level(logging.WARNING):
        plan = api.plan(cluster_file=cluster, model="llama2_7b",
                        overrides=["cost=profiled", f"cost.profile_file={profile}", "solver.max_tp=8",
                                   "train.global_batch=64", "solver.iterations=10"])
    assert max(s.tp for p in plan.pipelines for s in p.stages) <= 8
    assert not [r for r in caplog.records if "TP degree 16" in r.getMessage()]


def test_max_tp_bounds_the_symmetric_layouts():
    """``Problem.max_tp`` is one of Megatron's constraints where set (the search's seeds)."""
    problem = Problem(cluster_preset("homo_a800_16"), model_preset("llama2_7b"),
                      TrainSettings(global_batch=16), AnalyticCostModel())
    assert legal(problem, 1, 16, 1)
    limited = Problem(problem.cluster, problem.model, problem.train, problem.cost, max_tp=8)
    assert not legal(limited, 1, 16, 1) and legal(limited, 2, 8, 1)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "zb_v"])
def test_use_all_devices_gives_every_device_a_stage(tmp_path, schedule):
    """3 + 2 GPUs, the tiny model (8 blocks, 2 chunks a rank): no symmetric layout of all 5 is
    legal, so the megatron seed leaves the slowest idle; it used to win under use_all_devices."""
    cluster = write_cluster(tmp_path, [("a100-40g", 3), ("rtx4090", 2)])
    plan = api.plan(cluster_file=cluster, model="tiny", schedule=schedule,
                    overrides=["train.global_batch=8", "solver.use_all_devices=true"])
    assert set(plan.devices) == {d.id for d in plan.cluster.devices}


def test_use_all_devices_prices_one_rank_pipelines_as_the_schedule_says(tmp_path):
    """2 + 2 + 1 GPUs, the tiny model under Hanayo (two waves: four chunks a rank, so at most two
    ranks of its 8 blocks): every plan of all 5 devices has a one-rank pipeline, which Hanayo
    prices as 1F1B (``Pricing.fewer_ranks``); the search used to leave such layouts out and
    found no plan of every device. The plan validates and fits as evaluate checks it."""
    cluster = write_cluster(tmp_path, [("a100-40g", 2), ("rtx4090", 2), ("rtx3090", 1)])
    plan = api.plan(cluster_file=cluster, model="tiny", schedule="hanayo",
                    overrides=["train.global_batch=8", "solver.use_all_devices=true", "solver.seeds=[]"])
    assert set(plan.devices) == {d.id for d in plan.cluster.devices}
    assert min(len(p.stages) for p in plan.pipelines) == 1
    assert evaluated(plan).estimate.fits


def test_use_all_devices_says_when_no_plan_uses_every_device(tmp_path, caplog):
    """DualPipeV needs 2 micro-batches per rank: 4 micro-batches on 2 + 2 + 1 GPUs leave no
    plan of every device; the best plan on fewer is returned and says so (its solver section's
    ``idle_devices`` and a warning naming them)."""
    cluster = write_cluster(tmp_path, [("a100-40g", 2), ("rtx4090", 2), ("rtx3090", 1)])
    with caplog.at_level(logging.WARNING):
        plan = api.plan(cluster_file=cluster, model="tiny", schedule="dualpipe_v",
                        overrides=["train.global_batch=4", "solver.use_all_devices=true"])
    idle = [d.id for d in plan.cluster.devices if d.id not in set(plan.devices)]
    assert idle and plan.solver["idle_devices"] == idle
    assert [r for r in caplog.records if "use_all_devices=true: no plan that gives every device" in r.getMessage()
            and ", ".join(idle) in r.getMessage()]
    assert evaluated(plan).estimate.fits
