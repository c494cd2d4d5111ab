"""``out/final/`` beside the weights, in two cases the first tests left out: a resumed run
(``init_from=`` gives no weights then, but still its ids, generation config and tokenizer), and a
token file made with a bare ``tokenizer.json`` (``final/`` gets a minimal ``tokenizer_config.json``
so that ``AutoTokenizer`` knows the end-of-document token prepare-data appended)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexicore.core.hf_config import SpecialTokens
from hexicore.core.hf_export import TokenizerFiles, data_tokenizer, resolve, tokenizer_config, write_extras
from hexicore.core.token_file import TokenFile
from tests.conftest import run_cli
from tests.helpers import (HF_IDS as IDS, HF_WORDS as WORDS, hf_make_source as make_source,
                           hf_make_tokenizer as make_tokenizer)


CLUSTER = """name: one
inter: {bandwidth_gbs: 1.0, latency_us: 50}
machines:
  - {name: A, gpu: my-gpu, count: 1, bandwidth_gbs: 32, latency_us: 5}
gpus:
  my-gpu: {tflops: 1e2, memory_gb: 16}
"""


def test_a_resumed_plan_run_takes_final_extras_from_init_from_again(tmp_path, capsys):
    """``plan_file=`` + ``init_from=``: the plan carries the model, so ``init_from`` is the only
    source of ids, generation config and tokenizer; a resumed run that gives it again writes the
    same ``final/`` as the run it continues (it used to write config and weights only). A resume
    whose ``init_from`` is not there is one line naming the field."""
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    src = make_source(tmp_path / "src")
    (tmp_path / "c.yaml").write_text(CLUSTER)
    plan = tmp_path / "plan.json"
    assert run_cli(["plan", f"model_file={src}", f"cluster_file={tmp_path / 'c.yaml'}", "train.global_batch=2",
                    "train.seq_len=16", "train.dtype=fp32", f"out={plan}", f"hydra.run.dir={tmp_path / 'p'}"]) == 0
    common = ["train", f"plan_file={plan}", "runtime.progress=false", "train.steps=2", "runtime.lr_schedule=cosine",
              f"hydra.run.dir={tmp_path / 'run'}"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(common + [f"init_from={src}", "train.checkpoint_every=1", f"out={a}"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    resume = f"resume={a / 'checkpoints' / 'step_1'}"
    assert run_cli(common + [resume, f"init_from={tmp_path / 'gone'}", f"out={b}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "init_from: no such directory" in err and "gone" in err, err
    assert not b.exists()
    assert run_cli(common + [resume, f"init_from={src}", f"out={b}"]) == 0, capsys.readouterr().err
    names = sorted(p.name for p in (a / "final").iterdir())
    assert names == sorted(p.name for p in (b / "final").iterdir()) and "generation_config.json" in names
    cfg = json.loads((b / "final" / "config.json").read_text())
    assert {k: cfg[k] for k in IDS} == IDS
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "hexicore_files.json"):
        assert (a / "final" / name).read_bytes() == (b / "final" / name).read_bytes(), name
    assert AutoTokenizer.from_pretrained(b / "final").eos_token == "</s>"


def bare_token_file(tmp_path: Path, specials=("<unk>", "<|endoftext|>", "<pad>")) -> TokenFile:
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    make_tokenizer(50, specials=specials).save(str(tok_dir / "tokenizer.json"))
    (tmp_path / "docs.txt").write_text(" ".join(WORDS) + "\n")
    assert run_cli(["prepare-data", f"input={tmp_path / 'docs.txt'}", f"tokenizer={tok_dir / 'tokenizer.json'}",
                    f"out={tmp_path / 'x.bin'}", f"hydra.run.dir={tmp_path / 'prep'}"]) == 0
    return TokenFile.open(tmp_path / "x.bin")


def test_a_bare_tokenizer_json_gets_a_config_whose_eos_is_the_token_files(tmp_path):
    """prepare-data with a lone ``tokenizer.json``: final/ used to hold only that file, and
    ``AutoTokenizer`` loaded it with no eos. Now a minimal ``tokenizer_config.json`` goes with it
    (listed in the manifest like the copies), its eos the sidecar's; bos/pad of the model's ids
    only where the tokenizer has a special token there."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    tf = bare_token_file(tmp_path)
    found, warnings = data_tokenizer(tf)
    assert warnings == [] and found.eos == tf.eos == 1
    extras, _ = resolve([], found, 64)
    assert extras.names() == ("tokenizer.json", "tokenizer_config.json")
    final = tmp_path / "final"
    final.mkdir()
    write_extras(final, extras)
    tok = AutoTokenizer.from_pretrained(final)
    assert (tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", tf.eos)
    assert "tokenizer_config.json" in json.loads((final / "hexicore_files.json").read_text())["files"]
    # the model's ids: pad 2 is a special token of this tokenizer, bos 5 an ordinary word (left out)
    doc = json.loads(tokenizer_config(found, SpecialTokens(bos=5, eos=(0, 2), pad=2)))
    assert doc == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<pad>"}
    # without a token file's eos, the model's first eos id where it is a special token
    no_eos = TokenizerFiles.directory(tmp_path / "tok")
    assert json.loads(tokenizer_config(no_eos, SpecialTokens(eos=(2, 0))))["eos_token"] == "<pad>"


def test_a_tokenizer_with_its_own_config_gets_none_written(tmp_path):
    src = make_source(tmp_path / "src")
    extras, _ = resolve([("init_from", str(src))], None, 64)
    assert extras.tokenizer_config is None and extras.names().count("tokenizer_config.json") == 1
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    lone = TokenizerFiles.directory(tmp_path / "broken")
    assert json.loads(resolve([], lone, 64)[0].tokenizer_config) == {"tokenizer_class": "PreTrainedTokenizerFast"}
