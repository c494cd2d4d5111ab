"""Hugging Face ``config.json`` <-> :class:`~hexicore.core.model.ModelSpec`.

Any decoder-only config plans by its shape (:func:`shape_spec`: GPT-2, GPT-Neo(X), GPT-J, OPT,
Falcon, Phi, Gemma, ...); the Llama family, which the torch runtime also trains, is read in full:

``model_file=PATH/config.json`` (or a directory holding one) reads a Llama-family configuration:
``LlamaForCausalLM``, ``MistralForCausalLM`` (up to its sliding window) and ``Qwen2ForCausalLM``
(recognised by ``architectures`` or ``model_type``). Fields read: ``hidden_size``,
``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``head_dim``, ``vocab_size``, ``rms_norm_eps``, ``rope_theta`` / ``rope_scaling`` (the
transformers 4 layout) or ``rope_parameters`` (transformers 5), ``tie_word_embeddings``,
``attention_bias`` (Llama: q, k, v and o biases; Qwen2 always has q/k/v biases and no o bias;
Mistral has none, whatever the field says, as in ``transformers``),
``max_position_embeddings``.

What the runtime does not implement is refused here, before any process starts, with one line
naming the file and the field: other architectures, mixture-of-experts, rope types other than
default and ``llama3``, activations other than SiLU, MLP biases. The planner then prices the
exact parameter count (biases, tied embeddings).

The training sequence length is ``train.seq_len`` when set, up to ``max_position_embeddings``
(the spec's ``max_position``; a sliding window shorter than that bounds it instead: full
attention, which the runtime computes, equals sliding-window attention only on sequences no
longer than the window); the spec's own ``seq_len``, the default, is that bound capped at
:data:`DEFAULT_SEQ_LEN` (a context of 128k positions is a limit, not a training length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.fields import is_whole
from hexicore.core.model import HF_ARCHITECTURES as ARCHITECTURES, ModelSpec, rope_scaling_pairs

#: the spec's seq_len when the config allows more positions than this
DEFAULT_SEQ_LEN = 4096


def is_hf_config(path: str | Path) -> bool:
    """A ``*.json`` file or a directory holding ``config.json``."""
    p = Path(path)
    return p.suffix == ".json" or (p.is_dir() and (p / "config.json").is_file())


#: the weight files of a Hugging Face checkpoint directory that hexicore reads (safetensors)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
#: the weight files of the older torch.save format, which hexicore does not read
PICKLED_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def weights_folder(path: str | Path, field: str = "model_file") -> str | None:
    """``path`` when it is a checkpoint directory holding safetensors weights (what
    ``from_pretrained`` would load), None for a config file or a directory of a config alone; a
    directory holding only ``pytorch_model.bin`` weights is refused (hexicore reads safetensors)."""
    p = Path(path)
    if not p.is_dir():
        return None
    if any((p / name).is_file() for name in WEIGHT_FILES):
        return str(p)
    pickled = next((name for name in PICKLED_WEIGHT_FILES if (p / name).is_file()), None)
    if pickled:
        raise HexicoreError(f"holds {pickled} weights, which hexicore does not read: save them as safetensors "
                            "(save_pretrained(..., safe_serialization=True)), or give init_from=none to start "
                            "from a fresh initialisation", source=str(p), field=field)
    return None


def config_path(path: str | Path) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read ``path`` (a config.json or its directory) into a :class:`ModelSpec`."""
    p = config_path(path)
    data = schema.load_json(p, "model config")
    return spec_from_hf(data, str(p))


def _model_type(d: Mapping[str, Any], source: str) -> str | None:
    """The Llama-family type the config names (by ``architectures``, else ``model_type``); an
    architecture and a ``model_type`` naming two different ones are refused (transformers builds
    the ``model_type``'s class, whatever ``architectures`` says); None for any other model."""
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise HexicoreError("expected a list of class names (strings), as transformers writes it", source=source,
                            field="architectures")
    by_arch = {v: k for k, v in ARCHITECTURES.items()}
    mt = d.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise HexicoreError(f"expected a string, got {type(mt).__name__}", source=source, field="model_type")
    for a in archs:
        if a in by_arch:
            if isinstance(mt, str) and mt in ARCHITECTURES and mt != by_arch[a]:
                raise HexicoreError(f"{a} is a {by_arch[a]} model but model_type is {mt!r} (transformers would "
                                    "build that); make the two agree", source=source, field="model_type")
            return by_arch[a]
    if isinstance(mt, str) and mt in ARCHITECTURES:
        return str(mt)
    return None


