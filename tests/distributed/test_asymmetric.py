"""Asymmetric execution: any HexiScale plan — pipelines with different stage counts,
layer cuts, TP degrees, batch shares and schedules — trains exactly like ``parallel=none``.

Fast tests check the chunked data-parallel sync plan (chunks of the smallest shard size, each
all-reduced among exactly its holders) and that ``evaluate`` and ``train`` agree on a plan. The
slow test is two launches: one 6-rank job runs the reference and every plan in sequence, then
``hexicore plan`` output for a small synthetic cluster goes through ``hexicore train plan_file=``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.registry import Registry
from tests.conftest import run_cli
from tests.helpers import (CPU6_SEQ as SEQ, CPU6_TOL as TOL, CPU6_ACCEPTANCE as ACCEPTANCE,
                           CPU6_PLANS as PLANS)
from tests.helpers import tiny, plan_of, layout_of, worker_spec, _max_rel, _max_abs

CONF = Path(__file__).resolve().parents[2] / "conf"


# ------------------------------------------------------------------ sync plan (no processes)
def test_chunks_have_the_smallest_shard_size_and_exactly_their_holders():
    from hexicore_plugins.runtimes.torch.parallel.data.sync import full_shapes, sync_plan

    layout = layout_of(ACCEPTANCE)
    shapes = full_shapes(layout.model)
    plan = sync_plan(layout, shapes)
    # ranks: pipeline 1 = (0,1) [0,5), 2 [5,8); pipeline 2 = 3 [0,3), 4 [3,6), 5 [6,8)
    assert plan.members() == [(0, 3), (0, 4), (1, 3), (1, 4), (2, 4), (2, 5), (0, 1, 3), (0, 1, 4)]
    for members, items in plan.groups.items():
        for c, hold, contrib in items:
            assert {h.rank for h in hold} == set(members)
            assert len(contrib) == 2 and {h.pipeline for h in contrib} == {0, 1}  # one contributor per pipeline
            if c.dim is not None:  # layers of the tp=2 stage are cut in halves, the others stay whole
                assert c.hi - c.lo == shapes[c.name][c.dim] // (2 if {0, 1} & set(members) else 1)
    q = "model.layers.4.self_attn.q_proj.weight"  # rank 0/1 hold halves, rank 4 the whole
    assert [(m, c.lo, c.hi) for m, items in plan.groups.items() for c, _, _ in items if c.name == q] == \
        [((0, 4), 0, 32), ((1, 4), 32, 64)]
    # no extra traffic: a holder moves each element it holds once; replicated tensors of the tp=2 stage
    # (embedding, block norms of [0,5)) are held by both of its ranks
    def dup(n):
        return n == "model.embed_tokens.weight" or (n.startswith("model.layers.") and "norm" in n
                                                     and int(n.split(".")[2]) < 5)
    assert plan.traffic() == sum((2 + dup(n)) * math.prod(s) for n, s in shapes.items())


def test_every_parameter_chunk_is_covered_once_per_pipeline():
    from hexicore_plugins.runtimes.torch.parallel.data.sync import full_shapes, sync_plan

    big = ModelSpec(name="t", layers=4, hidden=32, heads=8, kv_heads=4, ffn=64, vocab=64, seq_len=16)
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, schedule_actions

    pipes = [(4, [StageGroup((0, 1, 2, 3), 1), StageGroup((4,), 3)]), (2, [StageGroup((5, 6), 2),
                                                                            StageGroup((7,), 2)]),
             (2, [StageGroup((8,), 4)])]
    reg = Registry.default()
    layout = build_layout(big, [(b, g, schedule_actions({"name": "1f1b"}, len(g), b, reg)) for b, g in pipes],
                          global_batch=8, micro_batch=1, seq_len=16)
    shapes = full_shapes(big)
    plan = sync_plan(layout, shapes)
    q0 = "model.layers.0.self_attn.q_proj.weight"  # tp 4 | tp 2 | tp 1: chunks of a quarter
    cuts = sorted((c.lo, c.hi, m) for m, items in plan.groups.items() for c, _, _ in items if c.name == q0)
    assert cuts == [(0, 8, (0, 5, 8)), (8, 16, (1, 5, 8)), (16, 24, (2, 6, 8)), (24, 32, (3, 6, 8))]
    for name, shape in shapes.items():
        chunks = [c for items in plan.groups.values() for c, _, _ in items if c.name == name]
        assert sum(c.numel for c in chunks) == math.prod(shape), name


# ------------------------------------------------------------------ evaluate and train agree
def test_runtime_refusals_are_one_line_before_launch_and_evaluate_agrees(tmp_path, capsys, monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    bad = plan_of([(8, {"name": "hanayo", "waves": 2}, [(1, 6), (1, 1), (1, 1)])])  # 4 chunks on 1 layer
    path = tmp_path / "bad.json"
    bad.save(path)

    def cli(*args):
        return run_cli(args), capsys.readouterr()

    code, io = cli("train", f"plan_file={path}", "runtime.progress=false", f"out={tmp_path}")
    assert code == 2 and io.err.count("\n") == 1 and "more stages than layers" in io.err
    assert io.err.startswith(f"hexicore: error: {path}: ")  # the plan's error names the plan file
    code, io = cli("evaluate", f"plan_file={path}")
    assert code == 0 and "runtime torch cannot run this plan" in io.err and "more stages than layers" in io.err
    good = tmp_path / "good.json"
    plan_of(ACCEPTANCE).save(good)
    code, io = cli("evaluate", f"plan_file={good}")
    assert code == 0 and "cannot run" not in io.err


def test_plan_is_quiet_about_a_model_the_runtime_does_not_train(tmp_path, capsys):
    """A GPT-style model plans (the cost model prices it); the torch runtime trains Llama-style
    models only, which ``train`` says once, in its one-line refusal: planning does not repeat it
    on every plan (nobody asked to train)."""
    gpt = tmp_path / "gpt.yaml"
    gpt.write_text("{name: g, arch: gpt, layers: 4, hidden: 64, heads: 4, ffn: 256, vocab: 128, seq_len: 32}\n")
    code = run_cli(["plan", "cluster=tight8", f"model_file={gpt}", "train.global_batch=8", f"out={tmp_path / 'g.json'}"])
    err = capsys.readouterr().err
    assert code == 0 and "cannot run" not in err
    code = run_cli(["train", f"plan_file={tmp_path / 'g.json'}", "train.steps=1", f"out={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Llama-style" in err
    code = run_cli(["plan", "cluster=tight8", "model=tiny", "train.global_batch=8", f"out={tmp_path / 't.json'}"])
    assert code == 0 and "cannot run" not in capsys.readouterr().err


def test_a_tp_the_runtime_cannot_shard_names_its_stage():
    """The runtime's refusal (a warning of plan and evaluate) named ``stages.tp``, no pipeline
    nor stage: now the plan's own field."""
    from hexicore.core.errors import PlanError

    with pytest.raises(PlanError) as e:
        layout_of([(4, "1f1b", [(1, 8)]), (4, "1f1b", [(1, 2), (3, 6)])])
    assert e.value.field == "pipelines[1].stages[1].tp" and "does not divide the model's heads (4)" in e.value.message


