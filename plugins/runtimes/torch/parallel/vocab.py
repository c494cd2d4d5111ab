"""Vocabulary parallelism: the token embedding, the head and the loss split by vocabulary rows
across a stage's TP group (Shoeybi et al. 2019, §3: Megatron-LM's ``VocabParallelEmbedding``,
column-parallel output layer and parallel cross-entropy), under ``train.vocab_parallel`` with a
TP group of more than one rank (:attr:`.tensor.TPGroup.vocab_split`).

TP rank ``r`` of ``t`` holds rows ``[lo, hi)`` of the ``V`` rows of ``model.embed_tokens.weight``
and of ``lm_head.weight`` (:func:`.tensor.shard_range`: ``V / t`` each, or, where ``t`` does not
divide ``V``, the first ``V mod t`` ranks one row more — no padding, so every stored tensor keeps
the model's shape); a tied head is the same Parameter, so the same rows.

* :class:`VocabEmbedding`: each rank looks up the tokens in its range and writes zeros for the
  others; one all-reduce of the ``[B, S, H]`` output (:func:`.tensor.reduce_from`: sum forward,
  identity backward) gives every rank the whole embedding. Backward touches only the rank's rows.
* :class:`VocabHead`: column parallel over the vocabulary: :func:`.tensor.copy_to` (identity
  forward, all-reduce of the input's gradient backward), then each rank its ``hi - lo`` logits.
* :func:`cross_entropy_sum`: ``sum_n (log sum_v exp z_nv - z_n,target)`` without ever gathering
  the logits: three all-reduces of one fp32 number per token — the row maximum ``m`` (MAX), the
  target's logit ``z_target - m`` (SUM; only the rank holding the target contributes) and
  ``sum_v exp(z_v - m)`` (SUM). Backward needs no communication: the gradient of the rank's
  logits is ``(softmax - onehot(target)) x`` the loss gradient, on its columns only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .tensor import TPGroup, copy_to, reduce_from, shard_range


class VocabEmbedding(nn.Module):
    """This rank's rows ``[lo, hi)`` of the token embedding (module docstring)."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.lo, self.hi = shard_range(vocab, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(self.hi - self.lo, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.lo) | (ids >= self.hi)
        out = F.embedding((ids - self.lo).masked_fill(outside, 0), self.weight)
        return reduce_from(out.masked_fill(outside.unsqueeze(-1), 0.0), self.tp)


class VocabHead(nn.Module):
    """This rank's rows ``[lo, hi)`` of the output projection: its slice of the logits."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.lo, self.hi = shard_range(vocab, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(self.hi - self.lo, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to(x, self.tp), self.weight)


class _CrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split by vocabulary columns (module docstring)."""

    @staticmethod
    def forward(ctx, logits, target, lo, tp):  # noqa: D102
        z = logits - tp.all_reduce(logits.max(dim=-1).values, torch.distributed.ReduceOp.MAX).unsqueeze(-1)
        outside = (target < lo) | (target >= lo + logits.shape[-1])
        local = (target - lo).masked_fill(outside, 0)
        picked = tp.all_reduce(z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0))
        soft = z.exp_()
        total = tp.all_reduce(soft.sum(dim=-1))
        soft.div_(total.unsqueeze(-1))
        ctx.save_for_backward(soft, local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        soft, local, outside = ctx.saved_tensors
        rows = torch.arange(soft.shape[0], device=soft.device)
        soft[rows, local] -= (~outside).to(soft.dtype)  # softmax - onehot, in place as Megatron-LM does
        return soft.mul_(grad.unsqueeze(-1)), None, None, None


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor, lo: int, tp: TPGroup) -> torch.Tensor:
    """``sum(cross-entropy)`` of ``logits [N, hi - lo]`` (this rank's vocabulary columns,
    starting at row ``lo``) against ``target [N]`` (ids over the whole vocabulary); every rank of
    ``tp`` gets the same value, and its logits their own gradient."""
    return _CrossEntropy.apply(logits.float(), target, lo, tp).sum()
