"""Checkpoints of sharded training state (ZeRO-1/2/3): the same files as unsharded training.

A checkpoint (:mod:`.native`: ``checkpoints/step_K/``, ``out/final/``) stores full tensors
under standard names, whatever the plan, so it must not depend on the ZeRO stage either. Under
ZeRO a chunk group's AdamW moments (and, ZeRO-3, its fp32 weights) live as pieces of the group's
flat bucket (:mod:`..parallel.data.zero_state`, :mod:`..parallel.data.sync`): member ``i`` of the ranks that tile the bucket
(all holders, or, hybrid, the holders in its machine: :mod:`..parallel.data.hybrid`) keeps ``bounds[i]``.

Saving (:func:`full_local`, collective over each group): the pieces are all-gathered among the
ranks that tile the bucket, and every holder cuts the whole bucket back into the chunks of its
local tensors — exactly what an unsharded rank holds — so :func:`.native.local_pieces`
reports them like unsharded state and rank 0 consolidates and writes as before. The gathered
tensors exist only while the checkpoint is written (every holder gathers, not only the
writers: one collective per group, no point-to-point bookkeeping).

Resuming (:func:`restore`): each rank reads, slice by slice, the TP slices of its local tensors
from ``optim.safetensors`` (as :func:`.native.restore_optimizer` does), concatenates the
chunks of each group in bucket order and keeps its piece ``bounds[i]``; the AdamW step count
comes from ``meta.json``. ZeRO-3 weights need nothing: the parameters are initialised from the
checkpoint's model before the sharded state takes its pieces of them. So a checkpoint written
under any stage and plan resumes under any other.

The sharded objects are read through their pieces per group only: :class:`..parallel.data.zero_state.ShardedAdamW`
(``splits``, ``moments``: one contiguous range of the bucket per member) and
:class:`..parallel.data.zero_state.ShardedState` (``buckets``: ``members``, ``handle``, ``chunks``, ``span``,
``bounds``, ``i``; ``pieces``: weights, gradient, moments — a member's piece is its slice of
every unit, :func:`..parallel.data.sync.apportion`) — both with the step count ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .native import OPTIM_KEYS, optim_source
from ..parallel.data.zero_state import ShardedAdamW, ShardedOptimizer
from ..model.stage_module import full_shape
from ..parallel.tensor import TPGroup, shard_dim, shard_range


@dataclass(frozen=True)
class Shard:
    """One chunk group as this rank keeps it: ``tensors`` (``exp_avg``, ``exp_avg_sq``, and
    ``param`` under ZeRO-3) are its piece of the flat bucket of ``chunks``; member ``j``'s piece
    is the ranges ``slices[j]`` of the bucket, in order; this rank is member ``i``; ``handle``
    is the communicator of the members, whose pieces tile the bucket (None: alone)."""

    chunks: list
    slices: list[list[tuple[int, int]]]
    i: int
    handle: Any
    tensors: dict[str, torch.Tensor]

    @property
    def size(self) -> int:
        return max(hi for ranges in self.slices for _, hi in ranges)

    def mine(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the whole ``flat`` bucket."""
        return torch.cat([flat[lo:hi] for lo, hi in self.slices[self.i]])


def shards(sharded: ShardedOptimizer) -> list[Shard]:
    """The :class:`Shard` of every chunk group of a :class:`..parallel.data.zero_state.ShardedAdamW` or a
    :class:`..parallel.data.zero_state.ShardedState` (module docstring)."""
    if isinstance(sharded, ShardedAdamW):
        out = []
        for members, _, chunks in sharded.sync.items:
            sp = sharded.splits[members]
            handle = sharded.handle(sp.peers) if len(sp.peers) > 1 else None
            avg, sq = sharded.moments[members]
            out.append(Shard(chunks, [[b] for b in sp.bounds], sp.i, handle, {"exp_avg": avg, "exp_avg_sq": sq}))
        return out
    out = []
    for b, (weights, _, avg, sq) in zip(sharded.buckets, sharded.pieces):
        tensors = {"exp_avg": avg, "exp_avg_sq": sq}
        if sharded.frees_weights:  # ZeRO-3 keeps only its piece of the weights
            tensors["param"] = weights
        slices = [[(start + lo, start + hi) for (start, _), bounds in zip(b.span, b.bounds)
                   for lo, hi in [bounds[j]]] for j in range(len(b.members))]
        out.append(Shard(b.chunks, slices, b.i, b.handle if len(b.members) > 1 else None, tensors))
    return out


