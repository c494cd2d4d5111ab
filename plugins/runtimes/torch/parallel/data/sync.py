"""Asymmetric data-parallel gradient sync: chunked all-reduce among exactly the holders of a chunk.

HexiScale §3.2 (asymmetric plans): pipelines of one plan may cut the model differently and shard
a layer with different TP degrees, so "the same shard in every pipeline" does not exist. Instead,
for every parameter (grouped by its standard name — the layer, not the stage, decides who holds
it) this module cuts the full tensor along its TP shard dimension at *every* shard boundary any
holder has. With TP degrees that divide each other this is exactly HexiScale's rule: every larger
shard is split into chunks of the smallest shard size. Each chunk is all-reduced among exactly the
ranks whose shard contains it — no rank sends or receives a byte it does not hold.

Replicated tensors (norms, embedding, head) are one chunk held by every rank of every stage that
has them; under ``train.vocab_parallel`` the embedding and the head are split by vocabulary rows
(:mod:`..vocab`) and cut like the other TP-split tensors, at every holder's row boundaries. A pipeline can hold a chunk on several ranks (TP ranks of a replicated tensor,
Chimera's model copies after ``REDUCE``); those copies are equal, so one of them — the
*contributor*: first chain, lowest TP rank — puts its gradient in and the others put zeros; every
holder receives the sum. Chunk groups whose holders all belong to one pipeline need no sync.

Batch weighting: each micro-batch loss is ``sum(cross-entropy) / tokens of the global batch``
(:mod:`..pipeline`), so a pipeline's accumulated gradient is already weighted by its batch share
and the plain sum over pipelines is the full-batch gradient (loss = mean over the global batch).

Every rank derives the same :class:`SyncPlan` from the layout; groups are created once, in the
same order everywhere (``new_group`` is collective); each group's chunks travel in one flat
bucket, in a fixed order, as one asynchronous all-reduce per group.

Overlap (``train.dp_overlap``, Megatron-LM's overlap-grad-reduce, DDP's buckets): a bucket is
posted as soon as every local stage it reads is final on this rank (the executor tells
:meth:`DPSync.ready` after a stage's last ``B`` or ``W``, or after the ``REDUCE`` of a stage
with replicas) while the rank goes on with its list; the step waits only for what is still in
flight. Buckets are posted in one order on every rank (:func:`launch_key`: the group holding the
highest layer first, as backward produces them), so two groups sharing ranks are never posted
in opposite orders (NCCL's rule for communicators used side by side); a bucket whose turn has
come but whose stages are not final holds back the ones after it on this rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..assignment import RankAssignment
from ..tensor import shard_dim, shard_range


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
    from ...model.llama import LlamaChunk

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


def layer_of(name: str) -> float:
    """Where a parameter sits in the model's order: the embedding ``-1``, block ``i`` ``i``, the
    final norm and the head after every block (``inf``)."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return int(parts[2])
    return -1 if parts[:2] == ["model", "embed_tokens"] else math.inf


def launch_key(members: tuple[int, ...], chunks: Sequence) -> tuple:
    """The order every rank posts its buckets in: the bucket whose chunks reach the highest layer
    first (backward finishes the last layers first), then by members (every member of a group
    knows its chunks and cuts them alike, so the order is the same everywhere)."""
    return (-max(layer_of(item[0].name) for item in chunks), len(members), members)


def holders(layout: RankAssignment, shapes: dict[str, tuple[int, ...]]) -> dict[str, list[Holder]]:
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
    return shard_range(full, h.tp_rank, h.tp_size)


