"""torch runtime, single process: layouts and pre-launch checks, data, checkpoints, the executor
on one rank (local hand-over, I/W split), and ``hexicore train parallel=none`` + resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hexicore.pipeline.actions import Action, ActionList
from hexicore.core.emulation import Emulation
from hexicore.core.errors import HexicoreError
from hexicore.registry import Registry
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore_plugins.runtimes.torch.parallel.assignment import (StageGroup, build_layout, chunk_layers, reference_layout,
                                                    single_pipeline_layout)
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from tests.conftest import run_cli

CONF = Path(__file__).resolve().parents[2] / "conf"
TRAIN = ["model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=4", "runtime.progress=false"]


def cli(args, capsys):
    return run_cli(["train", *args]), capsys.readouterr()


# ------------------------------------------------------------------ layouts
def test_chunk_layers_walk_each_chain():
    hanayo = Hanayo(waves=1).actions(ScheduleSpec(2, 2))  # stages 0,1,2,3 on ranks 0,1,1,0
    assert chunk_layers(hanayo, [4, 4]) == ((0, 2), (2, 4), (4, 6), (6, 8))
    inter = Interleaved1F1B(chunks=2).actions(ScheduleSpec(2, 4))  # stage c*P + r on rank r
    assert chunk_layers(inter, [5, 3]) == ((0, 3), (3, 5), (5, 7), (7, 8))
    chimera = Chimera().actions(ScheduleSpec(3, 4))  # up chain 3,4,5 on ranks 2,1,0 copies positions
    assert chunk_layers(chimera, [3, 3, 2]) == ((0, 3), (3, 6), (6, 8), (0, 3), (3, 6), (6, 8))


def test_runtime_refuses_impossible_layouts(tiny):
    reg = Registry.default()
    with pytest.raises(HexicoreError, match="more stages than layers"):
        single_pipeline_layout(tiny, {"name": "1f1b"}, 9, registry=reg, global_batch=4, micro_batch=1, seq_len=32)
    with pytest.raises(HexicoreError, match="more stages than layers"):
        single_pipeline_layout(tiny, {"name": "hanayo", "waves": 2}, 3, registry=reg, global_batch=6, micro_batch=1,
                               seq_len=32)
    with pytest.raises(HexicoreError, match="does not divide the model's heads"):
        single_pipeline_layout(tiny, {"name": "1f1b"}, 2, registry=reg, global_batch=4, micro_batch=1, seq_len=32, tp=3)
    with pytest.raises(HexicoreError, match="exceeds the model"):
        reference_layout(tiny, global_batch=4, micro_batch=1, seq_len=64)
    # waves=auto picks among the W the ranks' blocks allow (8 blocks on 2 ranks: 2W <= 4)
    lay = single_pipeline_layout(tiny, {"name": "hanayo", "waves": "auto"}, 2, registry=reg, global_batch=8,
                                 micro_batch=1, seq_len=32)
    assert lay.pipelines[0].actions.schedule["waves"] <= 2


def test_fifo_check_for_untagged_p2p():
    from hexicore_plugins.runtimes.torch.parallel.assignment import check_fifo

    al = Hanayo(waves=1).actions(ScheduleSpec(2, 4))
    check_fifo(al)
    A = Action
    swapped = ActionList({"name": "x"}, 2, 2, 2, (0, 1), (
        (A("F", 0, 0), A("SEND_F", 0, 0, 1), A("F", 0, 1), A("SEND_F", 0, 1, 1), A("RECV_B", 0, 0, 1), A("B", 0, 0),
         A("RECV_B", 0, 1, 1), A("B", 0, 1)),
        (A("RECV_F", 1, 1, 0), A("RECV_F", 1, 0, 0), A("F", 1, 0), A("B", 1, 0), A("SEND_B", 1, 0, 0), A("F", 1, 1),
         A("B", 1, 1), A("SEND_B", 1, 1, 0))))
    with pytest.raises(HexicoreError, match="another order"):
        check_fifo(swapped)


def _plan_json(tmp_path, tp):
    from hexicore.core.cluster import Cluster
    from hexicore.core.model import ModelSpec
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings
    model = ModelSpec.load(CONF / "model" / "tiny.yaml")
    cluster = Cluster.load(CONF / "cluster" / "paper_case.yaml")
    devs = tuple(f"A.{i}" for i in range(tp))
    plan = Plan(model, cluster, TrainSettings(4, 1, 32, "fp32", False),
                (Pipeline(4, (Stage(devs, tp, (0, 4)), Stage(("B.0",), 1, (4, 8)))),))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


@pytest.mark.parametrize("args,needle", [
    (["schedule=1f1b", "pipeline.ranks=2", "train.global_batch=5", "train.micro_batch=2"],
     "command line: train.micro_batch: global batch 5 is not a multiple of micro-batch 2"),
    (["schedule=1f1b", "pipeline.ranks=9"], "command line: pipeline.ranks: 9 pipeline stages"),
    (["schedule=hanayo", "schedule.waves=0", "pipeline.ranks=2"], "command line: schedule.waves: schedule 'hanayo'"),
    (["schedule=dualpipe_v", "pipeline.ranks=2", "train.global_batch=2"],
     "command line: train.global_batch: schedule 'dualpipe_v': needs micro_batches >= 2 x ranks = 4, got 2"),
    (["parallel=none", "runtime.data=foo"], "command line: runtime.data: unknown data 'foo'"),
    (["parallel=none", "train.seq_len=999"], "command line: train.seq_len: sequence length 999"),
    (["model=bert_large", "pipeline.ranks=2"], "model=bert_large: model.arch: the torch runtime trains Llama"),
    (["schedule=auto", "pipeline.ranks=2"], "command line: schedule: schedule=auto is for hexicore plan only (it "
                                            "picks a schedule per pipeline); hexicore train pipeline.ranks=P takes one of: 1f1b,"),
])
def test_cli_errors_name_the_command_line_and_the_key(tmp_path, capsys, monkeypatch, args, needle):
    """A run without a plan: every value is the command line's, so its errors name it and the key as written."""
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    code, io = cli([*TRAIN, *args, f"out={tmp_path}"], capsys)
    assert code == 2 and io.err.count("\n") == 1 and f"hexicore: error: {needle}" in io.err, io.err
    assert not (tmp_path / "metrics.json").exists()


