"""ModelSpec: exact parameter counts against published sizes, FLOPs and activation formulas."""

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec, parse_model
from tests.conftest import model_preset


@pytest.mark.parametrize("name, published", [
    ("llama2_7b", 6.74e9), ("llama2_13b", 13.0e9), ("llama_30b", 32.5e9), ("llama2_70b", 69.0e9),
    ("gpt3_1.3b", 1.3e9), ("bert_large", 0.34e9),
])
def test_preset_totals_match_published_sizes(name, published):
    total = model_preset(name).total_params()
    tolerance = 0.01 if name.startswith("llama") else 0.02  # GPT/BERT sizes are quoted to 2 digits
    assert abs(total - published) / published < tolerance


def test_llama2_7b_exact_count():
    # 32 x (4*4096^2 + 3*4096*11008 + 2*4096) + 2*32000*4096 + 4096, counted by hand
    assert model_preset("llama2_7b").total_params() == 6_738_415_616


def test_gqa_shrinks_kv_projections():
    m = model_preset("llama2_70b")
    h, kv = 8192, 8 * 128
    assert m.attention_params() == 2 * h * h + 2 * h * kv
    assert m.layer_params() == 2 * h * h + 2 * h * kv + 3 * h * 28672 + 2 * h


def test_gpt_layer_has_biases_and_layernorm():
    m = model_preset("gpt3_1.3b")
    h, f = 2048, 8192
    assert m.layer_params() == (4 * h * h + 4 * h) + (2 * h * f + f + h) + 2 * (2 * h)
    assert m.head_params() == 2 * h  # tied: only the final LayerNorm


def test_flops_per_token_include_attention_s2_term():
    m = model_preset("llama2_13b")
    h, s, f = 5120, 4096, 13824
    assert m.layer_flops_per_token() == 2 * (4 * h * h + 3 * h * f) + 4 * s * h
    # GPT shape: per micro-batch of B sequences 24*B*S*H^2 + 4*B*S^2*H when ffn = 4H, MHA
    g = ModelSpec("g", 2, 256, 4, 4, 1024, 100, 64, arch="gpt", norm="layernorm")
    assert g.layer_flops_per_token() * 64 == pytest.approx(24 * 64 * 256**2 + 4 * 64**2 * 256)


def test_activation_bytes():
    m = model_preset("llama2_13b")
    assert m.activation_bytes_per_layer(1, recompute=True) == 4096 * 5120 * 2
    sbh = 2 * 4096 * 5120
    assert m.activation_bytes_per_layer(2, tp=2, recompute=False) == pytest.approx(sbh * (10 + 12))
    assert m.activation_bytes_per_layer(2, tp=2, recompute=False, flash_attention=False) == \
        pytest.approx(sbh * (10 + 12 + 5 * 40 * 4096 / (5120 * 2)))


@pytest.mark.parametrize("bad, field", [
    ({"layers": 0}, "layers"), ({"heads": 3}, "heads"), ({"kv_heads": 3}, "kv_heads"),
    ({"hidden": "big"}, "hidden"), ({"arch": "rnn"}, "arch"), ({"colour": 1}, "colour"),
    ({"head_dim": 7}, "head_dim"), ({"hidden": 60}, "head_dim"),  # rotary positions need an even head_dim
])
def test_bad_model_fields_are_named(bad, field):
    d = dict(name="m", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=100, seq_len=16)
    d.update(bad)
    with pytest.raises(HexicoreError) as e:
        parse_model(d, "m.yaml")
    assert e.value.source == "m.yaml" and e.value.field == field


def test_integer_fields_read_integral_scientific_text():
    """YAML 1.1 reads ``2e0`` as text; integer fields read it as its number, as float fields do."""
    d = dict(name="m", layers="2e0", hidden=64, heads=4, kv_heads=2, ffn="1.28e2", vocab=100, seq_len=16)
    m = parse_model(d, "m.yaml")
    assert (m.layers, m.ffn) == (2, 128) and isinstance(m.layers, int)
    with pytest.raises(HexicoreError) as e:
        parse_model({**d, "layers": "2.5e0"}, "m.yaml")
    assert e.value.field == "layers" and "integer" in str(e.value)


def test_odd_head_dim_is_refused_for_rotary_positions_only():
    from hexicore.core.hf_config import spec_from_hf

    gpt = parse_model(dict(name="g", arch="gpt", layers=2, hidden=28, heads=4, ffn=64, vocab=100, seq_len=16), "g.yaml")
    assert gpt.head_dim == 7  # learned positions: any head size
    hf = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=60, intermediate_size=176,
              num_hidden_layers=2, num_attention_heads=4, vocab_size=256, max_position_embeddings=64)
    with pytest.raises(HexicoreError) as e:
        spec_from_hf(hf, "config.json")
    assert (e.value.source, e.value.field) == ("config.json", "head_dim") and "even" in str(e.value)
