"""``train.vocab_parallel`` priced by hand: a stage's TP ranks split the embedding and the head by
vocabulary rows, so their matrices, training state, casts and logits fall ``/ tp``, the head's
compute ``/ tp``, and the embedding, cross-entropy and head-gradient all-reduces are added."""

import dataclasses

import pytest

from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.cost import AnalyticCostModel
from tests.helpers import (HAND_CLUSTER as CLUSTER, HAND_COST as COST, HAND_H as H, HAND_MODEL as MODEL,
                           HAND_S as S, HAND_TRAIN as TRAIN, HAND_V as V, plan_of)

GIB = 2**30
ON = dataclasses.replace(TRAIN, vocab_parallel=True)
NO_RC = dataclasses.replace(ON, recompute=False)


def allreduce(n: int, nbytes: float, alpha: float = 10e-6, beta: float = 10e9) -> float:
    """A ring all-reduce among ``n`` devices of machine A by hand: ``2 (n - 1) (alpha + bytes / (n beta))``."""
    return 2 * (n - 1) * (alpha + nbytes / (n * beta))


def test_head_compute_falls_by_the_tp_degree():
    pair = ["A.0", "A.1"]
    blocks = COST.compute_s(CLUSTER, MODEL, ON, pair, 2)
    head_off = COST.compute_s(CLUSTER, MODEL, TRAIN, pair, 2, last=True) - blocks
    head_on = COST.compute_s(CLUSTER, MODEL, ON, pair, 2, last=True) - blocks
    assert head_off == pytest.approx(4 * S * 2 * H * V / (100e12 * 0.5))  # one member's FLOP/s: replicated
    assert head_on == pytest.approx(head_off / 2)
    # one device: nothing to split
    assert COST.compute_s(CLUSTER, MODEL, ON, ["A.0"], 2, last=True) == COST.compute_s(CLUSTER, MODEL, TRAIN, ["A.0"], 2,
                                                                                        last=True)


def test_the_added_all_reduces_by_hand():
    pair = ["A.0", "A.1"]
    embedding = allreduce(2, S * H * 4)  # the embedding's fp32 output, forward
    statistics = 3 * allreduce(2, S * 4)  # max, target logit, sum of exponentials: one fp32 per token each
    head_grad = allreduce(2, S * H * 2)  # the head input's bf16 gradient, backward
    assert COST.vocab_comm_s(CLUSTER, MODEL, ON, pair, first=True) == pytest.approx((embedding, 0.0))
    assert COST.vocab_comm_s(CLUSTER, MODEL, ON, pair, last=True) == pytest.approx((statistics, head_grad))
    assert COST.vocab_comm_s(CLUSTER, MODEL, TRAIN, pair, first=True, last=True) == (0.0, 0.0)
    assert COST.vocab_comm_s(CLUSTER, MODEL, ON, ["A.0"], first=True, last=True) == (0.0, 0.0)
    stage = COST.stage_s(CLUSTER, MODEL, ON, pair, 2, first=True, last=True)
    assert stage == pytest.approx(COST.compute_s(CLUSTER, MODEL, ON, pair, 2, last=True)
                                  + COST.tp_comm_s(CLUSTER, MODEL, ON, pair, 2) + embedding + statistics + head_grad)


def test_memory_of_the_ends_falls_by_the_tp_degree():
    """A two-way first+last stage without recomputation: the embedding and the head (untied) at
    ``V/2 x H`` each in the weights, gradients and optimizer; the head's bf16 cast ``/ 2``; the
    fp32 logits and their gradient ``2 x S x V/2 x 4``."""
    pair = ["A.0", "A.1"]
    off = COST.stage_memory_parts(CLUSTER, MODEL, dataclasses.replace(NO_RC, vocab_parallel=False), pair, 2,
                                  first=True, last=True)
    on = COST.stage_memory_parts(CLUSTER, MODEL, NO_RC, pair, 2, first=True, last=True)
    half = V * H / 2  # of each of the two matrices
    for part, per in (("weights", 4), ("gradients", 4), ("optimizer", 8)):
        assert (off[part] - on[part]) * GIB == pytest.approx(2 * half * per)
    assert (off["activations"] - on["activations"]) * GIB == pytest.approx(2 * half)  # the bf16 cast of the head
    assert (off["workspace"] - on["workspace"]) * GIB == pytest.approx(2 * S * (V / 2) * 4)
    # the state left: 2 blocks split, what TP replicates (norms) whole, both ends' halves
    rep = 2 * H
    mine = 2 * ((MODEL.layer_params() - rep) / 2 + rep) + half + (H + half)
    assert on["weights"] * GIB == pytest.approx(4 * mine)


def test_an_uneven_vocabulary_is_priced_at_its_largest_shard():
    odd = dataclasses.replace(MODEL, vocab=1001)
    parts = COST.stage_memory_parts(CLUSTER, odd, NO_RC, ["A.0", "A.1"], 0, first=True)
    assert parts["weights"] * GIB == pytest.approx(4 * 501 * H)  # rank 0 holds rows [0, 501)


