"""Where a run's weights come from, as ``from_pretrained`` users expect: ``model_file=DIR`` holding
weights starts from them, ``init_from=none`` from a fresh initialisation, and the run says which.
A token file given beside the default data trains on it, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import hf_make_source as make_source


def train_argv(tmp_path: Path, out: str, *extra: str) -> list[str]:
    return ["train", "parallel=none", "train.steps=1", "train.global_batch=2", "train.seq_len=16",
            "train.dtype=fp32", "runtime.progress=false", f"out={tmp_path / out}", f"hydra.run.dir={tmp_path / 'run'}",
            *extra]


def first_loss(tmp_path: Path, out: str) -> float:
    return json.loads((tmp_path / out / "metrics.json").read_text())["losses"][0]


def test_model_file_dir_starts_from_its_weights_and_init_from_none_does_not(tmp_path, capsys):
    src = make_source(tmp_path / "src")
    assert run_cli(train_argv(tmp_path, "given", f"model_file={src}", f"init_from={src}")) == 0
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, "implied", f"model_file={src}")) == 0
    said = capsys.readouterr().out
    assert f"starting from the weights in {src}" in said
    assert first_loss(tmp_path, "implied") == first_loss(tmp_path, "given")
    assert run_cli(train_argv(tmp_path, "fresh", f"model_file={src}", "init_from=none")) == 0
    assert "starting from a fresh initialisation (seed 0)" in capsys.readouterr().out
    assert first_loss(tmp_path, "fresh") != first_loss(tmp_path, "given")


def test_a_config_alone_is_a_fresh_start_and_pickled_weights_are_one_line(tmp_path, capsys, monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    src = make_source(tmp_path / "src")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_bytes((src / "config.json").read_bytes())
    assert run_cli(train_argv(tmp_path, "bare", f"model_file={bare}")) == 0
    assert "starting from a fresh initialisation" in capsys.readouterr().out
    (bare / "pytorch_model.bin").write_bytes(b"not read")
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a worker was launched"))
    assert run_cli(train_argv(tmp_path, "pickled", f"model_file={bare}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pytorch_model.bin" in err and "init_from=none" in err and str(bare) in err
    assert not (tmp_path / "pickled").exists()


def test_a_token_file_beside_the_default_data_is_trained_on(tmp_path, capsys):
    from hexicore.core.token_file import sidecar_path

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)))
    tok = tmp_path / "tok.json"
    from tests.helpers import hf_make_tokenizer

    hf_make_tokenizer(60).save(str(tok))
    assert run_cli(["prepare-data", f"input={corpus}", f"tokenizer={tok}", f"out={tmp_path / 'c.bin'}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    base = ["model=tiny", "model.vocab=64"]
    assert run_cli(train_argv(tmp_path, "tokens", *base, "runtime.data=tokens", f"runtime.data_file={tmp_path / 'c.bin'}")) == 0
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, "implied", *base, f"runtime.data_file={tmp_path / 'c.bin'}")) == 0
    assert "runtime.data=tokens, implied by runtime.data_file" in capsys.readouterr().err
    assert first_loss(tmp_path, "implied") == first_loss(tmp_path, "tokens")
    sidecar_path(tmp_path / "c.bin").unlink()
    assert run_cli(train_argv(tmp_path, "raw", *base, f"runtime.data_file={tmp_path / 'c.bin'}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runtime.data" in err and "runtime.data=text" in err
    assert not (tmp_path / "raw").exists()
