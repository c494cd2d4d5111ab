"""Sharded training state (ZeRO 0-3) and the precision recipe: formulas by hand, the plan field,
the planner's ``train.zero=auto`` on memory-tight clusters."""

from dataclasses import replace

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.settings import TrainSettings
from hexicore.cost import AnalyticCostModel
from hexicore.cost.precision import StateBytes, sharded, state_bytes, largest_unit_params

from tests.helpers import (HAND_CLUSTER as CLUSTER, HAND_COST as COST, HAND_LAYER_FLOPS_TOKEN as LAYER_FLOPS_TOKEN,
                           HAND_LAYER_PARAMS as LAYER_PARAMS, HAND_MODEL as MODEL, HAND_TRAIN as TRAIN, HAND_H as H,
                           HAND_V as V)


GIB = 2**30


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_recipe_is_16_bytes_whatever_the_autocast_dtype(dtype):
    assert state_bytes(dtype) == StateBytes(4.0, 4.0, 8.0)
    assert state_bytes(dtype, 8.0) == StateBytes(2.0, 2.0, 4.0)  # the override, split 1/4 : 1/4 : 1/2


def test_runtime_keeps_what_the_recipe_says():
    """The torch runtime's stage parameters, gradients and AdamW state: 16 B per parameter."""
    torch = pytest.importorskip("torch")
    from hexicore.core.model import ModelSpec
    from hexicore_plugins.runtimes.torch.model.llama import LlamaChunk

    m = ModelSpec("t", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=50, seq_len=8)
    chunk = LlamaChunk(m, 0, 2, first=True, last=True)
    opt = torch.optim.AdamW(chunk.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunk(torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8)))
    loss.backward()
    opt.step()
    params = list(chunk.parameters())
    n = sum(p.numel() for p in params)
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
    moments = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.dim() > 0)
    assert (weights / n, grads / n, moments / n) == (4.0, 4.0, 8.0)


def test_sharded_parts_per_stage():
    per = state_bytes("bf16")
    assert sharded(per, 0, 4) == per
    assert sharded(per, 1, 4) == StateBytes(4, 4, 2)
    assert sharded(per, 2, 4) == StateBytes(4, 1, 2)
    assert sharded(per, 3, 4) == StateBytes(1, 1, 2)


@pytest.mark.parametrize("zero,w,g,o", [(0, 4, 4, 8), (1, 4, 4, 4), (2, 4, 2, 4), (3, 2, 2, 4)])
def test_stage_memory_parts_by_hand(zero, w, g, o):
    # first stage, 2 layers + embedding, tp 1, two holders (dp=2): the sharded parts halve
    t = TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=zero)
    parts = COST.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2, first=True, in_flight=3, dp=2)
    params = 2 * LAYER_PARAMS + V * H
    assert parts["weights"] == pytest.approx(w * params / GIB)
    assert parts["gradients"] == pytest.approx(g * params / GIB)
    assert parts["optimizer"] == pytest.approx(o * params / GIB)
    base = COST.stage_memory_parts(CLUSTER, MODEL, TRAIN, ["A.0"], 2, first=True, in_flight=3, dp=2)
    assert parts["activations"] == pytest.approx(base["activations"])
    # ZeRO-3 gathers one unit's fp32 weights at a time, the stage's largest: here a block (> V * H);
    # ZeRO-2/3 hold one unit's full fp32 gradient until it is summed
    assert LAYER_PARAMS > V * H
    extra = 4 * LAYER_PARAMS * ((zero == 3) + (zero >= 2)) / GIB
    assert parts["workspace"] == pytest.approx(base["workspace"] + extra)
    # one holder: nothing to shard
    alone = COST.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2, first=True, in_flight=3, dp=1)
    assert alone["optimizer"] == pytest.approx(8 * params / GIB)


def _plan(zero, dp_overlap=False):
    t = TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=zero, dp_overlap=dp_overlap)
    return Plan(MODEL, CLUSTER, t, (
        Pipeline(2, (Stage(("A.0",), 1, (0, 2)), Stage(("A.1",), 1, (2, 4)))),
        Pipeline(2, (Stage(("B.0",), 1, (0, 2)), Stage(("B.1",), 1, (2, 4)))),
    ))


