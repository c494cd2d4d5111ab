"""A run's folder holds what repeats it: ``out/config.yaml``, the resolved configuration (every
key, the optimizer's betas, eps, weight decay and clipping among them), which Hydra reads back;
another optimizer setting repeats too (``runtime.betas``)."""

from __future__ import annotations

import json

import yaml

from tests.conftest import run_cli

RUN = ["train", "parallel=none", "model=tiny", "model.layers=2", "train.steps=2", "train.global_batch=2",
       "train.seq_len=16", "train.dtype=fp32", "runtime.progress=false", "runtime.clip_grad=1.0",
       "runtime.weight_decay=0.05"]


def test_the_run_folder_repeats_the_run(tmp_path, capsys):
    first = tmp_path / "first"
    assert run_cli([*RUN, f"out={first}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    text = (first / "config.yaml").read_text()
    assert text.startswith("# hexicore.run_config/1")
    cfg = yaml.safe_load(text)
    assert cfg["runtime"]["weight_decay"] == 0.05 and cfg["runtime"]["clip_grad"] == 1.0
    assert cfg["model"]["layers"] == 2 and cfg["cluster"]["machines"] and cfg["out"] == str(first)
    assert {k: cfg["runtime"][k] for k in ("lr", "betas", "eps", "lr_schedule")} == \
        {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-5, "lr_schedule": "constant"}
    metrics = json.loads((first / "metrics.json").read_text())
    capsys.readouterr()
    again = tmp_path / "again"
    assert run_cli(["train", "--config-path", str(first), "--config-name", "config", f"out={again}",
                    f"hydra.run.dir={tmp_path / 'run2'}"]) == 0, capsys.readouterr().err
    assert json.loads((again / "metrics.json").read_text())["losses"] == metrics["losses"]
    assert run_cli([*RUN, f"out={first}", f"hydra.run.dir={tmp_path / 'run3'}"]) == 0  # its own config.yaml: replaced


def test_a_users_config_yaml_in_out_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.yaml").write_text("mine: true\n")
    assert run_cli([*RUN, f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.yaml" in err
    assert (out / "config.yaml").read_text() == "mine: true\n" and not (out / "metrics.json").exists()


def test_betas_are_a_setting_and_bad_ones_are_one_line(tmp_path, capsys):
    assert run_cli([*RUN, "runtime.betas=[0.8,0.9]", f"out={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'r'}"]) == 0
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["runtime"]["betas"] == [0.8, 0.9]
    capsys.readouterr()
    assert run_cli([*RUN, "runtime.betas=[0.9,1.5]", f"out={tmp_path / 'b'}", f"hydra.run.dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runtime.betas" in err


def test_resuming_with_other_betas_is_refused(tmp_path, capsys):
    out = tmp_path / "a"
    assert run_cli([*RUN, "train.checkpoint_every=2", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"]) == 0
    capsys.readouterr()
    args = [a for a in RUN if not a.startswith("train.steps=")]
    assert run_cli([*args, "train.steps=3", f"resume={out / 'checkpoints' / 'step_2'}", "runtime.betas=[0.8,0.9]",
                    f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runtime.betas" in err
    assert run_cli([*args, "train.steps=3", f"resume={out / 'checkpoints' / 'step_2'}", f"out={out}",
                    f"hydra.run.dir={tmp_path / 'r'}"]) == 0
