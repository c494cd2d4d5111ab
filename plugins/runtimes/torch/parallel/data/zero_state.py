"""Sharded training state in the torch runtime: ZeRO-2/3 per micro-batch (ZeRO-2 for every
pipeline shape, ZeRO-3 where every pipeline is one stage or the pipelines mirror each other,
:func:`zero3_runs`).

ZeRO (Rajbhandari et al., SC'20) over the chunk groups of :mod:`.sync` (the ranks that hold
the same chunks of the same parameters, HexiScale §3.2). A group's flat bucket is cut into units
(:mod:`.zero_units`: the embedding, each block, the final norm with the head) and member ``i``
owns a slice of every unit (:func:`.sync.apportion`): even, or (``zero_split=memory``,
Cephalo-style) proportional to its device memory, within one element of the cost model's
``n * w_i / sum w``. At the step each member updates its slices with AdamW; ZeRO-2 then
all-gathers the updated weights unit by unit.

:class:`ShardedState`: during every backward action that finishes a gradient (``B``, or ``W``),
as soon as a unit's gradients are all accumulated (a post-accumulate-grad hook per parameter),
the unit's gradient is summed among the group (posted asynchronously, collected when done, at
the latest before the optimizer step) and each member adds its piece to a persistent gradient
shard; the unit's local gradients are freed. So about one unit's full gradient exists at a time,
and between micro-batches a rank holds ``1/n`` of the gradients, whatever its chunks (Chimera's
copies each add their own micro-batches'). Units are summed in the order the layout predicts
(:func:`reduce_needs`); what is left is summed when the action ends.

Stage 3 also keeps only its piece of the fp32 weights and gathers them unit by unit, as FSDP
wraps a transformer: a forward pre-hook gathers a unit just before its forward and a forward hook
frees it after (``untyped_storage().resize_(0)`` through ``.data``: autograd's saved references
stay valid); a hook on the unit's output gradient fires when its backward starts, frees the unit
before it and gathers this one again (not the embedding: its gradient reads no weight). So one
unit is gathered at a time, with recomputation and the ``I``/``W`` split too; no prefetch.

The step has two phases (:mod:`.grad_norm`): :meth:`ShardedState.prepare` collects every summed
gradient piece, :meth:`ShardedState.apply` updates once the global gradient norm is known.

Hybrid sharding (``zero_scope=machine``, ZeRO-3; :mod:`.hybrid`): a bucket's members are the
group's holders in this rank's machine; at the step the pieces are summed across machines
(:func:`.hybrid.sum_across`), then AdamW runs identically on every machine.

Collectives of ranks whose schedules differ pair up in rounds (:mod:`.zero_units`); before the
step every rank runs the rounds left up to the most any member of its group has.

Units of the sharded training state, the rounds that pair their collectives across ranks, and
the shard arithmetic (pieces, AdamW on a piece, gathers and sums of pieces).

A *unit* is what ZeRO-3 gathers at once, as PyTorch's FSDP wraps a transformer model: the
embedding (key ``-1``), each block (its layer index), and the final norm with the head (key
``layers``). Every unit is an *atom*
of a chunk group's flat bucket, sharded on its own (a unit is gathered and its gradient summed
alone): member ``j`` owns a slice of every atom (:func:`apportion`), its *piece* is those slices,
atom after atom.

Pairing (the module docstring of :mod:`.zero_state`): every rank knows, from the layout, every rank's
*needs* in step order — the units each compute action gathers (:func:`gather_needs`) and the
units whose gradient each backward finishes, one by one (:func:`reduce_needs`). Round ``k`` of a group carries the
union of its members' ``k``-th needs (:func:`rounds`): ranks whose schedules differ (a forward
next to a backward, 1F1B next to GPipe) take part in the same round, each contributing its pieces
of every atom in it (zeros for a gradient it does not have) and keeping what it needs. Every rank
runs its rounds in order ``(k, group)``, so no collective waits on one posted later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from hexicore.pipeline.actions import Op

from .grad_norm import squares
from .hybrid import atom_cross, counted, peers_of, split, sum_across
from .sync import DPSync, apportion, layer_of

EMBED_UNIT = -1


def unit_of(name: str, layers: int) -> int:
    """The unit of parameter ``name``: ``-1`` embedding, ``i`` block ``i``, ``layers`` norm + head
    (:func:`.sync.layer_of`, the last position numbered)."""
    where = layer_of(name)
    return layers if where == math.inf else int(where)


def stage_units(part, s: int, layers: int) -> list[int]:
    """Units of stage chunk ``s`` of pipeline ``part``, in forward order."""
    start, end = part.chunk_layers[s]
    return [EMBED_UNIT] * part.first_of_chain(s) + list(range(start, end)) + [layers] * part.last_of_chain(s)


def _acts(layout, rank: int):
    role = layout.role(rank)
    if role is None:
        return None, ()
    part = layout.pipelines[role.pipeline]
    return part, part.actions.actions[role.pipe_rank]


def backward_units(part, s: int, op: Op, layers: int) -> list[int]:
    """Units whose weights a backward pass (``B``, ``I``, ``W``) of stage ``s`` reads, in the
    order it reaches them: every unit but the embedding (its gradient reads no weight), reversed;
    none for ``I`` on a chain's first stage (no input gradient to compute)."""
    if op is Op.I and part.first_of_chain(s):
        return []
    return [u for u in reversed(stage_units(part, s, layers)) if u != EMBED_UNIT]


