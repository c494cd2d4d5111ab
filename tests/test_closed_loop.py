"""The closed loop, small: profile an emulated two-speed cluster, train two clearly different
plans, and hold the profiled predictions (``metrics.json`` ``predicted``, ``cost=profiled``)
against the measured steps. The full acceptance (nine plans, ten per cent, the order of all of
them, hexiscale vs megatron) is the benchmark ``bench/closed_loop.py`` (docs/results.md)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

CLUSTER = """name: emu2
gpus:
  fastgpu: {tflops: 50, memory_gb: 16}
  slowgpu: {tflops: 50, memory_gb: 16}
inter: {bandwidth_gbs: 1.0, latency_us: 50}
machines:
  - {name: F, gpu: fastgpu, count: 1, bandwidth_gbs: 10.0, emulate: {slowdown: 8}}
  - {name: S, gpu: slowgpu, count: 1, bandwidth_gbs: 10.0, emulate: {slowdown: 24}}
"""
MODEL = "name: small\nlayers: 4\nhidden: 192\nheads: 4\nkv_heads: 2\nffn: 512\nvocab: 256\nseq_len: 64\n"


@pytest.mark.slow
def test_profiled_predictions_hold_for_two_trained_plans(tmp_path, capsys, monkeypatch):
    """Both devices emulated (8x and 24x the host's time), so the two ranks leave the host idle
    most of the time as devices with their own compute would. The wiring is held, not the
    accuracy (the benchmark's): the profile, cost=profiled and metrics.json's predicted step
    within 50% of the measured one, and the order of two plans ~2x apart. A slowdown not seen,
    a stage or pipeline priced twice or not at all is off by more. On this 2-core host one
    profile's own noise (an emulated block's CPU time moves 10-40% between profiles, an action's
    fixed cost 0-50% of a block) put single runs 32% off at worst in nine runs: 25% flaked in CI."""
    from hexicore.core.cluster import Cluster
    from hexicore.core.model import ModelSpec
    from hexicore.core.plan import Pipeline, Plan, Stage, TrainConfig

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "m.yaml").write_text(MODEL)
    prof, hydra = tmp_path / "profile.yaml", f"hydra.run.dir={tmp_path / 'r'}"
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                    "train.dtype=fp32", "train.recompute=false", "profile.micro_batches=[1]", "profile.tp=[1]",
                    "profile.repeats=5", "profile.link_bytes=[4096,65536,1048576]", f"out={prof}", hydra])
    assert code == 0, capsys.readouterr().err
    cluster, model = Cluster.load(tmp_path / "c.yaml"), ModelSpec.load(tmp_path / "m.yaml")
    train = TrainConfig(global_batch=4, micro_batch=1, seq_len=64, dtype="fp32", recompute=False)
    # the slow device's blocks cost ~3 fast ones: ~15 vs ~39 fast blocks a step
    shapes = {"fast": [(("F.0",), 3), (("S.0",), 1)], "slow": [(("S.0",), 3), (("F.0",), 1)]}
    got = {}
    for name, stages in shapes.items():
        built, start = [], 0
        for devs, n in stages:
            built.append(Stage(devs, 1, (start, start + n)))
            start += n
        plan = Plan(model, cluster, train, (Pipeline(4, tuple(built), {"name": "1f1b"}),), solver={"name": "hand"})
        path = plan.save(tmp_path / f"{name}.json")
        code = run_cli(["train", f"plan_file={path}", "train.steps=4", "train.dtype=fp32", "train.recompute=false",
                        "runtime.progress=false", "cost=profiled", f"cost.profile_file={prof}",
                        f"out={tmp_path / name}", hydra])
        assert code == 0, capsys.readouterr().err
        m = json.loads((tmp_path / name / "metrics.json").read_text())
        got[name] = (m["predicted"]["step_s"], m["measured"]["step_s"])
    for name, (pred, meas) in got.items():
        assert abs(pred / meas - 1) <= 0.5, (name, got)
    assert got["fast"][0] < got["slow"][0] / 1.5 and got["fast"][1] < got["slow"][1], got
