"""Activation memory from a profile's measured bytes (hexicore.cost.measured_block,
ProfiledCostModel.stage_memory_parts): the measured bytes replace the analytic formula's where
they apply, interpolated in tokens; elsewhere the formula stays, with a note. The last test
checks the model against the one GPU run on record (docs/results.md, "GPU figures")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.model import ModelSpec
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import Profile, parse_profile
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.base import GIB
from hexicore.cost.block_memory import block_bytes, weight_cast_bytes
from hexicore.cost.measured_block import tokens_bytes
from hexicore.cost.profiled import ProfiledCostModel

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = parse_cluster({"name": "one", "machines": [{"name": "A", "gpu": "rtx4090", "count": 2,
                                                      "bandwidth_gbs": 32, "latency_us": 10}]}, "test")
MODEL = ModelSpec("m", 4, 64, 4, 4, 176, 256, 32)
SHAPE = {"hidden": 64, "ffn": 176, "heads": 4, "kv_heads": 4}


def profile(dtype: str = "bf16", **shape) -> Profile:
    blocks = [{"micro_batch": mb, "tp": 1, "seq_len": 32, **{**SHAPE, **shape}, "forward_s": 0.01 * mb,
               "backward_s": 0.02 * mb, "activation_bytes": act} for mb, act in ((1, 3.0e6), (2, 5.0e6))]
    return parse_profile({"format": "hexicore.profile/1", "environment": {"dtype": dtype},
                          "devices": {"rtx4090": {"blocks": blocks}}}, "p.yaml")


def test_tokens_bytes_affine_through_the_nearest_two_proportional_with_one():
    pts = [(4096.0, 1.374e9), (8192.0, 2.272e9)]
    assert tokens_bytes(pts, 4096.0) == pytest.approx(1.374e9)
    assert tokens_bytes(pts, 6144.0) == pytest.approx(1.823e9)
    assert tokens_bytes(pts, 16384.0) == pytest.approx(2.272e9 + 2 * 0.898e9)  # the fixed part stays fixed
    assert tokens_bytes(pts, 2048.0) == pytest.approx(1.374e9 - 0.449e9)
    assert tokens_bytes([(100.0, 50.0)], 300.0) == pytest.approx(150.0)
    assert tokens_bytes([(100.0, 50.0), (200.0, 40.0)], 300.0) == pytest.approx(40.0 * 3 / 2)  # shrinking: proportional
    three = [(10.0, 10.0), (20.0, 30.0), (40.0, 50.0)]
    assert tokens_bytes(three, 30.0) == pytest.approx(40.0)  # bracketed by 20 and 40, not 10 and 20


def test_measured_bytes_replace_the_formula_per_in_flight_micro_batch():
    cost = ProfiledCostModel(profile=profile())
    t = TrainSettings(global_batch=8, micro_batch=2, seq_len=32, recompute=False, dtype="bf16")
    parts = cost.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 3, in_flight=2)
    casts = weight_cast_bytes(MODEL, 1, 2)  # measured with each forward's casts; the runtime holds them once
    assert parts["activations"] == pytest.approx((2 * 3 * (5.0e6 - casts) + 3 * casts) / GIB)
    ana = AnalyticCostModel().stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 3, in_flight=2)
    assert {k: v for k, v in parts.items() if k != "activations"} == pytest.approx(
        {k: v for k, v in ana.items() if k != "activations"})
    t3 = TrainSettings(global_batch=9, micro_batch=3, seq_len=32, recompute=False, dtype="bf16")  # 7e6: affine
    assert cost.stage_memory_parts(CLUSTER, MODEL, t3, ["A.0"], 1)["activations"] == pytest.approx(7.0e6 / GIB)


def test_recomputation_keeps_block_inputs_and_recomputes_one_measured_block():
    cost, ana = ProfiledCostModel(profile=profile()), AnalyticCostModel()
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=True, dtype="bf16")
    got = cost.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2)
    want = ana.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2)
    full = block_bytes(MODEL, 1, 32, 1, 2)  # the analytic workspace: the runtime's count of one block
    assert got["activations"] == pytest.approx(want["activations"])
    assert got["workspace"] == pytest.approx(want["workspace"] + (3.0e6 - full) / GIB)


def test_a_tp_degree_not_profiled_scales_as_the_formula_does(caplog):
    cost = ProfiledCostModel(profile=profile())
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="bf16")
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = cost.stage_memory_parts(CLUSTER, MODEL, t, ["A.0", "A.1"], 2)["activations"]
    f1, f2 = (block_bytes(MODEL, 1, 32, k, 2) for k in (1, 2))
    assert got == pytest.approx(2 * 3.0e6 * f2 / f1 / GIB)
    assert any("TP degree 2" in r.getMessage() and "scaled from TP 1" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case, why", [("dtype", "measured in fp32"), ("shape", "another block shape")])
def test_what_does_not_apply_is_the_formula_with_a_note(case, why, caplog):
    cost = ProfiledCostModel(profile=profile(dtype="fp32" if case == "dtype" else "bf16",
                                             **({"ffn": 352} if case == "shape" else {})))
    devices = ["A.0"]
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="bf16")
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = cost.stage_memory_parts(CLUSTER, MODEL, t, devices, 2)
    assert got == pytest.approx(AnalyticCostModel().stage_memory_parts(CLUSTER, MODEL, t, devices, 2))
    assert any(why in r.getMessage() and "activation" in r.getMessage() for r in caplog.records)


def test_the_recorded_h200_run_is_predicted_within_five_percent(tmp_path):
    """The H200 profile and run of docs/results.md: a 4-block Llama-2-7B-shaped model, bf16,
    global batch 4 of micro-batch 1 on one GPU, measured peak 22.90 GiB (allocator); the
    paper's activation formula predicted 19.07 GiB (-16.7%), the analytic model's count of the
    runtime's saved tensors gives 21.57 (-5.8%: CUDA's attention kernel and allocator keep more)."""
    from hexicore.app.api import load_plan
    from hexicore.core.prediction import predictions

    plan = load_plan(ROOT / "tests" / "data" / "h200_llama2_7b_4l_plan.json")
    prof = Profile.load(str(ROOT / "docs" / "profiles" / "h200-llama2_7b-2026-12-04.yaml"))
    got = predictions(ProfiledCostModel(profile=prof).estimate(plan), plan.devices)
    assert got["peak_memory_gb"][0] == pytest.approx(22.90, rel=0.05)
    assert got["step_s"] == pytest.approx(0.2644, rel=0.05)
    analytic = predictions(AnalyticCostModel().estimate(plan), plan.devices)["peak_memory_gb"][0]
    assert analytic == pytest.approx(22.90, rel=0.1) and analytic < got["peak_memory_gb"][0]


def test_bytes_below_the_block_input_are_no_reading(caplog):
    prof = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [
        {"micro_batch": 1, "tp": 1, "seq_len": 32, **SHAPE, "forward_s": 0.01, "backward_s": 0.02,
         "activation_bytes": 1e-300}]}}}, "p.yaml")
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="bf16")
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = ProfiledCostModel(profile=prof).stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2)
    assert got == pytest.approx(AnalyticCostModel().stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 2))
    assert any("below the block's own input" in r.getMessage() for r in caplog.records)


def test_an_unmeasured_gpu_type_takes_the_measured_ones_bytes(caplog):
    two = parse_cluster({"name": "two", "inter": {"bandwidth_gbs": 1.0}, "machines": [
        {"name": "A", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32},
        {"name": "B", "gpu": "rtx3090", "count": 1, "bandwidth_gbs": 32}]}, "test")
    measured = [{"micro_batch": mb, "tp": 1, "seq_len": 32, **SHAPE, "forward_s": 0.01 * mb, "backward_s": 0.02 * mb,
                 "activation_bytes": act} for mb, act in ((1, 3.0e6), (2, 5.0e6))]
    blocks = [{"micro_batch": 1, "tp": 1, "seq_len": 32, **SHAPE, "forward_s": 0.02, "backward_s": 0.04}]
    prof = parse_profile({"format": "hexicore.profile/1", "environment": {"dtype": "bf16"},
                          "devices": {"rtx4090": {"blocks": measured}, "rtx3090": {"blocks": blocks}}}, "p.yaml")
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp16")  # 2 B like bf16
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = ProfiledCostModel(profile=prof).stage_memory_parts(two, MODEL, t, ["B.0"], 2)["activations"]
    assert got == pytest.approx(2 * 3.0e6 / GIB)
    assert any("rtx3090" in r.getMessage() and "largest other profiled" in r.getMessage() for r in caplog.records)


def test_the_console_prints_each_warning_once():
    from hexicore.app.console_log import Once

    once = Once()
    rec = [logging.LogRecord("hexicore", logging.WARNING, "f", 1, "same %s", ("thing",), None) for _ in range(2)]
    other = logging.LogRecord("hexicore", logging.WARNING, "f", 1, "other", (), None)
    assert [once.filter(r) for r in (*rec, other)] == [True, False, True]


def test_a_last_stage_keeps_the_head_projections_cast_as_the_analytic_model_prices_it():
    """The measured block bytes replace the formula's blocks only: the head's cast under
    autocast (``V x H x 2 B``, once where the runtime casts once per step) stays on a last stage."""
    cost = ProfiledCostModel(profile=profile())
    t = TrainSettings(global_batch=8, micro_batch=2, seq_len=32, recompute=False, dtype="bf16")
    def held(model, last):
        return model.stage_memory_parts(CLUSTER, MODEL, t, ["A.0"], 3, in_flight=2, last=last)["activations"] * GIB
    head = 2 * MODEL.vocab * MODEL.hidden
    assert held(cost, True) - held(cost, False) == pytest.approx(head)
    ana = AnalyticCostModel()
    assert held(ana, True) - held(ana, False) == pytest.approx(head)
