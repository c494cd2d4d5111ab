"""The Llama model of the torch runtime: chunks, TP shards (simulated, no process group), recompute."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hexicore_plugins.runtimes.torch.model.llama import MLP, Attention, LlamaChunk, apply_rope, rope_tables  # noqa: E402
from hexicore_plugins.runtimes.torch.model.stage_module import full_model, load_shards, seeded  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup, shard, shard_dim, unshard  # noqa: E402


def tokens(model, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, model.vocab, (batch, model.seq_len + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def test_standard_names_and_parameter_count(tiny):
    m = full_model(tiny, seeded(0))
    names = list(m.state_dict())
    assert names[0] == "model.embed_tokens.weight" and names[-2:] == ["model.norm.weight", "lm_head.weight"]
    assert "model.layers.7.self_attn.k_proj.weight" in names and "model.layers.0.mlp.down_proj.weight" in names
    assert m.state_dict()["model.layers.0.self_attn.k_proj.weight"].shape == (tiny.kv_dim, tiny.hidden)
    assert sum(p.numel() for p in m.parameters()) == tiny.total_params()


def test_initial_loss_is_uniform_guess(tiny):
    x, y = tokens(tiny)
    loss = full_model(tiny, seeded(0))(x, y, 1.0 / y.numel())
    assert abs(loss.item() - math.log(tiny.vocab)) < 0.05


def test_chunks_compose_to_the_full_model(tiny):
    """Cutting by layer range changes nothing: same loss, same gradients, same names."""
    x, y = tokens(tiny)
    full = full_model(tiny, seeded(3))
    ref = full(x, y)
    ref.backward()
    a = LlamaChunk(tiny, 0, 3, first=True, last=False)
    b = LlamaChunk(tiny, 3, tiny.layers, first=False, last=True)
    for c in (a, b):
        load_shards(c, seeded(3), TPGroup())
    h = a(x)
    h2 = h.detach().requires_grad_()
    loss = b(h2, y)
    loss.backward()
    h.backward(h2.grad)
    assert torch.equal(loss, ref)
    grads = {**{n: p.grad for n, p in a.named_parameters()}, **{n: p.grad for n, p in b.named_parameters()}}
    assert set(grads) == {n for n, _ in full.named_parameters()}
    for n, p in full.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cls", [Attention, MLP])
def test_tensor_parallel_shards_sum_to_the_full_module(tiny, cls):
    """Megatron column/row parallel: per-shard partial outputs sum to the full output, input
    gradients sum to the full input gradient, weight gradients are slices of the full ones."""
    torch.manual_seed(0)
    full = cls(tiny, TPGroup())
    for p in full.parameters():
        torch.nn.init.normal_(p, std=0.05)
    cos, sin = rope_tables(tiny.seq_len, tiny.head_dim)
    args = (cos, sin) if cls is Attention else ()
    x = torch.randn(2, tiny.seq_len, tiny.hidden, requires_grad=True)
    out = full(x, *args)
    gout = torch.randn_like(out)
    out.backward(gout)
    outs, gxs = [], []
    for r in range(2):
        tp = TPGroup(r, 2, None)  # simulated: all-reduces are identities
        part = cls(tiny, tp)
        with torch.no_grad():
            for n, p in part.named_parameters():
                p.copy_(shard(dict(full.named_parameters())[n], shard_dim(n), r, 2))
        xr = x.detach().clone().requires_grad_()
        o = part(xr, *args)
        o.backward(gout)
        outs.append(o.detach())
        gxs.append(xr.grad)
        for n, p in part.named_parameters():
            torch.testing.assert_close(p.grad, shard(dict(full.named_parameters())[n].grad, shard_dim(n), r, 2),
                                       rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[0] + outs[1], out.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gxs[0] + gxs[1], x.grad, rtol=1e-5, atol=1e-6)


def test_shard_roundtrip_and_dims():
    assert shard_dim("model.layers.3.self_attn.q_proj.weight") == 0
    assert shard_dim("model.layers.3.mlp.down_proj.weight") == 1
    assert shard_dim("model.layers.3.input_layernorm.weight") is None
    assert shard_dim("lm_head.weight") is None
    t = torch.arange(24.0).view(4, 6)
    for dim in (0, 1):
        assert torch.equal(unshard([shard(t, dim, r, 2) for r in range(2)], dim), t)


def test_recompute_gives_identical_gradients(tiny):
    x, y = tokens(tiny)
    grads = []
    for recompute in (False, True):
        m = LlamaChunk(tiny, 0, tiny.layers, first=True, last=True, recompute=recompute)
        load_shards(m, seeded(1), TPGroup())
        m(x, y).backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-6, atol=1e-8)


def test_rope_rotation_preserves_norm_and_is_relative(tiny):
    cos, sin = rope_tables(16, tiny.head_dim)
    q = torch.randn(1, 1, 16, tiny.head_dim)
    k = torch.randn(1, 1, 16, tiny.head_dim)
    rq = apply_rope(q, cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    # same vectors at every position: the score depends only on the offset
    q1 = q[:, :, :1].expand(1, 1, 16, -1)
    k1 = k[:, :, :1].expand(1, 1, 16, -1)
    s = apply_rope(q1, cos, sin)[0, 0] @ apply_rope(k1, cos, sin)[0, 0].T
    torch.testing.assert_close(s[5, 3], s[9, 7], rtol=1e-4, atol=1e-5)
