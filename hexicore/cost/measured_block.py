"""A profile's block measurements read at a plan's shape: seconds and activation bytes.

**Seconds** (:func:`interpolate`): affine in the block's FLOPs (:func:`block_flops`, counted as
the model's own blocks are) through the two nearest measurements, proportional beyond them.

**Activation bytes** (:func:`activation_bytes`): the bytes one block keeps for backward.
``hexicore profile`` records per block ``activation_bytes``: what one forward of one micro-batch
leaves allocated for its backward (the CUDA allocator's growth; on CPU the distinct saved
tensors). That is more than the analytic per-layer formula (Korthikanti et al., 2022, eq. 2,
written for GPT's 4h MLP and 16-bit tensors): Llama's SwiGLU keeps three ``ffn``-wide tensors,
norms and rotary embeddings keep fp32 copies, and under autocast each forward keeps the bf16
casts of the fp32 weights it multiplied by (each micro-batch its own, as every forward action
enters its own autocast region). One H200 run measured 1.28 GiB a Llama-2-7B block at 4,096
tokens where the formula gives 0.53 (docs/results.md, "GPU figures").

Measurements are taken where they apply: the block's shape (:func:`own_shape`) and the plan's
dtype must match; a TP degree not measured is scaled from the nearest one measured as the
formula scales between the two (its split parts ``/ tp``, the rest whole); across micro-batch
sizes and sequence lengths the bytes are interpolated in tokens (``micro_batch x seq_len``):
affine through the two nearest measurements (the weight casts are a fixed part, the
activations grow with the tokens; attention through SDPA or flash-attn keeps no ``S x S``
scores), proportional with a single one. Anything else is the analytic formula's, with a
one-line note.
"""

from __future__ import annotations

from typing import Sequence

from hexicore.core.model import ModelSpec
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import BlockTiming
from hexicore.cost.block_memory import block_bytes


def own_shape(b: BlockTiming, model: ModelSpec) -> bool:
    """Whether block ``b`` was measured at ``model``'s block shape (each of ``hidden``, ``ffn``,
    ``heads``, ``kv_heads``, ``head_dim`` equal where the profile records it)."""
    return all(getattr(b, k) in (0, getattr(model, k)) for k in ("hidden", "ffn", "heads", "kv_heads", "head_dim"))


def tokens_bytes(points: Sequence[tuple[float, float]], x: float) -> float:
    """Bytes at ``x`` tokens from measured ``(tokens, bytes)``: affine through the two nearest
    distinct measurements (extrapolated beyond them), proportional to the nearest one where
    there is a single token count or the two do not grow with the tokens; never negative."""
    by = {}
    for t, b in points:
        by[t] = max(by.get(t, 0.0), b)
    pts = sorted(by.items(), key=lambda p: (abs(p[0] - x), p[0]))
    (x0, b0) = pts[0]
    if len(pts) > 1:
        inside = [p for p in pts[1:] if (p[0] - x) * (x0 - x) < 0]  # one on the other side of x
        x1, b1 = (inside or pts[1:])[0]
        slope = (b1 - b0) / (x1 - x0)
        if slope > 0:
            return max(b0 + slope * (x - x0), 0.0)
    return b0 * x / x0


