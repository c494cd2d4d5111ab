"""The learning-rate schedule and gradient clipping by global norm (``runtime.lr_schedule``,
``warmup_steps``, ``min_lr``, ``clip_grad``): the lr formula by hand, the settings check, one
process against a plain torch loop with ``torch.nn.utils.clip_grad_norm_``, resuming a
schedule, and (slow) distributed runs of every optimizer path against ``parallel=none``."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hexicore.core.errors import HexicoreError
from hexicore_plugins.runtimes.torch.train.lr_schedule import lr_at
from tests.conftest import run_cli

#: the distributed tests' optimizer: clipping active at every step (norms ~2), cosine with warmup
OPTIM = {"clip_grad": 0.01, "lr_schedule": "cosine", "warmup_steps": 1, "min_lr": 1e-5, "lr": 1e-3}


# ------------------------------------------------------------------ the formula (no torch)
def test_lr_of_every_schedule_by_hand():
    kw = {"lr": 1.0, "warmup_steps": 2, "min_lr": 0.1, "steps": 10}
    for schedule in ("constant", "linear", "cosine"):  # warmup: lr * (k + 1) / W, whatever the schedule
        assert [lr_at(k, schedule=schedule, **kw) for k in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert [lr_at(k, schedule="constant", **kw) for k in range(2, 10)] == [1.0] * 8
    # 8 decay steps: t = (k - 2) / 8
    assert lr_at(6, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(9, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * (1 / 8))
    assert lr_at(4, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.sqrt(0.5)))
    assert lr_at(6, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(7 * math.pi / 8)))
    # the default is exactly the constant lr, and warmup may span the whole run
    assert all(lr_at(k, lr=3e-4, steps=5) == 3e-4 for k in range(5))
    assert [lr_at(k, lr=1.0, schedule="cosine", warmup_steps=4, steps=4) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(0, lr=2.0, schedule="linear", steps=4) == 2.0 and lr_at(2, lr=2.0, schedule="linear", steps=4) == 1.0


@pytest.mark.parametrize("params,field,words", [
    ({"lr_schedule": "cosin"}, "runtime.lr_schedule", "unknown lr schedule"),
    ({"warmup_steps": -1}, "runtime.warmup_steps", ">= 0"),
    ({"min_lr": -1e-6}, "runtime.min_lr", ">= 0"),
    ({"lr": 1e-4, "min_lr": 2e-4}, "runtime.min_lr", "above lr"),
    ({"clip_grad": 0}, "runtime.clip_grad", "> 0"),
    ({"clip_grad": "x"}, "runtime.clip_grad", "a number"),
])
def test_bad_optimizer_settings_name_their_key(params, field, words):
    from hexicore_plugins.runtimes.torch.runtime import TorchSettings

    with pytest.raises(HexicoreError) as e:
        TorchSettings.parse(params)
    assert e.value.field == field and words in str(e.value)
    s = TorchSettings.parse({"lr_schedule": "linear", "warmup_steps": 3, "min_lr": 1e-5, "clip_grad": 1}).optimizer
    assert (s.lr_schedule, s.warmup_steps, s.min_lr, s.clip_grad) == ("linear", 3, 1e-5, 1.0)
    assert TorchSettings.parse({}).optimizer.clip_grad is None and TorchSettings.parse({}).optimizer.lr_schedule == "constant"


# ------------------------------------------------------------------ one process, in this process
def _spec(steps=3, **kw):
    from hexicore_plugins.runtimes.torch.parallel.assignment import reference_layout
    from tests.helpers import tiny, worker_spec
    layout = reference_layout(tiny(), global_batch=4, micro_batch=2, seq_len=16)
    return worker_spec(layout, steps=steps, seed=3, dtype="fp32", recompute=False, progress=False, return_state=True,
                       **kw)


def _plain_torch(spec):
    """The run as a plain torch loop on the whole model: ``clip_grad_norm_`` and the lr schedule
    by hand; per step (loss, pre-clip norm) and the final weights."""
    import torch

    from hexicore_plugins.runtimes.torch.train.data_source import make_source
    from hexicore_plugins.runtimes.torch.model.stage_module import Seeded, full_model

    lay, train, adam = spec.layout, spec.train, spec.optimizer
    model = full_model(lay.model, Seeded(train.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=adam.lr, betas=(0.9, 0.95), eps=adam.eps,
                            weight_decay=adam.weight_decay)
    src = make_source("synthetic", vocab=lay.model.vocab, seq_len=lay.seq_len, global_batch=lay.global_batch,
                      seed=train.seed)
    out = []
    for k in range(train.steps):
        rows = src.batch(k)
        loss = model(rows[:, :-1], rows[:, 1:], 1.0 / (lay.global_batch * lay.seq_len))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), adam.clip_grad or math.inf)
        for g in opt.param_groups:
            g["lr"] = lr_at(k, lr=adam.lr, schedule=adam.lr_schedule, warmup_steps=adam.warmup_steps,
                            min_lr=adam.min_lr, steps=train.steps)
        opt.step()
        opt.zero_grad()
        out.append((float(loss.detach()), float(norm)))
    return out, {n: p.detach() for n, p in model.state_dict().items()}


def _rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def _diff(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in b)


def test_one_process_norm_and_clipped_update_are_torchs(tmp_path):
    """The runtime's ``grad_norm`` is ``clip_grad_norm_``'s on the whole model, its clipped
    update and cosine lr the plain loop's; clipping (0.01, active: norms ~2) changes the weights."""
    import torch

    from hexicore_plugins.runtimes.torch.train.trainer import train

    spec = _spec(**OPTIM)
    got = train(spec, 0, 1, torch.device("cpu"))
    want, weights = _plain_torch(spec)
    m = got["metrics"]
    assert _rel(m["grad_norm"], [n for _, n in want]) <= 1e-5 and min(m["grad_norm"]) > 10 * OPTIM["clip_grad"]
    assert _rel(m["losses"], [x for x, _ in want]) <= 1e-5
    assert m["lr"] == [1e-3, 1e-3, pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)]  # t = 1/2: cos = 0
    assert _diff(got["state"], weights) <= 1e-6
    no_clip = dataclasses.replace(spec, optimizer=dataclasses.replace(spec.optimizer, clip_grad=None))
    unclipped = train(no_clip, 0, 1, torch.device("cpu"))
    assert unclipped["metrics"]["grad_norm"][0] == m["grad_norm"][0]  # logged whether or not clipping is on
    assert _diff(unclipped["state"], weights) > 100 * 1e-6
    assert _diff(unclipped["state"], _plain_torch(no_clip)[1]) <= 1e-6


