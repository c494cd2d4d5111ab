"""Per-device memory and stage compute follow each schedule's placement (which blocks, embeddings
and heads a rank holds): hand-computed weights for Chimera and Hanayo, the runtime's chunks'
parameters on every rank, 1F1B/GPipe unchanged, and the planner's caps under the placement."""

import pytest

from hexicore.core.placement import Copy, Placement
from hexicore.core.plan import Plan
from hexicore.cost import GIB, AnalyticCostModel
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.action_placement import placement
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.planner.pricing import ScheduleBook, timed_cost
from hexicore.registry import Registry
from tests.helpers import layout_of, plan_of, tiny
from tests.helpers import PLACEMENT_PLANS as PLANS


def priced() -> AnalyticCostModel:
    return timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default()))


def weights(cost, plan) -> list[float]:
    """Per device (plan order) the weight bytes the cost model prices (4 B per parameter)."""
    return [parts["weights"] * GIB / 4 for parts in cost.memory_parts(plan).values()]


def test_placement_read_from_the_action_lists():
    reg = Registry.default()
    chim = placement(reg.create("schedule", "chimera").order(ScheduleSpec(3, 4)))
    assert chim.ranks == ((Copy(0, True, False, 0.5), Copy(2, False, True, 0.5, 1)),
                          (Copy(1, False, False, 0.5), Copy(1, False, False, 0.5, 1)),
                          (Copy(2, False, True, 0.5), Copy(0, True, False, 0.5, 1)))
    assert (chim.primary("embedding"), chim.primary("head")) == (0, 2)  # chain 0's: the DP sync's
    assert chim.holders(0) == (0, 2) and chim.holders(1) == (1,) and chim.blocks(0, [2, 3, 3]) == 5
    assert chim.share_layers(0, [2, 3, 3]) == 3 and chim.embeddings(2) == chim.heads(0) == 1
    for name, params in (("hanayo", {"waves": 2}), ("zb_v", {}), ("dualpipe_v", {})):
        pl = reg.create("schedule", name, **params).placement(4, 8)
        assert pl.ranks[0] == (Copy(0, True, True),) and pl.heads(3) == 0, name  # the chain ends on rank 0
        assert pl.primary("head") == 0, name
    for name, params in (("1f1b", {}), ("gpipe", {}), ("interleaved_1f1b", {"chunks": 2}), ("zb_h1", {})):
        assert reg.create("schedule", name, **params).placement(4, 8) == Placement.plain(4), name


def test_hand_computed_weights_of_chimera_and_hanayo():
    m = tiny()
    block, emb, head = m.layer_params(), m.embedding_params(), m.head_params()
    cost = priced()
    # Chimera, layers 2 | 3 | 3: rank r keeps its own blocks and rank P-1-r's (the up copy);
    # ranks 0 and 2 keep an embedding (down chain 0 / up chain) and a head (up / down)
    assert weights(cost, plan_of(PLANS["chimera P=3"])) == [5 * block + emb + head, 6 * block, 5 * block + emb + head]
    # Hanayo W=1, layers 2 | 3 | 3: the chain turns on rank 2 and ends on rank 0 with the head
    assert weights(cost, plan_of(PLANS["hanayo W=1 P=3"])) == [2 * block + emb + head, 3 * block, 3 * block]
    # the plain assumption (no placement) gave the head to the last rank and one copy each
    assert weights(AnalyticCostModel(), plan_of(PLANS["chimera P=3"])) == [2 * block + emb, 3 * block, 3 * block + head]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", list(PLANS))
def test_weights_equal_the_runtimes_parameters_on_every_rank(name, tied):
    """The torch runtime's chunks of each rank (built as a worker builds them, no process
    launched): their distinct parameters equal the cost model's weights on that rank's devices —
    with tied embeddings too, where a rank holding a head without its chain's embedding keeps a
    copy of it (the last stage under 1F1B, Chimera's ranks 0 and P-1)."""
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout
    from hexicore_plugins.runtimes.torch.model.stage_module import build_stages, seeded
    from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup
    from tests.helpers import CPU6_SEQ as SEQ

    plan = plan_of(PLANS[name])
    plan = replace(plan, model=replace(plan.model, tied_embeddings=tied))
    layout = plan_layout(plan, [p.schedule for p in plan.pipelines], registry=Registry.default(), seq_len=SEQ)
    part, parts = layout.pipelines[0], priced().memory_parts(plan)
    for q, (group, stage) in enumerate(zip(part.groups, plan.pipelines[0].stages)):
        for k, dev in enumerate(stage.devices):
            chunks = build_stages(plan.model, part, q, TPGroup(k, group.tp), full=seeded(0), recompute=False,
                                  device=torch.device("cpu"))
            held = {id(p): p.numel() for c in chunks.values() for p in c.module.parameters()}
            assert sum(held.values()) == parts[dev]["weights"] * GIB / 4, (name, q, k)


