"""A Llama-style decoder built from a :class:`hexicore.core.model.ModelSpec`, cut into stage chunks.

Layout (Touvron et al. 2023): token embedding, ``layers`` pre-norm blocks of RMSNorm ->
grouped-query attention with rotary positions (RoPE, rotate-half form) -> residual, RMSNorm ->
SwiGLU MLP (``down(silu(gate(x)) * up(x))``) -> residual; final RMSNorm and the head. What a
:class:`ModelSpec` read from a Hugging Face config adds: ``head_dim`` apart from ``hidden / heads``,
q/k/v biases (``qkv_bias``, Qwen2) and an o bias (``o_bias``, Llama's ``attention_bias``),
``norm_eps``, ``rope_theta``, Llama 3's wavelength-band rope scaling (:func:`inv_frequencies`)
and a head tied to the embedding (``tied_embeddings``: one Parameter when a chunk holds both;
across chunks see :mod:`..parallel.tied_embedding`). Parameter names are the standard (Hugging Face Llama) ones —
``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ``model.norm.weight``,
``lm_head.weight`` — so a chunk's ``state_dict`` keys are already global names and the full
model is just the chunk that covers everything.

A :class:`LlamaChunk` holds blocks ``[start, end)``; the first chunk of a chain adds the
embedding, the last adds norm + head + the loss. With a :class:`TPGroup` of size > 1 the
attention and MLP are Megatron column/row parallel (see :mod:`..parallel.tensor`), and with its
``vocab_parallel`` the embedding, the head and the loss are split by vocabulary rows
(:mod:`..parallel.vocab`; the same parameter names, each rank its rows). Attention goes
through flash-attn when it imports and the tensors are half precision on CUDA, else through
``torch.nn.functional.scaled_dot_product_attention``. ``recompute=True`` wraps each block in
``torch.utils.checkpoint`` (activation recomputation).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hexicore.core.model import ModelSpec

from ..parallel.tensor import TPGroup, copy_to, reduce_from
from ..parallel.vocab import VocabEmbedding, VocabHead, cross_entropy_sum

ROPE_THETA = 10000.0
NORM_EPS = 1e-5
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"

try:  # optional: only ever used on CUDA with half-precision tensors
    from flash_attn import flash_attn_func as _flash_attn_func  # type: ignore
except Exception:  # noqa: BLE001 - not installed / no CUDA build
    _flash_attn_func = None


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def inv_frequencies(head_dim: int, theta: float = ROPE_THETA, scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Rotary inverse frequencies ``theta^(-2i/d)`` (Su et al. 2021); with Llama 3's scaling
    (``rope_type: llama3``, The Llama 3 Herd of Models, §3.2 long context): wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, shorter than
    ``... / high_freq_factor`` kept, and the band between interpolated linearly in
    ``original / wavelength``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    sc = dict(scaling or {})
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind in ("default", None):
        return inv
    if kind != "llama3":
        raise ValueError(f"rope type {kind!r} is not implemented (default, llama3)")
    factor, lo_f, hi_f = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo_f, inv / factor, inv)
    smooth = (old / wavelen - lo_f) / (hi_f - lo_f)
    mid = (wavelen >= old / hi_f) & (wavelen <= old / lo_f)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rope_tables(seq_len: int, head_dim: int, theta: float = ROPE_THETA,
                scaling: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[seq_len, head_dim]`` for rotary positions (rotate-half layout)."""
    inv = inv_frequencies(head_dim, theta, scaling)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, h, S, d]`` by position (rotate-half convention)."""
    d = x.shape[-1] // 2
    rotated = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q [B, h, S, d]`` over ``k, v [B, kv, S, d]`` (GQA: kv divides h)."""
    if _flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out = _flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return out.transpose(1, 2)
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """GQA self-attention; with TP each rank holds ``heads/tp`` query and ``kv_heads/tp`` kv heads."""

    def __init__(self, spec: ModelSpec, tp: TPGroup):
        super().__init__()
        self.tp, self.d = tp, spec.head_dim
        self.h, self.kv = spec.heads // tp.size, spec.kv_heads // tp.size
        self.q_proj = nn.Linear(spec.hidden, self.h * self.d, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(spec.hidden, self.kv * self.d, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(spec.hidden, self.kv * self.d, bias=spec.qkv_bias)
        self.o_proj = RowLinear(self.h * self.d, spec.hidden, bias=spec.o_bias, tp=tp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to(x, self.tp)
        q = self.q_proj(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        out = attention(q, k, v).transpose(1, 2).reshape(b, s, self.h * self.d)
        return self.o_proj(out)


class RowLinear(nn.Module):
    """Row-parallel linear: the partial products are all-reduced, then the (replicated) bias is
    added once — not once per TP rank."""

    def __init__(self, n_in: int, n_out: int, *, bias: bool, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020); with TP each rank holds ``ffn/tp`` columns of gate/up, rows of down."""

    def __init__(self, spec: ModelSpec, tp: TPGroup):
        super().__init__()
        self.tp = tp
        f = spec.ffn // tp.size
        self.gate_proj = nn.Linear(spec.hidden, f, bias=False)
        self.up_proj = nn.Linear(spec.hidden, f, bias=False)
        self.down_proj = nn.Linear(f, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to(x, self.tp)
        return reduce_from(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), self.tp)


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``+ mlp(norm(.))``."""

    def __init__(self, spec: ModelSpec, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps)
        self.self_attn = Attention(spec, tp)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps)
        self.mlp = MLP(spec, tp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaChunk(nn.Module):
    """Blocks ``[start, end)`` of the model (+ embedding if ``first``, + norm/head/loss if ``last``).

    ``forward(x, labels, loss_scale)``: ``x`` is token ids on the first chunk, hidden states
    ``[B, S, H]`` otherwise; the last chunk returns ``sum(cross-entropy) * loss_scale`` (the
    executor passes ``1 / tokens of the global batch`` so that summing over micro-batches and
    pipelines gives the global mean), every other chunk returns hidden states.
    """

    def __init__(self, spec: ModelSpec, start: int, end: int, *, first: bool, last: bool,
                 tp: TPGroup = TPGroup(), recompute: bool = False):
        super().__init__()
        if spec.arch != "llama":
            raise ValueError(f"the torch runtime builds Llama-style models, not arch {spec.arch!r}")
        self.spec, self.start, self.end, self.first, self.last = spec, start, end, first, last
        self.recompute, self.tp = recompute, tp
        self.model = nn.Module()
        if first:
            self.model.embed_tokens = VocabEmbedding(spec.vocab, spec.hidden, tp) if tp.vocab_split else \
                nn.Embedding(spec.vocab, spec.hidden)
        self.model.layers = nn.ModuleDict({str(i): Block(spec, tp) for i in range(start, end)})
        if last:
            self.model.norm = RMSNorm(spec.hidden, spec.norm_eps)
            self.lm_head = VocabHead(spec.vocab, spec.hidden, tp) if tp.vocab_split else \
                nn.Linear(spec.hidden, spec.vocab, bias=False)
            if first and spec.tied_embeddings:  # one Parameter, named model.embed_tokens.weight
                self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = self._rope(spec.seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _rope(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(seq_len, self.spec.head_dim, self.spec.rope_theta, dict(self.spec.rope_scaling))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None, loss_scale: float = 1.0) -> torch.Tensor:
        h = self.model.embed_tokens(x) if self.first else x
        cos, sin = self.cos, self.sin
        if cos.shape[0] < h.shape[1]:
            cos, sin = (t.to(h.device) for t in self._rope(h.shape[1]))
        for block in self.model.layers.values():
            if self.recompute and torch.is_grad_enabled():
                h = checkpoint(block, h, cos, sin, use_reentrant=False)
            else:
                h = block(h, cos, sin)
        if not self.last:
            return h
        logits = self.lm_head(self.model.norm(h)).float()
        logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        if self.tp.vocab_split:  # this rank's vocabulary columns only
            return cross_entropy_sum(logits, labels, self.lm_head.lo, self.tp) * loss_scale
        return F.cross_entropy(logits, labels, reduction="sum") * loss_scale
