"""The analytic cost model against values computed by hand from HexiScale App. A."""

import math
from dataclasses import replace

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.cost import AnalyticCostModel
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.settings import TrainSettings
from tests.helpers import (HAND_CLUSTER as CLUSTER, HAND_MODEL as MODEL, HAND_TRAIN as TRAIN, HAND_COST as COST,
                           HAND_H as H, HAND_S as S, HAND_F as F, HAND_V as V, HAND_B as B,
                           HAND_LAYER_PARAMS as LAYER_PARAMS, HAND_LAYER_FLOPS_TOKEN as LAYER_FLOPS_TOKEN)


def test_compute_time_by_hand():
    # 2 layers on one fast GPU, recompute: 4 x forward FLOPs / (100e12 * 0.5)
    expect = 4 * S * B * 2 * LAYER_FLOPS_TOKEN / (100e12 * 0.5)
    assert COST.compute_s(CLUSTER, MODEL, TRAIN, ["A.0"], 2) == pytest.approx(expect)
    # last stage adds the head (2*H*V per token)
    expect_last = 4 * S * B * (2 * LAYER_FLOPS_TOKEN + 2 * H * V) / (100e12 * 0.5)
    assert COST.compute_s(CLUSTER, MODEL, TRAIN, ["A.0"], 2, last=True) == pytest.approx(expect_last)
    # TP over a fast and a slow GPU runs at 2 x the slow one
    assert COST.compute_s(CLUSTER, MODEL, TRAIN, ["A.0", "B.0"], 2) == pytest.approx(
        4 * S * B * 2 * LAYER_FLOPS_TOKEN / (2 * 50e12 * 0.5))


def test_tp_comm_by_hand():
    # 12 * max_d sum_{d'} (alpha + B*S*H*2 / (|d| * beta)) per layer
    msg = B * S * H * 2
    inside = 12 * (10e-6 + msg / (2 * 10e9))
    across = 12 * (100e-6 + msg / (2 * 1e9))
    assert COST.tp_comm_s(CLUSTER, MODEL, TRAIN, ["A.0", "A.1"], 1) == pytest.approx(inside)
    assert COST.tp_comm_s(CLUSTER, MODEL, TRAIN, ["A.0", "B.1"], 3) == pytest.approx(3 * across)
    assert COST.tp_comm_s(CLUSTER, MODEL, TRAIN, ["A.0"], 3) == 0.0
    no_rc = TrainSettings(4, 1, 512, "bf16", recompute=False)
    assert COST.tp_comm_s(CLUSTER, MODEL, no_rc, ["A.0", "A.1"], 1) == pytest.approx(inside * 8 / 12)


def test_hop_by_hand():
    msg = B * S * H * 2
    # A.1 -> {B.0, B.1}: leader send over the 1 GB/s link both ways, the activation broadcast
    # inside B; the gradient comes back to one device: no broadcast
    expect = 2 * (100e-6 + msg / 1e9) + (20e-6 + msg / 5e9)
    assert COST.hop_s(CLUSTER, MODEL, TRAIN, ["A.1"], ["B.0", "B.1"]) == pytest.approx(expect)
    # {B.0, B.1} -> A.1: the gradient is broadcast inside B, the activation is not
    assert COST.hop_s(CLUSTER, MODEL, TRAIN, ["B.0", "B.1"], ["A.1"]) == pytest.approx(expect)
    # {A.0, A.1} -> {B.0, B.1}: a broadcast each way, the activation's inside B, the gradient's inside A
    both = 2 * (100e-6 + msg / 1e9) + (20e-6 + msg / 5e9) + (10e-6 + msg / 10e9)
    assert COST.hop_s(CLUSTER, MODEL, TRAIN, ["A.0", "A.1"], ["B.0", "B.1"]) == pytest.approx(both)
    # into a single GPU: no broadcast
    assert COST.hop_s(CLUSTER, MODEL, TRAIN, ["A.0"], ["A.1"]) == pytest.approx(2 * (10e-6 + msg / 10e9))


