"""What one transformer block of the torch runtime keeps for its backward, counted tensor by tensor.

The analytic formula of App. A / Korthikanti et al. (2022, eq. 2: ``S*B*H*(10 + 24/t)`` bytes)
is written for GPT blocks whose every tensor is 16-bit. The torch runtime (``plugins/runtimes/
torch/model.py``) trains Llama blocks in fp32 weights under autocast, and keeps per token, on a
rank of a TP group of ``t`` (``q`` the query width ``heads * head_dim``, ``f`` the FFN width):

* in fp32 whatever ``train.dtype`` — the residual stream and the RMSNorms' math: the block input
  ``x``, ``x * rstd``, the residual ``h1`` after attention and ``h1 * rstd``: ``4 x hidden x 4 B``;
* in ``train.dtype`` — the two normed inputs of the projections (whole: TP copies them):
  ``2 x hidden``; the attention's q, k, v (k and v repeated to the query heads) and its output:
  ``4 x q / t``; the MLP's gate, up, ``silu(gate)`` and their product: ``4 x f / t``;
* in fp32, per row: two ``rstd`` and the attention's log-sum-exp per head (``heads / t``).

Per forward, not per token: under autocast (bf16/fp16) the rotary tables' casts, ``4 x S x
head_dim`` in ``train.dtype``, and the cast of every weight a projection multiplies (``2 B x`` the
block's matrices ``/ t``, :func:`weight_cast_bytes`): each forward action enters its own autocast
region, and its backward keeps the casts it multiplied by. Without recomputation the runtime
casts each weight once per step and every micro-batch's forward reuses that cast
(:func:`casts_once`), so a stage holds its blocks' casts once, not once per in-flight
micro-batch; under recomputation (nothing of a forward is kept) and under ZeRO-3 (each weight is
gathered and freed per use) each forward casts its own. A recipe of 16-bit weights (the paper's
8 B of state a parameter) keeps its residual stream in 16 bits and casts nothing.

``hexicore profile`` records the same bytes as ``activation_bytes`` (CPU: the distinct saved
tensors; CUDA: the allocator's growth); ``tests/cost/test_block_memory.py`` holds this count against
that measurement. Other blocks (GPT, LayerNorm) keep the paper's formula.
"""

from __future__ import annotations

from hexicore.core.model import ModelSpec
from hexicore.cost.precision import vocab_matrix

__all__ = ["block_bytes", "casts_once", "counted", "head_cast_bytes", "runtime_block_bytes", "weight_cast_bytes"]


def counted(model: ModelSpec) -> bool:
    """Whether :func:`runtime_block_bytes` counts this block (the runtime's Llama block: arch
    llama with RMSNorm)."""
    return model.arch == "llama" and model.norm == "rmsnorm"


def runtime_block_bytes(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, dtype_bytes: float,
                        weight_bytes: float = 4.0) -> float:
    """Bytes one forward of one micro-batch through one block leaves for its backward on a rank
    of a TP group of ``tp`` (module docstring), computing in ``dtype_bytes`` with weights of
    ``weight_bytes`` (the state recipe's: 4, fp32 under autocast; 2 under the paper's 8 B of
    state a parameter). The residual stream and the norms keep the wider of the two; the weights'
    casts are kept only where the weights are wider than the compute dtype."""
    tokens = micro_batch * seq_len
    h, q, f = model.hidden, model.q_dim, model.ffn
    wide = max(weight_bytes, dtype_bytes)
    per_token = 4 * wide * h + dtype_bytes * (2 * h + 4 * q / tp + 4 * f / tp) + 4 * (2 + model.heads / tp)
    per_forward = 0.0
    if dtype_bytes < 4:  # the fp32 rotary tables' casts
        per_forward += dtype_bytes * 4 * seq_len * model.head_dim
    return tokens * per_token + per_forward + weight_cast_bytes(model, tp, dtype_bytes, weight_bytes)


def weight_cast_bytes(model: ModelSpec, tp: int, dtype_bytes: float, weight_bytes: float = 4.0) -> float:
    """Bytes of one block's weight casts under autocast on a rank of a TP group of ``tp``:
    ``dtype_bytes x (H (2q + 2 kv) + 3 H f) / t`` (its attention and MLP matrices), where the
    weights are wider than the compute dtype; 0 otherwise and for blocks the runtime does not
    count (:func:`counted`)."""
    if not counted(model) or weight_bytes <= dtype_bytes:
        return 0.0
    h = model.hidden
    return dtype_bytes * (h * (2 * model.q_dim + 2 * model.kv_dim) + 3 * h * model.ffn) / tp


def head_cast_bytes(model: ModelSpec, dtype_bytes: float, weight_bytes: float = 4.0, split: int = 1) -> float:
    """Bytes of the head projection's cast under autocast, ``dtype_bytes x V x H`` (whole on every
    TP rank: the runtime keeps the head whole; ``ceil(V / split) x H`` where vocabulary
    parallelism splits it among ``split`` ranks, :func:`hexicore.cost.precision.vocab_matrix`),
    where the weights are wider than the compute dtype and the runtime counts the model's blocks
    (:func:`counted`); 0 otherwise."""
    if not counted(model) or weight_bytes <= dtype_bytes:
        return 0.0
    return dtype_bytes * vocab_matrix(model, split)


def casts_once(recompute: bool, zero_stage: int, dp: int) -> bool:
    """Whether the runtime holds each weight's cast once per step, shared by the micro-batches'
    forwards (module docstring): without recomputation, unless ZeRO-3 frees the weights between
    their uses (``dp > 1``)."""
    return not recompute and not (zero_stage == 3 and dp > 1)


def block_bytes(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, dtype_bytes: float,
                weight_bytes: float = 4.0) -> float:
    """One block's saved bytes for one micro-batch without recomputation: the runtime's count
    (:func:`runtime_block_bytes`) for the blocks it counts, else App. A's formula
    (:meth:`ModelSpec.activation_bytes_per_layer`)."""
    if counted(model):
        return runtime_block_bytes(model, micro_batch, seq_len, tp, dtype_bytes, weight_bytes)
    return model.activation_bytes_per_layer(micro_batch, tp=tp, recompute=False, dtype_bytes=int(dtype_bytes),
                                            seq_len=seq_len)
