"""Tied embeddings across stages: the embedding group's all-reduce is priced on the stages that
hold a copy, and no ZeRO stage shards the copies (the torch runtime keeps them whole and sums
their gradients in the embedding group) — checked by hand and against the runtime."""

import dataclasses

import pytest

from hexicore.core.plan import Plan

from hexicore.core.settings import TrainSettings
from hexicore.cost import AnalyticCostModel
from hexicore.cost.precision import tied_whole
from tests.helpers import TWO_BY_TWO, tied_plan

GIB = 2**30
#: one stage per pipeline (what ZeRO-3 runs on); ranks 0-2, different micro-batch counts
FLAT = [(3, "1f1b", [(1, 8)]), (3, "gpipe", [(1, 8)]), (2, "1f1b", [(1, 8)])]
#: Chimera's two copies per pipeline next to a plain 1F1B pipeline: a chunk has three holders
MIX = [(4, "chimera", [(1, 3), (1, 5)]), (4, "1f1b", [(1, 3), (1, 5)])]


def ring(plan: Plan, n: int, n_params: float) -> float:
    """App. A's COMM-DP-LAYER among ``n`` devices of machine M by hand: ``2 (n - 1) (alpha +
    P B / (n beta))`` (32 GB/s, 10 us)."""
    return 2 * (n - 1) * (10e-6 + n_params * plan.train.dtype_bytes / (n * 32e9))


def test_one_pipeline_pays_the_embedding_groups_all_reduce_on_its_first_and_last_stage():
    plan = tied_plan([(8, "1f1b", [(1, 3), (1, 2), (1, 3)])])
    m = plan.model
    got = AnalyticCostModel().dp_stage_s(plan)
    want = ring(plan, 2, m.vocab * m.hidden)
    assert got[(0, 0)] == pytest.approx(want) and got[(0, 2)] == pytest.approx(want)
    assert got[(0, 1)] == 0.0
    assert AnalyticCostModel().estimate(plan).dp_s == pytest.approx(want)
    assert AnalyticCostModel().dp_stage_s(tied_plan([(8, "1f1b", [(1, 3), (1, 2), (1, 3)])], tied=False)) == {}
    # one stage holds embedding and head as one Parameter: no group
    assert AnalyticCostModel().dp_stage_s(tied_plan([(8, "1f1b", [(2, 8)])])) == {}


def test_several_pipelines_sum_every_copy_in_one_group_whatever_the_zero_stage():
    """Two pipelines x two stages: the embedding group has four members (both ends of both
    pipelines); the rest of a first stage is its blocks' ring among the two pipelines, and the
    head's final norm joins the last stage's. Under ZeRO-3 the group is still paid at the step."""
    plan = tied_plan(TWO_BY_TWO)
    m = plan.model
    group = ring(plan, 4, m.vocab * m.hidden)
    blocks = ring(plan, 2, m.layer_params())
    got = AnalyticCostModel().dp_stage_s(plan)
    assert got[(0, 0)] == pytest.approx(3 * blocks + group)
    assert got[(1, 1)] == pytest.approx(5 * blocks + ring(plan, 2, m.head_params()) + group)
    zero3 = tied_plan(FLAT, zero=3)
    assert AnalyticCostModel().dp_s(zero3) == pytest.approx(ring(zero3, 3, m.vocab * m.hidden))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_keeps_the_tied_copies_whole(zero):
    plan = tied_plan(FLAT if zero == 3 else TWO_BY_TWO, zero=zero)
    m = plan.model
    parts = AnalyticCostModel().memory_parts(plan)
    emb = m.vocab * m.hidden
    if zero == 3:  # every rank: the whole model, all but the embedding in thirds
        params = m.layers * m.layer_params() + m.embedding_params() + m.head_params()
        assert parts["M.0"]["optimizer"] * GIB == pytest.approx(8 * ((params - emb) / 3 + emb))
    else:  # first stage: 3 blocks + the embedding; last: 5 blocks + the head and its own copy
        assert parts["M.0"]["optimizer"] * GIB == pytest.approx(8 * (3 * m.layer_params() / 2 + emb))
        assert parts["M.1"]["optimizer"] * GIB == pytest.approx(8 * ((5 * m.layer_params() + m.head_params()) / 2 + emb))
    assert tied_whole(m, True, True) == emb and tied_whole(m, False, True) == emb and tied_whole(m, True, False) == emb