def test_a_hop_between_overlapping_groups_leaves_other_hops_alone():
    """A solver's tables may price a hop into a group that shares a device with the sender (no
    room left on the machine): the leader pair is that one device, no send. Before, its value was
    remembered for every hop between the two machines with as many receivers, so a real plan's
    hop priced after it lost its send (a CP-SAT plan's estimate then differed from evaluate's)."""
    def three():
        return parse_cluster({"name": "c", "inter": {"bandwidth_gbs": 1.0, "latency_us": 100},
                              "machines": [{"name": "C", "gpu": "fast", "count": 3, "bandwidth_gbs": 10,
                                            "latency_us": 10}],
                              "gpus": {"fast": {"tflops": 100, "memory_gb": 40}}}, "c")
    msg = B * S * H * 2
    one = 10e-6 + msg / 10e9
    cl = three()
    assert COST.hop_s(cl, MODEL, TRAIN, ["C.0", "C.1"], ["C.2", "C.0"]) == pytest.approx(2 * one)  # broadcast only
    assert COST.hop_s(cl, MODEL, TRAIN, ["C.0"], ["C.1", "C.2"]) == pytest.approx(3 * one)  # one broadcast
    assert COST.hop_s(cl, MODEL, TRAIN, ["C.0"], ["C.1", "C.2"]) == COST.hop_s(three(), MODEL, TRAIN, ["C.0"], ["C.1", "C.2"])


def test_pipeline_formula():
    # sum_j (S_j + H_j) + (n_mb - 1) * max_j (S_j + H_j)
    assert COST.pipeline_s([1.0, 2.0, 1.5], [0.1, 0.2], 5) == pytest.approx((1.1 + 2.2 + 1.5) + 4 * 2.2)


def test_dp_layer_by_hand_matches_paper_formula_without_tp():
    # two pipelines, tp=1 each, layer held by A.0 and B.0 over the 1 GB/s link:
    # 2 * (alpha + P*2 / (2 * beta))
    t = COST.dp_layer_s(CLUSTER, [Stage(("A.0",), 1, (0, 4)), Stage(("B.0",), 1, (0, 4))], LAYER_PARAMS, 2)
    assert t == pytest.approx(2 * (100e-6 + LAYER_PARAMS * 2 / (2 * 1e9)))


def test_dp_layer_chunks_for_different_tp():
    # pipeline 1 tp=2 on A, pipeline 2 tp=1 on B.0: two chunks of P/2, B.0 all-reduces both with
    # one A device each; the worst device is B.0: 2 * 2 * (alpha + (P*2/2) / (2 * beta))
    t = COST.dp_layer_s(CLUSTER, [Stage(("A.0", "A.1"), 2, (0, 4)), Stage(("B.0",), 1, (0, 4))], LAYER_PARAMS, 2)
    assert t == pytest.approx(2 * 2 * (100e-6 + (LAYER_PARAMS * 2 / 2) / (2 * 1e9)))


def test_dp_under_tp_syncs_replicated_tensors_among_every_tp_rank():
    # two one-stage pipelines, TP-2 on A and TP-2 on B: the TP-split part of a block in chunks of
    # P/2 (each A device with one B device over the 1 GB/s link), while norms, embedding and
    # head (every TP rank keeps them whole) are all-reduced among all four ranks, whole:
    # 2 * max_d sum_{d' != d} (alpha + P_rep*2 / (4 * beta_dd'))
    plan = Plan(MODEL, CLUSTER, TRAIN, (Pipeline(2, (Stage(("A.0", "A.1"), 2, (0, 4)),)),
                                        Pipeline(2, (Stage(("B.0", "B.1"), 2, (0, 4)),))))
    rep = 2 * H  # the llama block's two RMSNorm weights
    split = 2 * (100e-6 + (LAYER_PARAMS - rep) * 4 / 2 / (2 * 1e9))  # fp32 gradients: 4 B

    def ring(n_params):  # worst rank (A or B): its TP peer inside its machine + two across
        return max(2 * ((lat + n_params * 4 / (4 * bw)) + 2 * (100e-6 + n_params * 4 / (4 * 1e9)))
                   for bw, lat in ((10e9, 10e-6), (5e9, 20e-6)))

    expect = 4 * (split + ring(rep)) + ring(V * H) + ring(V * H + H)
    assert COST.dp_s(plan) == pytest.approx(expect)


def test_single_pipeline_has_no_dp_cost():
    plan = Plan(MODEL, CLUSTER, TRAIN, (Pipeline(4, (Stage(("A.0", "A.1"), 2, (0, 4)),)),))
    assert COST.dp_s(plan) == 0.0


