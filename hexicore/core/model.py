"""Transformer specifications: parameters, FLOPs and activation bytes (HexiScale App. A,
docs/background.md).

Two families are described by one :class:`ModelSpec`:

* ``arch: llama`` — RMSNorm (weight only), rotary positions, grouped-query attention
  (``kv_heads`` <= ``heads``), SwiGLU FFN (gate, up, down), untied embedding and head; no
  biases unless ``qkv_bias`` (Qwen2: q, k, v projections) or ``o_bias`` (Llama's
  ``attention_bias`` adds both). Hugging Face Llama-family configs (Llama, Mistral, Qwen2) read
  into this form through :mod:`hexicore.core.hf_config`; ``head_dim`` may differ from
  ``hidden / heads``, ``rope_theta``/``rope_scaling``/``norm_eps`` follow the config.
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

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.fields import whole

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Hugging Face model types the torch runtime implements -> the architecture class name written
#: back into config.json (hexicore.core.hf_config reads configs into these)
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
HF_MODEL_TYPES = tuple(HF_ARCHITECTURES)
ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


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
    head_dim: int | None = None  # None: hidden // heads
    qkv_bias: bool = False
    o_bias: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs, e.g. Llama 3's
    max_position: int = 0  # the config's max_position_embeddings, or its shorter sliding window (0: not stated)
    hf_model_type: str = ""  # the model_type of a Hugging Face config it was read from ("llama", "gpt2", ...)

    def __post_init__(self) -> None:
        positive = whole()
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            positive(getattr(self, name), name)
        limits.check(self.layers, limits.MAX_LAYERS, "layers", field="layers")
        limits.check(self.seq_len, limits.MAX_SEQ_LEN, "tokens", field="seq_len")
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        derived = self.head_dim is None
        if derived:
            if self.hidden % self.heads:
                raise HexicoreError(f"hidden {self.hidden} is not divisible by heads {self.heads}", field="heads")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        else:
            positive(self.head_dim, "head_dim")
        if self.heads % self.kv_heads:
            raise HexicoreError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}", field="kv_heads")
        if self.arch not in ("llama", "gpt"):
            raise HexicoreError(f"unknown arch {self.arch!r}; choose one of: gpt, llama", field="arch")
        if self.arch == "llama" and self.head_dim % 2:  # rotary positions rotate pairs of dimensions
            how = f" (hidden {self.hidden} / heads {self.heads})" if derived else ""
            raise HexicoreError(f"must be even for rotary positions (arch llama), got {self.head_dim}{how}",
                                field="head_dim")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise HexicoreError(f"unknown norm {self.norm!r}; choose one of: layernorm, rmsnorm", field="norm")
        if self.max_position and self.seq_len > self.max_position:
            raise HexicoreError(f"{self.max_position} positions are fewer than seq_len {self.seq_len}, the model's "
                                "training length: a sequence may not be longer than the positions",
                                field="max_position")

    def check_seq_len(self, seq_len: int, source: str | None, field: str = "train.seq_len") -> None:
        """Refuse a training ``seq_len`` beyond the positions the model states (``max_position``;
        none stated: no bound here), one line naming ``field``."""
        if self.max_position and seq_len > self.max_position:
            raise HexicoreError(f"{seq_len} tokens are more than the model's max_position {self.max_position} (the "
                                "longest sequence its positions allow)", source=source, field=field)

    def tp_divides(self, tp: int) -> bool:
        """Whether tensor parallelism of degree ``tp`` shards this model the Megatron way: ``tp``
        divides the attention heads, the KV heads and the FFN width (the torch runtime's rule,
        docs/runtime.md; every solver offers only such degrees)."""
        return self.heads % tp == 0 and self.kv_heads % tp == 0 and self.ffn % tp == 0

    # ------------------------------------------------------------- parameters
    @property
    def longest_seq(self) -> int:
        """The longest training sequence: ``seq_len`` (for a Hugging Face config the default
        training length, at most 4096) or the positions the config allows, if more."""
        return max(self.seq_len, self.max_position)

    @property
    def q_dim(self) -> int:
        """Width of the query projection: ``heads * head_dim`` (``hidden`` unless head_dim differs)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def _bias(self) -> bool:
        return self.arch == "gpt"

    def attention_params(self) -> int:
        """Q, K, V, O projections (GQA: K and V are ``hidden x kv_dim``); biases for gpt on all
        four, else on q/k/v with ``qkv_bias`` and on o with ``o_bias``."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = 2 * h * q + 2 * h * kv
        qkv_b = self._bias or self.qkv_bias
        o_b = self._bias or self.o_bias
        return weights + ((q + 2 * kv) if qkv_b else 0) + (h if o_b else 0)

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
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.ffn
        return 2 * h * q + 2 * h * kv + (3 if self.arch == "llama" else 2) * h * f

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
        ``24*B*S*H^2 + 4*B*S^2*H`` of a GPT block (docs/background.md, Cost model) with the
        real FFN width and GQA projection sizes (the score term uses the query width, ``H``
        unless ``head_dim`` differs). Causal masking is not subtracted (Megatron's convention).
        """
        s = self.seq_len if seq_len is None else seq_len
        return 2.0 * self.layer_matmul_params() + 4.0 * s * self.q_dim

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
        """The plan JSON's ``model`` object; fields added for Hugging Face configs are written
        only when they differ from their defaults (so older plans stay byte-identical)."""
        d = asdict(self)
        for f in _OPTIONAL:
            if d[f.name] == (self.hidden // self.heads if f.name == "head_dim" and not self.hidden % self.heads
                             else f.default):
                del d[f.name]
        if "rope_scaling" in d:
            d["rope_scaling"] = dict(self.rope_scaling)
        return d

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, prefix: str | None = None) -> "ModelSpec":
        return parse_model(data, source, prefix)

    @classmethod
    def load(cls, path: str | Path) -> "ModelSpec":
        return parse_model(schema.load_yaml(path, "model"), str(path), None)


