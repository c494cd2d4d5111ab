"""Baseline solvers (metis_like, galvatron_like, fsdp) and hexiscale against them."""

from dataclasses import replace
import importlib

import pytest
from hypothesis import given, settings, strategies as st

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.registry import Registry
from hexicore.planner.plan_check import validate_plan

baselines = importlib.import_module("hexicore_plugins.solvers.baselines")


@pytest.fixture(scope="module")
def paper_problem():
    return build_problem(config_from_overrides(["cost.state_bytes_per_param=8"]), Registry.default())  # the paper's state size


def solve(problem, name, **params):
    return Registry.default().create("solver", name, **params).solve(problem, time_limit=None, seed=0,
                                                                      progress=lambda m, f: None)


def test_proportional_layers():
    assert baselines.proportional(40, [2.0, 1.0, 1.0], [40, 40, 40]) == [20, 10, 10]
    assert baselines.proportional(10, [1.0, 1.0, 1.0], [10, 10, 10]) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    out = baselines.proportional(40, [4.0, 1.0, 1.0], [20, 40, 40])  # capped stage: overflow re-partitioned
    assert out is not None and out[0] == 20 and sum(out) == 40
    assert baselines.proportional(40, [1.0, 1.0], [10, 10]) is None
    # slow stages below one layer's share keep one each; the fast ones give the surplus back
    assert baselines.proportional(8, [312.0] * 3 + [71.0] * 4, [8] * 7) == [1, 1, 2, 1, 1, 1, 1]
    # a layer per chunk of the schedule (Hanayo W=2: 4 a rank): the slow stages are lifted to it
    assert baselines.proportional(12, [3.0, 1.0, 1.0], [12] * 3, least=[4, 4, 4]) == [4, 4, 4]
    assert baselines.proportional(16, [14.0, 1.0, 1.0], [16] * 3, least=[2, 2, 2]) == [12, 2, 2]
    assert baselines.proportional(10, [1.0, 1.0, 1.0], [10] * 3, least=[4, 4, 4]) is None
    assert baselines.proportional(12, [1.0, 1.0, 1.0], [12, 3, 12], least=[4, 4, 4]) is None  # a cap below it


@pytest.mark.parametrize("name", ["metis_like", "galvatron_like"])
def test_baselines_return_valid_plans(paper_problem, name):
    plan = solve(paper_problem, name)
    est, _ = validate_plan(plan, paper_problem.cost)
    assert est.fits and plan.solver["name"] == name


def test_metis_like_is_one_symmetric_layout_in_type_order(paper_problem):
    plan = solve(paper_problem, "metis_like")
    p = plan.solver["params"]
    assert p["dp"] * p["tp"] * p["pp"] == 8
    assert len({tuple(s.layers for s in q.stages) for q in plan.pipelines}) == 1  # uniform across replicas
    order = p["order"]
    for q in plan.pipelines:  # stages follow the chosen device-type order
        kinds = [order.index(paper_problem.cluster.device(s.devices[0]).gpu.name) for s in q.stages]
        assert kinds == sorted(kinds)


def test_galvatron_like_balances_memory(paper_problem):
    plan = solve(paper_problem, "galvatron_like")
    est = paper_problem.evaluate(plan)
    counts = [s.n_layers for s in plan.pipelines[0].stages]
    for j in range(len(counts) - 1):  # no fitting one-layer move lowers the peak
        for d in (1, -1):
            alt = counts[:]
            alt[j] += d
            alt[j + 1] -= d
            if min(alt) < 1:
                continue
            e = paper_problem.evaluate(baselines.with_layers(plan, alt))
            if not e.fits:
                continue
            assert max(e.memory_gb.values()) >= max(est.memory_gb.values()) - 1e-6


def test_fsdp_is_zero3_with_batch_by_speed_and_fits_13b_by_memory_shards():
    small = build_problem(config_from_overrides(["model=tiny"]), Registry.default())
    plan = solve(small, "fsdp")
    assert len(plan.pipelines) == 8 and all(len(p.stages) == 1 for p in plan.pipelines)
    assert plan.train.zero == 3 and validate_plan(plan, small.cost)[0].fits
    # paper_case: A800s (312 TFLOPS) get more micro-batches than the RTX 4090s (165.2)
    speed = {d.id: d.tflops for d in small.cluster.devices}
    by_speed = sorted(plan.pipelines, key=lambda p: -speed[p.stages[0].devices[0]])
    assert by_speed[0].batch > by_speed[-1].batch
    # Llama-2 13B, 16 B/param: 26 GB per device with even shards does not fit a 24 GB card;
    # shards proportional to memory do (the A800s keep 80/(3x80+5x24) of each chunk)
    big = build_problem(config_from_overrides([]), Registry.default())
    plan = solve(big, "fsdp")
    est = validate_plan(plan, big.cost)[0]
    assert plan.train.zero_split == "memory" and est.fits
    even = big.cost.estimate(replace(plan, train=replace(plan.train, zero_split="even")))
    assert not even.fits