def test_plan_layout_runs_each_pipelines_own_schedule():
    layout = layout_of(PLANS["3 pipelines: tp2 (gpipe) | 2 stages (hanayo) | tp1 whole model (1f1b)"])
    assert [p.actions.schedule["name"] for p in layout.pipelines] == ["gpipe", "hanayo", "1f1b"]
    assert [p.batch for p in layout.pipelines] == [2, 4, 2] and layout.world == 5
    assert layout.schedule_name == "gpipe+hanayo+1f1b"
    with pytest.raises(HexicoreError, match="does not divide"):
        layout_of([(8, "1f1b", [(3, 8)])])


@pytest.mark.slow
def test_asymmetric_plans_match_single_process_and_planner_plan_trains(tmp_path, capsys):
    """One 6-rank job: the reference on rank 0, then every plan of :data:`PLANS`; each matches
    ``parallel=none`` on the same global batch (losses and final weights within 1e-5). Then a plan
    written by ``hexicore plan`` for a small synthetic cluster trains through ``hexicore train``."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions

    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=6)
    layouts = [dataclasses.replace(layout_of(p), world=6) for p in PLANS.values()]  # one 6-rank job
    specs = [worker_spec(x, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True)
             for x in [ref, *layouts]]
    results = launch(specs, 6)
    report = []
    for name, got in zip(PLANS, results[1:]):
        rel = _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"])
        w = _max_abs(got["state"], results[0]["state"])
        report.append(f"{name:72s} loss rel {rel:.1e}  weights abs {w:.1e}")
        assert rel <= TOL and w <= TOL, report[-1]
    with capsys.disabled():
        print("\n" + "\n".join(report))

    cluster = tmp_path / "small.yaml"
    cluster.write_text("name: small4\ninter: {bandwidth_gbs: 0.7, latency_us: 50}\nmachines:\n"
                       "  - {name: A, gpu: rtx3090, count: 2, bandwidth_gbs: 24, latency_us: 10}\n"
                       "  - {name: B, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}\n")
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    common = ["model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=8"]

    def cli(*args):
        return run_cli(args), capsys.readouterr()

    code, io = cli("plan", f"cluster_file={cluster}", *common, "solver.dp_min=2", f"out={plan_path}")
    assert code == 0, io.err
    plan = Plan.load(plan_path)
    assert len(plan.pipelines) >= 2
    code, io = cli("train", f"plan_file={plan_path}", "train.steps=2", "runtime.progress=false", f"out={out}",
                   f"hydra.run.dir={tmp_path / 'hydra'}")
    assert code == 0, io.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ranks"] == len(plan.devices) and metrics["plan"] == str(plan_path)
    assert len(metrics["losses"]) == 2 and all(math.isfinite(x) for x in metrics["losses"])
    from safetensors.torch import load_file

    assert load_file(out / "final" / "model.safetensors").keys() == results[0]["state"].keys()