def test_memory_by_hand():
    # first stage, 2 layers, tp=1, 3 micro-batches in flight, recompute:
    # state 16 bytes/param (the runtime's recipe: fp32 weights 4 + fp32 gradients 4 + two fp32
    # Adam moments 8) x (2 layers + embedding) + 3 x 2 x B*S*H*4 (the kept block inputs are the
    # residual stream, in the fp32 weights' dtype under autocast) + the saved tensors of the block
    # being recomputed (the runtime's Llama block, hexicore/cost/block_memory.py): per token fp32
    # x, x*rstd, h1, h1*rstd (16 H), bf16 normed inputs, q, k, v, attention out, gate, up,
    # silu(gate), their product (2 x (2 H + 4 H + 4 F)), two rstd and 8 heads' log-sum-exp (4 x 10);
    # per forward the bf16 casts of the rotary tables (4 x S x 128) and of the block's matrices
    state = 16 * (2 * LAYER_PARAMS + V * H)
    act = 3 * 2 * B * S * H * 4
    work = S * B * (16 * H + 2 * (6 * H + 4 * F) + 40) + 2 * (4 * S * 128 + 4 * H * H + 3 * H * F)
    gb = COST.stage_memory_gb(CLUSTER, MODEL, TRAIN, ["A.0"], 2, first=True, in_flight=3)
    assert gb == pytest.approx((state + act + work) / 2**30)
    # the paper's 8 bytes of state a parameter (bf16 weights): the kept block inputs in bf16 too
    paper = AnalyticCostModel(default_efficiency=0.5, reserve_gb=0.0, state_bytes_per_param=8)
    gb = paper.stage_memory_gb(CLUSTER, MODEL, TRAIN, ["A.0"], 2, first=True, in_flight=3)
    work = S * B * (8 * H + 2 * (6 * H + 4 * F) + 40) + 2 * 4 * S * 128  # 16-bit residual stream, no weight casts
    assert gb == pytest.approx((state / 2 + act / 2 + work) / 2**30)


def test_estimate_iteration_and_mfu_by_hand():
    """App. A: the sync after the slowest pipeline (``dp_overlap=false``)."""
    plan = Plan(MODEL, CLUSTER, replace(TRAIN, dp_overlap=False), (
        Pipeline(2, (Stage(("A.0",), 1, (0, 2)), Stage(("A.1",), 1, (2, 4)))),
        Pipeline(2, (Stage(("B.0",), 1, (0, 2)), Stage(("B.1",), 1, (2, 4)))),
    ))
    est = COST.estimate(plan)
    s_a = [COST.stage_s(CLUSTER, MODEL, TRAIN, ["A.0"], 2), COST.stage_s(CLUSTER, MODEL, TRAIN, ["A.1"], 2, last=True)]
    s_b = [COST.stage_s(CLUSTER, MODEL, TRAIN, ["B.0"], 2), COST.stage_s(CLUSTER, MODEL, TRAIN, ["B.1"], 2, last=True)]
    h_a = COST.hop_s(CLUSTER, MODEL, TRAIN, ["A.0"], ["A.1"])
    h_b = COST.hop_s(CLUSTER, MODEL, TRAIN, ["B.0"], ["B.1"])
    p_a = (s_a[0] + h_a + s_a[1]) + 1 * max(s_a[0] + h_a, s_a[1])
    p_b = (s_b[0] + h_b + s_b[1]) + 1 * max(s_b[0] + h_b, s_b[1])
    assert est.pipeline_s == pytest.approx((p_a, p_b))
    # DP: each stage holds 2 layers synced A.i <-> B.i over 1 GB/s, plus embedding / head; the
    # gradients travel in fp32 (4 B, the runtime's recipe) although the run is bf16
    per_layer = 2 * (100e-6 + LAYER_PARAMS * 4 / (2e9))
    emb = 2 * (100e-6 + V * H * 4 / 2e9)
    head = 2 * (100e-6 + (H + V * H) * 4 / 2e9)
    assert est.dp_s == pytest.approx(2 * per_layer + max(emb, head))
    assert est.iteration_s == pytest.approx(max(p_a, p_b) + est.dp_s)
    flops = 3 * 4 * S * (4 * LAYER_FLOPS_TOKEN + 2 * H * V)
    assert est.mfu == pytest.approx(flops / (est.iteration_s * 300e12))
    assert est.fits and math.isclose(est.tokens_per_s, 4 * S / est.iteration_s)
