"""Training metrics where training tools read them: ``runtime.log=tensorboard`` writes event
files under ``out/tensorboard/`` that TensorBoard's own reader reads back (a 2-rank run);
``runtime.log=wandb`` writes an offline W&B run under ``out/wandb/`` (skipped without wandb);
asking for a logger that is not installed is one line before any worker starts."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import run_cli

RUN = ["train", "schedule=1f1b", "pipeline.ranks=2", "model=tiny", "model.layers=2", "train.steps=3",
       "train.global_batch=4", "train.seq_len=16", "train.dtype=fp32", "runtime.progress=false"]


@pytest.mark.slow
def test_tensorboard_reads_back_a_two_rank_runs_scalars(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run_cli([*RUN, "runtime.log=tensorboard", f"out={out}"]) == 0, capsys.readouterr().err
    runs = sorted((out / "tensorboard").iterdir())
    assert [r.name for r in runs] == ["run-1"]
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_s",
            "measured/step_s"} <= tags
    import json

    losses = json.loads((out / "metrics.json").read_text())["losses"]
    logged = [e.value for e in events.Scalars("train/loss")]
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2]
    assert logged == pytest.approx(losses, rel=1e-6)


@pytest.mark.slow
def test_wandb_offline_writes_its_run(tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert run_cli([*RUN, "runtime.log=wandb", f"out={out}"]) == 0, capsys.readouterr().err
    assert list((out / "wandb").glob("offline-run-*"))


def test_a_logger_that_is_not_installed_is_one_line(tmp_path, capsys, monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a worker was launched"))
    assert run_cli([*RUN, "runtime.log=wandb", f"out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hexicore[wandb]" in err and "runtime.log" in err
    assert run_cli([*RUN, "runtime.log=csv", f"out={tmp_path / 'o'}"]) == 2
    assert "runtime.log" in capsys.readouterr().err
