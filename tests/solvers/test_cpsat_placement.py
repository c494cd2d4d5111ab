"""CP-SAT under schedules that cut a rank's blocks into chunks or keep the head on rank 0.

The model keeps a block per chunk on every stage (``least``: Hanayo's 2W, the V schedules' 2)
and follows the schedule's placement of the head (``head``: the first stage of zb_v,
dualpipe_v and Hanayo), so the plans it returns fit their devices and are run by the runtime.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.cost import AnalyticCostModel
from hexicore.planner.stage_layout.pipeline_fit import holds_chunks
from hexicore.planner.pricing import ScheduleBook, schedule_pricing
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout
from hexicore_plugins.solvers.cpsat.ends import head_rows, plain_rows
from hexicore_plugins.solvers.cpsat.tables import build_tables, stage_options
from tests.helpers import (cpsat_cluster as cluster, cpsat_problem as problem, cpsat_small_llama as small_llama,
                           cpsat_solve as solve)


REG = Registry.default()


def priced(c, m, gb, schedule):
    cost, book = schedule_pricing(AnalyticCostModel(), schedule, REG)
    return replace(problem(c, m, gb, schedule=schedule, cost=cost), pricing=book, registry=REG)


@pytest.mark.parametrize("schedule, head", [
    ({"name": "1f1b"}, None),                       # plain: the last stage
    ({"name": "chimera"}, None),                    # two chains per rank: not linear, kept plain
    ({"name": "zb_v"}, (1, 0, 0, 0)),
    ({"name": "hanayo", "waves": 2}, (1, 0, 0, 0)),
])
def test_head_rows_follow_the_schedules_placement(schedule, head):
    p = priced(cluster([("A", "rtx3090", 4, 32.0)]), small_llama(8), 8, schedule)
    rows = head_rows(p, 4, 8)
    assert rows[4] == (head or plain_rows(4)[4]) and rows[1] == (1, 0, 0, 0)


def test_least_rows_are_the_schedule_books():
    p = priced(cluster([("A", "rtx3090", 4, 32.0)]), small_llama(8), 8, {"name": "hanayo", "waves": 2})
    tab = build_tables(p, stage_options(p), 2, 4)
    assert tab.least[3] == (*ScheduleBook(REG).least({"name": "hanayo", "waves": 2}, 3), 0) == (4, 4, 4, 0)


ONE_GPU_EACH = [(n, "rtx3090", 1, 32.0) for n in "ABCD"]  # 24 GB each: 12 7B-wide blocks need 2+ stages


UNEVEN = [("A", "rtx3090", 2, 16.0), ("B", "rtx4090", 2, 32.0), ("C", "slow", 2, 8.0)]


@pytest.mark.parametrize("schedule", [{"name": "zb_v"}, {"name": "hanayo", "waves": 2}])
def test_plans_fit_keep_a_block_per_chunk_and_run(schedule):
    """Llama-2-7B (sequences of 2,048) on six 12-24 GB GPUs: the first stage keeps the head too.
    (Before the model knew, it priced the head on the last stage and the plan failed the memory
    check.)"""
    c = cluster(UNEVEN, inter_gbs=1.5, gpus={"slow": {"tflops": 50, "memory_gb": 12}})
    p = priced(c, small_llama(32, seq_len=2048), 8, schedule)
    plan = solve(p, time_limit=5, use_all_devices=True)
    assert max(len(pp.stages) for pp in plan.pipelines) > 1 and p.cost.estimate(plan).fits
    assert all(holds_chunks(p.pricing, pp) for pp in plan.pipelines)
    layout = plan_layout(plan, [dict(pp.schedule) for pp in plan.pipelines], registry=REG, seq_len=plan.train.seq_len)
    assert layout.world == len(plan.devices)


def test_no_layout_with_a_block_per_chunk_is_an_error_naming_the_rule():
    """Hanayo with 4 waves needs 8 blocks per rank: 12 blocks make no pipeline of 2+ stages, and
    one 24 GB GPU holds no 12. (Before the rule, the model returned 6 + 6, which train refuses.)"""
    p = priced(cluster(ONE_GPU_EACH, inter_gbs=10.0), small_llama(12), 16, {"name": "hanayo", "waves": 4})
    with pytest.raises(HexicoreError, match="a block per chunk its schedule runs"):
        solve(p, time_limit=5, use_all_devices=True)


def test_in_flight_rows_are_the_cost_models_and_kept_per_cost_model():
    """Under synth (peaks simulated on synthesised lists, forked across cores) every in-flight
    entry is ``cost.in_flight`` of the template pipeline asked in this process, and a second
    table on the same cost model (an allocation's sub-cluster) asks the cost model nothing."""
    from hexicore.core.plan import Pipeline, Stage
    from hexicore_plugins.solvers.cpsat import tables as tables_mod

    p = priced(cluster([("A", "rtx3090", 3, 32.0)]), small_llama(8), 4, {"name": "synth"})
    tab = build_tables(p, stage_options(p), 2, 3)
    fresh = priced(cluster([("A", "rtx3090", 3, 32.0)]), small_llama(8), 4, {"name": "synth"})
    for P in range(1, 4):
        pipe = Pipeline(1, tuple(Stage((), 0, (0, 0)) for _ in range(P)), dict(fresh.schedule))
        for j in range(P):
            assert [tab.flights[tab.in_flight[P][j][n]] for n in range(1, 5)] == \
                [fresh.cost.in_flight(pipe, j, n) for n in range(1, 5)]
    asked = []
    real = tables_mod.in_flight_rows.__globals__["fork_map"]
    tables_mod.in_flight_rows.__globals__["fork_map"] = lambda fn, items, w: asked.extend(items) or real(fn, items, w)
    try:
        sub = replace(p, cluster=cluster([("A", "rtx3090", 2, 32.0)]))
        again = build_tables(sub, stage_options(sub), 2, 2)
    finally:
        tables_mod.in_flight_rows.__globals__["fork_map"] = real
    assert asked == [] and [[again.flights[f] for f in r] for r in again.in_flight[2]] == \
        [[tab.flights[f] for f in r] for r in tab.in_flight[2][:3]]


@pytest.mark.parametrize("schedule", [{"name": "zb_v"}, {"name": "hanayo", "waves": 2}, {"name": "interleaved_1f1b"},
                                      {"name": "1f1b"}])
def test_memory_caps_price_the_cost_models_own_in_flight_counts(schedule):
    """Every cap entry the model reads for (P, j, n) is the largest block count whose
    ``stage_memory_gb`` at the cost model's in-flight count fits, that count fractional or not
    (zb_v's 3.5 at stage 2 of 4). (Before, the tables truncated it to 3: one RTX 4090 took 7
    blocks of a 28-block 7B model the estimate prices at 24.17 GB, and CP-SAT returned that plan.)"""
    from hexicore.core.plan import Pipeline, Stage

    c = cluster(UNEVEN, inter_gbs=1.5, gpus={"slow": {"tflops": 50, "memory_gb": 12}})
    p = priced(c, small_llama(28, seq_len=4096), 8, schedule)
    options = stage_options(p)
    tab = build_tables(p, options, 2, 4)
    mem = [c.device(o.devices[0]).memory_gb for o in options]
    for P in range(1, 5):
        pipe = Pipeline(1, tuple(Stage((), 0, (0, 0)) for _ in range(P)), dict(p.schedule))
        for j in range(P):
            for n in (1, 4, 8):
                flight = p.cost.in_flight(pipe, j, n)
                if flight == float("inf"):
                    continue
                assert tab.flights[tab.in_flight[P][j][n]] == flight
                for o, opt in enumerate(options, 1):
                    for fi, la in ((j == 0, False), (j == 0, True)):
                        cap = tab.cap[o][fi][la][tab.in_flight[P][j][n]]
                        gb = [p.cost.stage_memory_gb(c, p.model, p.train, opt.devices, k, first=fi, last=la,
                                                     in_flight=flight) for k in (cap, cap + 1)]
                        assert (cap == 0 or gb[0] <= mem[o - 1]) and (cap == 28 or gb[1] > mem[o - 1])


@pytest.mark.parametrize("schedule, layers", [({"name": "zb_v"}, 28), ({"name": "interleaved_1f1b"}, 28)])
def test_plans_fit_under_fractional_in_flight_counts(schedule, layers):
    """The plans CP-SAT returns fit by the cost model's own estimate where the schedule's peaks
    hold fractions of a micro-batch (zb_v, interleaved 1F1B on 28 blocks at sequences of 4,096)."""
    c = cluster(UNEVEN, inter_gbs=1.5, gpus={"slow": {"tflops": 50, "memory_gb": 12}})
    p = priced(c, small_llama(layers, seq_len=4096), 8, schedule)
    plan = solve(p, time_limit=3, use_all_devices=True)
    assert p.cost.estimate(plan).fits, p.cost.estimate(plan).oom
