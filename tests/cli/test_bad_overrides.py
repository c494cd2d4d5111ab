"""Every bad override is one line and exit 2 before any work (the solver, cost and runtime
sections validate their parameters and name ``solver.time_limit`` etc.), and the torch runtime's
thread setting follows the machine (plugins/runtimes/torch/launch/launcher.py)."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

CASES = [
    (["plan", "solver=cpsat", "solver.time_limit=abc"], "solver.time_limit"),
    (["plan", "solver=cpsat", "solver.time_limit=-5"], "solver.time_limit"),
    (["plan", "solver.time_limit=0"], "solver.time_limit"),
    (["plan", "solver=cpsat", "solver.workers=abc"], "solver.workers"),
    (["plan", "cost.default_efficiency=5"], "cost.default_efficiency"),
    (["plan", "cost.default_efficiency=abc"], "cost.default_efficiency"),
    (["train", "parallel=none", "runtime.lr=abc"], "runtime.lr"),
    (["train", "parallel=none", "runtime.timeout_s=abc"], "runtime.timeout_s"),
    (["train", "parallel=none", "train.seq_len=0"], "train.seq_len"),
    (["plan", "seed=abc"], "seed"),
    (["train", "parallel=none", "train.steps=abc"], "train.steps"),
    (["train", "parallel=none", "+model.head_dim=7"], "model.head_dim"),
    (["train", "parallel=none", "runtime.start_method=foo"], "runtime.start_method"),
    (["train", "parallel=none", "runtime.progress=maybe"], "runtime.progress"),
    (["train", "parallel=none", "runtime.lr_schedule=cosin"], "runtime.lr_schedule"),
    (["train", "parallel=none", "runtime.warmup_steps=-1"], "runtime.warmup_steps"),
    (["train", "parallel=none", "runtime.warmup_steps=1.5"], "runtime.warmup_steps"),
    (["train", "parallel=none", "train.steps=2", "runtime.warmup_steps=3"], "runtime.warmup_steps"),
    (["train", "parallel=none", "runtime.min_lr=-1e-5"], "runtime.min_lr"),
    (["train", "parallel=none", "runtime.lr=1e-4", "runtime.min_lr=2e-4"], "runtime.min_lr"),
    (["train", "parallel=none", "runtime.clip_grad=0"], "runtime.clip_grad"),
    (["train", "parallel=none", "runtime.clip_grad=-1.0"], "runtime.clip_grad"),
    (["train", "parallel=none", "runtime.clip_grad=abc"], "runtime.clip_grad"),
    (["train", "parallel=none", "runtime.fault=abc"], "runtime.fault"),
    (["train", "parallel=none", "runtime.fault=5"], "runtime.fault"),
    (["train", "parallel=none", "runtime.fault={x: 1}"], "runtime.fault.x"),
    (["train", "parallel=none", "runtime.fault={rank: 0, step: 1, kind: foo}"], "runtime.fault.kind"),
    (["train", "parallel=none", "runtime.fault={rank: 5, step: 0, kind: die}"], "runtime.fault.rank"),
    (["train", "parallel=none", "train.steps=2", "runtime.fault={rank: 0, step: 99, kind: die}"], "runtime.fault.step"),
    (["train", "parallel=none", "runtime.fault={step: 1, kind: die}"], "runtime.fault.rank"),
    (["train", "pipeline.ranks=2", "train.global_batch=4", "runtime.fault={rank: 2, kind: die}"], "runtime.fault.rank"),
    (["plan", "solver.seeds=[nope]"], "solver.seeds"),
    # a removed group or section: the command would fall back on a default of its own (``~solver``
    # ran megatron) or stop with a traceback (``~cluster``, ``~train``)
    (["plan", "~solver"], "solver"),
    (["plan", "~cluster"], "cluster"),
    (["plan", "~train"], "train"),
    (["simulate", "~schedule"], "schedule"),
    (["simulate", "~pipeline"], "pipeline"),
]


@pytest.mark.parametrize("argv,field", CASES, ids=[" ".join(c[0][1:]) for c in CASES])
def test_bad_override_is_one_line_exit_2(argv, field, tmp_path, capsys):
    out = tmp_path / "out.json" if argv[0] == "plan" else tmp_path / "run"
    code = run_cli([argv[0], "model=tiny", *argv[1:], f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and field in err and "Traceback" not in err, err
    assert not out.exists()


FILE_CASES = [
    (["plan", "model_file={model}", "model.layers=4"], "model.layers", "model_file="),
    (["plan", "model_file={model}", "model=tiny"], "model", "model_file="),
    (["plan", "cluster_file={cluster}", "cluster=hetero1"], "cluster", "cluster_file="),
    (["plan", "cluster_file={cluster}", "cluster.inter.bandwidth_gbs=5"], "cluster.inter.bandwidth_gbs", "cluster_file="),
    (["evaluate", "plan_file={plan}", "model_file={model}"], "model_file", "plan_file="),
    (["train", "plan_file={plan}", "cluster_file={cluster}", "train.steps=1"], "cluster_file", "plan_file="),
    (["evaluate", "plan_file={plan}", "model=llama2_70b"], "model", "plan_file="),
    (["evaluate", "plan_file={plan}", "model.layers=80"], "model.layers", "plan_file="),
    (["evaluate", "plan_file={plan}", "cluster=hetero1"], "cluster", "plan_file="),
    (["evaluate", "plan_file={plan}", "cluster.inter.bandwidth_gbs=5"], "cluster.inter.bandwidth_gbs", "plan_file="),
    (["evaluate", "plan_file={plan}", "exclude=[A.0]"], "exclude", "plan_file="),
    (["train", "plan_file={plan}", "model=tiny", "train.steps=1"], "model", "plan_file="),
]


@pytest.mark.parametrize("argv,field,beside", FILE_CASES, ids=[" ".join(c[0][1:]) for c in FILE_CASES])
def test_an_override_a_file_makes_void_is_refused(argv, field, beside, tmp_path, capsys):
    """``model.layers=4`` beside ``model_file=`` (or anything beside ``plan_file=`` that the plan
    carries) was silently ignored: it is one line naming the key, exit 2, nothing written."""
    files = {"model": tmp_path / "m.yaml", "cluster": tmp_path / "c.yaml", "plan": tmp_path / "p.json"}
    files["model"].write_text("{name: m, layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 128, seq_len: 16}\n")
    files["cluster"].write_text("machines: [{name: A, gpu: rtx3090, count: 2, bandwidth_gbs: 16}]\n")
    assert run_cli(["plan", f"model_file={files['model']}", f"cluster_file={files['cluster']}",
                    "train.global_batch=4", f"out={files['plan']}"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    code = run_cli([a.format(**files) for a in argv] + [f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{field}:" in err and beside in err, err
    assert not out.exists()


def test_threads_divide_the_free_cores_and_are_printed(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch import launcher as launch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launch, "usable_cores", lambda: 8)
    try:
        monkeypatch.setattr(launch.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        assert launch.set_threads(1, announce=True) == 8 == torch.get_num_threads()
        assert "torch threads per rank: 8 (8 cores, load 0, 1 local rank)" in capsys.readouterr().out
        assert launch.set_threads(3) == 2  # an idle machine split among three local ranks
        monkeypatch.setattr(launch.os, "getloadavg", lambda: (6.5, 0.0, 0.0))
        assert launch.set_threads(1) == 2  # six cores kept busy by others: use the two left
        assert launch.set_threads(4) == 1
        monkeypatch.setattr(launch.os, "getloadavg", lambda: (20.0, 0.0, 0.0))
        assert launch.set_threads(1) == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(3)
        assert launch.set_threads(2, announce=True) == 3 and "OMP_NUM_THREADS" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


SWEEPS = [
    (["plan", "-m", "train.global_batch=4,abc"], "sweep value train.global_batch=abc"),
    (["train", "-m", "parallel=none", "train.global_batch=4,abc"], "sweep value train.global_batch=abc"),
    # a key of one swept group option only (Hydra's multi-line error, exit 1, before)
    (["simulate", "-m", "schedule=hanayo,gpipe", "schedule.max_waves=3"],
     "schedule.max_waves: sweep value schedule=gpipe: unknown key"),
    (["plan", "-m", "solver=hexiscale,megatron", "solver.tau=3"], "solver.tau: sweep value solver=megatron"),
    (["plan", "cluster=hetero1,hetero2"], "add -m"),
    (["plan", "train.global_batch=4,8"], "add -m"),
]


@pytest.mark.parametrize("argv,text", SWEEPS, ids=[" ".join(c[0]) for c in SWEEPS])
def test_a_bad_sweep_is_one_line_exit_2_before_any_job(argv, text, tmp_path, capsys):
    """A sweep value of the wrong type (Hydra checks every job's overrides before running any)
    and several values without -m are one line naming the override, exit 2, nothing written."""
    code = run_cli([argv[0], "model=tiny", *argv[1:], f"hydra.sweep.dir={tmp_path / 's'}",
                    f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and text in err and "Traceback" not in err, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv,key", [
    (["simulate", "-m", "schedule=gpipe,1f1b"], "hydra.sweep.dir"),
    (["simulate", "schedule=gpipe"], "hydra.run.dir"),
])
@pytest.mark.parametrize("below", ["", "sub"])
def test_a_run_or_sweep_directory_that_is_a_file(argv, key, below, tmp_path, capsys):
    """Hydra's mkdir of it ended the command with a traceback (a sweep's also warned in the callback)."""
    (tmp_path / "f").write_text("mine\n")
    code = run_cli([*argv, "pipeline.ranks=2", f"{key}={tmp_path / 'f' / below}".rstrip("/")])
    err = capsys.readouterr().err.strip().splitlines()
    want = f"hexicore: error: command line: {key}: {tmp_path / 'f'} is a file, not a directory"
    assert code == 2 and err == [want], err
    assert (tmp_path / "f").read_text() == "mine\n"