def test_hanayo_head_is_computed_on_rank_0():
    cost, plan = priced(), plan_of(PLANS["hanayo W=2"])
    c, m, t = plan.cluster, plan.model, plan.train
    stages, _ = cost.pipeline_pieces(plan, plan.pipelines[0])
    s0, s1 = plan.pipelines[0].stages
    assert stages == [cost.stage_s(c, m, t, s0.devices, 4, first=True, last=True),
                      cost.stage_s(c, m, t, s1.devices, 4, first=False, last=False)]
    chim = plan_of(PLANS["chimera P=3"])  # each rank runs half the micro-batches through either copy
    st, _ = cost.pipeline_pieces(chim, chim.pipelines[0])
    d0 = chim.pipelines[0].stages[0].devices
    assert st[0] == pytest.approx(0.5 * cost.stage_s(c, m, t, d0, 2, first=True) + 0.5 * cost.stage_s(c, m, t, d0, 3,
                                                                                                        last=True))


@pytest.mark.parametrize("name", ["1f1b", "gpipe tp=2"])
def test_plain_schedules_are_priced_exactly_as_before(name):
    """1F1B and GPipe: the placement is the plain one, so the estimate with it injected is the
    estimate without it, number for number."""
    plan = plan_of(PLANS[name])
    book = ScheduleBook(Registry.default())
    with_it = timed_cost(AnalyticCostModel(), book)
    without = AnalyticCostModel(pipeline_timer=with_it.pipeline_timer, activation=with_it.activation)
    assert with_it.placement is not None and with_it.estimate(plan) == without.estimate(plan)


def test_planner_caps_keep_every_copy_within_memory():
    """The search's caps under a placement: a stage's cap bounds every holder of its blocks
    with all its copies, so what the search lays out fits by the exact model; on 12 GB cards
    1F1B's layout of GPT-3 1.3B fits, Chimera's two copies of it do not, and the search says so."""
    from hexicore.core.cluster import parse_cluster
    from hexicore.core.settings import TrainSettings
    from hexicore.planner.stage_layout.stage_table import StageTable, layout_pipeline
    from tests.conftest import model_preset

    m, train = model_preset("gpt3_1.3b"), TrainSettings(global_batch=8, micro_batch=1, seq_len=2048)
    cost, stages = priced(), [(f"A.{i}",) for i in range(4)]

    def on(gpu):
        return parse_cluster({"name": "c", "inter": {"bandwidth_gbs": 1, "latency_us": 50},
                              "machines": [{"name": "A", "gpu": gpu, "count": 4, "bandwidth_gbs": 32,
                                            "latency_us": 10}]}, "test")

    for gpu in ("rtx4090", "rtx3080ti"):
        c = on(gpu)
        for sched in ({"name": "chimera"}, {"name": "hanayo", "waves": 1}, {"name": "1f1b"}):
            lay = layout_pipeline(StageTable(c, m, train, cost, sched), stages, 8)
            if lay is None:
                assert (gpu, sched["name"]) == ("rtx3080ti", "chimera")
                continue
            est = cost.estimate(Plan(m, c, train, (lay.pipeline(8, ScheduleRef.from_mapping(sched)),)))
            assert est.fits, (gpu, sched, est.memory_gb)
    small = on("rtx3080ti")
    lay = layout_pipeline(StageTable(small, m, train, cost, {"name": "1f1b"}), stages, 8)
    pipe = lay.pipeline(8, ScheduleRef.from_mapping({"name": "chimera"}))
    assert not cost.estimate(Plan(m, small, train, (pipe,))).fits  # the copies overflow the plain layout
    from hexicore.core.errors import PlanError
    from hexicore.planner.plan_check import validate_plan

    # GPT-3 ties its embeddings: rank 0 keeps chain 0's embedding and the up chain's head, whose
    # embedding is on rank 3, so a copy of it too
    said = r"\(5 layers, tp=1; its schedule places 10 blocks, 1 embedding\(s\) and 1 head\(s\) on it\)"
    with pytest.raises(PlanError, match=said):
        validate_plan(Plan(m, small, train, (pipe,)), cost)


