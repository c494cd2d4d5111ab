"""Transformer specifications: parameters, FLOPs and activation bytes (REFERENCE.md §3).

Two families are described by one :class:`ModelSpec`:

* ``arch: llama`` — RMSNorm (weight only), rotary positions, grouped-query attention
  (``kv_heads`` <= ``heads``), SwiGLU FFN (gate, up, down), no biases, untied embedding and head.
* ``arch: gpt`` — LayerNorm (weight + bias), learned positions, multi-head attention with biases,
  GELU FFN (two matrices with biases); GPT-3 ties the head to the embedding, BERT adds
  token-type embeddings and a pooler-free MLM head (we count the tied decoder only).

Counts are exact for these layouts; tests check the Llama presets against their published
sizes (6.74B, 13.0B, 32.5B, 69.0B).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hexicore.core import schema
from hexicore.core.errors import HexicoreError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder (or encoder) stack of ``layers`` identical transformer blocks."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    arch: str = "llama"
    norm: str = "rmsnorm"
    tied_embeddings: bool = False
    type_vocab: int = 0  # BERT token types

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HexicoreError(f"must be a positive integer, got {v!r}", field=f)
        if self.hidden % self.heads:
            raise HexicoreError(f"hidden {self.hidden} is not divisible by heads {self.heads}", field="heads")
        if self.heads % self.kv_heads:
            raise HexicoreError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}", field="kv_heads")
        if self.arch not in ("llama", "gpt"):
            raise HexicoreError(f"unknown arch {self.arch!r}; choose one of: gpt, llama", field="arch")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise HexicoreError(f"unknown norm {self.norm!r}; choose one of: layernorm, rmsnorm", field="norm")

    # ------------------------------------------------------------- parameters
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def _bias(self) -> bool:
        return self.arch == "gpt"

    def attention_params(self) -> int:
        """Q, K, V, O projections (GQA: K and V are ``hidden x kv_dim``), biases for gpt."""
        h, kv = self.hidden, self.kv_dim
        weights = 2 * h * h + 2 * h * kv
        return weights + ((2 * h + 2 * kv) if self._bias else 0)

    def mlp_params(self) -> int:
        """SwiGLU: gate, up, down = 3*H*F. GELU: up, down = 2*H*F plus biases F + H."""
        h, f = self.hidden, self.ffn
        if self.arch == "llama":
            return 3 * h * f
        return 2 * h * f + f + h

    def norm_params(self) -> int:
        """Per norm: weight (RMSNorm) or weight + bias (LayerNorm)."""
        return self.hidden * (1 if self.norm == "rmsnorm" else 2)

    def layer_params(self) -> int:
        """One transformer block: attention + MLP + two norms."""
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def layer_matmul_params(self) -> int:
        """Weights that take part in matmuls (drive FLOPs): attention + MLP matrices."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        return 2 * h * h + 2 * h * kv + (3 if self.arch == "llama" else 2) * h * f

    def embedding_params(self) -> int:
        """Token embedding (+ learned positions and token types for gpt/bert)."""
        n = self.vocab * self.hidden
        if self.arch == "gpt":
            n += self.seq_len * self.hidden + self.type_vocab * self.hidden
        return n

    def head_params(self) -> int:
        """Final norm + output projection (0 extra weights when tied to the embedding)."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    # ------------------------------------------------------------------ FLOPs
    def layer_flops_per_token(self, seq_len: int | None = None) -> float:
        """Forward FLOPs of one block per token: 2 * matmul params + 4*S*H for QK^T and AV.

        Summed over a micro-batch of B sequences this is the standard
        ``24*B*S*H^2 + 4*B*S^2*H`` of a GPT block (REFERENCE.md §3) with the real FFN width
        and GQA projection sizes. Causal masking is not subtracted (Megatron's convention).
        """
        s = self.seq_len if seq_len is None else seq_len
        return 2.0 * self.layer_matmul_params() + 4.0 * s * self.hidden

    def head_flops_per_token(self) -> float:
        """Forward FLOPs of the output projection per token (2*H*V)."""
        return 2.0 * self.hidden * self.vocab

    def model_flops_per_token(self, seq_len: int | None = None) -> float:
        """Forward FLOPs per token of the whole model (all blocks + head)."""
        return self.layers * self.layer_flops_per_token(seq_len) + self.head_flops_per_token()

    # ------------------------------------------------------------- activations
    def activation_bytes_per_layer(self, micro_batch: int, *, tp: int = 1, recompute: bool = True,
                                   dtype_bytes: int = 2, seq_len: int | None = None,
                                   flash_attention: bool = True) -> float:
        """Activation memory one block keeps for backward, for one micro-batch.

        Full recomputation keeps only the block input, ``B*S*H*B_type`` (HexiScale App. A).
        Without it: Korthikanti et al. (2022) eq. 2 with TP, ``S*B*H*(10 + 24/t + 5*a*S/(H*t))``
        bytes for 16-bit tensors (scaled by ``dtype_bytes/2``); FlashAttention (which HexiScale
        uses, §3.2) never materialises the ``a*S*S`` scores, so ``flash_attention`` drops the
        ``5*a*S/(H*t)`` term.
        """
        s = self.seq_len if seq_len is None else seq_len
        sbh = micro_batch * s * self.hidden
        if recompute:
            return sbh * dtype_bytes
        per = 10 + 24 / tp + (0.0 if flash_attention else 5 * self.heads * s / (self.hidden * tp))
        return sbh * per * dtype_bytes / 2

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, prefix: str | None = None) -> "ModelSpec":
        return parse_model(data, source, prefix)

    @classmethod
    def load(cls, path: str | Path) -> "ModelSpec":
        return parse_model(schema.load_yaml(path, "model"), str(path), None)


_INT_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")


def parse_model(data: Any, source: str | None, prefix: str | None = None) -> ModelSpec:
    """Validate a model mapping (conf/model/*.yaml) into a :class:`ModelSpec`."""
    d = schema.as_mapping(data, source, prefix)
    known = {f.name for f in fields(ModelSpec)}

    def fp(k: str) -> str:
        return f"{prefix}.{k}" if prefix else k

    unknown = sorted(set(d) - known - {"_target_"})
    if unknown:
        raise HexicoreError(f"unknown field; model fields are: {', '.join(sorted(known))}", source=source,
                            field=fp(unknown[0]))
    kw: dict[str, Any] = {"name": schema.string(d.get("name", "model"), source, fp("name"))}
    for k in _INT_FIELDS:
        if k == "kv_heads" and d.get(k) is None:
            continue
        kw[k] = schema.integer(schema.get(d, k, source, prefix), source, fp(k))
    kw.setdefault("kv_heads", kw["heads"])
    for k in ("arch", "norm"):
        if d.get(k) is not None:
            kw[k] = schema.string(d[k], source, fp(k))
    if kw.get("arch") == "gpt" and "norm" not in kw:
        kw["norm"] = "layernorm"
    if d.get("tied_embeddings") is not None:
        if not isinstance(d["tied_embeddings"], bool):
            raise HexicoreError("expected true or false", source=source, field=fp("tied_embeddings"))
        kw["tied_embeddings"] = d["tied_embeddings"]
    if d.get("type_vocab") is not None:
        kw["type_vocab"] = schema.integer(d["type_vocab"], source, fp("type_vocab"), minimum=0)
    try:
        return ModelSpec(**kw)
    except HexicoreError as exc:
        raise exc.located(source, prefix) from None
