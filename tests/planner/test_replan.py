"""Elastic replanning: exclude=[...] + warm_start=PLAN.json repairs the previous plan."""

import json
import random
from dataclasses import replace

import pytest

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.core.model import ModelSpec
from hexicore.core.settings import TrainSettings
from hexicore.planner.problem import Problem
from hexicore.registry import Registry
from hexicore.planner.replan.diff import describe, plan_diff
from hexicore.planner.plan_check import validate_plan

from tests.conftest import CONF
from tests.helpers import SEARCH_FAST as FAST, search_random_cluster as random_cluster
from tests.conftest import run_cli


def solve(problem, seed=0, **params):
    return Registry.default().create("solver", "hexiscale", **{**FAST, **params}).solve(
        problem, time_limit=None, seed=seed, progress=lambda m, f: None)


def run(args, capsys):
    return run_cli(args), capsys.readouterr()


@pytest.fixture(scope="module")
def paper_problem():
    return build_problem(config_from_overrides([]), Registry.default())


def test_replan_after_losing_two_devices(paper_problem):
    before = solve(paper_problem)
    lost = ["A.1", "B.0"]
    after = replace(paper_problem, cluster=paper_problem.cluster.exclude(lost), warm_start=before)
    plan = solve(after)
    est, _ = validate_plan(plan, after.cost)
    assert est.fits and not set(lost) & set(plan.devices)
    diff = plan.solver["replan"]
    assert diff["excluded"] == lost and diff["lost"] == [d for d in lost if d in before.devices]
    assert diff["devices_moved"] >= 0 and diff["layers_moved"] >= 0
    assert "replan: excluded A.1, B.0" in describe(diff)


@pytest.mark.parametrize("seed", range(5))
def test_replanned_plan_never_uses_an_excluded_device(seed):
    rng = random.Random(100 + seed)
    reg = Registry.default()
    cluster = random_cluster(rng)
    model = ModelSpec.load(CONF / "model" / "gpt3_1.3b.yaml")
    problem = Problem(cluster, model, TrainSettings(global_batch=16, micro_batch=1, seq_len=2048),
                      reg.create("cost_model", "analytic"), {"name": "1f1b"}, reg)
    before = solve(problem, seed=seed)
    used = list(before.devices)
    lost = rng.sample(used, min(len(used) - 1, rng.randint(1, 2))) if len(used) > 1 else []
    if not lost or len(lost) >= len(cluster.devices):
        pytest.skip("nothing to lose")
    after = replace(problem, cluster=cluster.exclude(lost), warm_start=before)
    plan = solve(after, seed=seed)
    est, _ = validate_plan(plan, after.cost)
    assert est.fits and not set(lost) & set(plan.devices)
    assert plan.solver["replan"]["lost"] == sorted(lost)


def test_diff_of_identical_plans_is_empty(paper_problem):
    plan = solve(paper_problem)
    d = plan_diff(plan, plan)
    assert d["devices_moved"] == 0 and d["layers_moved"] == 0 and d["pipelines_kept"] == len(plan.pipelines)


def test_cli_replan_prints_the_difference(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    hydra = f"hydra.run.dir={tmp_path / 'run'}"
    code, _ = run(["plan", "solver.iterations=6", f"out={first}", hydra], capsys)
    assert code == 0
    code, out = run(["plan", "solver.iterations=6", "exclude=[A.1,B.0]", f"warm_start={first}", f"out={second}",
                     hydra], capsys)
    assert code == 0, out.err
    assert "replan: excluded A.1, B.0" in out.out
    data = json.loads(second.read_text())
    assert data["solver"]["replan"]["excluded"] == ["A.1", "B.0"]
    assert not {"A.1", "B.0"} & {d for p in data["pipelines"] for s in p["stages"] for d in s["devices"]}


@pytest.mark.parametrize("extra, words", [
    (["exclude=[A.0,A.1,A.2,B.0,B.1,B.2,C.0,C.1]"], "excluding every device"),
    (["exclude=[A.1,Q.7]"], "unknown device 'Q.7'"),
    (["warm_start=/nonexistent/plan.json"], "plan.json"),
    (["warm_start=MALFORMED"], "malformed"),
    (["warm_start=OTHER"], "error: command line: warm_start: the plan is for model 'gpt3_1.3b'"),
    # a plan of another cluster (every device "lost", exit 0 before): nothing to repair
    (["warm_start=OTHER_CLUSTER", "cluster=homo_a800_16"], "none of whose devices this run's cluster 'homo_a800_16' has"),
])
def test_bad_replan_input_exits_2_with_one_line(tmp_path, capsys, extra, words):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    other = tmp_path / "other.json"
    if any(e.startswith("warm_start=OTHER") and "CLUSTER" not in e for e in extra):  # a plan for another model
        code, _ = run(["plan", "model=gpt3_1.3b", "solver=megatron", f"out={other}", f"hydra.run.dir={tmp_path / 'r0'}"],
                      capsys)
        assert code == 0
    if any("OTHER_CLUSTER" in e for e in extra):  # a plan of the default cluster, paper_case
        other = tmp_path / "other_cluster.json"
        assert run(["plan", "solver=megatron", "cost.state_bytes_per_param=8", f"out={other}",
                    f"hydra.run.dir={tmp_path / 'r1'}"], capsys)[0] == 0
    extra = [e.replace("MALFORMED", str(bad)).replace("OTHER_CLUSTER", str(other)).replace("OTHER", str(other))
             for e in extra]
    code, out = run(["plan", *extra, f"out={tmp_path / 'x.json'}", f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], out.err


def test_devices_an_allocation_leaves_idle_are_moved_not_lost(paper_problem):
    """A replan whose machine allocation leaves devices idle (its plan's cluster excludes them)
    reports as lost only what the cluster asked for lost them: the idle ones moved."""
    before = solve(paper_problem)
    idle = list(before.devices[:2])
    new = replace(before, cluster=before.cluster.exclude(idle))
    diff = plan_diff(before, new, paper_problem.cluster)
    assert diff["lost"] == [] and diff["excluded"] == []
    assert plan_diff(before, new)["lost"] == sorted(idle)