def _refuse_unsupported(d: Mapping[str, Any], mt: str, source: str) -> int | None:
    """Refuse what the runtime cannot train; the sliding window, when one applies (full
    attention equals it only on sequences no longer than the window, so it bounds the training
    sequence)."""
    for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"):
        if d.get(k):
            raise HexicoreError("mixture-of-experts models are not supported by the runtime", source=source, field=k)
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise HexicoreError(f"activation {act!r} is not supported (SiLU/SwiGLU only)", source=source, field="hidden_act")
    if d.get("mlp_bias"):
        raise HexicoreError("MLP biases are not supported by the runtime", source=source, field="mlp_bias")
    return _window(d, mt, source)


def _window(d: Mapping[str, Any], mt: str, source: str) -> int | None:
    """The sliding window that applies, as transformers reads the config: Mistral's on every
    layer; Qwen2's only with ``use_sliding_window``, on the layers ``layer_types`` marks
    ``sliding_attention`` (given, or from layer ``max_window_layers`` on); Llama has none."""
    window = d.get("sliding_window")
    if window is None or mt == "llama" or (mt == "qwen2" and not d.get("use_sliding_window")):
        return None
    if mt == "qwen2":
        types = d.get("layer_types")
        if types is None:
            first = schema.integer(d.get("max_window_layers", 28), source, "max_window_layers", minimum=0)
            if first >= schema.integer(d.get("num_hidden_layers"), source, "num_hidden_layers"):
                return None
        elif "sliding_attention" not in schema.as_list(types, source, "layer_types"):
            return None
    return schema.integer(window, source, "sliding_window", minimum=1)


def _rope(d: Mapping[str, Any], source: str) -> tuple[float, tuple[tuple[str, Any], ...]]:
    """(rope_theta, rope_scaling pairs) from either config layout; refuses unknown rope types.
    A config with both layouts must say the same in each: transformers versions differ in
    which one they read (5.x takes ``rope_scaling`` with the top-level ``rope_theta``)."""
    found = [(k, d[k]) for k in ("rope_parameters", "rope_scaling") if d.get(k)]  # {} or null: not given
    read = []
    for field_name, params in found or [("rope_scaling", {})]:
        params = schema.as_mapping(params, source, field_name)
        scaling = rope_scaling_pairs(params, source, field_name)
        theta = schema.number(params.get("rope_theta", d.get("rope_theta", 10000.0)), source, "rope_theta")
        read.append((theta, scaling))
    if len(read) == 2 and read[0] != read[1]:
        raise HexicoreError(f"rope_scaling {_said(read[1])} and rope_parameters {_said(read[0])} disagree; "
                            "give one of them", source=source, field="rope_scaling")
    return read[0]


def _said(rope: tuple[float, tuple[tuple[str, Any], ...]]) -> str:
    return f"(rope_theta {rope[0]:g}, {dict(rope[1]).get('rope_type', 'default')})"


def spec_from_hf(data: Any, source: str = "config.json") -> ModelSpec:
    """Validate a Hugging Face config mapping into a :class:`ModelSpec` (module docstring)."""
    d = schema.as_mapping(data, source, None)
    mt = _model_type(d, source)
    if mt is None:
        spec = shape_spec(d, source)
        special_tokens(d, source, spec.vocab)  # checked where read, as below
        return spec

    def integer(key: str, default: Any = None) -> int:
        value = d.get(key)  # null means the default, as transformers reads it
        value = default if value is None else value
        if value is None:
            raise HexicoreError("missing required field", source=source, field=key)
        return schema.integer(value, source, key)

    window = _refuse_unsupported(d, mt, source)
    max_pos = integer("max_position_embeddings", DEFAULT_SEQ_LEN)
    max_pos = min(max_pos, window) if window else max_pos
    seq_len = min(max_pos, DEFAULT_SEQ_LEN)
    heads = integer("num_attention_heads")
    hidden = integer("hidden_size")
    theta, scaling = _rope(d, source)
    tied = d.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise HexicoreError("expected true or false", source=source, field="tie_word_embeddings")
    bias = False if d.get("attention_bias") is None else d["attention_bias"]
    if not isinstance(bias, bool):
        raise HexicoreError("expected true or false", source=source, field="attention_bias")
    try:
        spec = ModelSpec(
            name=str(d.get("_name_or_path") or Path(source).parent.name or mt), layers=integer("num_hidden_layers"),
            hidden=hidden, heads=heads, kv_heads=integer("num_key_value_heads", heads), ffn=integer("intermediate_size"),
            vocab=integer("vocab_size"), seq_len=seq_len, tied_embeddings=tied,
            head_dim=integer("head_dim") if d.get("head_dim") is not None else None,
            qkv_bias=True if mt == "qwen2" else bias and mt == "llama", o_bias=bias and mt == "llama",
            norm_eps=schema.number(d.get("rms_norm_eps", 1e-6), source, "rms_norm_eps"),
            rope_theta=theta, rope_scaling=scaling, max_position=max_pos, hf_model_type=mt)
    except HexicoreError as exc:
        raise exc.located(source, None) from None
    special_tokens(d, source, spec.vocab)  # checked where read: plan and train accept the same files
    return spec


