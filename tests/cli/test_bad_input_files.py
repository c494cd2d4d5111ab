"""Model files, Hugging Face configs, cluster files and prepare-data inputs that used to end in a
traceback (or be trained on and fail in a worker): each is one line naming the file and the
field, exit status 2, nothing written."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli

MODEL = {"name": "x", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256, "seq_len": 32}
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
      "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
CLUSTER = {"name": "c", "inter": {"bandwidth_gbs": 2, "latency_us": 50},
           "machines": [{"name": "F0", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32}]}


def _one_line(code, capsys, source, field, tmp_path, out):
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("hexicore: error: ") and f"{source}: {field}:" in lines[0], err
    assert not (tmp_path / out).exists()


@pytest.mark.parametrize("change,field", [
    ({"rope_scaling": {"rope_type": "weird", "factor": 2}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "x", "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": 16}}, "rope_scaling.factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "rope_scaling.low_freq_factor"),
    ({"hf_model_type": "gpt2"}, "model.hf_model_type"),  # a type planning reads by shape; the runtime refuses it
    ({"max_position": 16}, "max_position"),  # below the model's own seq_len 32: was accepted
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": 16.5}},  # config.json got 16, the runtime used 16.5
     "rope_scaling.original_max_position_embeddings"),
])
def test_model_file_fields_the_runtime_cannot_train_are_refused_before_launch(change, field, tmp_path, capsys):
    """These used to pass the reader and fail inside training (rope) or after it, with the
    weights half written (hf_model_type)."""
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**MODEL, **change}))
    code = run_cli(["train", "parallel=none", f"model_file={tmp_path / 'm.yaml'}", "train.steps=1",
                    "train.global_batch=2", "train.dtype=fp32", f"out={tmp_path / 'o'}",
                    f"hydra.run.dir={tmp_path / 'h'}"])
    _one_line(code, capsys, "m.yaml", field, tmp_path, "o")


@pytest.mark.parametrize("change,field", [
    ({"architectures": None, "model_type": ["llama"]}, "model_type"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": "abc"}, "sliding_window"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": [4]}, "sliding_window"),
    ({"attention_bias": "false"}, "attention_bias"),  # was bool("false"): biases added
])
def test_bad_hf_config_fields(change, field, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**HF, **change}))
    code = run_cli(["plan", f"model_file={tmp_path / 'hf'}", "cluster=tight8", "solver=megatron",
                    f"out={tmp_path / 'p.json'}", f"hydra.run.dir={tmp_path / 'h'}"])
    _one_line(code, capsys, "config.json", field, tmp_path, "p.json")


@pytest.mark.parametrize("change,field", [
    ({"excluded": [["F0.0"]]}, "excluded"),
    ({"machines": None, "inter": None, "synthetic": {"gpus": 8, "mix": {}}}, "synthetic.mix"),
    ({"emulate": {"links": "yes"}}, "emulate.links"),  # emulated links: a flag, nothing else
    ({"emulate": {"link": True}}, "emulate.link"),
    ({"emulate": {}}, "emulate"),
    ({"emulate": {"tflops": 1.0}}, "emulate.tflops"),  # a machine's key, not the cluster's
])
def test_bad_cluster_fields(change, field, tmp_path, capsys):
    doc = {k: v for k, v in {**CLUSTER, **change}.items() if v is not None}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    code = run_cli(["plan", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", "solver=megatron",
                    f"out={tmp_path / 'p.json'}", f"hydra.run.dir={tmp_path / 'h'}"])
    _one_line(code, capsys, "c.yaml", field, tmp_path, "p.json")


@pytest.mark.parametrize("inputs,extra,source,field", [
    ({"b.jsonl": b'\xff\xfe{"text": "a"}\n'}, [], "b.jsonl", "line 1"),
    ({"a.txt": b"some text"}, ["prepare.batch_docs=0"], "command line", "prepare.batch_docs"),
    ({}, ["input=[]"], "command line", "input"),
])
def test_bad_prepare_data_inputs(inputs, extra, source, field, tmp_path, capsys, monkeypatch):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "</s>": 1, "a": 2}, unk_token="<unk>"))
    tok.save(str(tmp_path / "tok.json"))
    for name, data in inputs.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    given = [f"input={next(iter(inputs))}"] if inputs else []
    code = run_cli(["prepare-data", *given, "tokenizer=tok.json", "out=x.bin", *extra,
                    f"hydra.run.dir={tmp_path / 'h'}"])
    _one_line(code, capsys, source, field, tmp_path, "x.bin")
    assert not (tmp_path / "x.bin.json").exists()


def _hf_dir(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(HF))  # max_position_embeddings 32
    return tmp_path / "hf"


@pytest.mark.parametrize("command", [
    ["plan", "cluster=tight8", "solver=megatron", "train.global_batch=4", "OUT"],
    ["train", "parallel=none", "train.steps=1", "train.global_batch=2", "train.dtype=fp32", "OUT"],
])
def test_a_training_sequence_beyond_the_models_positions_is_refused(command, tmp_path, capsys):
    """``train.seq_len`` above ``max_position_embeddings`` was planned (and priced) as if the
    model could train it; train refused it only in the runtime's layout check."""
    argv = [a.replace("OUT", f"out={tmp_path / 'o'}") for a in command]
    code = run_cli([*argv, f"model_file={_hf_dir(tmp_path)}", "train.seq_len=64", f"hydra.run.dir={tmp_path / 'h'}"])
    _one_line(code, capsys, "command line", "train.seq_len", tmp_path, "o")
    code = run_cli([*argv, f"model_file={tmp_path / 'hf'}", "train.seq_len=32", f"hydra.run.dir={tmp_path / 'h2'}"])
    assert code == 0, capsys.readouterr().err


def test_a_plan_whose_seq_len_exceeds_its_models_positions_is_refused(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert run_cli(["plan", f"model_file={_hf_dir(tmp_path)}", "cluster=tight8", "solver=megatron",
                    "train.global_batch=4", f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"]) == 0
    data = json.loads(out.read_text())
    assert data["model"]["max_position"] == 32 == data["train"]["seq_len"]
    data["train"]["seq_len"] = 64
    (tmp_path / "bad.json").write_text(json.dumps(data))
    capsys.readouterr()
    code = run_cli(["evaluate", f"plan_file={tmp_path / 'bad.json'}", f"out={tmp_path / 'e.json'}",
                    f"hydra.run.dir={tmp_path / 'h2'}"])
    _one_line(code, capsys, "bad.json", "train.seq_len", tmp_path, "e.json")