def test_data_parallel_sync_of_the_head_follows_the_placement():
    """Two Hanayo pipelines: the runtime all-reduces the head among the first stages (the chain
    ends on rank 0), and the cost model's COMM-DP puts the head's term there too."""
    from hexicore.cost import sharding

    pipes = [(4, {"name": "hanayo", "waves": 1}, [(1, 4), (1, 4)])] * 2
    plan, cost = plan_of(pipes), priced()
    got, plain = sharding.dp_stage_parts(cost, plan), sharding.dp_stage_parts(AnalyticCostModel(), plan)
    head = sharding._sync_s(cost, plan, [p.stages[0] for p in plan.pipelines], 0.0, plan.model.head_params(), {},
                            None)[0]
    assert head > 0 and sharding.ends(cost, plan, plan.pipelines[0]) == (0, 0)
    assert got[(0, 0)][0] == pytest.approx(plain[(0, 0)][0] + head)
    assert got[(0, 1)][0] == pytest.approx(plain[(0, 1)][0] - head)
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.data.sync import sync_plan

    groups = sync_plan(layout_of(pipes)).groups
    assert [m for m, items in groups.items() if any(c.name == "lm_head.weight" for c, _, _ in items)] == [(0, 2)]


def test_chimera_keeps_a_mirrored_stage_at_its_tp_degree():
    """Chimera's rank j keeps a copy of stage P-1-j: a plan whose stages j and P-1-j differ in
    TP degree cannot run. The placement names it, plan checks refuse it with the field, the
    search never lays it out, and hexiscale's Chimera plans on hetero1 keep the degrees equal."""
    from hexicore.app.compose import config_from_overrides, solve
    from hexicore.core.errors import PlanError
    from hexicore.planner.stage_layout.pipeline_fit import fits
    from hexicore.planner.plan_check import validate_plan

    chim = Registry.default().create("schedule", "chimera").placement(3, 4)
    assert chim.split_tp([1, 1, 1]) is None and chim.split_tp([2, 1, 2]) is None
    assert chim.split_tp([2, 1, 1]) == (0, 2)  # rank 0 keeps stage 2's blocks at TP 2
    assert Placement.plain(3).split_tp([2, 1, 1]) is None
    cost = priced()
    plan = plan_of([(8, "chimera", [(2, 3), (1, 3), (1, 2)])])
    with pytest.raises(PlanError, match=r"keeps a copy of stage 2's blocks \(tp=1\) on stage 0 \(tp=2\)") as err:
        validate_plan(plan, cost)
    assert err.value.field == "pipelines[0].stages[0].tp"
    assert not fits(ScheduleBook(Registry.default()), cost, plan, plan.pipelines[0])
    ok = plan_of([(8, "chimera", [(2, 3), (1, 3), (2, 2)])])
    validate_plan(ok, cost)
    cfg = config_from_overrides(["cluster=hetero1", "model=llama2_7b", "train.global_batch=128", "schedule=chimera",
                                 "solver.iterations=3", "solver.use_all_devices=true"])
    made, _ = solve(cfg, Registry.default())
    for p in made.pipelines:
        tps = [s.tp for s in p.stages]
        assert tps == tps[::-1], tps


