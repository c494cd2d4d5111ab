"""Hugging Face Llama-family configs in (hexicore.core.hf_config): exact parameter counts against
``transformers``' own models, refusals of what the runtime does not implement, and the
config.json written back."""

from __future__ import annotations

import json

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.hf_config import hf_config_dict, load_hf_config, spec_from_hf
from hexicore.core.model import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def _count(config) -> int:
    model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


@pytest.mark.parametrize("cls, extra", [
    ("LlamaConfig", {}),
    ("LlamaConfig", {"attention_bias": True, "head_dim": 24}),
    ("LlamaConfig", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("Qwen2Config", {"tie_word_embeddings": True}),
    ("MistralConfig", {"sliding_window": None}),
    ("MistralConfig", {"sliding_window": None, "attention_bias": True}),  # Mistral has no biases
    ("Qwen2Config", {"attention_bias": False}),  # Qwen2 always has q/k/v biases
])
def test_parameter_count_equals_transformers(tmp_path, cls, extra):
    config = getattr(transformers, cls)(**SMALL, **extra)
    config.save_pretrained(tmp_path)
    spec = load_hf_config(tmp_path)
    assert spec.total_params() == _count(config)
    assert spec.layers == 3 and spec.kv_heads == 2 and spec.seq_len == 128


def test_llama3_rope_and_round_trip(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}
    transformers.LlamaConfig(**SMALL, rope_scaling=dict(rope), rope_theta=500000.0).save_pretrained(tmp_path)
    spec = load_hf_config(tmp_path / "config.json")
    assert dict(spec.rope_scaling) == rope and spec.rope_theta == 500000.0
    again = ModelSpec.from_dict(spec.to_dict())
    assert again == spec
    written = tmp_path / "out"
    written.mkdir()
    (written / "config.json").write_text(json.dumps(hf_config_dict(spec)))
    assert load_hf_config(written) == spec  # the model's name too, not the directory's ("out")
    back = transformers.AutoConfig.from_pretrained(written)
    assert back.num_hidden_layers == 3 and back.rope_parameters["rope_type"] == "llama3"


def test_plain_specs_serialise_as_before():
    spec = ModelSpec("m", 2, 64, 4, 2, 176, 256, 32)
    assert set(spec.to_dict()) == {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
                                   "arch", "norm", "tied_embeddings", "type_vocab"}


@pytest.mark.parametrize("change, field", [
    ({"num_local_experts": 8}, "num_local_experts"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"hidden_size": None}, "hidden_size"),
    # transformers builds Llama from model_type; hexicore read Qwen2 (q/k/v biases) from architectures
    ({"architectures": ["Qwen2ForCausalLM"]}, "model_type"),
])
def test_refusals_name_the_field(change, field):
    d = {"model_type": "llama", **SMALL, **change}
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(HexicoreError) as exc:
        spec_from_hf(d, "cfg/config.json")
    assert exc.value.field == field and exc.value.source == "cfg/config.json"


def test_plan_from_hf_config_cli(tmp_path, capsys):
    from tests.conftest import run_cli

    transformers.Qwen2Config(**SMALL, tie_word_embeddings=True).save_pretrained(tmp_path)
    out = tmp_path / "plan.json"
    code = run_cli(["plan", "cluster=paper_case", f"model_file={tmp_path}", "train.global_batch=8", f"out={out}",
                    f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    plan = json.loads(out.read_text())
    assert plan["model"]["qkv_bias"] is True and plan["model"]["tied_embeddings"] is True
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL, "hidden_act": "relu"}))
    capsys.readouterr()
    code = run_cli(["plan", f"model_file={bad}", f"hydra.run.dir={tmp_path / 'run2'}"])
    err = capsys.readouterr().err
    assert code == 2 and "hidden_act" in err and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty"  # before: "model file not found" for a directory that is there
    empty.mkdir()
    code = run_cli(["plan", f"model_file={empty}", f"hydra.run.dir={tmp_path / 'run3'}"])
    err = capsys.readouterr().err
    assert code == 2 and "a directory without config.json" in err and len(err.strip().splitlines()) == 1


