"""The global gradient norm of a step and gradient clipping by it, as one process computes them.

``torch.nn.utils.clip_grad_norm_`` on one process over the whole model takes the L2 norm of
every gradient element once, after the step's gradient is summed, and scales every gradient by
``min(1, clip_grad / (norm + 1e-6))``. Distributed, every element must still count once: each
rank sums the squares of the elements it *counts* (:func:`counted`), one all-reduce of that
scalar over the ranks the layout uses gives every rank the same norm, so every rank uses the same coefficient.

Who counts what, after the step's sums (``REDUCE`` of stage replicas, the data-parallel sync,
the tied-embedding group — so every copy of an element holds the summed gradient):

* tensors the plain AdamW updates: pipeline 0's copies only (every pipeline holds the whole
  model; DP replicas are equal after the sync), chain 0's (Chimera's copies are equal after
  ``REDUCE``), a TP-sharded tensor on every TP rank (each holds its own slice; under
  ``train.vocab_parallel`` the embedding and the head too), a replicated one
  (norms, embedding, head, the o bias) on TP rank 0 only, a Parameter shared by two chunks of a
  rank once, and a tied head not at all (it is the embedding, which chain 0's first stage counts);
* tensors ZeRO shards (:class:`.zero_state.ShardedAdamW`, :class:`.zero_state.ShardedState`): each
  rank's piece of every chunk group's summed gradient bucket — the pieces tile the bucket and a
  bucket holds each chunk of each tensor once; under hybrid sharding every machine holds a
  tiling, and only the pieces of the group's first machine count (:func:`.hybrid.counted`).

The sharded optimizers therefore run in two phases: the summed gradient pieces of every group
first, then (with the norm known) the updates.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from ...model.llama import HEAD
from ..tensor import shard_dim

#: torch.nn.utils.clip_grad_norm_'s guard against a zero norm
EPS = 1e-6


def squares(grads: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of the squares of every element of ``grads`` (float64 accumulator, on ``device``)."""
    grads = [g for g in grads if g.numel()]
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch._foreach_norm(grads)  # one fused kernel per device and dtype, as clip_grad_norm_ does
    return torch.stack([n.to(device=device, dtype=torch.float64) for n in norms]).pow(2).sum()


def counted(stages: dict, tp_rank: int, pipeline: int, skip: set) -> list[torch.Tensor]:
    """The gradients of this rank's plain (not ZeRO-sharded: ``skip`` holds ``(stage, name)``
    of the sharded ones) tensors it counts in the global norm (module docstring)."""
    if pipeline != 0:
        return []
    seen, out = set(), []
    for s in sorted(stages):
        st = stages[s]
        if not st.primary:
            continue
        tied = st.module.spec.tied_embeddings
        for name, p in st.module.named_parameters():
            if (s, name) in skip or id(p) in seen or p.grad is None or (tied and name == HEAD):
                continue
            if shard_dim(name, st.module.tp.vocab_parallel) is None and tp_rank != 0:
                continue
            seen.add(id(p))
            out.append(p.grad)
    return out


def global_norm(local: torch.Tensor, ranks: int, group=None) -> float:
    """The L2 norm from every rank's ``local`` sum of squares (collective over ``group``, the
    ``ranks`` ranks a layout uses; None: the world)."""
    if ranks > 1:
        dist.all_reduce(local, group=group)
    return float(local.sqrt())


def coefficient(norm: float, clip_grad: float | None) -> float | None:
    """torch's clip coefficient ``min(1, clip_grad / (norm + 1e-6))``; None without clipping."""
    if clip_grad is None:
        return None
    return min(1.0, clip_grad / (norm + EPS))


@torch.no_grad()
def step_plain(optimizer: torch.optim.Optimizer, lr: float | None, coef: float | None) -> None:
    """Scale the plain AdamW's gradients by ``coef`` (None: unclipped), set this step's ``lr``
    (None: keep it), step and free the gradients."""
    for group in optimizer.param_groups:
        if lr is not None:
            group["lr"] = lr
        if coef is not None:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(coef)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


__all__ = ["EPS", "squares", "counted", "global_norm", "coefficient", "step_plain"]
