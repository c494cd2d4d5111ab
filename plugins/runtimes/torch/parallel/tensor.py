"""Megatron-style tensor parallelism (Shoeybi et al. 2019, §3): column- and row-parallel linears.

A TP group of ``size`` ranks splits each attention block by heads and each MLP by FFN columns:
``q/k/v_proj`` and ``gate/up_proj`` are *column* parallel (output features sharded, dim 0 of the
weight), ``o_proj`` and ``down_proj`` are *row* parallel (input features sharded, dim 1). Two
conjugate operators glue them (Megatron's ``f`` and ``g``):

* :func:`copy_to` — identity forward, all-reduce of the gradient backward (enters a TP region);
* :func:`reduce_from` — all-reduce forward, identity backward (leaves it).

Everything else (norms, embedding, head) is replicated; its gradients come out identical on every
TP rank because its inputs and output gradients are identical there, so it needs no sync. With
``train.vocab_parallel`` (:attr:`TPGroup.vocab_parallel`) the embedding and the head are split
too, by vocabulary rows (:mod:`.vocab`: dim 0 of both weights, :func:`shard_range`'s rows).
A :class:`TPGroup` with ``group=None`` and ``size > 1`` is a *simulated* shard: the all-reduces
are identities, so single-process tests can sum per-shard partial outputs by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: module name -> dimension of its ``weight`` that TP shards (0: column parallel, 1: row parallel)
SHARD_DIM = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0, "o_proj": 1, "down_proj": 1}


@dataclass(frozen=True)
class TPGroup:
    """This rank's place in a tensor-parallel group (``group``: a torch process group or None)."""

    rank: int = 0
    size: int = 1
    group: Any = None
    #: whether the embedding and the head are split by vocabulary across the group (:mod:`.vocab`)
    vocab_parallel: bool = False

    def all_reduce(self, t: torch.Tensor, op: Any = None) -> torch.Tensor:
        """Sum (or ``op``, a ``torch.distributed.ReduceOp``) ``t`` in place over the group."""
        if self.size > 1 and self.group is not None:
            torch.distributed.all_reduce(t, group=self.group, **({} if op is None else {"op": op}))
        return t

    @property
    def vocab_split(self) -> bool:
        """Whether this rank holds only its vocabulary rows of the embedding and the head."""
        return self.vocab_parallel and self.size > 1


#: the parameters :mod:`.vocab` splits by vocabulary rows (dim 0) under ``train.vocab_parallel``
VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")


def shard_dim(name: str, vocab_parallel: bool = False) -> int | None:
    """The TP shard dimension of a parameter by its standard name (None: replicated). Biases of
    column-parallel projections (q/k/v) are sharded with their output features; the bias of a
    row-parallel one (o_proj) is replicated and added once after the all-reduce. With
    ``vocab_parallel`` the embedding and the head are split by vocabulary rows (dim 0)."""
    if name in VOCAB_ROWS:
        return 0 if vocab_parallel else None
    parts = name.split(".")
    if len(parts) < 2:
        return None
    if parts[-1] == "weight":
        return SHARD_DIM.get(parts[-2])
    if parts[-1] == "bias":
        return 0 if SHARD_DIM.get(parts[-2]) == 0 else None
    return None


def shard_range(full: int, rank: int, size: int) -> tuple[int, int]:
    """``[lo, hi)`` of TP rank ``rank``'s contiguous piece of ``full`` elements among ``size``:
    even where ``size`` divides ``full`` (heads and FFN columns always do, :func:`..assignment.check_model`);
    a vocabulary it does not divide is split unevenly, the first ``full % size`` ranks one row more."""
    base, extra = divmod(full, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def shard(full: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    """This rank's contiguous slice of a full tensor (heads / FFN columns / vocabulary rows stay
    contiguous; :func:`shard_range`)."""
    if dim is None or size == 1:
        return full
    lo, hi = shard_range(full.shape[dim], rank, size)
    return full.narrow(dim, lo, hi - lo)


def unshard(pieces: list[torch.Tensor], dim: int | None) -> torch.Tensor:
    """Inverse of :func:`shard`: pieces ordered by TP rank."""
    return pieces[0] if dim is None or len(pieces) == 1 else torch.cat(pieces, dim=dim)


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):  # noqa: D102
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        return ctx.tp.all_reduce(g.clone()), None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):  # noqa: D102
        return tp.all_reduce(x.clone())

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        return g, None


def copy_to(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Megatron ``f``: enter a TP region (identity forward, all-reduce backward). Under autocast
    the input is cast to the autocast dtype first — the projections it feeds would each cast it
    anyway — so they share one low-precision copy for backward (not one each), and with TP the
    backward all-reduces its gradient in bf16/fp16, as Megatron-LM does and as the cost model
    prices TP messages (``B_type`` bytes), not in the fp32 of the residual stream."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind) and x.is_floating_point():
        x = x.to(torch.get_autocast_dtype(kind))
    return x if tp.size == 1 else _CopyTo.apply(x, tp)


def reduce_from(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Megatron ``g``: leave a TP region (all-reduce forward, identity backward)."""
    return x if tp.size == 1 else _ReduceFrom.apply(x, tp)