def test_hf_models_train_up_to_their_positions_and_windows():
    """``train.seq_len`` may exceed the spec's default length (at most 4096) up to the config's
    ``max_position_embeddings`` — before, a Llama 3 config of 8192 positions could not train at
    8192 — but never beyond a sliding window, where full attention would differ."""
    from hexicore.core.errors import PlanError
    from hexicore_plugins.runtimes.torch.parallel.assignment import reference_layout

    llama = spec_from_hf({"model_type": "llama", **SMALL, "max_position_embeddings": 8192})
    assert llama.seq_len == 4096 and reference_layout(llama, global_batch=1, micro_batch=1, seq_len=8192).seq_len == 8192
    with pytest.raises(PlanError, match="sequence length 8193 exceeds the model's 8192"):
        reference_layout(llama, global_batch=1, micro_batch=1, seq_len=8193)
    mistral = spec_from_hf({"model_type": "mistral", **SMALL, "max_position_embeddings": 32768,
                            "sliding_window": 4096})
    assert mistral.seq_len == 4096 and mistral.max_position == 4096
    with pytest.raises(PlanError, match="sequence length 4097 exceeds the model's 4096"):
        reference_layout(mistral, global_batch=1, micro_batch=1, seq_len=4097)
    short = spec_from_hf({"model_type": "mistral", **SMALL, "max_position_embeddings": 32768, "sliding_window": 64})
    assert short.seq_len == 64 and short.max_position == 64  # before: refused, though seq_len <= 64 trains exactly
    with pytest.raises(PlanError, match="sequence length 65 exceeds the model's 64"):
        reference_layout(short, global_batch=1, micro_batch=1, seq_len=65)
    full = spec_from_hf({"model_type": "mistral", **SMALL, "max_position_embeddings": 32768, "sliding_window": None})
    assert reference_layout(full, global_batch=1, micro_batch=1, seq_len=8192).seq_len == 8192
    plain = ModelSpec("m", 2, 64, 4, 2, 176, 256, 32)  # a model YAML: its seq_len is the limit
    with pytest.raises(PlanError, match="sequence length 33 exceeds"):
        reference_layout(plain, global_batch=1, micro_batch=1, seq_len=33)


@pytest.mark.parametrize("kind, fields, window", [
    ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 3}, None),
    ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}, 64),
    ("Qwen2Config", {"use_sliding_window": False, "sliding_window": 64, "max_window_layers": 0}, None),
    ("MistralConfig", {"sliding_window": 64}, 64),
    ("LlamaConfig", {}, None),
])
def test_the_window_applies_where_transformers_applies_it(kind, fields, window):
    """Qwen2 slides only from layer ``max_window_layers`` on (before: any ``use_sliding_window``
    bounded the sequence, though no layer slid); the config as transformers saves it."""
    d = getattr(transformers, kind)(**SMALL, **fields).to_dict()
    if kind == "LlamaConfig":
        d["sliding_window"] = 64  # not a Llama field: transformers' Llama ignores it
    assert spec_from_hf(d).max_position == (window or 128)
    d.pop("layer_types", None)  # transformers 4's files: the layers follow from max_window_layers
    assert spec_from_hf(d).max_position == (window or 128)


def test_null_kv_heads_means_multi_head_attention_as_in_transformers():
    """``"num_key_value_heads": null`` (older converted Llama configs) is read by transformers as
    one kv head per head; before, it was refused as a missing field."""
    fields = {**SMALL, "num_key_value_heads": None}
    spec = spec_from_hf({"model_type": "llama", **fields}, "cfg/config.json")
    config = transformers.LlamaConfig(**fields)
    assert spec.kv_heads == spec.heads == config.num_key_value_heads
    assert spec.total_params() == _count(config)


def test_rope_scaling_and_rope_parameters_must_agree():
    """transformers 5 reads ``rope_scaling`` (with the top-level ``rope_theta``) over
    ``rope_parameters`` when a config has both; hexicore read ``rope_parameters`` — two
    different models from one file, silently. Both are accepted only when they agree (as in the
    config.json hexicore writes)."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    both = {"model_type": "llama", **SMALL, "rope_scaling": llama3,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    with pytest.raises(HexicoreError, match="disagree") as exc:
        spec_from_hf(both, "cfg/config.json")
    assert exc.value.field == "rope_scaling" and exc.value.source == "cfg/config.json"
    with pytest.raises(HexicoreError, match="rope_theta 10000, llama3.*rope_theta 500000, llama3"):
        spec_from_hf({**both, "rope_parameters": {**llama3, "rope_theta": 500000.0}}, "cfg/config.json")
    agreed = spec_from_hf({**both, "rope_parameters": {**llama3, "rope_theta": 500000.0}, "rope_theta": 500000.0})
    assert agreed.rope_theta == 500000.0 and dict(agreed.rope_scaling)["rope_type"] == "llama3"
    assert spec_from_hf(hf_config_dict(agreed)) == agreed