def gather_needs(layout, rank: int) -> list[tuple[int, ...]]:
    """ZeRO-3: the unit every gather of ``rank`` fetches in one step, in order (one per entry)."""
    part, acts = _acts(layout, rank)
    layers, out = layout.model.layers, []
    for a in acts:
        if a.op is Op.F:
            out += [(u,) for u in stage_units(part, a.stage, layers)]
        elif a.op in (Op.B, Op.I, Op.W):
            out += [(u,) for u in backward_units(part, a.stage, a.op, layers)]
    return out


def reduce_needs(layout, rank: int) -> list[tuple[int, ...]]:
    """The unit whose gradient each backward of ``rank`` that finishes one (``B``, ``W``) sums,
    one entry per unit, in the order the backward finishes them (reversed, the embedding last)."""
    part, acts = _acts(layout, rank)
    return [(u,) for a in acts if a.op in (Op.B, Op.W) for u in reversed(stage_units(part, a.stage, layout.model.layers))]


def rounds(needs: dict[int, list[tuple[int, ...]]], members: Sequence[int], atom_of: dict[int, int]) -> list[tuple[int, ...]]:
    """Per round ``k``, the atoms of the group its members need (union; empty rounds are skipped
    by every member alike)."""
    n = max((len(needs[r]) for r in members), default=0)
    return [tuple(sorted({atom_of[u] for r in members if k < len(needs[r]) for u in needs[r][k] if u in atom_of}))
            for k in range(n)]


@dataclass
class Bucket:
    """One chunk group as this rank shards it, atom by atom. ``chunks`` are the group's
    ``(chunk, my holders, contributors)`` ordered atom after atom; atom ``a`` spans
    ``span[a]`` of the flat bucket and member ``j`` owns ``bounds[a][j]`` of it."""

    members: tuple[int, ...]
    handle: Any  # gradient sums
    gather_handle: Any  # ZeRO-3 weight gathers
    chunks: list
    atoms: list[tuple[int, ...]]
    span: list[tuple[int, int]]
    bounds: list[list[tuple[int, int]]]
    i: int
    gathers: list[tuple[int, ...]] = field(default_factory=list)  # atoms per gather round
    reduces: list[tuple[int, ...]] = field(default_factory=list)  # atoms per reduce round
    pad: Any = None
    cross: tuple = ()  # hybrid: (lo, hi, ranks) of this rank's slices summed across machines (:mod:`.hybrid`)
    counted: bool = True  # this rank's piece counts in the global gradient norm (:func:`.hybrid.counted`)

    @property
    def what(self) -> str:
        return f"ranks {list(self.members)}"

    def size(self, a: int, j: int) -> int:
        lo, hi = self.bounds[a][j]
        return hi - lo

    def offset(self, a: int) -> int:
        """Where atom ``a`` starts in this rank's piece."""
        return sum(self.size(b, self.i) for b in range(a))

    def chunks_of(self, a: int) -> list:
        lo, hi = self.span[a]
        out, k = [], 0
        for item in self.chunks:
            if lo <= k < hi:
                out.append(item)
            k += item[0].numel
        return out


def make_bucket(members, handle, gather_handle, chunks, atoms: list[tuple[int, ...]], layers: int, i: int,
                weights: Sequence[float] | None) -> Bucket:
    """A :class:`Bucket` with ``chunks`` reordered atom after atom (``members``: the ranks
    whose pieces tile it; ``handle``/``gather_handle`` None where that is this rank alone)."""
    atom_of = {u: a for a, us in enumerate(atoms) for u in us}
    ordered = sorted(chunks, key=lambda item: atom_of[unit_of(item[0].name, layers)])
    span, k = [], 0
    for a in range(len(atoms)):
        n = sum(c.numel for c, _, _ in ordered if atom_of[unit_of(c.name, layers)] == a)
        span.append((k, k + n))
        k += n
    bounds = apportion([hi - lo for lo, hi in span], weights, len(members))
    return Bucket(tuple(members), handle, gather_handle, ordered, list(atoms), span, bounds, i)


def unit_sizes(chunks, layers: int) -> list[int]:
    """Elements of each unit of a chunk group's ``(chunk, ...)`` items, units in ascending order
    (the atoms of a ZeRO-3 bucket)."""
    units = sorted({unit_of(item[0].name, layers) for item in chunks})
    return [sum(item[0].numel for item in chunks if unit_of(item[0].name, layers) == u) for u in units]