def test_zero_3_prices_a_pipeline_under_another_schedule_than_the_plans():
    """The planner prices each pipeline of a ZeRO-3 plan under the schedule it is about to record
    (``resolve_plan``: a synth schedule capped by the pipeline's memory): that pipeline is not one
    of the plan's, only its stages are, and ``hexicore plan ... train.zero=auto schedule=synth``
    ended in a traceback (StopIteration)."""
    from hexicore.planner.pricing import ScheduleBook, resolve_plan
    from hexicore.registry import Registry

    plan, cost = _plan(3), AnalyticCostModel()
    other = replace(plan.pipelines[1], schedule={"name": "synth", "memory": [2.0, 2.0]})
    assert cost.pipeline_pieces(plan, other) == cost.pipeline_pieces(plan, plan.pipelines[1])
    assert cost.pipeline_pieces(plan, other) != cost.pipeline_pieces(_plan(0), other)  # the gathers are in
    synth = replace(plan, pipelines=tuple(replace(p, schedule={"name": "synth"}) for p in plan.pipelines))
    resolved = resolve_plan(ScheduleBook(Registry.default()), cost, synth)
    assert all("stage_times" in p.schedule.params for p in resolved.pipelines)


def test_zero_1_2_cost_the_same_as_all_reduce_and_3_per_micro_batch():
    """At the step (App. A's sync, ``dp_overlap=false``)."""
    e0, e1, e2, e3 = (COST.estimate(_plan(z)) for z in range(4))
    assert e1.dp_s == e2.dp_s == e0.dp_s > 0  # reduce-scatter + all-gather = the all-reduce's bytes
    assert e1.pipeline_s == e0.pipeline_s
    # ZeRO-3: no step-end sync; each micro-batch pays all-gather (fwd) + all-gather (bwd) +
    # reduce-scatter, i.e. 1.5 x the stage's all-reduce term, stage by stage (by hand: A.i <-> B.i)
    assert e3.dp_s == 0.0
    per_layer = 2 * (100e-6 + LAYER_PARAMS * 4 / (2 * 1e9))  # fp32 gradients and weights: 4 B
    emb = 2 * (100e-6 + V * H * 4 / (2 * 1e9))
    head = 2 * (100e-6 + (V * H + H) * 4 / (2 * 1e9))  # lm_head + final norm
    z3 = [1.5 * (2 * per_layer + emb), 1.5 * (2 * per_layer + head)]
    stages, hops = COST.pipeline_pieces(_plan(0), _plan(0).pipelines[0])
    s3 = [s + z for s, z in zip(stages, z3)]
    expect = sum(s3) + hops[0] + 1 * max(s3[0] + hops[0], s3[1])
    assert e3.pipeline_s[0] == pytest.approx(expect)


def test_zero_2_reduce_scatters_every_micro_batch_and_a_slow_link_paces_the_stage():
    """ZeRO-2 keeps only its piece of the gradients between micro-batches, so every micro-batch's
    gradients are reduce-scattered as its backward finishes them (the runtime, DeepSpeed's stage
    2): half the stage's all-reduce term per micro-batch (by hand: A.i <-> B.i), the stage's
    period where longer than its compute (the hand cluster's 1 GB/s), behind it where shorter
    (a 10 TB/s link); hybrid ZeRO-2 sums at the step."""
    def by_hand(alpha: float, beta: float) -> list[float]:
        per_layer = 2 * (alpha + LAYER_PARAMS * 4 / (2 * beta))  # the all-reduce term, fp32 gradients
        emb, head = 2 * (alpha + V * H * 4 / (2 * beta)), 2 * (alpha + (V * H + H) * 4 / (2 * beta))  # head + norm
        return [0.5 * (2 * per_layer + emb), 0.5 * (2 * per_layer + head)]

    fast = parse_cluster({**CLUSTER.to_dict(), "inter": {"bandwidth_gbs": 10_000.0, "latency_us": 1.0}}, "fast")
    for cluster, rs in ((CLUSTER, by_hand(100e-6, 1e9)), (fast, by_hand(1e-6, 1e13))):
        plan0, plan2 = (replace(_plan(z), cluster=cluster) for z in (0, 2))
        assert COST.zero2_stage_s(plan2) == {(i, j): pytest.approx(rs[j]) for i in range(2) for j in range(2)}
        compute, _ = COST.pipeline_pieces(plan0, plan0.pipelines[0])
        got, _ = COST.pipeline_pieces(plan2, plan2.pipelines[0])
        assert got == pytest.approx([max(c, r) for c, r in zip(compute, rs)])
        paced = cluster is CLUSTER
        assert (min(rs) > max(compute)) is paced and (max(rs) < min(compute)) is not paced
        assert (COST.estimate(plan2).pipeline_s[0] > COST.estimate(plan0).pipeline_s[0]) is paced
    hybrid = replace(_plan(2), train=replace(_plan(2).train, zero_scope="machine"))
    assert COST.zero2_stage_s(hybrid) == {} and COST.zero2_stage_s(_plan(1)) == {} and COST.zero2_stage_s(_plan(3)) == {}