def _plan(pipes, zero=0, vocab=True, tied=False) -> Plan:
    p = plan_of(pipes)
    m = dataclasses.replace(p.model, tied_embeddings=tied)
    return Plan(m, p.cluster, TrainSettings(**{**p.train.to_dict(), "zero": zero, "vocab_parallel": vocab}),
                p.pipelines)


def test_the_data_parallel_sync_of_the_ends_moves_each_rank_its_rows():
    """Two pipelines of a TP-2 and a one-device stage (the tiny model on machine M, 32 GB/s,
    10 us): replicated, the embedding is all-reduced among all four ranks of the two first stages
    (a ring of four moving ``V x H``); split by rows, each row half among the two ranks holding it
    (two rings of two moving ``V x H / 2``, side by side). One-device heads: nothing changes."""
    pipes = [(4, "1f1b", [(2, 4), (1, 4)])] * 2
    on, off = _plan(pipes), _plan(pipes, vocab=False)
    m = on.model
    beta, alpha, fp32 = 32e9, 10e-6, 4

    def ring(n, n_params):
        return allreduce(n, n_params * fp32, alpha, beta)

    blocks = sum(ring(2, (m.layer_params() - 2 * m.hidden) / 2) + ring(4, 2 * m.hidden) for _ in range(4))
    got_on, got_off = AnalyticCostModel().dp_stage_s(on), AnalyticCostModel().dp_stage_s(off)
    assert got_off[(0, 0)] == pytest.approx(blocks + ring(4, m.vocab * m.hidden))
    assert got_on[(0, 0)] == pytest.approx(blocks + ring(2, m.vocab * m.hidden / 2))
    assert got_on[(1, 1)] == got_off[(1, 1)] == pytest.approx(4 * ring(2, m.layer_params())
                                                               + ring(2, m.vocab * m.hidden + m.hidden))


def test_zero_shards_the_ends_rows_among_the_pipelines():
    """ZeRO-1 over two pipelines: a first stage keeps the optimizer state of ``1/2`` of its blocks'
    and its embedding's ``V/2`` rows (every element split among ``tp x dp = 4`` holders either
    way); a tied embedding's rows stay whole per rank, ``V/2 x H``."""
    pipes = [(4, "1f1b", [(2, 4), (1, 4)])] * 2
    m = _plan(pipes).model
    for tied in (False, True):
        parts = AnalyticCostModel().memory_parts(_plan(pipes, zero=1, tied=tied))
        if tied:
            want = 4 * m.layer_params() / 4 + m.vocab * m.hidden / 2
        else:
            want = (4 * m.layer_params() + m.vocab * m.hidden) / 4
        assert parts["M.0"]["optimizer"] * GIB == pytest.approx(8 * want), tied
        assert parts["M.0"]["weights"] * GIB == pytest.approx(
            4 * (4 * ((m.layer_params() - 2 * m.hidden) / 2 + 2 * m.hidden) + m.vocab * m.hidden / 2)), tied


def test_the_plan_json_records_the_setting_only_when_on():
    assert "vocab_parallel" not in TRAIN.to_dict()
    assert ON.to_dict()["vocab_parallel"] is True
    assert TrainSettings.from_dict(ON.to_dict()) == ON


@pytest.mark.parametrize("measured", [True, False])
def test_the_profiled_head_is_split_and_the_all_reduces_priced_on_the_measured_links(measured):
    """The profile's head (measured at TP 1: 0.012 s) is ``/ 2`` on a vocabulary-parallel TP-2 last
    stage, as App. A's is where the head was not profiled; the added all-reduces are App. A's on
    the profile's links, not the cluster file's."""
    from hexicore.core.profile import parse_profile
    from hexicore.cost.profiled import ProfiledCostModel
    from tests.helpers import SAMPLE_CLUSTER, SAMPLE_MODEL, sample_raw_profile

    doc = sample_raw_profile()
    if measured:
        doc["devices"]["rtx4090"]["head"] = {"micro_batch": 1, "seq_len": 32, "hidden": 64, "vocab": 256,
                                             "forward_s": 0.004, "backward_s": 0.008}
    cost = ProfiledCostModel(profile=parse_profile(doc, "p.yaml"))
    off = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp32")
    on = dataclasses.replace(off, vocab_parallel=True)
    pair = ["A.0", "A.1"]
    whole = cost.head_s(SAMPLE_CLUSTER, SAMPLE_MODEL, off, pair)
    assert whole == pytest.approx(0.012 if measured else whole)
    assert cost.head_s(SAMPLE_CLUSTER, SAMPLE_MODEL, on, pair) == pytest.approx(whole / 2)
    links = cost.measured(SAMPLE_CLUSTER)
    assert cost.vocab_comm_s(SAMPLE_CLUSTER, SAMPLE_MODEL, on, pair, last=True) != \
        AnalyticCostModel().vocab_comm_s(SAMPLE_CLUSTER, SAMPLE_MODEL, on, pair, last=True)
    assert cost.vocab_comm_s(SAMPLE_CLUSTER, SAMPLE_MODEL, on, pair, first=True, last=True) == pytest.approx(
        AnalyticCostModel().vocab_comm_s(links, SAMPLE_MODEL, on, pair, first=True, last=True))