def test_resume_continues_the_schedule_and_refuses_other_settings(tmp_path, capsys):
    """Four steps in one go equal two, checkpointed, then resumed to four (cosine with warmup and
    clipping; fp32, 1e-6); ``meta.json`` records the optimizer; resuming with another lr, clip or
    (the schedule decays over ``train.steps``) another ``train.steps`` is one line, exit 2."""
    import torch

    from hexicore_plugins.runtimes.torch.train.trainer import train

    whole = train(_spec(steps=4, **OPTIM, checkpoint_every=2, out=str(tmp_path / "a")), 0, 1, torch.device("cpu"))
    step2 = tmp_path / "a" / "checkpoints" / "step_2"
    meta = json.loads((step2 / "meta.json").read_text())
    assert {k: meta[k] for k in OPTIM} == OPTIM and meta["train_steps"] == 4 and len(meta["grad_norms"]) == 2
    resumed = train(_spec(steps=4, **OPTIM, resume=str(step2)), 0, 1, torch.device("cpu"))
    assert _rel(resumed["metrics"]["losses"], whole["metrics"]["losses"]) <= 1e-6
    assert _rel(resumed["metrics"]["grad_norm"], whole["metrics"]["grad_norm"]) <= 1e-6
    assert resumed["metrics"]["lr"] == whole["metrics"]["lr"]
    assert _diff(resumed["state"], whole["state"]) <= 1e-6
    base = ["train", "parallel=none", "model=tiny", "train.global_batch=4", "train.micro_batch=2", "train.seq_len=16",
            "train.dtype=fp32", "seed=3", f"resume={step2}", f"hydra.run.dir={tmp_path / 'h'}"]
    base += [f"runtime.{k}={v}" for k, v in OPTIM.items()]
    for extra, field in ((["runtime.lr=2e-3"], "runtime.lr"), (["runtime.clip_grad=1.0"], "runtime.clip_grad"),
                         (["runtime.lr_schedule=linear"], "runtime.lr_schedule"), (["train.steps=6"], "train.steps")):
        out = tmp_path / "b"
        code = run_cli(base + ["train.steps=4"] + extra + [f"out={out}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{field}:" in err, (extra, err)
        assert not out.exists()


def test_an_older_checkpoint_without_optimizer_keys_resumes():
    from hexicore_plugins.runtimes.torch.checkpoint.native import check_resume

    ck = {"dir": "ck", "step": 2, "seed": 0, "model": {}, "data": {}, "plan": "p"}
    assert check_resume(ck, model={}, seed=0, data={}, plan="p", steps=9, optim={"lr": 1.0, "clip_grad": 1.0}) is None
    with pytest.raises(HexicoreError) as e:
        check_resume({**ck, "lr": 2.0}, model={}, seed=0, data={}, plan="p", steps=9, optim={"lr": 1.0})
    assert e.value.field == "runtime.lr"
    with pytest.raises(HexicoreError) as e:  # every differing setting in the one line, with what to give
        check_resume({**ck, "lr": 2.0, "lr_schedule": "cosine", "clip_grad": None}, model={}, seed=0, data={},
                     plan="p", steps=9, optim={"lr": 1.0, "lr_schedule": "constant", "clip_grad": 1.0})
    assert e.value.field == "runtime.lr" and "\n" not in str(e.value)
    assert "give runtime.lr=2.0 runtime.lr_schedule=cosine runtime.clip_grad=null)" in str(e.value)
    constant = {**ck, "lr_schedule": "constant", "train_steps": 4}  # a constant schedule may be extended
    assert check_resume(constant, model={}, seed=0, data={}, plan="p", steps=9, optim={}) is None
    with pytest.raises(HexicoreError) as e:
        check_resume({**constant, "lr_schedule": "cosine"}, model={}, seed=0, data={}, plan="p", steps=9, optim={})
    assert e.value.field == "train.steps"


# ------------------------------------------------------------------ every optimizer path, distributed
def _equal_to_reference(results, pairs):
    """Every run of ``pairs`` (index, reference index): losses and pre-clip norms within 1e-5
    relative, final weights within 1e-5, and clipping active (norms far above ``clip_grad``)."""
    for i, r in pairs:
        got, ref = results[i]["metrics"], results[r]["metrics"]
        assert _rel(got["losses"], ref["losses"]) <= 1e-5, i
        assert _rel(got["grad_norm"], ref["grad_norm"]) <= 1e-5, (i, got["grad_norm"], ref["grad_norm"])
        assert got["lr"] == ref["lr"] and min(got["grad_norm"]) > 10 * OPTIM["clip_grad"]
        assert _diff(results[i]["state"], results[r]["state"]) <= 1e-5, i


@pytest.mark.slow
def test_tp_asymmetric_zero_1_2_and_stage_replicas_clip_like_one_process():
    """One 6-rank job, clipped (0.01) under cosine with warmup: the asymmetric acceptance plan
    (a TP-2 stage beside a TP-1 pipeline) with plain AdamW, ZeRO-1 (ShardedAdamW) and ZeRO-2
    (ShardedState) over its two pipelines, and Chimera's stage replicas (REDUCE) next to a TP-2
    pipeline and a zero-bubble one — each gives ``parallel=none``'s losses, norms and weights."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions
    from tests.helpers import (CPU6_ACCEPTANCE as ACCEPTANCE, CPU6_PLANS as PLANS, CPU6_SEQ as SEQ, layout_of, tiny,
                               worker_spec)
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=6)
    acc = dataclasses.replace(layout_of(ACCEPTANCE), world=6)
    chimera = layout_of(PLANS["chimera (copies, REDUCE) | tp2 whole model | zb_h1 (I/W split)"])
    runs = ((ref, 0), (acc, 0), (acc, 1), (acc, 2), (chimera, 0))
    results = launch([worker_spec(x, steps=3, seed=5, dtype="fp32", recompute=False, progress=False,
                                  return_state=True, zero=z, **OPTIM) for x, z in runs], 6)
    _equal_to_reference(results, [(i, 0) for i in range(1, len(runs))])


@pytest.mark.slow
def test_hybrid_zero_3_and_tied_embeddings_clip_like_one_process():
    """One 4-rank job, clipped under cosine with warmup: hybrid sharding (two machines, different
    holder counts) under ZeRO-1 and under ZeRO-3 with a TP-2 pipeline, and tied embeddings on
    two two-stage pipelines under ZeRO-2 (the embedding group's copies counted once) — each gives
    its ``parallel=none`` reference's losses, norms and weights."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from hexicore.registry import Registry
    from tests.helpers import CPU6_SEQ as SEQ, worker_spec
    from tests.helpers import TWO_BY_TWO, tied_plan
    from tests.helpers import HYBRID3, _hybrid_plan

    def layout(plan):
        return dataclasses.replace(plan_layout(plan, [p.schedule for p in plan.pipelines],
                                               registry=Registry.default(), seq_len=SEQ), world=4)

    def reference(model):
        return build_layout(model, [(8, [StageGroup((0,), model.layers)], reference_actions(8))], global_batch=8,
                            micro_batch=1, seq_len=SEQ, world=4)

    h1, h3, tied = _hybrid_plan(1), _hybrid_plan(3, pipelines=HYBRID3), tied_plan(TWO_BY_TWO, zero=2)
    machines = tuple(h1.cluster.device(d).machine for d in h1.devices)
    base = {"steps": 3, "seed": 5, "dtype": "fp32", "recompute": False, "progress": False, "return_state": True,
            **OPTIM}
    specs = [worker_spec(reference(h1.model), **base),
             worker_spec(layout(h1), zero=1, machines=machines, **base),
             worker_spec(layout(h3), zero=3, machines=machines, **base),
             worker_spec(reference(tied.model), **base),
             worker_spec(layout(tied), zero=2, **base)]
    results = launch(specs, 4)
    _equal_to_reference(results, [(1, 0), (2, 0), (4, 3)])


def test_plain_adamw_is_fused_on_cuda_only():
    """The AdamW over the tensors ZeRO does not shard runs torch's fused kernel on CUDA; CPU keeps
    the default the one-process references use."""
    import torch

    from hexicore.core.settings import OptimizerSettings
    from hexicore_plugins.runtimes.torch.train.trainer import plain_adamw

    params = [torch.nn.Parameter(torch.zeros(2))]
    assert plain_adamw(params, OptimizerSettings(), torch.device("cpu")).defaults["fused"] is None
    if torch.cuda.is_available():
        cuda = [torch.nn.Parameter(torch.zeros(2, device="cuda"))]
        assert plain_adamw(cuda, OptimizerSettings(), torch.device("cuda")).defaults["fused"] is True


@pytest.mark.slow
def test_compiled_blocks_train_like_eager_ones(tiny):
    """``runtime.compile=true`` (torch.compile of each block, inductor on CPU) trains as the eager
    blocks do, in fp32 (1e-5): the same loss and weights after two steps."""
    from dataclasses import replace

    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import reference_layout
    from tests.helpers import worker_spec

    import torch._dynamo

    model = replace(tiny, layers=2)
    layout = reference_layout(model, global_batch=4, micro_batch=2, seq_len=32)
    torch._dynamo.reset()
    runs = [launch([worker_spec(layout, steps=2, seed=5, dtype="fp32", recompute=False, progress=False,
                                return_state=True, compile=flag)], 1)[0] for flag in (False, True)]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the blocks ran compiled
    assert runs[1]["metrics"]["losses"] == pytest.approx(runs[0]["metrics"]["losses"], rel=1e-5)
    for key, value in runs[0]["state"].items():
        assert (runs[1]["state"][key] - value).abs().max() < 1e-5, key