#: a shape's fields -> the names decoder-only configs give them, first found wins
SHAPE_FIELDS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "ffn": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff"),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}
#: model types whose block is GPT-2's (LayerNorm, one up and one down FFN matrix, biases); any
#: other decoder is priced as a gated (SwiGLU/GeGLU) RMSNorm block, Llama's
UNGATED = frozenset({"gpt2", "gpt_neo", "gpt_neox", "gptj", "opt", "falcon", "phi", "bloom", "mpt", "gpt_bigcode",
                     "codegen", "biogpt", "starcoder2", "xglm"})
#: model types whose configs tie the head to the embedding unless ``tie_word_embeddings`` says not
#: (transformers' own default for these classes)
TIED_BY_DEFAULT = frozenset({"gpt2", "gpt_neo", "opt", "falcon", "bloom", "mpt", "gpt_bigcode", "gemma", "gemma2",
                             "gemma3_text", "xglm", "biogpt"})


def _shape_field(d: Mapping[str, Any], name: str, source: str, default: Any = None) -> int:
    """The first of :data:`SHAPE_FIELDS` ``name`` the config gives (null: not given), or
    ``default``; missing with no default is one line naming every spelling."""
    keys = SHAPE_FIELDS[name]
    for key in keys:
        if d.get(key) is not None:
            return schema.integer(d[key], source, key)
    if default is None:
        raise HexicoreError(f"missing required field (one of: {', '.join(keys)})", source=source, field=keys[0])
    return default


def shape_spec(d: Mapping[str, Any], source: str) -> ModelSpec:
    """Any decoder-only config (GPT-2, GPT-Neo, GPT-NeoX, GPT-J, OPT, Falcon, Phi, Gemma, ...)
    read by its shape alone, for planning: hidden size, layers, heads, KV heads (Falcon's
    multi-query: one), FFN width (default 4 x hidden), vocabulary, positions, tied head. The
    block is GPT-2's for the :data:`UNGATED` types, else Llama's; ``hf_model_type`` keeps the
    config's ``model_type``, so the torch runtime (Llama, Mistral, Qwen2) refuses to train it.
    Encoder-decoder configs are refused."""
    if d.get("is_encoder_decoder"):
        raise HexicoreError("an encoder-decoder model; hexicore plans decoder-only models", source=source,
                            field="is_encoder_decoder")
    mt = d.get("model_type")
    if mt is not None and not (isinstance(mt, str) and mt.replace("_", "").isalnum()):
        raise HexicoreError(f"expected a model type such as \"gpt2\", got {mt!r}"[:200], source=source,
                            field="model_type")
    mt = mt or "unknown"
    hidden = _shape_field(d, "hidden", source)
    heads = _shape_field(d, "heads", source)
    if mt == "falcon" and not d.get("new_decoder_architecture"):
        kv = 1 if d.get("multi_query", True) else heads
    else:
        kv = _shape_field(d, "kv_heads", source, heads)
    positions = _shape_field(d, "positions", source, DEFAULT_SEQ_LEN)
    tied = d.get("tie_word_embeddings", mt in TIED_BY_DEFAULT)
    if not isinstance(tied, bool):
        raise HexicoreError("expected true or false", source=source, field="tie_word_embeddings")
    gated = mt not in UNGATED
    try:
        return ModelSpec(
            name=str(d.get("_name_or_path") or Path(source).parent.name or mt), layers=_shape_field(d, "layers", source),
            hidden=hidden, heads=heads, kv_heads=kv, ffn=_shape_field(d, "ffn", source, 4 * hidden),
            vocab=_shape_field(d, "vocab", source), seq_len=min(positions, DEFAULT_SEQ_LEN),
            arch="llama" if gated else "gpt", norm="rmsnorm" if gated else "layernorm", tied_embeddings=tied,
            head_dim=schema.integer(d["head_dim"], source, "head_dim") if gated and d.get("head_dim") else None,
            max_position=positions, hf_model_type=mt)
    except HexicoreError as exc:
        raise exc.located(source, None) from None


#: the special token ids of a Hugging Face config, as :class:`SpecialTokens` names them
TOKEN_ID_FIELDS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "pad_token_id"}