class Done:
    """A finished collective (a bucket whose pieces one rank holds alone: nothing to send)."""

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout=None) -> bool:
        return True


def gather_round(b: Bucket, atoms: tuple[int, ...], piece: torch.Tensor, keep: Sequence[int], wait: Callable,
                 handle) -> dict[int, torch.Tensor]:
    """All-gather every member's slices of ``atoms`` (its piece: ``piece``); return the whole
    flat of each atom in ``keep`` (one member: its own slices are the whole)."""
    if len(b.members) == 1:
        return {a: piece[b.offset(a): b.offset(a) + b.size(a, 0)] for a in keep}
    sizes = [sum(b.size(a, j) for a in atoms) for j in range(len(b.members))]
    mine = torch.cat([piece[b.offset(a): b.offset(a) + b.size(a, b.i)] for a in atoms])
    buf = torch.zeros(max(sizes), dtype=piece.dtype, device=piece.device)
    buf[: mine.numel()] = mine
    got = [torch.empty_like(buf) for _ in b.members]
    wait([torch.distributed.all_gather(got, buf, group=handle, async_op=True)], f"ZeRO weight all-gather with {b.what}")
    out = {}
    for a in keep:
        parts = []
        for j in range(len(b.members)):
            at = sum(b.size(x, j) for x in atoms[: atoms.index(a)])
            parts.append(got[j][at: at + b.size(a, j)])
        out[a] = torch.cat(parts)
    return out


def reduce_scatters(handle) -> bool:
    """Whether ``handle``'s backend sums with a reduce-scatter: NCCL, and gloo where torch gives
    it one (``ProcessGroupGloo._reduce_scatter_base``, torch 2.13 has it; the emulated-links
    backend wraps gloo and posts its). Elsewhere the sum is an all-reduce of which each member
    keeps its piece: the same result, twice the bytes of the ring's one pass."""
    return torch.distributed.get_backend(handle) == "nccl" or hasattr(torch.distributed.ProcessGroupGloo,
                                                                        "_reduce_scatter_base")


def post_pieces(pieces: list[torch.Tensor], i: int, handle) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Start the sum over the group of every member's ``pieces`` (member ``j``'s at ``pieces[j]``,
    views or tensors of one dtype), of which member ``i`` keeps its own: a reduce-scatter of the
    pieces padded to the largest (:func:`reduce_scatters`), else an all-reduce of them laid end to
    end. Returns the work and how to read the piece once it is done."""
    ref, n = pieces[i], pieces[i].numel()
    if reduce_scatters(handle):
        size = max(x.numel() for x in pieces)
        padded = torch.zeros(size * len(pieces), dtype=ref.dtype, device=ref.device)
        for j, x in enumerate(pieces):
            padded[j * size: j * size + x.numel()] = x
        out = torch.empty(size, dtype=ref.dtype, device=ref.device)
        work = torch.distributed.reduce_scatter_tensor(out, padded, group=handle, async_op=True)
        return work, lambda: out[:n]
    flat = torch.cat(pieces)
    lo = sum(x.numel() for x in pieces[:i])
    work = torch.distributed.all_reduce(flat, group=handle, async_op=True)
    return work, lambda: flat[lo: lo + n]


def post_sum(flat: torch.Tensor, bounds: list[tuple[int, int]], i: int, handle) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Start the sum over the group of ``flat`` (every member's whole flat, member ``j``'s piece at
    ``bounds[j]``), of which member ``i`` keeps its piece (:func:`post_pieces`)."""
    return post_pieces([flat[lo:hi] for lo, hi in bounds], i, handle)


def post_reduce(b: Bucket, atoms: tuple[int, ...], flats: dict[int, torch.Tensor], dtype, device) -> tuple[Any, Callable]:
    """Start the sum over the group of the gradients of ``atoms`` (``flats[a]``: this rank's
    whole flat of atom ``a``, zeros where absent) of which this rank keeps its slices, atom after
    atom (:func:`post_pieces`, each member's slices of the atoms one piece). Returns the work and
    how to read this rank's slices once it is done (one member: no collective)."""
    whole = [flats[a] if a in flats else torch.zeros(b.span[a][1] - b.span[a][0], dtype=dtype, device=device)
             for a in atoms]
    m = len(b.members)
    if m == 1:  # this rank's slices are the whole atoms
        return Done(), lambda: torch.cat(whole)
    pieces = [torch.cat([w[b.bounds[a][j][0]: b.bounds[a][j][1]] for a, w in zip(atoms, whole)]) for j in range(m)]
    return post_pieces(pieces, b.i, b.handle)


