"""The ``profiled`` cost model (hexicore.cost.profiled) and the profile file
(hexicore.core.profile): measured block times and links replace catalog peaks and configured
links, interpolated in FLOPs; what the profile lacks falls back to App. A with a warning."""

from __future__ import annotations

import logging

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.plan import TrainConfig
from hexicore.core.profile import Profile, parse_profile
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.profiled import ProfiledCostModel, block_flops, interpolate, profiled_from_config
from tests.conftest import run_cli

CLUSTER = parse_cluster({"name": "two", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                         "machines": [{"name": "A", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32, "latency_us": 10},
                                      {"name": "B", "gpu": "rtx3090", "count": 2, "bandwidth_gbs": 16,
                                       "latency_us": 10}]}, "test")
MODEL = ModelSpec("m", 4, 64, 4, 4, 176, 256, 32)
SHAPE = {"hidden": 64, "ffn": 176, "heads": 4, "kv_heads": 4}


def profile(**extra) -> Profile:
    return parse_profile({
        "format": "hexicore.profile/1",
        "devices": {"rtx4090": {"blocks": [
            {"micro_batch": 1, "tp": 1, "seq_len": 32, **SHAPE, "forward_s": 0.010, "backward_s": 0.020,
             "recompute_s": 0.010},
            {"micro_batch": 4, "tp": 1, "seq_len": 32, **SHAPE, "forward_s": 0.025, "backward_s": 0.050,
             "recompute_s": 0.025},
            {"micro_batch": 1, "tp": 2, "seq_len": 32, **SHAPE, "forward_s": 0.008, "backward_s": 0.016}]}},
        "links": [{"between": ["A", "B"], "latency_s": 1e-4, "bandwidth_gbs": 0.5},
                  {"between": ["A", "A"], "latency_s": 2e-5, "bandwidth_gbs": 20.0}],
        **extra}, "p.yaml")


def test_interpolation_is_affine_inside_and_proportional_outside():
    pts = [(10.0, 1.0), (40.0, 2.5)]
    assert interpolate(pts, 20.0) == pytest.approx(1.5)
    assert interpolate(pts, 80.0) == pytest.approx(5.0)
    assert interpolate(pts, 5.0) == pytest.approx(0.5)
    assert interpolate([(10.0, 1.0)], 30.0) == pytest.approx(3.0)


def test_block_time_measured_and_interpolated():
    cost = ProfiledCostModel(profile=profile())
    t1 = TrainConfig(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    assert cost.compute_s(CLUSTER, MODEL, t1, ["A.0"], 3) == pytest.approx(3 * 0.030)
    t2 = TrainConfig(global_batch=8, micro_batch=2, seq_len=32, recompute=True)
    # micro-batch 2 lies a third of the way (in FLOPs) from 1 to 4: 0.040 + (0.100 - 0.040) / 3
    assert cost.compute_s(CLUSTER, MODEL, t2, ["A.0"], 1) == pytest.approx(0.060)
    assert cost.tp_comm_s(CLUSTER, MODEL, t1, ["A.0", "A.1"], 2) == 0.0  # measured at TP 2: inside
    assert cost.compute_s(CLUSTER, MODEL, t1, ["A.0", "A.1"], 2) == pytest.approx(2 * 0.024)


def test_links_are_the_measured_ones():
    cost = ProfiledCostModel(profile=profile())
    m = cost.measured(CLUSTER)
    assert m.beta("A.0", "B.0") == pytest.approx(0.5e9) and m.alpha("A.0", "B.0") == pytest.approx(1e-4)
    assert m.beta("A.0", "A.1") == pytest.approx(20e9) and m.beta("B.0", "B.1") == CLUSTER.beta("B.0", "B.1")
    t = TrainConfig(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    msg = 1 * 32 * 64 * t.dtype_bytes
    assert cost.hop_s(CLUSTER, MODEL, t, ["A.0"], ["B.0"]) == pytest.approx(2 * (1e-4 + msg / 0.5e9))


def test_missing_pieces_fall_back_with_a_warning(caplog):
    cost = ProfiledCostModel(profile=profile())
    ana = AnalyticCostModel()
    t = TrainConfig(global_batch=8, micro_batch=1, seq_len=32)
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = cost.compute_s(CLUSTER, MODEL, t, ["B.0"], 2)
        cost.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1", "B.0", "B.1"][:2], 2)
        cost.compute_s(CLUSTER, MODEL, TrainConfig(8, 1, 32), ["A.0"], 2)
    assert got == ana.compute_s(CLUSTER, MODEL, t, ["B.0"], 2)
    assert any("rtx3090 was not profiled" in r.message for r in caplog.records)


def test_tp_not_measured_scales_by_flops_per_device():
    p = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [
        {"micro_batch": 1, "tp": 1, "seq_len": 32, "forward_s": 0.01, "backward_s": 0.02}]}}}, "p")
    cost = ProfiledCostModel(profile=p)
    t = TrainConfig(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    assert cost.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1) == pytest.approx(0.015)
    assert cost.tp_comm_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1) > 0  # priced on the measured link


def test_profile_round_trip_and_errors(tmp_path):
    p = profile()
    path = p.save(tmp_path / "profile.yaml")
    assert Profile.load(path) == p
    assert block_flops(p.devices["rtx4090"].blocks[0], MODEL) == pytest.approx(MODEL.layer_flops_per_token(32) * 32)
    with pytest.raises(HexicoreError) as exc:
        parse_profile({"format": "hexicore.profile/1", "devices": {"x": {"blocks": [{"tp": 1}]}}}, "bad.yaml")
    assert exc.value.field == "devices.x.blocks[0].micro_batch"
    with pytest.raises(HexicoreError, match="cost.profile_file"):
        profiled_from_config({})


def test_plan_with_the_profiled_cost_model(tmp_path, capsys):
    path = profile().save(tmp_path / "profile.yaml")
    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\nmachines:\n"
                       "  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}\n"
                       "  - {name: B, gpu: rtx3090, count: 2, bandwidth_gbs: 16, latency_us: 10}\n")
    code = run_cli(["plan", f"cluster_file={cluster}", "model=tiny", "cost=profiled", f"cost.profile_file={path}",
                    "train.global_batch=8", f"out={tmp_path / 'plan.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    code = run_cli(["evaluate", f"plan_file={tmp_path / 'plan.json'}", "cost=profiled", f"cost.profile_file={path}",
                    f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
