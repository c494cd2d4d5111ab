"""Any decoder-only Hugging Face config plans by its shape (GPT-2, GPT-Neo, GPT-NeoX, OPT, Falcon,
Phi, Gemma): the spec's parameter count is transformers' own within what learned positions add,
``plan`` and ``evaluate`` print no runtime note, and ``train`` refuses it once, in one line."""

from __future__ import annotations

import pytest

from hexicore.core.hf_config import load_hf_config
from tests.conftest import run_cli

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

SHAPES = {
    "GPT2Config": dict(n_embd=64, n_layer=3, n_head=4, vocab_size=256, n_positions=128, bos_token_id=0,
                       eos_token_id=0),
    "GPTNeoConfig": dict(hidden_size=64, num_layers=3, num_heads=4, vocab_size=256, max_position_embeddings=128,
                         attention_types=[[["global", "local"], 1], [["global"], 1]], bos_token_id=0, eos_token_id=0),
    "GPTNeoXConfig": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256,
                          vocab_size=256, max_position_embeddings=128),
    "OPTConfig": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=256, vocab_size=256,
                      max_position_embeddings=128, word_embed_proj_dim=64),
    "FalconConfig": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=256,
                         max_position_embeddings=128),
    "PhiConfig": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256,
                      vocab_size=256, max_position_embeddings=128),
    "GemmaConfig": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=32, intermediate_size=176, vocab_size=256, max_position_embeddings=128),
}


def saved(tmp_path, cls):
    config = getattr(transformers, cls)(**SHAPES[cls])
    config.save_pretrained(tmp_path / cls)
    return config, tmp_path / cls


@pytest.mark.parametrize("cls", list(SHAPES))
def test_a_decoder_config_reads_by_its_shape(tmp_path, cls):
    config, folder = saved(tmp_path, cls)
    spec = load_hf_config(folder)
    model = transformers.AutoModelForCausalLM.from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    assert (spec.layers, spec.hidden, spec.vocab) == (3, 64, 256)
    assert spec.hf_model_type == config.model_type
    assert abs(spec.total_params() / counted - 1) < 0.08  # learned positions priced for rotary models too


def test_an_encoder_decoder_config_is_one_line(tmp_path, capsys):
    transformers.T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=128, vocab_size=256).save_pretrained(tmp_path / "t5")
    code = run_cli(["plan", f"model_file={tmp_path / 't5'}", "cluster=tight8", f"out={tmp_path / 'p.json'}",
                    f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is_encoder_decoder" in err and "decoder-only" in err


@pytest.mark.parametrize("cls, says", [("GPTNeoXConfig", "arch 'gpt'"), ("GemmaConfig", "not gemma")])
def test_plan_and_evaluate_say_nothing_of_the_runtime_and_train_refuses_once(tmp_path, capsys, monkeypatch, cls, says):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    _, folder = saved(tmp_path, cls)
    plan = tmp_path / "plan.json"
    assert run_cli(["plan", f"model_file={folder}", "cluster=tight8", "train.global_batch=8", f"out={plan}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    assert "runtime" not in capsys.readouterr().err
    assert run_cli(["evaluate", f"plan_file={plan}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    assert "runtime" not in capsys.readouterr().err
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a worker was launched"))
    assert run_cli(["train", f"plan_file={plan}", "train.steps=1", f"out={tmp_path / 'o'}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count("torch runtime") == 1 and says in err
    assert not (tmp_path / "o").exists()