def test_plan_json_writes_zero_only_when_set():
    assert "zero" not in TrainSettings().to_dict()
    d = TrainSettings(zero=2).to_dict()
    assert d["zero"] == 2 and TrainSettings.from_dict(d).zero == 2
    assert TrainSettings.from_dict({"global_batch": 8}).zero == 0  # old plans: no field = 0
    assert TrainSettings.from_dict({"zero": "3"}).zero == 3
    with pytest.raises(HexicoreError) as e:
        TrainSettings.from_dict({"zero": 4}, "p.json")
    assert e.value.field == "train.zero"


def _solve(overrides, iterations: bool = True):
    from hexicore.app.compose import config_from_overrides, solve
    from hexicore.registry import Registry

    complete = [] if any(o.startswith("solver=") and o != "solver=hexiscale" for o in overrides) else \
        ["solver.time_budget=null"]  # hexiscale's complete search: the comparisons hold whatever the load
    plan, _ = solve(config_from_overrides(overrides + ["solver.iterations=12"] * iterations + complete),
                    Registry.default())
    return plan


def test_auto_finds_a_faster_plan_with_more_data_parallelism_on_a_memory_tight_cluster():
    """tight16 (16 x 24 GB) with Llama-2 7B: unsharded, a pipeline needs 5+ cards (16 B/param),
    so two deep pipelines; ZeRO-2 fits four pipelines of four stages and is faster."""
    base = ["cluster=tight16", "model=llama2_7b", "train.global_batch=64"]
    z0 = _solve(base + ["train.zero=0"])
    auto = _solve(base + ["train.zero=auto"])
    assert all(len(p.stages) >= 5 for p in z0.pipelines)  # deep pipelines
    assert auto.train.zero in (1, 2, 3) and len(auto.pipelines) > len(z0.pipelines)
    assert auto.estimate.iteration_s < z0.estimate.iteration_s
    seen = auto.solver["zero_s"]  # per stage the best the one search found there (unsharded plans fit too)
    assert set(seen) == {"0", "1", "2", "3"} and seen["0"] is not None
    assert seen[str(auto.train.zero)] == pytest.approx(auto.estimate.iteration_s, rel=1e-6)
    assert min(v for v in seen.values() if v is not None) >= auto.estimate.iteration_s * (1 - 0.05)


def test_auto_on_tight8_is_never_slower_and_keeps_a_deep_pipeline():
    """tight8 (8 x 24 GB) with Llama-2 7B: the replicated head and full logits on every TP rank
    (as the runtime keeps them) leave no sharded layout with more pipelines that is faster; auto
    keeps the deep single pipeline of zero=0."""
    base = ["cluster=tight8", "model=llama2_7b", "train.global_batch=32"]
    z0 = _solve(base + ["train.zero=0"])
    auto = _solve(base + ["train.zero=auto"])
    assert len(z0.pipelines) == 1 and len(z0.pipelines[0].stages) >= 5
    assert auto.estimate.iteration_s <= z0.estimate.iteration_s + 1e-9


def test_auto_is_never_slower_than_zero_0_where_both_fit():
    base = ["cluster=hetero1", "model=llama2_7b", "train.global_batch=64", "solver.use_all_devices=true"]
    auto = _solve(base + ["train.zero=auto"])
    z0 = _solve(base + ["train.zero=0"])
    assert auto.estimate.iteration_s <= z0.estimate.iteration_s + 1e-9


def test_memory_breakdown_sums_to_the_estimate():
    plan = _plan(2)
    parts = COST.memory_parts(plan)
    est = COST.estimate(plan)
    for d, gb in est.memory_gb.items():
        assert sum(parts[d].values()) == pytest.approx(gb, abs=1e-3)
    assert set(parts["A.0"]) == {"weights", "gradients", "optimizer", "activations", "workspace"}
    assert AnalyticCostModel(state_bytes_per_param=8).state_bytes(TRAIN).total == 8


def test_uneven_shards_follow_device_memory_by_hand():
    # A.* have 40 GB, B.* 16 GB: under zero_split=memory A keeps 40/56 of each chunk, B 16/56
    plan = _plan(1)
    plan = Plan(plan.model, plan.cluster, TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=1,
                                                      zero_split="memory"), plan.pipelines)
    parts = COST.memory_parts(plan)
    first = 2 * LAYER_PARAMS + V * H
    assert parts["A.0"]["optimizer"] == pytest.approx(8 * first * 40 / 56 / GIB)
    assert parts["B.0"]["optimizer"] == pytest.approx(8 * first * 16 / 56 / GIB)
    assert parts["B.0"]["weights"] == pytest.approx(4 * first / GIB)  # ZeRO-1 keeps whole weights
    # the ring's pieces are uneven: B.0 receives A.0's larger piece (40/56 of each chunk)
    per_layer_b = 2 * (100e-6 + LAYER_PARAMS * 4 * 40 / 56 / 1e9)  # fp32 gradients: 4 B
    emb_b = 2 * (100e-6 + V * H * 4 * 40 / 56 / 1e9)
    assert COST.dp_stage_s(plan)[(1, 0)] == pytest.approx(2 * per_layer_b + emb_b)
    assert "zero_split" in plan.train.to_dict() and "zero_split" not in _plan(1).train.to_dict()