@dataclass(frozen=True)
class SpecialTokens:
    """The special token ids a Hugging Face ``config.json`` carries (``eos`` may be several,
    as Llama 3's). They do not change the network, so they are no part of the
    :class:`ModelSpec` (nor of a plan, nor of what resuming compares): they only travel from
    the model's source to ``out/final/config.json`` and ``generation_config.json``."""

    bos: int | None = None
    eos: int | tuple[int, ...] | None = None
    pad: int | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.bos, self.eos, self.pad))

    def to_json(self) -> dict[str, Any]:
        """``{"bos_token_id": ..., "eos_token_id": ..., "pad_token_id": ...}``, the ids given only."""
        out: dict[str, Any] = {}
        for attr, key in TOKEN_ID_FIELDS.items():
            v = getattr(self, attr)
            if v is not None:
                out[key] = list(v) if isinstance(v, tuple) else v
        return out


def token_id(value: Any, source: str, field: str, vocab: int | None, *, several: bool = False) -> Any:
    """One special token id as a config gives it: null, an integer (negative: "none", a
    convention of some configs) below ``vocab``, or (``several``) a non-empty list of them."""
    if value is None:
        return None
    if several and isinstance(value, list):
        if not value:
            raise HexicoreError("expected an id or a non-empty list of ids, got []", source=source, field=field)
        return tuple(token_id(v, source, field, vocab) for v in value)
    if not is_whole(value):
        what = "an integer id or a list of them" if several else "an integer id or null"
        raise HexicoreError(f"expected {what}, got {shown(value)}"[:200], source=source, field=field)
    if vocab is not None and value >= vocab:
        raise HexicoreError(f"id {shown(value, 40)} is outside the vocabulary of {vocab}", source=source, field=field)
    return value


def special_tokens(data: Mapping[str, Any], source: str, vocab: int | None = None) -> SpecialTokens:
    """The ``bos_token_id``/``eos_token_id``/``pad_token_id`` of a config (or generation config)
    mapping, checked (one line naming the field); absent or null ids are None."""
    return SpecialTokens(**{attr: token_id(data.get(key), source, key, vocab, several=attr == "eos")
                            for attr, key in TOKEN_ID_FIELDS.items()})


def hf_config_dict(spec: ModelSpec, tokens: SpecialTokens | None = None) -> dict[str, Any]:
    """The ``config.json`` that ``transformers.AutoModelForCausalLM`` reads for ``spec`` (a
    Llama config for hexicore's own Llama-style specs), with the special token ids ``tokens``
    gives (none for hexicore's own model YAMLs)."""
    if spec.arch != "llama" or (spec.hf_model_type and spec.hf_model_type not in ARCHITECTURES):
        got = spec.hf_model_type if spec.arch == "llama" else spec.arch
        raise HexicoreError(f"only Llama-style models can be written as Hugging Face checkpoints, got {shown(got)}",
                            field="model.arch")
    mt = spec.hf_model_type or "llama"
    rope: dict[str, Any] = {"rope_theta": spec.rope_theta, "rope_type": "default"}
    rope.update(_rope_json(spec.rope_scaling))
    d: dict[str, Any] = {
        "architectures": [ARCHITECTURES[mt]], "model_type": mt, "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab,
        "rms_norm_eps": spec.norm_eps, "hidden_act": "silu",
        "max_position_embeddings": spec.max_position or spec.seq_len,
        "tie_word_embeddings": spec.tied_embeddings, "rope_parameters": rope, "rope_theta": spec.rope_theta,
        "torch_dtype": "float32", "_name_or_path": spec.name,  # the name a plan of this directory keeps
    }
    if spec.rope_scaling:
        d["rope_scaling"] = _rope_json(spec.rope_scaling)
    if mt == "qwen2":
        d.update(use_sliding_window=False, sliding_window=None)
    else:
        d["attention_bias"] = spec.o_bias
        if mt == "mistral":
            d["sliding_window"] = None
    d.update(tokens.to_json() if tokens else {})
    return d


def _rope_json(scaling) -> dict[str, Any]:
    """Rope scaling as transformers expects it (``original_max_position_embeddings`` an integer)."""
    d = dict(scaling)
    if isinstance(d.get("original_max_position_embeddings"), float):
        d["original_max_position_embeddings"] = int(d["original_max_position_embeddings"])
    return d


def write_hf_config(spec: ModelSpec, folder: str | Path, tokens: SpecialTokens | None = None) -> Path:
    """Write ``folder/config.json`` atomically, marked ``"format": "hexicore.hf_config/1"`` (the
    mark :mod:`hexicore.core.ownership` recognises; transformers ignores the extra key)."""
    doc = {**hf_config_dict(spec, tokens), "format": "hexicore.hf_config/1"}
    return schema.write_text_atomic(Path(folder) / "config.json", json.dumps(doc, indent=2) + "\n")