def test_chimera_copies_sum_their_gradients():
    """Chimera keeps stage P-1-r's blocks on rank r too: the runtime's REDUCE sums each stage's
    gradients between its two holders even with one pipeline, and a rank pays it for both copies
    (layers 2 | 3 | 3: ranks 0 and 2 hold 5 blocks held twice, rank 1 both copies of its own);
    the REDUCE of the end stages carries their embedding and head too (each chain has them)."""
    from hexicore.cost import sharding

    cost, plan = priced(), plan_of(PLANS["chimera P=3"])
    c, m, t = plan.cluster, plan.model, plan.train
    s0, _, s2 = plan.pipelines[0].stages
    one = cost.dp_layer_s(c, [s0, s2], m.layer_params(), t.dtype_bytes)
    ends = sum(cost.dp_layer_s(c, [s0, s2], n, t.dtype_bytes) for n in (m.embedding_params(), m.head_params()))
    assert one > 0
    parts = sharding.dp_stage_parts(cost, plan)
    assert parts[(0, 0)][0] == pytest.approx(5 * one + ends) and parts[(0, 2)][0] == pytest.approx(5 * one + ends)
    assert parts[(0, 1)] == (0.0, 0.0)
    assert cost.estimate(plan).dp_s == pytest.approx(5 * one + ends)
    assert AnalyticCostModel().estimate(plan).dp_s == 0.0  # the plain assumption: one pipeline, nothing to sync
    two = plan_of(PLANS["chimera P=3"] * 2, global_batch=16)  # the embedding's ring: both copies of both pipelines
    a0, _, a2 = two.pipelines[0].stages
    b0, _, b2 = two.pipelines[1].stages
    emb = cost.dp_layer_s(c, [a0, a2], m.embedding_params(), t.dtype_bytes) + \
        cost.dp_layer_s(c, [a0, a2, b0, b2], m.embedding_params(), t.dtype_bytes)
    head = cost.dp_layer_s(c, [a0, a2], m.head_params(), t.dtype_bytes) + \
        cost.dp_layer_s(c, [a0, a2, b0, b2], m.head_params(), t.dtype_bytes)
    block = one + cost.dp_layer_s(c, [a0, a2, b0, b2], m.layer_params(), t.dtype_bytes)
    assert sharding.dp_stage_parts(cost, two)[(1, 2)][0] == pytest.approx(5 * block + emb + head)



@pytest.mark.parametrize("memory_gb", [12.5, 13.5, 14.0])
def test_chimera_caps_count_the_tied_copies_of_ranks_0_and_p_minus_1(memory_gb):
    """GPT-3 1.3B ties its embeddings: Chimera's ranks 0 and P-1 each keep an embedding and the
    other chain's head with its own copy of it. The search's caps count that copy (they once
    used the rule heads - embeddings = 0 and laid out stages that did not fit at 12.5-14 GB)."""
    from hexicore.core.cluster import parse_cluster
    from hexicore.core.settings import TrainSettings
    from hexicore.planner.stage_layout.stage_table import StageTable, layout_pipeline
    from tests.conftest import model_preset

    m, train = model_preset("gpt3_1.3b"), TrainSettings(global_batch=8, micro_batch=1, seq_len=2048)
    c = parse_cluster({"name": "c", "gpus": {"g": {"tflops": 100, "memory_gb": memory_gb}},
                       "inter": {"bandwidth_gbs": 1, "latency_us": 50},
                       "machines": [{"name": "A", "gpu": "g", "count": 4, "bandwidth_gbs": 32, "latency_us": 10}]},
                      "test")
    sched, cost = {"name": "chimera"}, priced()
    lay = layout_pipeline(StageTable(c, m, train, cost, sched), [(f"A.{i}",) for i in range(4)], 8)
    if lay is not None:
        assert cost.estimate(Plan(m, c, train, (lay.pipeline(8, ScheduleRef.from_mapping(sched)),))).fits
    assert memory_gb < 13.5 or lay is not None  # the smallest card it fits: 13.1 GB (fp32 block inputs kept)


def test_chunk_counts_are_a_ranks_chunks_of_one_chain():
    """The fewest layers a rank may hold under a schedule: its stages on one chain (a model
    copy's chain repeats the first's blocks and adds none)."""
    from hexicore.planner.pricing import ScheduleBook
    from hexicore.registry import Registry

    book = ScheduleBook(Registry.default())
    assert book.least({"name": "1f1b"}, 4) == (1, 1, 1, 1)
    assert book.least({"name": "hanayo", "waves": 2}, 3) == (4, 4, 4)
    assert book.least({"name": "hanayo", "waves": "auto"}, 3) == (2, 2, 2)  # auto fits W to the blocks
    assert book.least({"name": "zb_v"}, 4) == (2, 2, 2, 2)
    assert book.least({"name": "interleaved_1f1b", "chunks": 3}, 2) == (3, 3)
    assert book.least({"name": "chimera"}, 4) == (1, 1, 1, 1)
    assert book.least({"name": "hanayo", "waves": 2}, 1) == (1,)  # one rank: runs as 1F1B