def test_the_torch_runtime_refuses_sharding_it_does_not_execute(tmp_path, capsys):
    from tests.conftest import run_cli

    plan = _plan(3)  # ZeRO-3 over pipelines of two stages cut differently
    plan = replace(plan, pipelines=(plan.pipelines[0], Pipeline(2, (Stage(("B.0",), 1, (0, 1)),
                                                                   Stage(("B.1",), 1, (1, 4))))))
    path = tmp_path / "z3.json"
    plan.save(str(path))
    assert run_cli(["train", f"plan_file={path}", "train.steps=1", f"out={tmp_path / 'run'}"]) == 2
    assert "does not execute" in capsys.readouterr().err
    assert run_cli(["evaluate", f"plan_file={path}"]) == 0  # evaluate warns, does not refuse
    out = capsys.readouterr()
    assert "does not execute" in out.err and "ZeRO-3 over 2 holders" in out.out
    hybrid = replace(plan, train=replace(plan.train, zero_scope="machine"))  # hybrid: the same refusal
    hybrid.save(str(path))
    assert run_cli(["train", f"plan_file={path}", "train.steps=1", f"out={tmp_path / 'run'}"]) == 2
    assert "does not execute ZeRO-3 for pipelines of more than one stage" in capsys.readouterr().err


def test_the_torch_runtime_accepts_uneven_shards_and_zero_3_on_one_stage_or_identical_pipelines():
    from hexicore_plugins.runtimes.torch.runtime import check_zero

    uneven = Plan(MODEL, CLUSTER, TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=2,
                                              zero_split="memory"), _plan(2).pipelines)
    check_zero(uneven.train, uneven.pipelines, None, "p.json")
    flat = Plan(MODEL, CLUSTER, TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=3),
                tuple(Pipeline(2, (Stage((d,), 1, (0, 4)),)) for d in ("A.0", "B.0")))
    check_zero(flat.train, flat.pipelines, None, "p.json")
    check_zero(_plan(3).train, _plan(3).pipelines, None, "p.json")  # two identical two-stage pipelines
    hybrid = Plan(MODEL, CLUSTER, TrainSettings(global_batch=6, micro_batch=1, seq_len=512, zero=3, zero_scope="machine"),
                  tuple(Pipeline(2, (Stage((d,), 1, (0, 4)),)) for d in ("A.0", "A.1", "B.0")))
    check_zero(hybrid.train, hybrid.pipelines, None, "p.json")  # hybrid ZeRO-3 (HSDP) on one-stage pipelines


def test_shard_bounds_even_and_by_memory_by_hand():
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.data.sync import shard_bounds

    assert shard_bounds(10, None, 3) == [(0, 4), (4, 7), (7, 10)]
    # 24 : 80 GB of 1000 elements: 24/104 * 1000 = 230.77 -> cut at 231
    assert shard_bounds(1000, [24.0, 80.0], 2) == [(0, 231), (231, 1000)]
    assert shard_bounds(5, [1.0, 0.0, 1.0], 3)[1] == (2, 2)  # a zero weight keeps nothing


#: TP degrees agree per layer (different batches, schedules): every chunk's holders are tp x n
#: ranks, so the cost model's ``params / tp / n`` is exactly what each rank keeps
SAME_TP = [(5, "1f1b", [(2, 3), (1, 5)]), (3, "gpipe", [(2, 3), (1, 5)])]


