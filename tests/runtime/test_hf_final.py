"""``out/final/`` as a drop-in Hugging Face directory: special token ids, generation config,
tokenizer files (hexicore/core/hf_export.py), and which of them a rerun may replace.

Every model and tokenizer is built here (``transformers`` random init, a ``tokenizers`` BPE
trained on a few lines, wrapped in ``PreTrainedTokenizerFast``); nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.hf_config import SpecialTokens, hf_config_dict, load_hf_config, special_tokens
from hexicore.core.hf_export import (FinalExtras, TokenizerFiles, data_tokenizer, resolve, write_extras)
from hexicore.core.ownership import FINAL_MANIFEST, check_final_extras, written_by_us
from hexicore.core.token_file import TokenFile
from tests.conftest import model_preset, run_cli
from tests.helpers import (HF_WORDS as WORDS, HF_IDS as IDS, hf_make_tokenizer as make_tokenizer,
                           hf_make_source as make_source)


def train_argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["train", "parallel=none", "train.steps=1", "train.global_batch=2", "train.seq_len=16",
            "train.dtype=fp32", "runtime.progress=false", f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}",
            *extra]


def no_launch(monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a worker was launched"))


# ------------------------------------------------------------------ training runs (in-process, 1 step)
def test_final_is_a_drop_in_directory_and_a_yaml_rerun_takes_it_back(tmp_path, capsys):
    """From a Hugging Face directory: final/ loads with AutoModelForCausalLM and AutoTokenizer,
    carries the source's ids and generation config, and generates. A rerun from a hexicore model
    YAML into the same out writes none of them and removes the ones the first run wrote, but
    not a user's file beside them."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = make_source(tmp_path / "src")
    assert run_cli(train_argv(tmp_path, f"model_file={src}", f"init_from={src}")) == 0, capsys.readouterr().err
    final = tmp_path / "out" / "final"
    cfg = json.loads((final / "config.json").read_text())
    assert {k: cfg[k] for k in IDS} == IDS
    assert GenerationConfig.from_pretrained(final).to_dict() == GenerationConfig.from_pretrained(src).to_dict()
    assert (final / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()
    tok, theirs = AutoTokenizer.from_pretrained(final), AutoTokenizer.from_pretrained(src)
    assert tok("the quick fox").input_ids == theirs("the quick fox").input_ids
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    assert model.config.eos_token_id == [2, 3] and model.generation_config.eos_token_id == [2, 3]
    prompt = torch.tensor([tok("the quick fox").input_ids])
    out = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert prompt.shape[1] < out.shape[1] <= prompt.shape[1] + 3 and out[0, :prompt.shape[1]].equal(prompt[0])
    (final / "notes.txt").write_text("mine")
    assert run_cli(train_argv(tmp_path, "model=tiny", "model.layers=2")) == 0, capsys.readouterr().err
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert not set(IDS) & set(json.loads((final / "config.json").read_text()))


def test_a_source_generation_config_that_is_not_json_is_one_line_before_any_worker(tmp_path, capsys, monkeypatch):
    src = make_source(tmp_path / "src", tokenizer=False)
    (src / "generation_config.json").write_text('{"eos_token_id": [2, 3],')
    no_launch(monkeypatch)
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, f"model_file={src}", f"init_from={src}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generation_config.json" in err and "malformed JSON" in err, err
    assert not (tmp_path / "out" / "final").exists()


@pytest.mark.parametrize("edit, field", [
    (("config.json", "eos_token_id", "2"), "eos_token_id"),
    (("config.json", "bos_token_id", 64), "bos_token_id"),
    (("generation_config.json", "pad_token_id", [3]), "pad_token_id"),
    (("generation_config.json", "eos_token_id", []), "eos_token_id"),
])
def test_bad_special_token_ids_are_one_line_naming_the_field(tmp_path, capsys, monkeypatch, edit, field):
    """An id that is no id (a string, a list for bos/pad, an empty list) or lies outside the
    model's vocabulary (64) would end in transformers' generate, long after training."""
    src = make_source(tmp_path / "src", tokenizer=False)
    name, key, value = edit
    doc = json.loads((src / name).read_text())
    doc[key] = value
    (src / name).write_text(json.dumps(doc))
    no_launch(monkeypatch)
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, f"model_file={src}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}: {field}:" in err, err


def test_an_init_from_config_that_is_not_json_is_one_line(tmp_path, capsys, monkeypatch):
    """Its ids would go to final/: a config.json there that is no JSON object is named, not
    skipped (before, the tensors alone were checked and the broken config was ignored)."""
    src = make_source(tmp_path / "src", tokenizer=False)
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    (weights / "config.json").write_text("[1, 2]")
    no_launch(monkeypatch)
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, f"model_file={src}", f"init_from={weights}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(weights / "config.json") in err, err


def test_a_users_tokenizer_in_final_is_refused_before_any_worker(tmp_path, capsys, monkeypatch):
    src = make_source(tmp_path / "src")
    final = tmp_path / "out" / "final"
    final.mkdir(parents=True)
    (final / "tokenizer.json").write_text("{}")
    no_launch(monkeypatch)
    capsys.readouterr()
    assert run_cli(train_argv(tmp_path, f"model_file={src}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "final/tokenizer.json" in err and "overwrite=true" in err, err
    assert (final / "tokenizer.json").read_text() == "{}"


@pytest.mark.slow
def test_token_file_tokenizer_wins_in_a_sharded_two_rank_run(tmp_path, capsys):
    """``runtime.data=tokens``: the tokenizer prepare-data read goes to final/ (with its
    directory's other tokenizer files), one warning says it differs from the model's; the
    per-stage shards' rank 0 still writes ids and generation config."""
    from transformers import AutoTokenizer

    src = make_source(tmp_path / "src")
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    make_tokenizer(50, specials=("<unk>", "<|endoftext|>")).save(str(tok_dir / "tokenizer.json"))
    (tmp_path / "docs.txt").write_text("\n".join(" ".join(WORDS[i:]) for i in range(len(WORDS))) * 20)
    assert run_cli(["prepare-data", f"input={tmp_path / 'docs.txt'}", f"tokenizer={tok_dir}", f"out={tmp_path / 'x.bin'}",
                    f"hydra.run.dir={tmp_path / 'prep'}"]) == 0
    capsys.readouterr()
    argv = train_argv(tmp_path, f"model_file={src}", f"init_from={src}", "runtime.data=tokens",
                      f"runtime.data_file={tmp_path / 'x.bin'}", "runtime.shard_mb=0.01")
    argv[1] = "pipeline.ranks=2"
    assert run_cli(argv) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(tok_dir) in warnings[0] and "token file's" in warnings[0], err
    final = tmp_path / "out" / "final"
    assert (final / "model.safetensors.index.json").is_file()
    assert (final / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    # a bare tokenizer.json: a minimal config, its eos the token file's end-of-document id
    assert json.loads((final / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    text = " ".join(WORDS[:5])
    assert AutoTokenizer.from_pretrained(final)(text).input_ids == AutoTokenizer.from_pretrained(tok_dir)(text).input_ids
    assert json.loads((final / "generation_config.json").read_text())["eos_token_id"] == [2, 3]


# ------------------------------------------------------------------ the parts, without training
def test_special_tokens_are_read_checked_and_written_only_when_given():
    tiny = model_preset("tiny")
    assert "eos_token_id" not in hf_config_dict(tiny)
    tokens = special_tokens({"bos_token_id": 1, "eos_token_id": [2, 7], "pad_token_id": None}, "c.json", 100)
    assert tokens == SpecialTokens(1, (2, 7), None) and tokens
    assert hf_config_dict(tiny, tokens)["eos_token_id"] == [2, 7] and "pad_token_id" not in hf_config_dict(tiny, tokens)
    assert not special_tokens({}, "c.json") and special_tokens({"pad_token_id": -1}, "c.json", 10).pad == -1
    with pytest.raises(HexicoreError, match="pad_token_id: expected an integer id or null, got True"):
        special_tokens({"pad_token_id": True}, "c.json")
    with pytest.raises(HexicoreError, match="c.json: eos_token_id: id 100 is outside the vocabulary of 100"):
        special_tokens({"eos_token_id": [1, 100]}, "c.json", 100)


def test_the_ids_stay_out_of_the_model_spec(tmp_path):
    """The model spec (plans, resume identity) is the same with or without ids in config.json."""
    src = make_source(tmp_path / "src", tokenizer=False, generation=False)
    with_ids = load_hf_config(src)
    doc = json.loads((src / "config.json").read_text())
    for k in IDS:
        doc.pop(k)
    (src / "config.json").write_text(json.dumps(doc))
    assert load_hf_config(src) == with_ids and with_ids.to_dict() == load_hf_config(src).to_dict()


def source_dir(root: Path, name: str, *, ids=None, gen=None, tok: str | None = None) -> str:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(ids or {}))
    if gen is not None:
        (d / "generation_config.json").write_text(json.dumps(gen))
    if tok is not None:
        (d / "tokenizer.json").write_text(tok)
        (d / "tokenizer_config.json").write_text("{}")
    return str(d)


def test_each_part_comes_from_the_first_source_that_has_it(tmp_path):
    a = source_dir(tmp_path, "a", ids={"eos_token_id": 2})
    b = source_dir(tmp_path, "b", ids={"eos_token_id": 5}, gen={"eos_token_id": 5}, tok='{"t": 1}')
    extras, warnings = resolve([("model_file", a), ("init_from", b)], None, 64)
    assert extras.tokens == SpecialTokens(eos=2) and extras.generation == str(Path(b) / "generation_config.json")
    assert extras.tokenizer.origin == b and [n for n, _ in extras.tokenizer.files] == ["tokenizer.json",
                                                                                       "tokenizer_config.json"]
    assert len(warnings) == 1 and "special token ids" in warnings[0] and "model_file's" in warnings[0]
    assert extras.names() == ("generation_config.json", "tokenizer.json", "tokenizer_config.json")
    same, none = resolve([("model_file", b), ("init_from", b)], None, 64)
    assert none == [] and same.tokens == SpecialTokens(eos=5)
    # a config.json-named file brings its directory; another name does not
    odd = Path(b) / "other.json"
    odd.write_text(json.dumps({"bos_token_id": 4}))
    lone, _ = resolve([("model_file", str(odd))], None, 64)
    assert lone == FinalExtras(SpecialTokens(bos=4)) and lone.names() == ("generation_config.json",)
    assert json.loads(lone.contents()["generation_config.json"]) == {"bos_token_id": 4}
    assert resolve([("model_file", str(Path(a) / "config.json"))], None, 64)[0].generation is None


def test_the_token_files_tokenizer_wins_and_a_same_one_is_quiet(tmp_path):
    b = source_dir(tmp_path, "b", tok='{"t": 1}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tokenizer.json").write_text('{"t": 2}')
    theirs = TokenizerFiles.directory(tmp_path / "data")
    extras, warnings = resolve([("init_from", b)], theirs, 64)
    assert extras.tokenizer == theirs and len(warnings) == 1 and "differs" in warnings[0]
    (tmp_path / "data" / "tokenizer.json").write_text('{"t": 1}')
    extras, warnings = resolve([("init_from", b)], TokenizerFiles.directory(tmp_path / "data"), 64)
    assert warnings == [] and extras.tokenizer.origin == b  # the same tokenizer: the model's fuller set


def test_prepare_data_records_its_tokenizer_and_a_changed_one_is_not_copied(tmp_path, capsys):
    tok = tmp_path / "tok"
    tok.mkdir()
    make_tokenizer(40, specials=("<unk>", "</s>")).save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    (tmp_path / "d.txt").write_text("the quick brown fox\n" * 50)
    assert run_cli(["prepare-data", f"input={tmp_path / 'd.txt'}", f"tokenizer={tok / 'tokenizer.json'}",
                    f"out={tmp_path / 'x.bin'}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    tf = TokenFile.open(tmp_path / "x.bin")
    assert tf.tokenizer_file == str((tok / "tokenizer.json").resolve()) and len(tf.tokenizer_sha256) == 64
    found, warnings = data_tokenizer(tf)
    assert warnings == [] and [n for n, _ in found.files] == ["tokenizer.json", "tokenizer_config.json"]
    make_tokenizer(45, specials=("<unk>", "</s>")).save(str(tok / "tokenizer.json"))
    found, warnings = data_tokenizer(TokenFile.open(tmp_path / "x.bin"))
    assert found is None and len(warnings) == 1 and "changed since prepare-data" in warnings[0]
    (tok / "tokenizer.json").unlink()
    found, warnings = data_tokenizer(TokenFile.open(tmp_path / "x.bin"))
    assert found is None and "is gone" in warnings[0]


def test_an_older_sidecar_names_its_tokenizer_as_given(tmp_path, monkeypatch):
    from hexicore.core.token_file import write_sidecar

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.bin").write_bytes(bytes(40))
    write_sidecar(tmp_path / "x.bin", {"dtype": "uint16", "vocab": 50, "tokens": 20, "tokenizer": "my.json"})
    assert data_tokenizer(TokenFile.open(tmp_path / "x.bin"))[0] is None  # not there: a warning, no tokenizer
    (tmp_path / "my.json").write_text('{"t": 3}')
    found, warnings = data_tokenizer(TokenFile.open(tmp_path / "x.bin"))
    assert warnings == [] and found.files == (("tokenizer.json", "my.json"),)
    write_sidecar(tmp_path / "x.bin", {"dtype": "uint16", "vocab": 50, "tokens": 20, "tokenizer_sha256": 5})
    with pytest.raises(HexicoreError, match="x.bin.json: tokenizer_sha256: expected text, got 5"):
        TokenFile.open(tmp_path / "x.bin")


def test_a_rerun_replaces_its_own_files_and_never_a_users(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    one = source_dir(tmp_path, "one", tok='{"v": 1}')
    (Path(one) / "merges.txt").write_text("a b\n")
    first = FinalExtras(SpecialTokens(eos=2), None, TokenizerFiles.directory(one))
    write_extras(final, first)
    assert {p.name for p in final.iterdir()} == {FINAL_MANIFEST, "generation_config.json", "tokenizer.json",
                                                 "tokenizer_config.json", "merges.txt"}
    assert all(written_by_us(final, n) for n in first.names())
    check_final_extras(final, first.names())  # a rerun may replace them
    (final / "tokenizer_config.json").write_text('{"edited": true}')  # the user's now
    with pytest.raises(HexicoreError, match="tokenizer_config.json: out: exists and is not a file an earlier run wrote"):
        check_final_extras(final, first.names())
    check_final_extras(final, first.names(), overwrite=True)
    with pytest.raises(HexicoreError, match="generation_config.json: out: exists and overwrite=false"):
        check_final_extras(final, first.names(), overwrite=False)
    two = source_dir(tmp_path, "two", tok='{"v": 2}')
    (Path(two) / "tokenizer_config.json").unlink()
    write_extras(final, FinalExtras(SpecialTokens(eos=3), None, TokenizerFiles.directory(two)))
    assert json.loads((final / "generation_config.json").read_text()) == {"eos_token_id": 3}
    assert (final / "tokenizer.json").read_text() == '{"v": 2}'
    assert not (final / "merges.txt").exists()  # ours and no longer written: gone
    assert (final / "tokenizer_config.json").read_text() == '{"edited": true}'  # changed by the user: kept
    listed = json.loads((final / FINAL_MANIFEST).read_text())["files"]
    assert sorted(listed) == ["generation_config.json", "tokenizer.json"]
    write_extras(final, None)
    assert {p.name for p in final.iterdir()} == {"tokenizer_config.json"}


def test_a_writer_killed_midway_leaves_files_a_rerun_recognises(tmp_path, monkeypatch):
    """The manifest lists the old and the new digest while the files are replaced."""
    from hexicore.core import schema

    final = tmp_path / "final"
    final.mkdir()
    write_extras(final, FinalExtras(SpecialTokens(eos=2)))
    real = schema.write_bytes_atomic

    def dies_after_one(path, data):  # the first file replaced, then the writer is killed
        out = real(path, data)
        if Path(path).name != FINAL_MANIFEST:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(schema, "write_bytes_atomic", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        write_extras(final, FinalExtras(SpecialTokens(eos=5)))
    monkeypatch.undo()
    assert json.loads((final / "generation_config.json").read_text()) == {"eos_token_id": 5}
    check_final_extras(final, ["generation_config.json"])  # still ours


def test_only_tokenizer_and_generation_files_are_ever_removed(tmp_path):
    """A manifest that lists another name (written by hand, or by a later hexicore) with the
    right digest does not make a rerun delete that file: the weights are not the manifest's."""
    from hexicore.core.ownership import file_digest

    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"weights")
    (final / "tokenizer.model").write_bytes(b"spm")
    doc = {"format": "hexicore.final_files/1", "files": {"model.safetensors": [file_digest(final / "model.safetensors")],
                                                         "tokenizer.model": [file_digest(final / "tokenizer.model")]}}
    (final / FINAL_MANIFEST).write_text(json.dumps(doc))
    write_extras(final, None)
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors"]