def block_flops(b: BlockTiming, model: ModelSpec) -> float:
    """Forward FLOPs of the measured block, counted as ``model``'s own blocks are
    (:meth:`ModelSpec.layer_flops_per_token`: its architecture's MLP, its head width), so a
    block measured at the model's shape and the plan's micro-batch and sequence is priced at
    exactly its measured time; a block of another shape (``hidden``, ``ffn``, ``heads``,
    ``kv_heads``, ``head_dim`` where given) with that shape and ``model``'s architecture."""
    h = b.hidden or model.hidden
    heads = b.heads or model.heads
    own = own_shape(b, model)
    hd = model.head_dim if own else (b.head_dim or h // heads)
    q = heads * hd
    kv = (b.kv_heads or model.kv_heads) * hd
    f = b.ffn or model.ffn
    mlp = 3 if model.arch == "llama" else 2  # SwiGLU's three matrices, GPT's two
    per_token = 2.0 * (2 * h * q + 2 * h * kv + mlp * h * f) + 4.0 * b.seq_len * q
    return per_token * b.micro_batch * b.seq_len


def target_flops(model: ModelSpec, train: TrainSettings) -> float:
    return model.layer_flops_per_token(train.seq_len) * train.micro_batch * train.seq_len


def block_seconds(b: BlockTiming, recompute: bool) -> float:
    """Forward + backward (+ the recomputed forward under recomputation: its measured
    ``recompute_s``, or where that was not measured (0) the measured forward, which it repeats)."""
    return b.forward_s + b.backward_s + ((b.recompute_s or b.forward_s) if recompute else 0.0)


def span(values: Sequence[int]) -> str:
    return f"{values[0]}" if len(values) == 1 else f"{values[0]}-{values[-1]}"


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Time at FLOPs ``x`` from measured ``(flops, seconds)``: affine through the bracketing pair,
    proportional to the nearest point outside the range (or with one point)."""
    pts = sorted(points)
    if len(pts) == 1 or x <= pts[0][0] or x >= pts[-1][0]:
        fx, ft = min(pts, key=lambda p: abs(p[0] - x))
        return ft * x / fx
    for (x0, t0), (x1, t1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return t0 + (t1 - t0) * (x - x0) / (x1 - x0) if x1 > x0 else t0
    return pts[-1][1]  # unreachable: x lies inside the range


def formula_bytes(model: ModelSpec, train: TrainSettings, tp: int, *, recompute: bool = False,
                  weight_bytes: float = 4.0) -> float:
    """The analytic model's bytes of one block for one micro-batch of ``train`` on a rank of a TP
    group of ``tp``: the block's saved tensors (:func:`hexicore.cost.block_memory.block_bytes`,
    weights of ``weight_bytes``), or with ``recompute`` the kept block input alone
    (:meth:`ModelSpec.activation_bytes_per_layer`)."""
    if recompute:
        return model.activation_bytes_per_layer(train.micro_batch, tp=tp, recompute=True,
                                                dtype_bytes=train.dtype_bytes, seq_len=train.seq_len)
    return block_bytes(model, train.micro_batch, train.seq_len, tp, train.dtype_bytes, weight_bytes)


def activation_bytes(blocks: Sequence[BlockTiming], model: ModelSpec, train: TrainSettings,
                     tp: int) -> tuple[float | None, str]:
    """``(bytes, note)``: one block's activations for one micro-batch of ``train`` on one rank of
    a TP group of ``tp``, from the profile entry's ``blocks`` (module docstring). A TP degree
    that was not measured is scaled from the nearest measured one by the analytic formula's
    ratio between the two degrees, tokens outside the measured ones are extrapolated (``note``
    says either); ``(None, why)`` where nothing applies, or where the bytes come out below the
    block's own input (``B*S*H*B_type``, which every backward keeps): not a reading of this
    runtime (a slipped exponent, an extrapolation through zero)."""
    measured = [b for b in blocks if b.activation_bytes > 0 and own_shape(b, model)]
    if not measured:
        return None, ("activation bytes were profiled for another block shape"
                      if any(b.activation_bytes > 0 for b in blocks) else "no activation bytes were profiled")
    near = min({b.tp for b in measured}, key=lambda t: (abs(t - tp), t))
    pts = [(float(b.micro_batch * b.seq_len), b.activation_bytes) for b in measured if b.tp == near]
    tokens = float(train.micro_batch * train.seq_len)
    got = tokens_bytes(pts, tokens)
    notes = []
    if near != tp:
        got *= formula_bytes(model, train, tp) / formula_bytes(model, train, near)
        notes.append(f"activation bytes were not profiled at TP degree {tp}; scaled from TP {near} as the "
                     f"analytic formula scales")
    lo, hi = min(x for x, _ in pts), max(x for x, _ in pts)
    if not lo * (1 - 1e-9) <= tokens <= hi * (1 + 1e-9):
        notes.append(f"activation bytes of {tokens:g} tokens a micro-batch extrapolated from the profiled "
                     f"{lo:g}-{hi:g}")
    floor = formula_bytes(model, train, tp, recompute=True)
    if got < floor:
        return None, (f"activation bytes of {tokens:g} tokens come out at {got:.4g} B, below the block's own "
                      f"input ({floor:.4g} B)")
    return got, "; ".join(notes)
