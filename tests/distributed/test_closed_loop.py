"""The closed loop, small: profile an emulated two-speed cluster (devices of a fixed speed,
``emulate: {tflops: X}``), train two clearly different plans, and hold the profiled predictions
(``metrics.json`` ``predicted``, ``cost=profiled``) against the measured steps. The full acceptance (nine plans, ten per cent, the order of all of
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
  - {name: F, gpu: fastgpu, count: 1, bandwidth_gbs: 10.0, emulate: {tflops: 0.003}}
  - {name: S, gpu: slowgpu, count: 1, bandwidth_gbs: 10.0, emulate: {tflops: 0.001}}
"""
MODEL = "name: small\nlayers: 4\nhidden: 192\nheads: 4\nkv_heads: 2\nffn: 512\nvocab: 256\nseq_len: 64\n"


@pytest.mark.slow
def test_profiled_predictions_hold_for_two_trained_plans(tmp_path, capsys, monkeypatch):
    """Both devices emulated at a fixed speed (3 and 1 GFLOP/s, some 20-70x below what a core of
    this host computes), so the two ranks leave the host idle most of the time, as devices with
    their own compute would, and the host's load does not move their time: the profile measures a
    block at its FLOPs over the rate, and metrics.json's predicted step is within 20% of the
    measured one (the benchmark's runs: within 5%; Python between actions and the messages run
    at the host's speed, which a loaded CI host slows). A rate not seen, a stage or pipeline
    priced twice or not at all is off by more; the order of two plans ~2x apart holds."""
    from hexicore.core.cluster import Cluster
    from hexicore.core.model import ModelSpec
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings
    from hexicore.core.profile import Profile
    from hexicore.cost.measured_block import block_flops

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "m.yaml").write_text(MODEL)
    prof, hydra = tmp_path / "profile.yaml", f"hydra.run.dir={tmp_path / 'r'}"
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                    "train.dtype=fp32", "train.recompute=false", "profile.micro_batches=[1]", "profile.tp=[1]",
                    "profile.repeats=5", "profile.link_bytes=[4096,65536,1048576]", f"out={prof}", hydra])
    assert code == 0, capsys.readouterr().err
    cluster, model = Cluster.load(tmp_path / "c.yaml"), ModelSpec.load(tmp_path / "m.yaml")
    for gpu, rate in (("fastgpu", 0.003e12), ("slowgpu", 0.001e12)):
        block = Profile.load(prof).devices[gpu].blocks[0]
        assert block.forward_s == pytest.approx(block_flops(block, model) / rate, rel=0.1), (gpu, block)
        assert block.backward_s == pytest.approx(2 * block.forward_s, rel=0.1), (gpu, block)
        # recomputation, as the runtime's checkpoint runs it, stops before the MLP's down projection
        down = 2 * model.hidden * model.ffn * block.micro_batch * block.seq_len
        assert block.recompute_s == pytest.approx((block_flops(block, model) - down) / rate, rel=0.1), (gpu, block)
    train = TrainSettings(global_batch=4, micro_batch=1, seq_len=64, dtype="fp32", recompute=False)
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
        assert abs(pred / meas - 1) <= 0.2, (name, got)
    assert got["fast"][0] < got["slow"][0] / 1.5 and got["fast"][1] < got["slow"][1], got


def test_the_links_section_compares_every_quantity_a_run_measures():
    """``bench/closed_loop.py --links``'s section: per plan the step, each pipeline, the DP sync
    and each hop (medians over the runs) against the prediction, and how many of each lie
    within 10%."""
    from bench.closed_loop import links_section, quantities

    def run(step: float, pipes: list[float], sync: float, hop: float | None) -> dict:
        return {"measured_s": step, "dp_sync_s": sync, "pipelines_s": pipes, "peak_memory_gb": [0.4, 0.5],
                "memory": "rss", "hops": [[hop, None], []],
                "predicted": {"dp_sync_s": 0.1, "pipelines_s": [1.0, 0.9], "peak_memory_gb": [0.1, 0.2],
                              "hops": [[0.02, 0.03], []]}}

    runs = [run(1.1, [1.0, 0.9], 0.1, 0.02), run(1.2, [1.2, 0.95], 0.2, None), run(1.3, [1.4, 1.0], 0.3, 0.03)]
    q = quantities(runs)
    assert q["dp_sync"] == {"profiled_s": 0.1, "measured_s": 0.2}
    assert [p["measured_s"] for p in q["pipelines"]] == [1.2, 0.95]
    assert [(h["pipeline"], h["hop"], h["profiled_s"], h["measured_s"]) for h in q["hops"]] == \
        [(0, 0, 0.02, pytest.approx(0.025)), (0, 1, 0.03, None)]  # (the runs that timed it; none did boundary 1)
    stages = {"predicted": [[{"forward_s": 0.1, "backward_s": 0.2}]], "measured": [[{"forward_s": 0.125, "backward_s": 0.2}]]}
    row = {"plan": "p", "profiled_s": 1.1, "measured_s": 1.2, "round_s": [1.1, 1.2, 1.3], "analytic_s": 0.1,
           "stages": stages, **q}
    args = {"links": 0.05, "links_latency_us": 2000, "steps": 7, "rounds": 3, "tflops": 0.012, "slowdown": 2.5}
    text = links_section({"args": args, "rows": [row], "date": "d", "uptime": "u", "profile_s": {"sequential": 40}})
    line = next(x for x in text.splitlines() if x.startswith("| p |"))
    assert "1.100 / 1.200 (-8%)" in line and "0.100 / 0.200 (-50%)" in line and "20% / 0%" in line
    assert "1.000 / 1.200 (-17%); 0.900 / 0.950 (-5%)" in line and "0.20 / 0.50" in line
    assert "p0.0 20.0 / 25.0 (-20%); p0.1 30.0 / -" in line
    assert "steps within 10%: 1 of 1 (largest 8%); pipelines within 10%: 1 of 2 (largest 17%); " \
           "DP syncs within 10%: 0 of 1 (largest 50%); hops within 10%: 0 of 1 (largest 20%)" in text