def sync_plan(layout: RankAssignment, shapes: dict[str, tuple[int, ...]] | None = None) -> SyncPlan:
    """Cut every parameter at all holders' shard boundaries; group chunks by their holder sets."""
    shapes = shapes if shapes is not None else full_shapes(layout.model)
    plan = SyncPlan()
    for name, hs in holders(layout, shapes).items():
        if len({h.pipeline for h in hs}) < 2:
            continue  # one pipeline: REDUCE (Chimera) already made its copies equal
        dim, total = shard_dim(name, layout.vocab_parallel), math.prod(shapes[name])
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
        self.sharded = None  # ZeRO: a .zero.ShardedOptimizer, set by parallelize()
        self.gather_handles: dict[tuple[int, ...], object] = {}  # ZeRO-2/3 per micro-batch: weight gathers
        self.handles = handles  # chunk group members -> its communicator (this rank's groups)
        self.hybrid_handles: dict[tuple[int, ...], object] = {}  # zero_scope=machine: :mod:`.hybrid`
        self.items = [(m, handles[m], [(c, [h for h in hold if h.rank == rank], contrib)
                                       for c, hold, contrib in plan.groups[m]])
                      for m in plan.members() if rank in m]
        self.stages = frozenset(h.stage for _, _, chunks in self.items for _, mine, _ in chunks for h in mine)
        #: groups cut by layer: some member holds their chunks on more than one stage (every member
        #: decides alike, from every holder)
        self.by_layer = {m: any(len({h.stage for _, hold, _ in plan.groups[m] for h in hold if h.rank == r}) > 1
                                for r in m) for m, _, _ in self.items}
        self.begin()

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
        the other holders (copies of an equal gradient) and for a tensor without a gradient."""
        pieces = []
        for c, mine, contrib in chunks:
            src = [h for h in mine if h in contrib]
            ref = params[(mine[0].stage, c.name)]
            grad = params[(src[0].stage, c.name)].grad if src else None
            t = self._view(grad, c, src[0]) if grad is not None else torch.zeros_like(self._view(ref, c, mine[0]))
            pieces.append(t.reshape(-1))
        return torch.cat(pieces)

    @property
    def posts_early(self) -> bool:
        """Whether buckets can be posted before the step: plain all-reduce and step-end ZeRO
        (ZeRO-2/3 per micro-batch sum their units during the backwards themselves)."""
        return self.sharded is None or self.sharded.posts_early

    def buckets(self) -> list[tuple[tuple[int, ...], Any, list, frozenset[int]]]:
        """``(members, communicator, chunks, local stages read)`` of every bucket, in the order they
        are posted (:func:`launch_key`): without ZeRO, where a member holds the group's chunks on
        several stages (interleaved, waves), one bucket per layer (the embedding, a block, the
        norm and head), so a layer syncs once its own stage is final while another chunk of the
        same holders may still be computing; otherwise (and under step-end ZeRO, whose pieces are
        cut from the group's whole bucket) one bucket per group."""
        out = []
        for members, handle, chunks in self.items:
            parts: dict[float, list] = {}
            cut = self.sharded is None and self.by_layer[members]
            for item in chunks:
                parts.setdefault(layer_of(item[0].name) if cut else 0.0, []).append(item)
            for part in parts.values():
                out.append((members, handle, part, frozenset(h.stage for _, mine, _ in part for h in mine)))
        return sorted(out, key=lambda b: launch_key(b[0], b[2]))

    def begin(self) -> None:
        """A step starts: nothing posted yet."""
        self.cursor = 0
        self.order = self.buckets()
        self.posted: list[tuple[tuple[int, ...], list, torch.Tensor, Any]] = []

    def ready(self, params: dict[tuple[int, str], torch.nn.Parameter], final: frozenset[int] | set[int]) -> None:
        """Post, in the launch order (:meth:`buckets`), every next bucket whose local stages are
        all in ``final`` (their gradients will not change before the step)."""
        while self.cursor < len(self.order):
            members, handle, chunks, needs = self.order[self.cursor]
            if not needs <= final:
                return
            if self.sharded is not None:
                self.sharded.post(params, members, chunks)
            else:
                flat = self.bucket(params, chunks)
                self.posted.append((members, chunks, flat, torch.distributed.all_reduce(flat, group=handle, async_op=True)))
            self.cursor += 1

    def run(self, params: dict[tuple[int, str], torch.nn.Parameter], wait: Callable[[list, str], None]) -> None:
        """All-reduce every chunk group this rank is in; ``params[(stage, name)]`` are its tensors.
        Buckets posted early (:meth:`ready`) are only waited for; the rest are posted now.
        With a sharded optimizer attached (``sharded``), its first phase runs instead: the summed
        gradient pieces (its ``apply`` updates once the global norm is known, :mod:`.grad_norm`)."""
        if self.posts_early:
            self.ready(params, self.stages)
        if self.sharded is not None:
            self.sharded.prepare(params, wait)
            return
        for p in params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for members, chunks, flat, work in self.posted:
            wait([work], f"data-parallel gradient sync with ranks {list(members)}")
            i = 0
            for c, mine, _ in chunks:
                for h in mine:
                    v = self._view(params[(h.stage, c.name)].grad, c, h)
                    v.copy_(flat[i: i + c.numel].view_as(v))
                i += c.numel


def shard_bounds(n: int, weights: Sequence[float] | None, members: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of every member's piece of a bucket of ``n`` elements: even (``weights``
    None; the first ``n % members`` get one more) or cut at ``round(n * sum(w[:i]) / sum(w))``."""
    if weights is None:
        base, extra = divmod(n, members)
        los = [i * base + min(i, extra) for i in range(members)]
        return [(lo, lo + base + (1 if i < extra else 0)) for i, lo in enumerate(los)]
    total = float(sum(weights))
    cuts = [round(n * sum(weights[:i]) / total) for i in range(members)] + [n]
    return list(zip(cuts, cuts[1:]))


def apportion(sizes: Sequence[int], weights: Sequence[float] | None, members: int) -> list[list[tuple[int, int]]]:
    """Every member's ``[lo, hi)`` of each atom of ``sizes`` elements, ``w_j / sum w`` of each
    (even without ``weights``), rounded so that each member's total over the atoms stays within
    one element of ``sum(sizes) * w_j / sum w`` (the cost model's share): largest remainders per
    atom, each member's rounding error carried to the next atom."""
    w = [1.0] * members if weights is None else [float(x) for x in weights]
    total, carry, out = sum(w), [0.0] * members, []
    for n in sizes:
        target = [n * x / total + e for x, e in zip(w, carry)]
        take = [max(0, math.floor(t)) for t in target]
        for j in sorted(range(members), key=lambda j: (-(target[j] - math.floor(target[j])), j)):
            if sum(take) >= n:
                break
            take[j] += 1
        while sum(take) > n:  # only after clamping a negative target
            take[max(range(members), key=lambda j: (take[j] - target[j], j))] -= 1
        carry = [t - k for t, k in zip(target, take)]
        cuts = [sum(take[:j]) for j in range(members + 1)]
        out.append(list(zip(cuts, cuts[1:])))
    return out