def gather(sh: Shard, piece: torch.Tensor, wait: Callable, what: str) -> torch.Tensor:
    """All-gather every member's piece of ``sh`` (padded to the largest) into the whole flat bucket."""
    if sh.handle is None:
        return piece
    sizes = [sum(hi - lo for lo, hi in ranges) for ranges in sh.slices]
    buf = torch.zeros(max(sizes), dtype=piece.dtype, device=piece.device)
    buf[: piece.numel()] = piece
    got = [torch.empty_like(buf) for _ in sh.slices]
    wait([torch.distributed.all_gather(got, buf, group=sh.handle, async_op=True)], what)
    flat = torch.empty(sh.size, dtype=piece.dtype, device=piece.device)
    for j, ranges in enumerate(sh.slices):
        k = 0
        for lo, hi in ranges:
            flat[lo:hi] = got[j][k: k + hi - lo]
            k += hi - lo
    return flat


def _params(stages: dict) -> dict[tuple[int, str], torch.nn.Parameter]:
    return {(s, n): p for s in sorted(stages) for n, p in stages[s].module.named_parameters()}


@torch.no_grad()
def full_local(sharded: ShardedOptimizer, stages: dict, wait: Callable) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """Collective over every chunk group: ``(stage, name) -> {"exp_avg", "exp_avg_sq", "step"
    (, "param")}``, full local tensors (this rank's TP slice) on the CPU, for every tensor the
    sharded state covers (empty outside pipeline 0, which alone reports)."""
    params = _params(stages)
    step = torch.tensor(float(sharded.t))
    out: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for sh in shards(sharded):
        for key, piece in sh.tensors.items():
            flat = gather(sh, piece, wait, f"checkpoint gather of ZeRO {key} pieces")
            if sharded.sync.pipeline != 0:
                continue  # only pipeline 0 reports tensors (:func:`.native.local_pieces`)
            k = 0
            for c, mine, _ in sh.chunks:
                for h in mine:
                    p = params[(h.stage, c.name)]
                    item = out.setdefault((h.stage, c.name), {"step": step})
                    if key not in item:
                        item[key] = torch.zeros(p.shape, dtype=piece.dtype)
                    v = item[key] if c.dim is None else \
                        item[key].narrow(c.dim, c.lo - shard_range(c.full, h.tp_rank, h.tp_size)[0], c.hi - c.lo)
                    v.copy_(flat[k: k + c.numel].view_as(v).cpu())
                k += c.numel
    return out


@torch.no_grad()
def restore(sharded: ShardedOptimizer, stages: dict, tp: TPGroup, ck: dict[str, Any]) -> None:
    """Give every chunk group's pieces their values from checkpoint ``ck`` (module docstring)."""
    if ck.get("adam_step") is None:
        return
    src = optim_source(ck)
    params = _params(stages)
    spec = next(iter(stages.values())).module.spec if stages else None
    cache: dict[tuple[str, str], torch.Tensor] = {}

    def local(key: str, name: str, p: torch.Tensor) -> torch.Tensor:
        if (key, name) not in cache:
            dim, full = shard_dim(name, tp.vocab_parallel), full_shape(name, p.shape, tp, spec)
            cache[(key, name)] = src.with_prefix(f"{key}.").read(name, full, dim, tp.rank, tp.size)
        return cache[(key, name)]

    for sh in shards(sharded):
        for key in OPTIM_KEYS:
            parts = []
            for c, mine, _ in sh.chunks:
                h = mine[0]
                t = local(key, c.name, params[(h.stage, c.name)])
                if c.dim is not None:
                    t = t.narrow(c.dim, c.lo - shard_range(c.full, h.tp_rank, h.tp_size)[0], c.hi - c.lo)
                parts.append(t.reshape(-1))
            flat = torch.cat(parts)
            sh.tensors[key].copy_(sh.mine(flat).to(sh.tensors[key].device, sh.tensors[key].dtype))
    sharded.t = int(round(float(ck["adam_step"])))


__all__ = ["Shard", "shards", "gather", "full_local", "restore"]
