"""The runtime's block memory counted by hand (hexicore/cost/block_memory.py) against what the
runtime's own block saves for backward on CPU (``hexicore profile``'s activation bytes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hexicore.core.model import ModelSpec
from hexicore.cost.block_memory import counted, runtime_block_bytes
from hexicore_plugins.runtimes.torch.model.llama import Block, rope_tables
from hexicore_plugins.runtimes.torch.profile.samplers import activation_bytes
from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup


@pytest.mark.parametrize("shape", [(128, 4, 2, 352, 64, 1), (256, 4, 4, 688, 128, 2), (192, 6, 2, 512, 32, 3)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_counted_bytes_are_what_the_runtime_block_saves(shape, dtype):
    h, heads, kv, f, s, b = shape
    spec = ModelSpec("m", layers=2, hidden=h, heads=heads, kv_heads=kv, ffn=f, vocab=256, seq_len=s)
    block = Block(spec, TPGroup())
    cos, sin = rope_tables(s, spec.head_dim)
    x = torch.randn(b, s, h, requires_grad=True)
    got = activation_bytes(block, x, cos, sin, SimpleNamespace(dtype=dtype), torch.device("cpu"))
    want = runtime_block_bytes(spec, b, s, 1, 4 if dtype == "fp32" else 2)
    assert got == pytest.approx(want, rel=2e-3), (got, want)


def test_by_hand_with_tp_and_casts():
    """A Llama-2-7B block, 4,096 tokens, TP 2, bf16: fp32 residual 16 B x 4096, bf16 normed
    inputs 2 x 4096 x 2 B, q/k/v/out 4 x 2048 x 2 B, MLP 4 x 5504 x 2 B, rstd + lse 4 x (2 + 16)
    per token; per forward the rotary casts 4 x 4096 x 128 x 2 B and half the weights in bf16."""
    m = ModelSpec("7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000, seq_len=4096)
    per_token = 16 * 4096 + 2 * (2 * 4096 + 4 * 2048 + 4 * 5504) + 4 * (2 + 16)
    casts = 2 * (4 * 4096 * 128 + (4 * 4096 * 4096 + 3 * 4096 * 11008) / 2)
    assert runtime_block_bytes(m, 1, 4096, 2, 2) == 4096 * per_token + casts
    assert runtime_block_bytes(m, 1, 4096, 2, 4) == 4096 * (16 * 4096 + 4 * (2 * 4096 + 4 * 2048 + 4 * 5504) + 72)
    assert counted(m) and not counted(ModelSpec("g", layers=2, hidden=64, heads=2, kv_heads=2, ffn=256, vocab=64,
                                                seq_len=32, arch="gpt", norm="layernorm"))