_INT_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")
_OPTIONAL = tuple(f for f in fields(ModelSpec) if f.name in (
    "head_dim", "qkv_bias", "o_bias", "norm_eps", "rope_theta", "rope_scaling", "max_position", "hf_model_type"))


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
    kw.update(_parse_optional(d, source, fp))
    try:
        return ModelSpec(**kw)
    except HexicoreError as exc:
        raise exc.located(source, prefix) from None


def _parse_optional(d: Any, source: str | None, fp: Any) -> dict[str, Any]:
    """The optional fields a plan written from a Hugging Face config carries."""
    kw: dict[str, Any] = {}
    for k in ("qkv_bias", "o_bias"):
        if d.get(k) is not None:
            if not isinstance(d[k], bool):
                raise HexicoreError("expected true or false", source=source, field=fp(k))
            kw[k] = d[k]
    for k in ("head_dim", "max_position"):
        if d.get(k) is not None:
            kw[k] = schema.integer(d[k], source, fp(k), minimum=0 if k == "max_position" else 1)
    for k in ("norm_eps", "rope_theta"):
        if d.get(k) is not None:
            kw[k] = schema.number(d[k], source, fp(k))
    if d.get("rope_scaling") is not None:
        kw["rope_scaling"] = rope_scaling_pairs(d["rope_scaling"], source, fp("rope_scaling"))
    if d.get("hf_model_type") is not None:
        kw["hf_model_type"] = schema.string(d["hf_model_type"], source, fp("hf_model_type"))
        if not kw["hf_model_type"].replace("_", "").isalnum():
            raise HexicoreError(f"expected a Hugging Face model_type (llama, gpt2, ...), got {kw['hf_model_type']!r}",
                                source=source, field=fp("hf_model_type"))
    return kw


def rope_scaling_pairs(raw: Any, source: str | None, field: str) -> tuple[tuple[str, Any], ...]:
    """``rope_scaling`` (a model file's, or an HF config's ``rope_scaling``/``rope_parameters``;
    other keys ignored): the default (no pairs) or Llama 3's type with its four numbers, as the
    runtime implements them; anything else is refused here, not in a training worker."""
    m = schema.as_mapping(raw, source, field)
    kind = m.get("rope_type", m.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise HexicoreError(f"rope type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}",
                            source=source, field=f"{field}.rope_type")
    if kind == "default":
        return ()
    scaling: dict[str, Any] = {"rope_type": "llama3"}
    for k in LLAMA3_KEYS:
        scaling[k] = schema.number(schema.get(m, k, source, field), source, f"{field}.{k}")
    original = scaling["original_max_position_embeddings"]
    if not original.is_integer():  # config.json gets it as an integer
        raise HexicoreError(f"expected a whole number of positions, got {original:g}", source=source,
                            field=f"{field}.original_max_position_embeddings")
    return tuple(sorted(scaling.items()))
