"""Asymmetric data-parallel gradient sync: chunked all-reduce among exactly the holders of a chunk.

HexiScale §3.2 (asymmetric plans): pipelines of one plan may cut the model differently and shard
a layer with different TP degrees, so "the same shard in every pipeline" does not exist. Instead,
for every parameter (grouped by its standard name — the layer, not the stage, decides who holds
it) this module cuts the full tensor along its TP shard dimension at *every* shard boundary any
holder has. With TP degrees that divide each other this is exactly HexiScale's rule: every larger
shard is split into chunks of the smallest shard size. Each chunk is all-reduced among exactly the
ranks whose shard contains it — no rank sends or receives a byte it does not hold.

Replicated tensors (norms, embedding, head) are one chunk held by every rank of every stage that
has them. A pipeline can hold a chunk on several ranks (TP ranks of a replicated tensor,
Chimera's model copies after ``REDUCE``); those copies are equal, so one of them — the
*contributor*: first chain, lowest TP rank — puts its gradient in and the others put zeros; every
holder receives the sum. Chunk groups whose holders all belong to one pipeline need no sync.

Batch weighting: each micro-batch loss is ``sum(cross-entropy) / tokens of the global batch``
(:mod:`.executor`), so a pipeline's accumulated gradient is already weighted by its batch share
and the plain sum over pipelines is the full-batch gradient (loss = mean over the global batch).

Every rank derives the same :class:`SyncPlan` from the layout; groups are created once, in the
same order everywhere (``new_group`` is collective); each group's chunks travel in one flat
bucket, in a fixed order, as one asynchronous all-reduce per group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .grad_norm import squares
from .layout import Layout
from .tensor_parallel import shard_dim
from .zero import adamw_, gather_pieces, sum_piece


@dataclass(frozen=True)
class Holder:
    """One stage chunk that holds a parameter: where, and which slice of the full tensor."""

    rank: int
    pipeline: int
    stage: int  # action-list stage id within the pipeline
    chain: int
    tp_rank: int
    tp_size: int


@dataclass(frozen=True)
class Chunk:
    """Elements ``[lo, hi)`` along ``dim`` of parameter ``name`` (``dim=None``: the whole tensor)."""

    name: str
    dim: int | None
    lo: int
    hi: int
    full: int  # size of the full tensor along ``dim`` (0 when replicated)
    numel: int  # elements in the chunk


@dataclass
class SyncPlan:
    """Every chunk group of a layout: member ranks -> ``[(chunk, holders, contributors)]``."""

    groups: dict[tuple[int, ...], list[tuple[Chunk, tuple[Holder, ...], frozenset[Holder]]]] = field(default_factory=dict)

    def members(self) -> list[tuple[int, ...]]:
        """Group member sets in the creation order every rank uses."""
        return sorted(self.groups, key=lambda m: (len(m), m))

    def traffic(self) -> int:
        """Elements all-reduced, summed over ranks (bucket size x members, per group)."""
        return sum(len(m) * sum(c.numel for c, _, _ in items) for m, items in self.groups.items())


def full_shapes(model) -> dict[str, tuple[int, ...]]:
    """Standard name -> full shape of every parameter of the whole model (built on the meta device)."""
    from .model import LlamaChunk

    with torch.device("meta"):
        m = LlamaChunk(model, 0, model.layers, first=True, last=True)
    return {n: tuple(p.shape) for n, p in m.named_parameters()}


def _held(name: str, start: int, end: int, first: bool, last: bool) -> bool:
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return start <= int(parts[2]) < end
    if parts[:2] == ["model", "embed_tokens"]:
        return first
    return last  # model.norm, lm_head


def holders(layout: Layout, shapes: dict[str, tuple[int, ...]]) -> dict[str, list[Holder]]:
    """Parameter name -> every (rank, stage) holding (a shard of) it, in every pipeline."""
    out: dict[str, list[Holder]] = {n: [] for n in shapes}
    for part in layout.pipelines:
        al = part.actions
        for s in range(al.stages):
            g = part.groups[al.stage_rank[s]]
            start, end = part.chunk_layers[s]
            first, last, chain = part.first_of_chain(s), part.last_of_chain(s), part.chain_index(s)
            for name in shapes:
                if _held(name, start, end, first, last):
                    for t, r in enumerate(g.ranks):
                        out[name].append(Holder(r, part.index, s, chain, t, g.tp))
    return out


def _bounds(h: Holder, full: int) -> tuple[int, int]:
    n = full // h.tp_size
    return h.tp_rank * n, (h.tp_rank + 1) * n


def sync_plan(layout: Layout, shapes: dict[str, tuple[int, ...]] | None = None) -> SyncPlan:
    """Cut every parameter at all holders' shard boundaries; group chunks by their holder sets."""
    shapes = shapes if shapes is not None else full_shapes(layout.model)
    plan = SyncPlan()
    for name, hs in holders(layout, shapes).items():
        if len({h.pipeline for h in hs}) < 2:
            continue  # one pipeline: REDUCE (Chimera) already made its copies equal
        dim, total = shard_dim(name), math.prod(shapes[name])
        if dim is None:
            chunks = [Chunk(name, None, 0, 0, 0, total)]
        else:
            full = shapes[name][dim]
            cuts = sorted({b for h in hs for b in _bounds(h, full)})
            chunks = [Chunk(name, dim, lo, hi, full, total // full * (hi - lo)) for lo, hi in zip(cuts, cuts[1:])]
        for c in chunks:
            hold = tuple(h for h in hs if c.dim is None or _bounds(h, c.full)[0] <= c.lo < _bounds(h, c.full)[1])
            first: dict[int, Holder] = {}
            for h in sorted(hold, key=lambda h: (h.chain, h.tp_rank, h.stage)):
                first.setdefault(h.pipeline, h)
            members = tuple(sorted({h.rank for h in hold}))
            plan.groups.setdefault(members, []).append((c, hold, frozenset(first.values())))
    return plan


class DPSync:
    """This rank's part of a :class:`SyncPlan`: its groups' handles and how to fill the buckets."""

    def __init__(self, plan: SyncPlan, rank: int, pipeline: int, handles: dict[tuple[int, ...], object]):
        self.rank, self.pipeline = rank, pipeline
        self.sharded = None  # ZeRO: a ShardedAdamW or a .zero.ShardedState, set by the trainer
        self.gather_handles: dict[tuple[int, ...], object] = {}  # ZeRO-2/3 per micro-batch: weight gathers
        self.handles = handles  # chunk group members -> its communicator (this rank's groups)
        self.hybrid_handles: dict[tuple[int, ...], object] = {}  # zero_scope=machine: :mod:`.hybrid`
        self.items = [(m, handles[m], [(c, [h for h in hold if h.rank == rank], contrib)
                                       for c, hold, contrib in plan.groups[m]])
                      for m in plan.members() if rank in m]

    def __bool__(self) -> bool:
        return bool(self.items)

    def handle(self, ranks: tuple[int, ...]):
        """The communicator of ``ranks``: a chunk group's own, or one of hybrid sharding's (None: alone)."""
        return self.handles[ranks] if ranks in self.handles else self.hybrid_handles.get(ranks)

    @staticmethod
    def _view(p: torch.Tensor, c: Chunk, h: Holder) -> torch.Tensor:
        """The chunk's slice of this holder's local tensor."""
        if c.dim is None:
            return p
        return p.narrow(c.dim, c.lo - _bounds(h, c.full)[0], c.hi - c.lo)

    def bucket(self, params: dict[tuple[int, str], torch.nn.Parameter], chunks: list) -> torch.Tensor:
        """One group's flat gradient bucket: the contributor's slice of each chunk, zeros from
        the other holders (copies of an equal gradient)."""
        pieces = []
        for c, mine, contrib in chunks:
            src = [h for h in mine if h in contrib]
            ref = params[(mine[0].stage, c.name)]
            if src:
                t = self._view(params[(src[0].stage, c.name)].grad, c, src[0])
            else:
                t = torch.zeros_like(self._view(ref, c, mine[0]))
            pieces.append(t.reshape(-1))
        return torch.cat(pieces)

    def run(self, params: dict[tuple[int, str], torch.nn.Parameter], wait: Callable[[list, str], None]) -> None:
        """All-reduce every chunk group this rank is in; ``params[(stage, name)]`` are its tensors.
        With a sharded optimizer attached (``sharded``), its first phase runs instead: the summed
        gradient pieces (its ``apply`` updates once the global norm is known, :mod:`.grad_norm`)."""
        if self.sharded is not None:
            self.sharded.prepare(params, wait)
            return
        for p in params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        pending = []
        for members, handle, chunks in self.items:
            flat = self.bucket(params, chunks)
            work = torch.distributed.all_reduce(flat, group=handle, async_op=True)
            pending.append((members, flat, chunks, work))
        for members, flat, chunks, work in pending:
            wait([work], f"data-parallel gradient sync with ranks {list(members)}")
            i = 0
            for c, mine, _ in chunks:
                for h in mine:
                    v = self._view(params[(h.stage, c.name)].grad, c, h)
                    v.copy_(flat[i: i + c.numel].view_as(v))
                i += c.numel


class ShardedAdamW:
    """ZeRO-1/2 (Rajbhandari et al., SC'20) over the chunk groups of :class:`DPSync`, for every
    plan shape: at the step, per group, the gradient bucket is summed among the chunk's holders
    and this rank keeps only its piece of it (:func:`.zero.shard_bounds`: even, or proportional
    to ``weights``, the shard weight of every global rank), updates its piece of the weights
    with AdamW (:func:`.zero.adamw_`, the exact ``torch.optim.AdamW`` arithmetic) keeping the
    two moments of that piece only, then all-gathers the updated weights into every local copy.
    The step has two phases (:mod:`.grad_norm`): every group's summed piece (:meth:`prepare`),
    then, with the global gradient norm known, the updates (:meth:`apply`).
    Gradients accumulate in full over a step's micro-batches and are freed after the step (the
    torch runtime runs ZeRO-1 here, and hybrid ZeRO-2; ZeRO-2 shards the gradients per
    micro-batch otherwise, :class:`.zero.ShardedState`).

    Hybrid sharding (``machines``: the machine of every global rank, ``zero_scope=machine``):
    the pieces are cut among the holders inside each machine and summed across machines
    segment by segment (:mod:`.hybrid`); the communicators are ``sync.hybrid_handles``."""

    def __init__(self, sync: DPSync, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 weights: tuple[float, ...] | None = None, machines: tuple[str, ...] | None = None,
                 device: torch.device | None = None):
        from .hybrid import counted, split

        self.sync, self.weights = sync, weights
        self.adam = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.splits, self.counted, self.grads = {}, {}, {}
        self.moments: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        for members, handle, chunks in sync.items:
            n = sum(c.numel for c, _, _ in chunks)
            sp = split(members, n, sync.rank, weights, machines)
            self.splits[members] = sp
            self.counted[members] = counted(members, sync.rank, machines)
            lo, hi = sp.piece
            self.moments[members] = (torch.zeros(hi - lo, device=device), torch.zeros(hi - lo, device=device))
        self.t = 0

    def handle(self, ranks: tuple[int, ...]):
        """The communicator of ``ranks``: a chunk group's own, or one of hybrid sharding's."""
        return self.sync.handles[ranks] if ranks in self.sync.handles else self.sync.hybrid_handles[ranks]

    def synced(self) -> set[tuple[int, str]]:
        """``(stage, name)`` of every local tensor this step updates (the rest: plain AdamW)."""
        return {(h.stage, c.name) for _, _, chunks in self.sync.items for c, mine, _ in chunks for h in mine}

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.moments.values() for t in pair)

    @torch.no_grad()
    def prepare(self, params: dict[tuple[int, str], torch.nn.Parameter], wait: Callable[[list, str], None]) -> None:
        """Phase 1 of the step: every group's gradient bucket summed, this rank's piece kept
        (hybrid: summed across machines too); the update waits for the global norm (:meth:`apply`)."""
        for p in params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.grads = {}
        for members, _, chunks in self.sync.items:
            sp = self.splits[members]
            lo, hi = sp.piece
            flat = self.sync.bucket(params, chunks)
            peers = self.handle(sp.peers) if len(sp.peers) > 1 else None
            g = flat[lo:hi] if peers is None else \
                sum_piece(flat, list(sp.bounds), sp.i, peers, wait, f"ZeRO gradient sum with ranks {list(sp.peers)}")
            self._cross(sp, g, wait)
            self.grads[members] = g.clone() if g.numel() < flat.numel() else g  # not the whole bucket kept
        for key in self.synced():
            params[key].grad = None

    def sq_norm(self, device: torch.device) -> torch.Tensor:
        """Sum of squares of the summed gradient pieces this rank counts (:func:`.hybrid.counted`)."""
        return squares([g for m, g in self.grads.items() if self.counted[m]], device)

    @torch.no_grad()
    def apply(self, params: dict[tuple[int, str], torch.nn.Parameter], wait: Callable[[list, str], None], *,
              lr: float | None = None, coef: float | None = None) -> None:
        """Phase 2: AdamW on every piece (its gradient scaled by ``coef``, at ``lr``; None: the
        constructor's), then the updated weights all-gathered into every local copy."""
        self.t += 1
        adam = {**self.adam, "lr": self.adam["lr"] if lr is None else lr}
        for members, _, chunks in self.sync.items:
            sp = self.splits[members]
            lo, hi = sp.piece
            peers = self.handle(sp.peers) if len(sp.peers) > 1 else None
            g = self.grads.pop(members)
            if coef is not None:
                g.mul_(coef)
            weights = torch.cat([self.sync._view(params[(mine[0].stage, c.name)], c, mine[0]).reshape(-1)
                                 for c, mine, _ in chunks])
            w = weights[lo:hi].clone()
            adamw_(w, g, *self.moments[members], self.t, **adam)
            new = w if peers is None else \
                gather_pieces(w, list(sp.bounds), peers, wait, f"ZeRO weight all-gather with ranks {list(sp.peers)}")
            k = 0
            for c, mine, _ in chunks:
                for h in mine:
                    v = self.sync._view(params[(h.stage, c.name)], c, h)
                    v.copy_(new[k: k + c.numel].view_as(v))
                k += c.numel

    def _cross(self, sp, g: torch.Tensor, wait: Callable) -> None:
        """Hybrid: sum each segment of this rank's gradient piece ``g`` with the other machines'
        holders of it (in place)."""
        lo = sp.piece[0]
        pending = []
        for a, b, ranks in sp.cross:
            seg = g[a - lo: b - lo].contiguous()
            work = torch.distributed.all_reduce(seg, group=self.handle(ranks), async_op=True)
            pending.append((a, b, ranks, seg, work))
        for a, b, ranks, seg, work in pending:
            wait([work], f"ZeRO gradient sum across machines with ranks {list(ranks)}")
            g[a - lo: b - lo].copy_(seg)