@pytest.mark.slow
def test_zero_1_and_2_train_like_one_process_and_keep_the_predicted_optimizer_bytes():
    """One 6-rank job: the one-process reference, then the asymmetric acceptance plan (tp2+tp1 |
    3 x tp1, uneven batches, different schedules) under ZeRO-1 and ZeRO-2, :data:`SAME_TP` under
    ZeRO-2 and under ZeRO-1 with shards by memory: losses and weights within 1e-5 of the
    reference; on :data:`SAME_TP` each rank's AdamW state (and under ZeRO-2 the gradients kept
    between micro-batches) equals the cost model's bytes for its device (up to one element per
    group from uneven division)."""
    import dataclasses

    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.data.sync import sync_plan
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions
    from tests.helpers import (CPU6_ACCEPTANCE as ACCEPTANCE, CPU6_SEQ as SEQ, _max_abs, _max_rel, layout_of,
                               plan_of, tiny, worker_spec)
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=6)
    acc = dataclasses.replace(layout_of(ACCEPTANCE), world=6)
    same = dataclasses.replace(layout_of(SAME_TP), world=6)
    specs = [worker_spec(x, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True, zero=z)
             for x, z in ((ref, 0), (acc, 1), (acc, 2), (same, 2))]
    uneven = _on_two_gpus(plan_of(SAME_TP), 1)  # pipeline 1 on 80 GB cards, shards by memory
    weights = AnalyticCostModel().shard_weights(uneven)
    specs.append(worker_spec(same, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True,
                             zero=1, shard_weights=tuple(weights[d] for d in uneven.devices)))
    results = launch(specs, 6)
    for got in results[1:]:
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
    plan = plan_of(SAME_TP)
    plan = Plan(plan.model, plan.cluster, TrainSettings(**{**plan.train.to_dict(), "zero": 2}), plan.pipelines)
    parts = AnalyticCostModel().memory_parts(plan)
    groups = sync_plan(same).members()
    measured = results[3]["metrics"]["optimizer_state_bytes"]
    assert len(measured) == 6
    for r, b in enumerate(measured):
        predicted = parts[f"M.{r}"]["optimizer"] * GIB
        slack = 8 * sum(1 for g in groups if r in g)  # even pieces differ by at most one element
        assert abs(b - predicted) <= slack, (r, b, predicted)
        unsharded = 2 * parts[f"M.{r}"]["weights"] * GIB  # 8 B of moments per 4 B of weights
        assert b <= unsharded / 2 + slack  # two holders per chunk: half of the moments
        kept = results[3]["metrics"]["state_bytes"][r]  # ZeRO-2 per micro-batch: half of the gradients
        assert abs(kept["gradients"] - parts[f"M.{r}"]["gradients"] * GIB) <= slack / 2, r
    acc_plan = plan_of(ACCEPTANCE)  # mixed TP: replicated tensors shared by all their holders' TP ranks
    acc_plan = Plan(acc_plan.model, acc_plan.cluster, TrainSettings(**{**acc_plan.train.to_dict(), "zero": 2}),
                    acc_plan.pipelines)
    acc_parts = AnalyticCostModel().memory_parts(acc_plan)
    acc_groups = sync_plan(acc).members()
    for r, kept in enumerate(results[2]["metrics"]["state_bytes"]):
        slack = 8 * sum(1 for g in acc_groups if r in g)
        assert abs(kept["optimizer"] - acc_parts[f"M.{r}"]["optimizer"] * GIB) <= slack, r
    parts = AnalyticCostModel().memory_parts(uneven)
    measured = results[4]["metrics"]["optimizer_state_bytes"]
    for r, b in enumerate(measured):
        slack = 8 * sum(1 for g in groups if r in g)
        assert abs(b - parts[uneven.devices[r]]["optimizer"] * GIB) <= slack, (r, b)
    for r in range(3):  # rank r (24 GB) and r + 3 (80 GB) hold the same chunks: 24 : 80 of each
        assert measured[r + 3] / measured[r] == pytest.approx(80 / 24, rel=1e-3)


def _on_two_gpus(plan: Plan, zero: int, split: str = "memory") -> Plan:
    """``plan`` with pipeline 0 on 24 GB cards (``M.*``) and pipeline 1 on 80 GB cards (``N.*``)."""
    d = plan.to_dict()
    d.pop("estimate", None)
    n = sum(len(s["devices"]) for s in d["pipelines"][1]["stages"])
    d["cluster"] = {**d["cluster"], "machines": [{"name": "M", "gpu": "rtx4090", "count": 6, "bandwidth_gbs": 32},
                                                 {"name": "N", "gpu": "a100-80g", "count": n, "bandwidth_gbs": 32}]}
    d["cluster"].pop("devices", None)
    k = 0
    for s in d["pipelines"][1]["stages"]:
        s["devices"] = [f"N.{k + i}" for i in range(len(s["devices"]))]
        k += len(s["devices"])
    d["train"].update({"zero": zero, "zero_split": split})
    return Plan.from_dict(d, "two-gpu plan")


#: ZeRO-3/2 per micro-batch (one stage per pipeline): different batches, schedules (1f1b | gpipe:
#: the gathers and gradient sums interleave differently) on an 80 GB and a 24 GB device
FLAT = [(5, "1f1b", "N.0"), (3, "gpipe", "M.0")]