def test_hexiscale_beats_every_baseline_on_the_paper_case(paper_problem):
    hexi = paper_problem.evaluate(solve(paper_problem, "hexiscale")).iteration_s
    for name in ("megatron", "metis_like", "galvatron_like"):
        assert hexi <= paper_problem.evaluate(solve(paper_problem, name)).iteration_s


@given(st.lists(st.floats(1.0, 2000.0), min_size=1, max_size=12), st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_speed_shares_give_every_replica_a_micro_batch(speeds, extra):
    """fsdp's batches: they sum to the micro-batches and none is empty, whatever the speeds (a
    fast device once took the last micro-batch of a slow one, an empty pipeline that made
    ``solver=fsdp`` report that nothing fits)."""
    total = len(speeds) + extra
    out = baselines.speed_shares(total, speeds)
    assert sum(out) == total and min(out) >= 1
    assert baselines.speed_shares(12, [989.4, 125, 68.2, 68.2, 68.2]) == [8, 1, 1, 1, 1]


def test_fsdp_plans_a_tiny_model_on_a_fast_and_slow_fleet(tmp_path):
    yaml = ("name: fs2\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\nmachines:\n"
            "  - {name: A, gpu: h100-80g, count: 1, bandwidth_gbs: 400, latency_us: 1}\n"
            "  - {name: C, gpu: v100-32g, count: 1, bandwidth_gbs: 100, latency_us: 5}\n"
            "  - {name: B, gpu: rtx3080ti, count: 3, bandwidth_gbs: 8, latency_us: 20}\n")
    (tmp_path / "c.yaml").write_text(yaml)
    problem = build_problem(config_from_overrides([f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny",
                                                   "solver=fsdp", "train.global_batch=12"]), Registry.default())
    plan = solve(problem, "fsdp")
    assert [p.batch for p in plan.pipelines] == [8, 1, 1, 1, 1]
    assert validate_plan(plan, problem.cost)[0].fits


def _one_machine(tmp_path, gpus, solver, schedule, batch):
    """tiny on one machine of ``gpus`` RTX 4090s under ``solver`` and ``schedule``."""
    (tmp_path / "c.yaml").write_text("name: one\nmachines:\n"
                                     f"  - {{name: A, gpu: rtx4090, count: {gpus}, bandwidth_gbs: 32, latency_us: 10}}\n")
    return build_problem(config_from_overrides(
        [f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", f"solver={solver}", f"schedule={schedule}",
         f"train.global_batch={batch}"]), Registry.default())


@pytest.mark.parametrize("name", ["megatron", "metis_like", "galvatron_like"])
def test_symmetric_layouts_leave_devices_idle_where_all_cannot_hold_a_layer_per_chunk(name, tmp_path):
    """5 GPUs have one legal (dp, tp, pp) for tiny (8 layers) and a batch of 8: (1, 1, 5), whose
    stages cannot hold the 2 chunks of interleaved 1F1B. The layout runs on 4 GPUs instead (the
    solvers refused: 'none legal' / 'no candidate fits in memory (0 tried)'), as for a GPU count
    that factors into no layout."""
    problem = _one_machine(tmp_path, 5, name, "interleaved_1f1b", 8)
    plan = solve(problem, name)
    assert len(plan.devices) == 4 and all(s.n_layers >= 2 for p in plan.pipelines for s in p.stages)
    assert validate_plan(plan, problem.cost)[0].fits


@pytest.mark.parametrize("name", ["megatron", "metis_like", "galvatron_like", "fsdp"])
def test_baselines_give_each_pipeline_the_micro_batches_its_schedule_needs(name, tmp_path):
    """DualPipeV runs a pipeline of P ranks on 2P micro-batches at least. With a batch of 2 on 4
    GPUs no symmetric layout of all four has them (tiny's TP stops at 2), and one replica per GPU
    gets one each: the solvers refused ('no candidate fits'); they now leave GPUs idle."""
    problem = _one_machine(tmp_path, 4, name, "dualpipe_v", 2)
    plan = solve(problem, name)
    assert len(plan.devices) < 4
    assert all(p.n_micro_batches(1) >= 2 * len(p.stages) for p in plan.pipelines)
    assert validate_plan(plan, problem.cost)[0].fits