def adamw_(w: torch.Tensor, g: torch.Tensor, avg: torch.Tensor, sq: torch.Tensor, t: int, *, lr: float,
           betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """One step of ``torch.optim.AdamW`` on ``w`` in place (decoupled decay, bias-corrected
    moments; Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Alg. 2)."""
    b1, b2 = betas
    with torch.no_grad():
        w.mul_(1 - lr * weight_decay)
        avg.lerp_(g, 1 - b1)
        sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (sq.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
        w.addcdiv_(avg, denom, value=-lr / (1 - b1 ** t))


def gather_pieces(piece: torch.Tensor, bounds: list[tuple[int, int]], handle, wait: Callable, what: str) -> torch.Tensor:
    """All-gather every member's piece (padded to the largest) into the whole flat bucket."""
    size = max(hi - lo for lo, hi in bounds)
    buf = torch.zeros(size, dtype=piece.dtype, device=piece.device)
    buf[: piece.numel()] = piece
    got = [torch.empty_like(buf) for _ in bounds]
    wait([torch.distributed.all_gather(got, buf, group=handle, async_op=True)], what)
    return torch.cat([got[j][: hi - lo] for j, (lo, hi) in enumerate(bounds)])


def sum_piece(flat: torch.Tensor, bounds: list[tuple[int, int]], i: int, handle, wait: Callable,
              what: str) -> torch.Tensor:
    """:func:`post_sum`, waited for."""
    work, read = post_sum(flat, bounds, i, handle)
    wait([work], what)
    return read()


class ShardedOptimizer:
    """What the executor, the data-parallel sync and the trainer call on a rank's ZeRO-sharded
    training state: :class:`ShardedAdamW` (ZeRO-1, hybrid ZeRO-2: at the step) and
    :class:`ShardedState` (ZeRO-2/3: per micro-batch). The step has two phases
    (:mod:`.grad_norm`): :meth:`prepare` sums the gradient pieces, :meth:`apply` updates once the
    global gradient norm is known. The defaults are what a kind with nothing to do does."""

    #: whether weights are freed between their uses (ZeRO-3): autocast must not cache their casts
    frees_weights = False
    #: whether a group's gradient sum can be posted as soon as its stages are final (:meth:`post`)
    posts_early = False

    def synced(self) -> set[tuple[int, str]]:
        """``(stage, name)`` of every local tensor this object updates (the rest: plain AdamW)."""
        raise NotImplementedError

    def before(self, action, wait: Callable) -> None:
        """Before a compute action (F, B, I, W): nothing unless sharded per micro-batch."""

    def after(self, action, wait: Callable) -> None:
        """After a compute action: nothing unless sharded per micro-batch."""

    def post(self, params: dict, members: tuple[int, ...], chunks: list) -> None:
        """Start one group's gradient sum (``posts_early`` kinds): :meth:`prepare` collects it."""
        raise NotImplementedError

    def prepare(self, params: dict, wait: Callable) -> None:
        """Phase 1 of the step: the summed gradient pieces of every group."""
        raise NotImplementedError

    def sq_norm(self, device: torch.device) -> torch.Tensor:
        """Sum of squares of the summed gradient pieces this rank counts (:func:`.hybrid.counted`)."""
        raise NotImplementedError

    def apply(self, params: dict, wait: Callable, *, lr: float | None = None, coef: float | None = None) -> None:
        """Phase 2 of the step: AdamW on the pieces, the updated weights where they are used."""
        raise NotImplementedError

    def state_bytes(self) -> int:
        """Bytes of AdamW moments this rank keeps."""
        raise NotImplementedError

    def kept_bytes(self, stages: dict) -> dict[str, int] | None:
        """Measured bytes kept between compute actions, by part (None: not measured for this kind)."""
        return None

    def materialize(self, wait: Callable) -> None:
        """After training: full weights back where the kind freed them (ZeRO-3); else nothing."""


class ShardedAdamW(ShardedOptimizer):
    """ZeRO-1/2 (Rajbhandari et al., SC'20) over the chunk groups of :class:`DPSync`, for every
    plan shape: at the step, per group, the gradient bucket is summed among the chunk's holders
    and this rank keeps only its piece of it (:func:`.sync.shard_bounds`: even, or proportional
    to ``weights``, the shard weight of every global rank), updates its piece of the weights
    with AdamW (:func:`adamw_`, the exact ``torch.optim.AdamW`` arithmetic) keeping the
    two moments of that piece only, then all-gathers the updated weights into every local copy.
    The step has two phases (:mod:`.grad_norm`): every group's summed piece (:meth:`prepare`),
    then, with the global gradient norm known, the updates (:meth:`apply`).
    Gradients accumulate in full over a step's micro-batches and are freed after the step (the
    torch runtime runs ZeRO-1 here, and hybrid ZeRO-2; ZeRO-2 shards the gradients per
    micro-batch otherwise, :class:`ShardedState`).

    Hybrid sharding (``machines``: the machine of every global rank, ``zero_scope=machine``):
    the pieces are cut among the holders inside each machine and summed across machines
    segment by segment (:mod:`.hybrid`); the communicators are ``sync.hybrid_handles``."""

    def __init__(self, sync: DPSync, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 weights: tuple[float, ...] | None = None, machines: tuple[str, ...] | None = None,
                 device: torch.device | None = None):
        self.sync, self.weights = sync, weights
        self.adam = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.splits, self.counted, self.grads = {}, {}, {}
        self.posted: dict[tuple[int, ...], tuple[list, Callable[[], torch.Tensor], int]] = {}  # post() -> prepare()
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

    posts_early = True

    @torch.no_grad()
    def post(self, params: dict[tuple[int, str], torch.nn.Parameter], members: tuple[int, ...], chunks: list) -> None:
        """Start the sum of one group's gradient bucket among the peers sharing its pieces (at
        once: a rank alone keeps its piece of its own bucket)."""
        sp = self.splits[members]
        lo, hi = sp.piece
        flat = self.sync.bucket(params, chunks)
        if len(sp.peers) > 1:
            work, read = post_sum(flat, list(sp.bounds), sp.i, self.handle(sp.peers))
            self.posted[members] = ([work], read, flat.numel())
        else:
            self.posted[members] = ([], lambda: flat[lo:hi], flat.numel())

    @torch.no_grad()
    def prepare(self, params: dict[tuple[int, str], torch.nn.Parameter], wait: Callable[[list, str], None]) -> None:
        """Phase 1 of the step: every group's gradient bucket summed (posted by :meth:`post`,
        through the sync's launch order), this rank's piece kept (hybrid: summed across
        machines too); the update waits for the global norm (:meth:`apply`)."""
        self.grads = {}
        for members, _, chunks in self.sync.items:
            sp = self.splits[members]
            works, read, whole = self.posted.pop(members)
            wait(works, f"ZeRO gradient sum with ranks {list(sp.peers)}")
            g = read()
            self._cross(sp, g, wait)
            self.grads[members] = g.clone() if g.numel() < whole else g  # not the whole bucket kept
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


GATHER_OPS = frozenset((Op.F, Op.B, Op.I, Op.W))
REDUCE_OPS = frozenset((Op.B, Op.W))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _contributes(c, h) -> bool:
    """Whether holder ``h`` puts its gradient of chunk ``c`` into a sum: a TP-split chunk has one
    holder per stage; a replicated one is equal on every TP rank, TP rank 0 puts it in."""
    return c.dim is not None or h.tp_rank == 0


class ShardedState(ShardedOptimizer):
    """ZeRO-2 (``stage=2``, every layout) or ZeRO-3 (``stage=3``, :func:`zero3_runs` layouts)
    for one rank (module docstring). ``params[(stage, name)]`` are the rank's
    parameters, full and initialised; ``weights`` the shard weight of every global rank (None:
    even); ``layout`` tells every rank's needs; ``stages`` (ZeRO-3) the modules to hook;
    ``machines`` (hybrid ZeRO-3) the machine of every global rank."""

    def __init__(self, sync, params: dict, *, stage: int, weights: Sequence[float] | None, layout,
                 stages: dict | None = None, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 machines: Sequence[str] | None = None):
        self.sync, self.params, self.stage, self.layers = sync, params, stage, layout.model.layers
        self.adam = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.t = 0
        everyone = range(layout.world)
        gneeds = {r: gather_needs(layout, r) for r in everyone} if stage == 3 else {}
        rneeds = {r: reduce_needs(layout, r) for r in everyone}
        self.gneeds, self.rneeds = gneeds.get(sync.rank, []), rneeds[sync.rank]
        self.buckets: list[Bucket] = []
        self.pieces: list[tuple[torch.Tensor, ...]] = []  # per bucket: weights (ZeRO-3), grad, avg, sq
        self.units: dict[int, dict[int, torch.nn.Parameter]] = {}  # unit -> its local sharded parameters
        self.by_stage: dict[tuple[int, int], dict[int, torch.nn.Parameter]] = {}  # (stage, unit) -> its parameters
        for members, _, chunks in sync.items:
            peers = peers_of(members, sync.rank, machines)  # hybrid: the holders in this rank's machine
            atoms = [(u,) for u in sorted({unit_of(c.name, self.layers) for c, _, _ in chunks})]
            b = make_bucket(peers, sync.handle(peers), sync.gather_handles.get(peers), chunks, atoms, self.layers,
                            peers.index(sync.rank), None if weights is None else [weights[r] for r in peers])
            b.counted = counted(members, sync.rank, machines)
            if machines is not None:
                b.cross = atom_cross(members, [e - s for s, e in b.span], sync.rank, weights, machines)
            atom_of = {u: a for a, us in enumerate(atoms) for u in us}
            b.gathers = rounds(gneeds, peers, atom_of) if stage == 3 else []
            b.reduces = rounds(rneeds, peers, atom_of)
            piece = self._my_weights(b)
            zeros = torch.zeros_like(piece)
            self.pieces.append((piece if stage == 3 else piece[:0].clone(), zeros, zeros.clone(), zeros.clone()))
            self.buckets.append(b)
            for c, mine, _ in chunks:
                for h in mine:
                    p = params[(h.stage, c.name)]
                    self.units.setdefault(unit_of(c.name, self.layers), {})[id(p)] = p
                    self.by_stage.setdefault((h.stage, unit_of(c.name, self.layers)), {})[id(p)] = p
        self.local = {k: p for ps in self.units.values() for k, p in ps.items()}
        role = layout.role(sync.rank)
        part = layout.pipelines[role.pipeline]
        self.stage_units = {s: stage_units(part, s, self.layers) for s in part.actions.stages_of(role.pipe_rank)}
        self.cur: int | None = None  # stage of the backward action running
        self.act_end: int | None = None  # reduce needs done when it ends
        self.arrived: dict[tuple[int, int], set[int]] = {}  # (stage, unit) -> parameters whose gradient is in
        for key, ps in self.by_stage.items():
            for p in ps.values():
                p.register_post_accumulate_grad_hook(lambda p, key=key: self._arrived(key, p))
        self.gcur = self.rcur = 0  # needs done this step (gathers, reduces)
        self.live: set[int] = set()  # units gathered now
        self.mode: str | None = None  # ZeRO-3: "forward" / "backward" during a compute action
        self.wait: Callable | None = None
        self.pending: list = []  # gradient sums posted, not yet added: (bucket index, atoms, work, read)
        self.grad_peak = 0  # most gradient bytes held after a compute action (local grads + pieces)
        self.gather_peak = 0  # most bytes of gathered unit weights alive at once (ZeRO-3)
        self.grad_live = self.grad_live_peak = 0  # full local gradient bytes not summed yet during a backward
        self.gathered = True
        if stage == 3:
            for u in list(self.units):
                self._free(u)
            self.gathered = False
            for st in (stages or {}).values():
                self._hook(st.module)

    @property
    def frees_weights(self) -> bool:
        return self.stage == 3

    def synced(self) -> set[tuple[int, str]]:
        """``(stage, name)`` of the local tensors this object updates (the rest: plain AdamW)."""
        return {(h.stage, c.name) for b in self.buckets for c, mine, _ in b.chunks for h in mine}

    def _my_weights(self, b: Bucket) -> torch.Tensor:
        """This rank's piece of the bucket's weights, read from its local parameters (a copy of
        the piece only, never of the whole bucket)."""
        out = []
        for a, (start, _) in enumerate(b.span):
            lo, hi = (start + x for x in b.bounds[a][b.i])
            k = start
            for c, mine, _ in b.chunks_of(a):
                if k < hi and k + c.numel > lo:
                    v = self.sync._view(self.params[(mine[0].stage, c.name)].data, c, mine[0]).reshape(-1)
                    out.append(v[max(lo - k, 0): min(hi - k, c.numel)])
                k += c.numel
        if out:
            return torch.cat(out)
        c, mine, _ = b.chunks[0]
        return self.params[(mine[0].stage, c.name)].data.new_zeros(0)

    def unit_bytes(self, u: int) -> int:
        """Bytes of unit ``u``'s local parameters, gathered."""
        return sum(_nbytes(p) for p in self.units.get(u, {}).values())

    def state_bytes(self) -> int:
        """Bytes of AdamW moments this rank keeps."""
        return sum(_nbytes(avg) + _nbytes(sq) for _, _, avg, sq in self.pieces)

    def kept_bytes(self, stages: dict) -> dict[str, int]:
        """Measured bytes this rank keeps between compute actions, by part: weights (allocated
        parameter storage plus ZeRO-3 pieces), gradients (:attr:`grad_peak`), optimizer moments
        of the sharded tensors; ``unsummed``, the most bytes of full local gradients alive at once
        during a backward (units accumulated, not summed yet); ZeRO-3 adds ``gathered``, the
        most bytes of gathered unit weights alive at once during compute (:attr:`gather_peak`)."""
        params = {id(p): p for st in stages.values() for p in st.module.parameters()}.values()
        weights = sum(p.data.untyped_storage().nbytes() for p in params) + sum(_nbytes(w) for w, *_ in self.pieces)
        out = {"weights": weights, "gradients": self.grad_peak, "optimizer": self.state_bytes(),
               "unsummed": self.grad_live_peak}
        if self.stage == 3:
            out["gathered"] = self.gather_peak
        return out

    # ------------------------------------------------------------ ZeRO-3 hooks
    def _hook(self, module) -> None:
        """Gather/free hooks on every unit of a stage chunk: (first module, last module)."""
        m = module.model
        spans = [(EMBED_UNIT, m.embed_tokens, m.embed_tokens)] if hasattr(m, "embed_tokens") else []
        spans += [(int(k), blk, blk) for k, blk in m.layers.items()]
        if hasattr(m, "norm"):
            spans.append((self.layers, m.norm, module.lm_head))
        for u, first, last in spans:
            first.register_forward_pre_hook(lambda mod, args, u=u: self._pre(u))
            last.register_forward_hook(lambda mod, args, out, u=u: self._post(u, out))

    def _pre(self, u: int) -> None:
        if self.mode == "forward":
            self._need(u)
        elif u not in self.live and self.units.get(u):
            raise RuntimeError(f"ZeRO-3: unit {u} recomputed in a backward pass while not gathered")

    def _post(self, u: int, out) -> None:
        if self.mode != "forward":
            return  # a recomputation inside a backward pass: the unit stays gathered
        self._free(u)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, u=u: self._backward_starts(u))

    def _backward_starts(self, u: int) -> None:
        """Unit ``u``'s output gradient is complete: the unit after it is done, ``u`` begins."""
        for v in list(self.live):
            self._free(v)
        if u != EMBED_UNIT:
            self._need(u)

    # ------------------------------------------------------------- weights
    def _free(self, u: int) -> None:
        for p in self.units.get(u, {}).values():
            p.data.untyped_storage().resize_(0)
        self.live.discard(u)

    @torch.no_grad()
    def _need(self, u: int) -> None:
        """Gather unit ``u``: this rank's next gather round in every group (module docstring)."""
        k = self.gcur
        if k >= len(self.gneeds) or self.gneeds[k] != (u,):
            want = self.gneeds[k] if k < len(self.gneeds) else "nothing"
            raise RuntimeError(f"ZeRO-3: gather {k} of the step fetches unit {u}, the layout expects {want}")
        for p in self.units.get(u, {}).values():
            p.data.untyped_storage().resize_(_nbytes(p))
        self._gather_round(k, u)
        self.gcur += 1
        self.live.add(u)
        self.gather_peak = max(self.gather_peak, sum(self.unit_bytes(v) for v in self.live))

    def _gather_round(self, k: int, u: int | None) -> None:
        """Round ``k`` of every group this rank is in; keep unit ``u`` (None: serve only)."""
        for b, (w, *_) in zip(self.buckets, self.pieces):
            atoms = b.gathers[k] if k < len(b.gathers) else ()
            if atoms:
                keep = [a for a in atoms if u in b.atoms[a]]
                got = gather_round(b, atoms, w, keep, self.wait, b.gather_handle)
                for a, flat in got.items():
                    self._write(b.chunks_of(a), flat)

    def _write(self, chunks, flat: torch.Tensor) -> None:
        """Copy a flat run of chunks into every local holder's view (through ``.data``)."""
        k = 0
        for c, mine, _ in chunks:
            for h in mine:
                v = self.sync._view(self.params[(h.stage, c.name)].data, c, h)
                v.copy_(flat[k: k + c.numel].view_as(v))
            k += c.numel

    def before(self, a, wait: Callable) -> None:
        """Before a compute action ``a``: ZeRO-3's hooks gather in the mode of its pass; a
        backward that finishes gradients sums them unit by unit as they arrive."""
        self.wait = wait
        if self.stage == 3 and a.op in GATHER_OPS:
            self.mode = "forward" if a.op is Op.F else "backward"
        if a.op in REDUCE_OPS:
            self.cur, self.act_end, self.arrived = a.stage, self.rcur + len(self.stage_units[a.stage]), {}

    def after(self, a, wait: Callable) -> None:
        """After a compute action: the gradients not summed yet are (a unit some of whose
        parameters got no gradient); stage 3 frees what is still gathered."""
        if a.op in REDUCE_OPS:
            self._flush(force=True)
            self.cur = self.act_end = None
        grads = {id(p): p.grad for p in self.params.values() if p.grad is not None}
        held = sum(_nbytes(t) for t in grads.values()) + sum(_nbytes(g) for _, g, _, _ in self.pieces)
        self.grad_peak = max(self.grad_peak, held)
        if self.stage == 3:
            for u in list(self.live):
                self._free(u)
            self.mode = None

    # ---------------------------------------------------------- gradients
    def _grads(self, b: Bucket, a: int, stage: int) -> torch.Tensor:
        """This rank's flat gradient of atom ``a`` from its holders on ``stage`` (zeros where it
        does not contribute)."""
        parts = []
        for c, mine, _ in b.chunks_of(a):
            h = next((h for h in mine if h.stage == stage), None)
            g = self.params[(h.stage, c.name)].grad if h is not None and _contributes(c, h) else None
            parts.append(self.sync._view(g, c, h).reshape(-1) if g is not None else
                         torch.zeros(c.numel, dtype=self.pieces[0][1].dtype, device=self.pieces[0][1].device))
        return torch.cat(parts)

    def _arrived(self, key: tuple[int, int], p) -> None:
        """A parameter's gradient of this backward is accumulated; a unit with all of them in
        is summed, in the order the layout predicts (:func:`reduce_needs`)."""
        if key[0] != self.cur:
            return
        got = self.arrived.setdefault(key, set())
        if id(p) not in got:
            got.add(id(p))
            self.grad_live += _nbytes(p)
            self.grad_live_peak = max(self.grad_live_peak, self.grad_live)
        self._flush(force=False)

    def _flush(self, *, force: bool) -> None:
        """Sum the predicted next units of this action whose gradients are complete (``force``:
        every one left)."""
        while self.act_end is not None and self.rcur < self.act_end:
            u = self.rneeds[self.rcur][0]
            key = (self.cur, u)
            if not force and len(self.arrived.get(key, ())) < len(self.by_stage.get(key, {})):
                break
            self.reduce(self.wait, self.cur, u)

    @torch.no_grad()
    def reduce(self, wait: Callable, stage: int | None, unit: int | None) -> None:
        """This rank's next reduce round in every group: sum ``unit``'s gradient of ``stage``
        (None: an empty round, zeros) into the pieces, then free its local gradients."""
        k = self.rcur
        for bi, b in enumerate(self.buckets):
            atoms = b.reduces[k] if k < len(b.reduces) else ()
            if not atoms:
                continue
            flats = {a: self._grads(b, a, stage) for a in atoms if unit in b.atoms[a]} if stage is not None else {}
            self._harvest(wait, everything=False)
            ref = self.pieces[bi][1]
            work, read = post_reduce(b, atoms, flats, ref.dtype, ref.device)
            self.pending.append((bi, atoms, work, read))
        self.rcur += 1
        for p in self.by_stage.get((stage, unit), {}).values():
            if id(p) in self.arrived.get((stage, unit), ()):
                self.grad_live -= _nbytes(p)
            p.grad = None

    def _harvest(self, wait: Callable, *, everything: bool) -> None:
        """Add finished gradient sums to their pieces (``everything``: wait for all of them)."""
        left = []
        for bi, atoms, work, read in self.pending:
            b = self.buckets[bi]
            if everything:
                wait([work], f"ZeRO gradient reduce-scatter with {b.what}")
            elif not work.is_completed():
                left.append((bi, atoms, work, read))
                continue
            got, at, g = read(), 0, self.pieces[bi][1]
            for a in atoms:
                n = b.size(a, b.i)
                g[b.offset(a): b.offset(a) + n] += got[at: at + n]
                at += n
        self.pending = left

    # --------------------------------------------------------------- step
    def _pad(self, wait: Callable) -> None:
        """Check this step's needs ran as the layout says; run the rounds left in each group."""
        if self.gcur != len(self.gneeds) or self.rcur != len(self.rneeds):
            raise RuntimeError(f"ZeRO: this step ran {self.gcur} gathers and {self.rcur} gradient sums, the layout "
                               f"expects {len(self.gneeds)} and {len(self.rneeds)}")
        for k in range(self.gcur, max((len(b.gathers) for b in self.buckets), default=0)):
            self._gather_round(k, None)
        while self.rcur < max((len(b.reduces) for b in self.buckets), default=0):
            self.reduce(wait, None, None)

    @torch.no_grad()
    def prepare(self, params: dict, wait: Callable) -> None:
        """Phase 1: the rounds left, every sum collected, (hybrid) pieces summed across machines."""
        self.wait = wait
        self._pad(wait)
        self._harvest(wait, everything=True)
        for b, (_, g, _, _) in zip(self.buckets, self.pieces):
            if b.cross:
                sum_across(b, g, self.sync.handle, wait)

    def sq_norm(self, device) -> torch.Tensor:
        """Sum of squares of the summed gradient pieces this rank counts (:func:`.hybrid.counted`)."""
        return squares([g for b, (_, g, _, _) in zip(self.buckets, self.pieces) if b.counted], device)

    @torch.no_grad()
    def apply(self, params: dict, wait: Callable, *, lr: float | None = None, coef: float | None = None) -> None:
        """Phase 2: AdamW on the pieces (gradient times ``coef``, at ``lr``), stage 2 gathers them."""
        self.t += 1
        adam = {**self.adam, "lr": self.adam["lr"] if lr is None else lr}
        for b, (w, g, avg, sq) in zip(self.buckets, self.pieces):
            if self.stage == 2:
                w = self._my_weights(b)
            if coef is not None:
                g.mul_(coef)
            adamw_(w, g, avg, sq, self.t, **adam)
            g.zero_()
            if self.stage == 2:  # unit by unit: never a second copy of the whole bucket
                for a in range(len(b.atoms)):
                    self._write(b.chunks_of(a), gather_round(b, (a,), w, (a,), wait, b.handle)[a])
        for p in self.local.values():
            p.grad = None
        self.gcur = self.rcur = 0

    @torch.no_grad()
    def materialize(self, wait: Callable) -> None:
        """Stage 3 after training: gather the full weights back for good (checkpoint, state)."""
        if self.stage != 3:
            return
        for p in self.local.values():
            p.data.untyped_storage().resize_(_nbytes(p))
        for b, (w, *_) in zip(self.buckets, self.pieces):
            for a in range(len(b.atoms)):
                self._write(b.chunks_of(a), gather_round(b, (a,), w, (a,), wait, b.gather_handle)[a])
        self.gathered = True