def _flat_plan(zero: int, split: str) -> Plan:
    from tests.helpers import CPU6_CLUSTER as CPU6, CPU6_SEQ as SEQ, plan_of
    base = plan_of([(b, s, [(1, 8)]) for b, s, _ in FLAT]).to_dict()
    base["cluster"] = {**CPU6, "machines": [{"name": "M", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32},
                                            {"name": "N", "gpu": "a100-80g", "count": 1, "bandwidth_gbs": 32}]}
    base.pop("estimate", None)
    for p, (_, _, dev) in zip(base["pipelines"], FLAT):
        p["stages"][0]["devices"] = [dev]
    base["train"].update({"zero": zero, "zero_split": split, "seq_len": SEQ})
    return Plan.from_dict(base, "flat plan")


@pytest.mark.slow
def test_zero_3_and_2_per_micro_batch_train_like_one_process_and_keep_the_predicted_state():
    """One 3-rank job: the reference; :data:`FLAT` under ZeRO-3 (even and memory-proportional
    shards) and ZeRO-2 (memory), each rank's kept weights, gradients and AdamW state equal to the
    cost model's (within one element), and the peaks of ZeRO-3's gathered unit weights and of
    gradients not summed yet equal to its workspace terms (the largest unit, a block); ZeRO-3 with mixed TP (tp2 | tp1 with the I/W split)
    and activation recomputation."""
    import dataclasses

    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from hexicore.registry import Registry
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, layout_of, tiny, worker_spec
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=3)
    cases = [(3, "even"), (3, "memory"), (2, "memory")]
    plans = [_flat_plan(z, split) for z, split in cases]
    specs = [worker_spec(ref, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True)]
    for plan in plans:
        layout = plan_layout(plan, [p.schedule for p in plan.pipelines], registry=Registry.default(), seq_len=SEQ)
        weights = AnalyticCostModel().shard_weights(plan)
        specs.append(worker_spec(dataclasses.replace(layout, world=3), steps=3, seed=5, dtype="fp32", recompute=False,
                                 progress=False, return_state=True, zero=plan.train.zero_stage,
                                 shard_weights=None if weights is None else tuple(weights[d] for d in plan.devices)))
    mixed = layout_of([(4, "1f1b", [(2, 8)]), (4, "zb_h1", [(1, 8)])])
    specs.append(worker_spec(mixed, steps=3, seed=5, dtype="fp32", recompute=True, progress=False, return_state=True,
                             zero=3))
    results = launch(specs, 3)
    for got in results[1:]:
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
    for (zero, split), plan, got in zip(cases, plans, results[1:4]):
        parts = AnalyticCostModel().memory_parts(plan)
        kept = got["metrics"]["state_bytes"]
        assert got["metrics"]["optimizer_state_bytes"] == [k["optimizer"] for k in kept[:2]] + [0]
        for r, dev in enumerate(plan.devices):
            for part, size in (("weights", 4), ("gradients", 4), ("optimizer", 8)):
                assert abs(kept[r][part] - parts[dev][part] * GIB) <= size, (zero, split, r, part)
        full = 4 * m.total_params()
        if split == "memory":  # rank 0 is the 80 GB device: it keeps 80/104 of the gradients
            assert kept[0]["gradients"] > full / 2 > kept[1]["gradients"]
        assert (kept[0]["weights"] < full) == (zero == 3)
        z1 = AnalyticCostModel().memory_parts(_flat_plan(1, split))
        for r, dev in enumerate(plan.devices):  # one unit at a time, the largest a block: the cost model's workspace
            assert kept[r]["unsummed"] == 4 * m.layer_params() < full / 8  # gradient accumulated, not summed yet
            gathered = kept[r]["gathered"] if zero == 3 else 0
            assert gathered == (4 * m.layer_params() if zero == 3 else 0)
            assert gathered + kept[r]["unsummed"] == pytest.approx(
                (parts[dev]["workspace"] - z1[dev]["workspace"]) * GIB, abs=0.5)
    largest = [4 * largest_unit_params(m, m.layers, tp, first=True, last=True) for tp in (2, 2, 1)]
    for r, kept in enumerate(results[4]["metrics"]["state_bytes"]):  # tp2 | tp1, I/W split, recomputation
        assert kept["gathered"] == kept["unsummed"] == largest[r], r


