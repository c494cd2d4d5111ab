"""Checkpoints of sharded training state (ZeRO-1/2/3): the same files as unsharded training.

A checkpoint (:mod:`.checkpoint`: ``checkpoints/step_K/``, ``out/final/``) stores full tensors
under standard names, whatever the plan, so it must not depend on the ZeRO stage either. Under
ZeRO a chunk group's AdamW moments (and, ZeRO-3, its fp32 weights) live as pieces of the group's
flat bucket (:mod:`.zero`, :mod:`.dp_sync`): member ``i`` of the ranks that tile the bucket
(all holders, or, hybrid, the holders in its machine: :mod:`.hybrid`) keeps ``bounds[i]``.

Saving (:func:`full_local`, collective over each group): the pieces are all-gathered among the
ranks that tile the bucket, and every holder cuts the whole bucket back into the chunks of its
local tensors — exactly what an unsharded rank holds — so :func:`.checkpoint.local_pieces`
reports them like unsharded state and rank 0 consolidates and writes as before. The gathered
tensors exist only while the checkpoint is written (every holder gathers, not only the
writers: one collective per group, no point-to-point bookkeeping).

Resuming (:func:`restore`): each rank reads, slice by slice, the TP slices of its local tensors
from ``optim.safetensors`` (as :func:`.checkpoint.restore_optimizer` does), concatenates the
chunks of each group in bucket order and keeps its piece ``bounds[i]``; the AdamW step count
comes from ``meta.json``. ZeRO-3 weights need nothing: the parameters are initialised from the
checkpoint's model before the sharded state takes its pieces of them. So a checkpoint written
under any stage and plan resumes under any other.

The sharded objects are read through their pieces per group only: :class:`.dp_sync.ShardedAdamW`
(``splits``, ``moments``) and :class:`.zero.ShardedState` (``groups``: ``members``, ``bounds``,
``i``, ``handle``, ``chunks``, ``avg``, ``sq``, ``weights``) — both with the step count ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .checkpoint import OPTIM_KEYS, optim_source
from .tensor_parallel import TPGroup, shard_dim
from .zero import gather_pieces


@dataclass(frozen=True)
class Shard:
    """One chunk group as this rank keeps it: ``tensors`` (``exp_avg``, ``exp_avg_sq``, and
    ``param`` under ZeRO-3) are its pieces ``bounds[i]`` of the flat bucket of ``chunks``;
    ``handle`` is the communicator of the ranks whose pieces tile the bucket (None: alone)."""

    chunks: list
    bounds: list[tuple[int, int]]
    i: int
    handle: Any
    tensors: dict[str, torch.Tensor]


def shards(sharded: Any) -> list[Shard]:
    """The :class:`Shard` of every chunk group of a :class:`.dp_sync.ShardedAdamW` or a
    :class:`.zero.ShardedState` (module docstring)."""
    if hasattr(sharded, "splits"):
        out = []
        for members, _, chunks in sharded.sync.items:
            sp = sharded.splits[members]
            handle = sharded.handle(sp.peers) if len(sp.peers) > 1 else None
            avg, sq = sharded.moments[members]
            out.append(Shard(chunks, list(sp.bounds), sp.i, handle, {"exp_avg": avg, "exp_avg_sq": sq}))
        return out
    out = []
    for g in sharded.groups:
        tensors = {"exp_avg": g.avg, "exp_avg_sq": g.sq}
        if getattr(sharded, "stage", 0) == 3:
            tensors["param"] = g.weights
        out.append(Shard(g.chunks, list(g.bounds), g.i, g.handle if len(g.bounds) > 1 else None, tensors))
    return out


def _params(stages: dict) -> dict[tuple[int, str], torch.nn.Parameter]:
    return {(s, n): p for s in sorted(stages) for n, p in stages[s].module.named_parameters()}


@torch.no_grad()
def full_local(sharded: Any, stages: dict, wait: Callable) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """Collective over every chunk group: ``(stage, name) -> {"exp_avg", "exp_avg_sq", "step"
    (, "param")}``, full local tensors (this rank's TP slice) on the CPU, for every tensor the
    sharded state covers (empty outside pipeline 0, which alone reports)."""
    params = _params(stages)
    step = torch.tensor(float(sharded.t))
    out: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for sh in shards(sharded):
        for key, piece in sh.tensors.items():
            flat = piece if sh.handle is None else \
                gather_pieces(piece, sh.bounds, sh.handle, wait, f"checkpoint gather of ZeRO {key} pieces")
            if sharded.sync.pipeline != 0:
                continue  # only pipeline 0 reports tensors (:func:`.checkpoint.local_pieces`)
            k = 0
            for c, mine, _ in sh.chunks:
                for h in mine:
                    p = params[(h.stage, c.name)]
                    item = out.setdefault((h.stage, c.name), {"step": step})
                    if key not in item:
                        item[key] = torch.zeros(p.shape, dtype=piece.dtype)
                    v = item[key] if c.dim is None else \
                        item[key].narrow(c.dim, c.lo - c.full // h.tp_size * h.tp_rank, c.hi - c.lo)
                    v.copy_(flat[k: k + c.numel].view_as(v).cpu())
                k += c.numel
    return out


@torch.no_grad()
def restore(sharded: Any, stages: dict, tp: TPGroup, ck: dict[str, Any]) -> None:
    """Give every chunk group's pieces their values from checkpoint ``ck`` (module docstring)."""
    if ck.get("adam_step") is None:
        return
    src = optim_source(ck)
    params = _params(stages)
    cache: dict[tuple[str, str], torch.Tensor] = {}

    def local(key: str, name: str, p: torch.Tensor) -> torch.Tensor:
        if (key, name) not in cache:
            dim, full = shard_dim(name), list(p.shape)
            if dim is not None:
                full[dim] *= tp.size
            cache[(key, name)] = src.with_prefix(f"{key}.").read(name, tuple(full), dim, tp.rank, tp.size)
        return cache[(key, name)]

    for sh in shards(sharded):
        lo, hi = sh.bounds[sh.i]
        for key in OPTIM_KEYS:
            parts = []
            for c, mine, _ in sh.chunks:
                h = mine[0]
                t = local(key, c.name, params[(h.stage, c.name)])
                if c.dim is not None:
                    t = t.narrow(c.dim, c.lo - c.full // h.tp_size * h.tp_rank, c.hi - c.lo)
                parts.append(t.reshape(-1))
            flat = torch.cat(parts)
            sh.tensors[key].copy_(flat[lo:hi].to(sh.tensors[key].device, sh.tensors[key].dtype))
    sharded.t = int(round(float(ck["adam_step"])))


__all__ = ["Shard", "shards", "full_local", "restore"]