def test_cli_bad_plans_exit_2_before_any_process(tmp_path, capsys, monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    code, io = cli([*TRAIN, "schedule=1f1b", "pipeline.ranks=9", f"out={tmp_path}"], capsys)
    assert code == 2 and io.err.count("\n") == 1 and "more stages than layers" in io.err
    assert "hexicore: error: command line: pipeline.ranks: 9 pipeline stages" in io.err
    code, io = cli([*TRAIN[1:], f"plan_file={_plan_json(tmp_path, 3)}", f"out={tmp_path}"], capsys)  # the plan carries its model
    assert code == 2 and io.err.count("\n") == 1 and "tensor-parallel degree 3 does not divide" in io.err
    code, io = cli([*TRAIN, "parallel=none", f"resume={tmp_path / 'nope.pt'}"], capsys)
    assert code == 2 and "no such checkpoint" in io.err
    code, io = cli(["train.steps=1", "model=llama2_70b", "pipeline.ranks=2", "runtime.progress=false"], capsys)
    assert code == 2 and io.err.count("\n") == 1 and "GiB" in io.err


def test_plan_layout_maps_devices_to_ranks(tmp_path):
    from hexicore.core.plan import Plan
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout

    layout = plan_layout(Plan.load(_plan_json(tmp_path, 2)), [{"name": "gpipe"}], registry=Registry.default(),
                         seq_len=32)
    assert layout.world == 3
    assert [g.ranks for g in layout.pipelines[0].groups] == [(0, 1), (2,)]
    assert layout.role(1).tp_rank == 1 and layout.role(2).pipe_rank == 1


def test_pipelines_of_one_shape_share_their_lists_and_others_get_their_own():
    """A plan's pipelines with the same schedule, ranks, micro-batches and blocks run the same
    lists, built once (80 stages of 512 micro-batches under ZB-H1 take 0.7 s each); a pipeline
    that differs in any of them gets its own, and each pipeline's lists are those built for it
    alone."""
    from hexicore.core.cluster import Cluster
    from hexicore.core.model import ModelSpec
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout, schedule_actions

    model = ModelSpec.load(CONF / "model" / "tiny.yaml")
    cluster = Cluster.load(CONF / "cluster" / "paper_case.yaml")
    pipes = (Pipeline(4, (Stage(("A.0",), 1, (0, 4)), Stage(("B.0",), 1, (4, 8)))),
             Pipeline(4, (Stage(("A.1",), 1, (0, 4)), Stage(("B.1",), 1, (4, 8)))),
             Pipeline(4, (Stage(("A.2",), 1, (0, 3)), Stage(("B.2",), 1, (3, 8)))),
             Pipeline(4, (Stage(("A.3",), 1, (0, 4)), Stage(("B.3",), 1, (4, 8)))))
    plan = Plan(model, cluster, TrainSettings(16, 1, 32, "fp32", False), pipes)
    scheds = [{"name": "zb_h1"}, {"name": "zb_h1"}, {"name": "zb_h1"}, {"name": "1f1b"}]
    layout = plan_layout(plan, scheds, registry=Registry.default(), seq_len=32)
    acts = [p.actions for p in layout.pipelines]
    assert acts[0] is acts[1] and acts[2] is not acts[0] and acts[3] is not acts[0]
    for p, sched, pipe in zip(layout.pipelines, scheds, pipes):
        alone = schedule_actions(sched, 2, 4, Registry.default(), rank_layers=[s.n_layers for s in pipe.stages],
                                 fallback=True)
        assert p.actions.actions == alone.actions


def test_registry_and_plugin_import_do_not_import_torch():
    code = ("import sys; from hexicore.registry import Registry; r = Registry.default(); "
            "assert 'torch' in r.names('runtime'); r.create('runtime', 'torch'); "
            "import hexicore_plugins.runtimes.torch.parallel.assignment; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_and_evaluate_check_the_runtime_without_importing_torch(tmp_path):
    """``plan`` and ``evaluate`` ask the torch runtime whether it can run the plan (ZeRO-3 layout
    included): that check must neither need torch nor pay its import (seconds per command)."""
    code = ("import sys; from hexicore.app.cli import main; "
            f"assert main(['plan', 'train.zero=3', 'out={tmp_path}/p.json', 'hydra.run.dir={tmp_path}/h']) in (0, None); "
            f"assert main(['evaluate', 'plan_file={tmp_path}/p.json', 'hydra.run.dir={tmp_path}/h2']) in (0, None); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


# --------------------------------------------------------------------- data
def test_data_is_a_pure_function_of_seed_and_step():
    from hexicore_plugins.runtimes.torch.train.data_source import ByteText, SyntheticTokens, demo_text_path

    a, b = SyntheticTokens(256, 32, 4, seed=1), SyntheticTokens(256, 32, 4, seed=1)
    assert a.batch(3).shape == (4, 33) and a.batch(3).equal(b.batch(3))
    assert not a.batch(3).equal(a.batch(4)) and not a.batch(3).equal(SyntheticTokens(256, 32, 4, 2).batch(3))
    text = demo_text_path().read_bytes()
    t = ByteText(None, 256, 32, 4, seed=0)
    rows = t.batch(0)
    assert rows.shape == (4, 33) and rows.equal(ByteText(None, 256, 32, 4, seed=0).batch(0))
    for row in rows:
        assert bytes(row.tolist()) in text
    with pytest.raises(HexicoreError, match="vocabulary of at least 256"):
        ByteText(None, 100, 32, 4, seed=0)


# -------------------------------------------------------------- checkpoints
def test_consolidate_joins_tp_shards_in_standard_order(tmp_path):
    import torch

    from hexicore_plugins.runtimes.torch.checkpoint import native as checkpoint
    from hexicore_plugins.runtimes.torch.parallel.tensor import shard

    q = torch.randn(8, 4)
    norm = torch.ones(4)
    pieces = [("model.layers.0.self_attn.q_proj.weight", 0, r, {"param": shard(q, 0, r, 2)}) for r in (1, 0)]
    pieces += [("lm_head.weight", None, 0, {"param": q}), ("model.layers.0.input_layernorm.weight", None, 0,
                                                           {"param": norm})]
    model, optim = checkpoint.consolidate(pieces)
    assert list(model) == ["model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                           "lm_head.weight"]
    assert model["model.layers.0.self_attn.q_proj.weight"].equal(q) and optim["step"] is None
    for k in (2, 10):
        checkpoint.save(tmp_path / "checkpoints" / f"step_{k}", model, optim,  # a complete meta.json: load checks it
                        {"step": k, "losses": [1.0] * k, "step_s": [0.1] * k, "seed": 0, "model": {}, "data": {},
                         "plan": "p"})
    assert checkpoint.resolve(tmp_path).name == "step_10"
    assert checkpoint.load(tmp_path)["step"] == 10
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text('{"x": 1}')
    with pytest.raises(HexicoreError, match="not a hexicore.checkpoint/2"):
        checkpoint.load(tmp_path / "other")


# ------------------------------------------------- executor on one process
def _run(layout, steps=3, **kw):
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from tests.helpers import worker_spec
    return launch([worker_spec(layout, steps=steps, seed=5, dtype="fp32", recompute=False, progress=False,
                               return_state=True, **kw)], 1)[0]


def test_executor_local_handover_and_split_backward_match_reference(tiny):
    """Two stages on one rank (a wave's turn: no comm), backward split into I and W."""
    A = Action
    acts = (A("F", 0, 0), A("F", 1, 0), A("I", 1, 0), A("B", 0, 0), A("W", 1, 0), A("F", 0, 1), A("F", 1, 1),
            A("B", 1, 1), A("I", 0, 1), A("W", 0, 1), A("STEP"))
    al = ActionList({"name": "hand"}, 1, 2, 2, (0, 0), (acts,))
    layout = build_layout(tiny, [(4, [StageGroup((0,), 8)], al)], global_batch=4, micro_batch=2, seq_len=32)
    ref = _run(reference_layout(tiny, global_batch=4, micro_batch=2, seq_len=32))
    got = _run(layout)
    assert got["metrics"]["losses"] == pytest.approx(ref["metrics"]["losses"], rel=1e-6)
    for k, v in ref["state"].items():
        assert (got["state"][k] - v).abs().max() < 1e-6, k


def test_executor_reports_an_unrunnable_list(tiny):
    from hexicore_plugins.runtimes.torch.parallel.pipeline import ExecutionError

    al = ActionList({"name": "bad"}, 1, 1, 1, (0,), ((Action("B", 0, 0), Action("STEP")),))
    layout = build_layout(tiny, [(4, [StageGroup((0,), 8)], al)], global_batch=4, micro_batch=4, seq_len=32)
    with pytest.raises(ExecutionError, match="before its forward"):
        _run(layout, steps=1)


# ------------------------------------------------- CLI: parallel=none + resume
def test_train_parallel_none_writes_contract_outputs_and_resumes(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    code, io = cli([*TRAIN, "parallel=none", "train.steps=4", "train.checkpoint_every=2", "seed=3", f"out={a}"],
                   capsys)
    assert code == 0, io.err
    m = json.loads((a / "metrics.json").read_text())
    assert set(m) == {"format", "losses", "tokens_per_s", "step_s", "ranks", "plan", "schedule", "seed", "predicted",
                      "measured", "lr", "grad_norm"}
    assert m["lr"] == [3e-4] * 4 and len(m["grad_norm"]) == 4 and all(x > 0 for x in m["grad_norm"])
    assert m["predicted"] is None and m["measured"]["steps"] == 3  # no plan, nothing predicted
    assert len(m["losses"]) == 4 and m["ranks"] == 1 and m["seed"] == 3 and m["tokens_per_s"] > 0
    from safetensors.torch import load_file

    final = load_file(a / "final" / "model.safetensors")
    assert "model.layers.7.mlp.up_proj.weight" in final and "lm_head.weight" in final
    assert json.loads((a / "final" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (a / "checkpoints" / "step_2" / "meta.json").is_file()
    assert not list(a.rglob("*.pt"))  # no pickles anywhere
    code, io = cli([*TRAIN, "parallel=none", "train.steps=4", "seed=3", f"out={b}",
                    f"resume={a / 'checkpoints' / 'step_2'}"], capsys)
    assert code == 0, io.err
    assert json.loads((b / "metrics.json").read_text())["losses"] == m["losses"]
    resumed = load_file(b / "final" / "model.safetensors")
    code, io = cli([*TRAIN, "parallel=none", "train.steps=4", "seed=4", f"out={tmp_path / 'c'}",
                    f"resume={a / 'checkpoints' / 'step_2'}"], capsys)
    assert code == 2 and io.err.count("\n") == 1 and "seed 3" in io.err
    assert all(resumed[k].equal(v) for k, v in final.items())


# ------------------------------------------- emulated heterogeneity (test aid)
def _emulated_runs(tiny, monkeypatch, emulation):
    """Two steps of F, F, I, B, W, STEP on one rank, plain and under ``emulation`` with its
    sleeps recorded, not slept: (plain result, emulated result, the sleeps)."""
    from hexicore_plugins.runtimes.torch.launch import emulated_device as emulate

    A = Action
    acts = (A("F", 0, 0), A("F", 1, 0), A("I", 1, 0), A("B", 0, 0), A("W", 1, 0), A("STEP"))
    al = ActionList({"name": "hand"}, 1, 2, 1, (0, 0), (acts,))
    layout = build_layout(tiny, [(4, [StageGroup((0,), 8)], al)], global_batch=4, micro_batch=4, seq_len=32)
    plain = _run(layout, steps=2)
    slept: list[float] = []
    monkeypatch.setattr(emulate.time, "sleep", slept.append)
    return plain, _run(layout, steps=2, emulation=(emulation,)), slept


def test_emulated_slowdown_stretches_every_compute_action_and_changes_no_number(tiny, monkeypatch):
    """``emulate: {slowdown: K}``: each F/B/I/W and the optimizer step lasts K x its work (a
    sleep follows it); a wait inside it is not work, and the numbers are unchanged."""
    from hexicore_plugins.runtimes.torch.launch import emulated_device as emulate

    # a large K keeps some sleep positive even on a loaded host, where an action's wall time may
    # exceed 3x its CPU time
    plain, slow, slept = _emulated_runs(tiny, monkeypatch, Emulation(slowdown=50.0))
    assert len(slept) == 2 * 6 and any(s > 0 for s in slept)  # 5 compute actions + the step, 2 steps
    assert slow["metrics"]["losses"] == plain["metrics"]["losses"]
    cpu = __import__("torch").device("cpu")
    took = emulate.stretch(1.0, 0.0, cpu)
    assert took > 0 and len(slept) == 12  # factor 1: no sleep
    import threading

    wall, work = emulate.clock()
    threading.Event().wait(0.05)  # waiting (for a core, a collective) is not work: not stretched
    assert emulate.stretch(3.0, wall, cpu, work) >= 0.05 and len(slept) == 13 and slept[-1] == 0.0
    wall = emulate.time.perf_counter()  # without CPU seconds (CUDA): K x the wall time, (K - 1) x it left
    assert emulate.stretch(3.0, wall - 0.1, cpu) >= 0.1 and slept[-1] == pytest.approx(0.2, abs=0.01)


def test_emulated_tflops_holds_each_compute_action_to_its_flops_and_changes_no_number(tiny, monkeypatch):
    """``emulate: {tflops: X}``: each F/B/I/W lasts its counted FLOPs over X (a sleep follows
    it); the optimizer step, with no counted FLOPs, its own time; the numbers are unchanged."""
    plain, held, slept = _emulated_runs(tiny, monkeypatch, Emulation(tflops=1e-6))  # 1 MFLOP/s: every action sleeps
    assert len(slept) == 2 * 6 and all(s > 0 for i, s in enumerate(slept) if i % 6 != 5)
    assert all(slept[i] == 0.0 for i in (5, 11))  # the optimizer step: nothing counted, nothing added
    assert held["metrics"]["losses"] == plain["metrics"]["losses"]


def test_emulate_in_a_cluster_file_round_trips_and_bad_values_are_refused(tmp_path):
    from hexicore.core.cluster import parse_cluster

    base = {"name": "e", "inter": {"bandwidth_gbs": 1.0},
            "machines": [{"name": "A", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100.0},
                         {"name": "B", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100.0,
                          "emulate": {"slowdown": 2.5}}]}
    c = parse_cluster(base, "c.yaml")
    assert [c.slowdown(d.id) for d in c.devices] == [1.0, 1.0, 2.5, 2.5]
    assert parse_cluster(c.to_dict(), "plan.json", "cluster") == c
    assert "emulate" not in c.to_dict()["machines"][0]
    for bad, field in (({"slowdown": 0.5}, "emulate.slowdown"), ({"slow": 2}, "emulate.slow"), (3, "emulate")):
        base["machines"][1]["emulate"] = bad
        with pytest.raises(HexicoreError) as e:
            parse_cluster(base, "c.yaml")
        assert e.value.field == f"machines[1].{field}"