@pytest.mark.slow
def test_an_fsdp_plan_trains_from_the_cli(tmp_path, capsys):
    """``hexicore plan solver=fsdp`` then ``hexicore train plan_file=``: a ZeRO-3 plan over a
    24 GB and an 80 GB card runs; the AdamW state each rank keeps is the cost model's."""
    import json

    pytest.importorskip("torch")
    from tests.conftest import run_cli

    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ninter: {bandwidth_gbs: 2, latency_us: 50}\nmachines:\n"
                       "  - {name: F, gpu: rtx4090, count: 1, bandwidth_gbs: 32, latency_us: 10}\n"
                       "  - {name: A, gpu: a100-80g, count: 1, bandwidth_gbs: 32, latency_us: 10}\n")
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    common = ["model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=6", "train.seq_len=32"]
    assert run_cli(["plan", "solver=fsdp", f"cluster_file={cluster}", *common, f"out={plan_path}"]) == 0
    plan = Plan.load(plan_path)
    assert plan.train.zero == 3 and [len(p.stages) for p in plan.pipelines] == [1, 1]
    assert [p.batch for p in plan.pipelines] != [3, 3]  # batch by speed: the pipelines differ
    capsys.readouterr()
    assert run_cli(["train", f"plan_file={plan_path}", "train.steps=2", "runtime.progress=false", f"out={out}",
                    f"hydra.run.dir={tmp_path / 'hydra'}"]) == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    parts = AnalyticCostModel().memory_parts(plan)
    for r, dev in enumerate(plan.devices):
        assert abs(metrics["optimizer_state_bytes"][r] - parts[dev]["optimizer"] * GIB) <= 8
        assert abs(metrics["state_bytes"][r]["weights"] - parts[dev]["weights"] * GIB) <= 4


@pytest.mark.parametrize("solver", ["megatron", "metis_like", "galvatron_like"])
def test_baselines_with_their_zero_1_option_fit_more_data_parallelism(solver):
    """``solver.zero=1`` (the originals' distributed optimizer): ZeRO-1 keeps ZeRO-0's traffic and
    only lowers memory, so the best fitting layout is never slower; on tight8 7B Megatron's and
    Galvatron's gain a second data-parallel group."""
    base = ["cluster=tight8", "model=llama2_7b", "train.global_batch=32", f"solver={solver}"]
    plain = _solve(base, False)
    z1 = _solve(base + ["solver.zero=1"], False)
    assert plain.train.zero == 0 and z1.train.zero == 1
    assert z1.estimate.iteration_s <= plain.estimate.iteration_s + 1e-9
    if solver != "metis_like":
        assert len(z1.pipelines) == 2 > len(plain.pipelines)


def test_a_bad_solver_zero_is_one_line():
    with pytest.raises(HexicoreError) as e:
        _solve(["cluster=tight8", "model=llama2_7b", "solver=megatron", "solver.zero=5"], False)
    assert e.value.field == "solver.zero"


def test_hybrid_sharding_by_hand():
    """``zero_scope=machine``: four one-stage replicas on A.0, A.1 | B.0, B.1 under ZeRO-3: each
    device keeps half of the sharded parts (two holders in its machine); per micro-batch 1.5 x
    the ring inside the slower machine (B: 5 GB/s, 20 us), at the step the sum of the halves
    between the machines (1 GB/s, 100 us) of P/2 parameters per tensor."""
    t = TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=3, zero_scope="machine")
    plan = Plan(MODEL, CLUSTER, t, tuple(Pipeline(1, (Stage((d,), 1, (0, 4)),)) for d in ("A.0", "A.1", "B.0", "B.1")))
    tensors = [LAYER_PARAMS] * 4 + [V * H, V * H + H]
    total = sum(tensors)
    parts = COST.memory_parts(plan)
    for d in ("A.0", "B.1"):
        assert parts[d]["optimizer"] == pytest.approx(8 * total / 2 / GIB)
        assert parts[d]["weights"] == pytest.approx(4 * total / 2 / GIB)
    inside_b = sum(2 * (20e-6 + p * 4 / (2 * 5e9)) for p in tensors)  # fp32 gradients: 4 B
    across = sum(2 * (100e-6 + p / 2 * 4 / (2 * 1e9)) for p in tensors)
    est = COST.estimate(plan)
    assert est.dp_s == pytest.approx(across)
    stage, _ = COST.pipeline_pieces(plan, plan.pipelines[2])
    plain, _ = COST.pipeline_pieces(replace(plan, train=TrainSettings(global_batch=4, micro_batch=1, seq_len=512)),
                                    plan.pipelines[2])
    assert stage[0] == pytest.approx(plain[0] + 1.5 * inside_b)
    assert "zero_scope" in t.to_dict() and TrainSettings.from_dict(t.to_dict()).zero_scope == "machine"
    # ZeRO-1 hybrid: the step pays the ring inside the machines and the halves across
    z1 = replace(plan, train=replace(t, zero=1))
    assert COST.estimate(z1).dp_s == pytest.approx(inside_b + across)
    # ZeRO-2 hybrid: the runtime sums gradients at the step, so they stay whole (as ZeRO-1's)
    z2 = COST.memory_parts(replace(plan, train=replace(t, zero=2)))["A.0"]
    assert z2["gradients"] == pytest.approx(4 * total / GIB) == COST.memory_parts(z1)["A.0"]["gradients"]
    assert z2["optimizer"] == pytest.approx(8 * total / 2 / GIB)