@pytest.mark.slow
def test_tied_copies_train_like_one_process_under_zero_and_keep_the_predicted_bytes():
    """One 4-rank job, tied embeddings: the one-process reference, :data:`TWO_BY_TWO` under ZeRO-1,
    :data:`FLAT` under ZeRO-3 (whose embedding group once waited on ranks still gathering
    their ZeRO-3 weights: a deadlock) and :data:`MIX` under ZeRO-2 train like one process
    (1e-5); each rank's AdamW state equals the cost model's (with the schedules' placements),
    the tied copies whole, every Chimera copy a holder of its shard (priced as one holder per
    pipeline, Chimera's ranks kept twice their bytes)."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from hexicore.registry import Registry
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, worker_spec
    from hexicore.planner.pricing import ScheduleBook, timed_cost

    cases = [(TWO_BY_TWO, 1), (FLAT, 3), (MIX, 2)]
    plans = [tied_plan(p, zero=z) for p, z in cases]
    m = plans[0].model
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=4)
    layouts = [dataclasses.replace(plan_layout(p, [q.schedule for q in p.pipelines], registry=Registry.default(),
                                               seq_len=SEQ), world=4) for p in plans]
    specs = [worker_spec(x, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True, zero=z)
             for x, z in [(ref, 0)] + [(lay, z) for lay, (_, z) in zip(layouts, cases)]]
    results = launch(specs, 4)
    for got in results[1:]:
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
    for plan, got in zip(plans, results[1:]):
        parts = timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default())).memory_parts(plan)
        for r, d in enumerate(plan.devices):
            assert abs(got["metrics"]["optimizer_state_bytes"][r] - parts[d]["optimizer"] * GIB) <= 64, (plan.train.zero, d)


def test_chimera_copies_each_keep_a_shard_by_hand():
    """Two Chimera pipelines of 3 stages (layers 2 | 3 | 3) under ZeRO-1: every copy is a holder,
    so a chunk has 4; rank 1 keeps both copies of stage 1 (two shares of its 3 blocks), ranks 0
    and 2 the blocks of stages 0 and 2, an embedding and a head (untied)."""
    from hexicore.planner.pricing import ScheduleBook, timed_cost
    from hexicore.registry import Registry

    chim = [(4, "chimera", [(1, 2), (1, 3), (1, 3)])] * 2
    plan = tied_plan(chim, zero=1, tied=False)
    m = plan.model
    parts = timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default())).memory_parts(plan)
    ends = (5 * m.layer_params() + m.embedding_params() + m.head_params()) / 4
    assert [parts[d]["optimizer"] * GIB / 8 for d in plan.devices] == pytest.approx(
        [ends, 6 * m.layer_params() / 4, ends] * 2)


@pytest.mark.slow
def test_every_schedules_copies_keep_the_predicted_zero_bytes():
    """One 6-rank job: two pipelines of each schedule plan of :mod:`tests.planner.test_placement` (Chimera,
    Hanayo, V shapes, interleaved, TP), tied, under ZeRO-2: each rank's AdamW state equals the
    cost model's under the schedule's placement (copies as holders, tied copies whole)."""
    pytest.importorskip("torch")
    from hexicore.planner.pricing import ScheduleBook, timed_cost
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout
    from tests.helpers import CPU6_SEQ as SEQ, plan_of, worker_spec
    from tests.helpers import PLACEMENT_PLANS as PLANS

    plans = []
    for pipes in PLANS.values():
        p = plan_of(pipes * 2, global_batch=16)
        p = dataclasses.replace(p, model=dataclasses.replace(p.model, tied_embeddings=True))
        plans.append(Plan(p.model, p.cluster, TrainSettings(**{**p.train.to_dict(), "zero": 2}), p.pipelines))
    layouts = [dataclasses.replace(plan_layout(p, [q.schedule for q in p.pipelines], registry=Registry.default(),
                                               seq_len=SEQ), world=6) for p in plans]
    results = launch([worker_spec(x, steps=1, seed=5, dtype="fp32", recompute=False, progress=False, zero=2)
                      for x in layouts], 6)
    cost = timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default()))
    for name, plan, got in zip(PLANS, plans, results):
        parts = cost.memory_parts(plan)
        for r, d in enumerate(plan.devices):
            assert abs(got["metrics"]["optimizer_state_bytes"][r] - parts[d]["optimizer"] * GIB) <= 64, (name, d)


@pytest.mark.parametrize("count", [1, 2])
def test_the_priced_embedding_group_is_the_runtimes(count):
    """For every schedule plan of :mod:`tests.planner.test_placement` (one or two pipelines): the stages
    whose tied-embedding all-reduce the cost model prices hold exactly the ranks of the runtime's
    embedding group (none where one stage holds the only copy)."""
    pytest.importorskip("torch")
    from hexicore.cost import sharding
    from hexicore.planner.pricing import ScheduleBook, timed_cost
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.parallel import tied_embedding as tied
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout
    from tests.helpers import CPU6_SEQ as SEQ, plan_of
    from tests.helpers import PLACEMENT_PLANS as PLANS

    cost = timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default()))
    for name, pipes in {**PLANS, "one stage": [(8, "1f1b", [(2, 8)])]}.items():
        p = plan_of(pipes * count, global_batch=8 * count)
        plan = dataclasses.replace(p, model=dataclasses.replace(p.model, tied_embeddings=True))
        layout = plan_layout(plan, [q.schedule for q in plan.pipelines], registry=Registry.default(), seq_len=SEQ)
        priced = {int(d.split(".")[1]) for i, j in sharding.tied_holders(cost, plan)
                  for d in plan.pipelines[i].stages[j].devices}
        assert priced == set(tied.members(layout)), name