def test_fsdp_hybrid_option_shards_per_machine():
    plan = _solve(["cluster=homo_a800_16", "model=llama2_7b", "train.global_batch=64", "solver=fsdp",
                   "solver.hybrid=true"], False)
    full = _solve(["cluster=homo_a800_16", "model=llama2_7b", "train.global_batch=64", "solver=fsdp"], False)
    assert plan.train.zero == 3 and plan.train.zero_scope == "machine" and full.train.zero_scope == "all"
    # two machines of 8 behind 0.7 GB/s: gathering every micro-batch across them is far slower
    assert plan.estimate.iteration_s < full.estimate.iteration_s


def test_tp_replicated_tensors_are_whole_on_every_tp_rank_by_hand():
    """The runtime splits only the attention/MLP matrices across TP ranks; norms, the embedding and
    the head stay whole on each (and so do the logits, and the head's FLOPs)."""
    t = TrainSettings(global_batch=4, micro_batch=1, seq_len=512)
    parts = COST.stage_memory_parts(CLUSTER, MODEL, t, ["A.0", "A.1"], 4, first=True, last=True, in_flight=1)
    rep = 2 * H  # two RMSNorms per block
    mine = 4 * ((LAYER_PARAMS - rep) / 2 + rep) + V * H + (V * H + H)
    assert parts["weights"] == pytest.approx(4 * mine / GIB)
    assert parts["optimizer"] == pytest.approx(8 * mine / GIB)
    # ZeRO-1 over two such pipelines: every element is split among its 4 holders (2 TP x 2 DP)
    z1 = COST.stage_memory_parts(CLUSTER, MODEL, replace(t, zero=1), ["A.0", "A.1"], 4, first=True, last=True,
                                 in_flight=1, dp=2)
    total = 4 * LAYER_PARAMS + V * H + (V * H + H)
    assert z1["optimizer"] == pytest.approx(8 * total / 4 / GIB) and z1["weights"] == parts["weights"]
    # workspace: one block's saved tensors on a TP rank (fp32 residual stream and normed bf16 inputs
    # whole, q/k/v/out, the MLP's four, the log-sum-exp and the weights' casts / 2; rotary casts
    # whole) + the whole logits and their gradient (fp32) + reserve 0
    act = 512 * (16 * H + 2 * (2 * H + 2 * H + 2 * 4 * H) + 4 * (2 + 4)) + 2 * (4 * 512 * 128 + 8 * H * H)
    assert MODEL.ffn == 4 * H  # 3 H F = 12 H^2: the block's matrices 4 H^2 + 12 H^2 = 16 H^2, / 2 on a rank
    assert parts["workspace"] == pytest.approx((act + 2 * 512 * V * 4) / GIB)
    # the head's FLOPs run on every TP rank: they are divided by one GPU's FLOP/s, not two
    blocks = 4 * 512 * LAYER_FLOPS_TOKEN / (2 * 100e12 * 0.5)
    head = 4 * 512 * 2 * H * V / (100e12 * 0.5)
    assert COST.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1, last=True) == pytest.approx(blocks + head)


def test_kept_state_with_different_tp_degrees_by_hand():
    """Pipeline 0 on A.0+A.1 (tp 2), pipeline 1 on B.0 (tp 1), whole model each, ZeRO-1: a split
    matrix is cut in halves, each half shared by one A rank and B.0; a replicated tensor is
    shared by A.0, A.1 and B.0."""
    t = TrainSettings(global_batch=4, micro_batch=1, seq_len=512, zero=1)
    plan = Plan(MODEL, CLUSTER, t, (Pipeline(2, (Stage(("A.0", "A.1"), 2, (0, 4)),)),
                                    Pipeline(2, (Stage(("B.0",), 1, (0, 4)),))))
    split = 4 * (LAYER_PARAMS - 2 * H)
    rep = 4 * 2 * H + V * H + (V * H + H)
    parts = COST.memory_parts(plan)
    assert parts["A.1"]["optimizer"] == pytest.approx(8 * (split / 4 + rep / 3) / GIB)
    assert parts["B.0"]["optimizer"] == pytest.approx(8 * (split / 2 + rep / 3) / GIB)
    assert parts["B.0"]["weights"] == pytest.approx(4 * (split + rep) / GIB)
