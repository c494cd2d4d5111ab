"""Sharded training state in the torch runtime: shard bounds, the AdamW update of a shard, and
ZeRO-2/3 per micro-batch (ZeRO-2 where every rank holds one stage chunk, ZeRO-3 where every
pipeline is one stage).

ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20) over the chunk groups of :mod:`.dp_sync` (every group is the set of ranks that
hold the same chunks of the same parameters, HexiScale §3.2). In a group's flat bucket (its
chunks, concatenated in a fixed order) member ``i`` owns the elements ``shard_bounds(...)[i]``:
even pieces, or — ``zero_split=memory``, Cephalo-style — pieces proportional to each member's
device memory, cut at ``round(n * cumulative share)`` so a piece is within one element of the
cost model's ``n * w_i / sum w`` (:meth:`hexicore.cost.analytic.AnalyticCostModel.kept_params`).

:class:`ShardedState`: after every backward action (``B``, or ``W`` of the zero-bubble split)
the gradients of the group are summed among its members and each keeps only its piece, added
to a persistent gradient shard; the full local gradients are freed, so between micro-batches a
rank holds ``1/n`` of the gradients. The sums are posted asynchronously and collected when done
(at the latest before the optimizer step): a rank never blocks on a gradient sum while its
pipeline still needs it, whatever order the schedules put backwards and transfers in (buckets
in flight are communication workspace, not counted as kept gradients). Stage 3
also keeps only its piece of the fp32 weights: before each compute action (``F``, ``B``, ``I``,
``W``) the weights are all-gathered into the stage's parameters and freed again after it
(``untyped_storage().resize_(0)`` through ``.data``, which leaves autograd's saved references in
place). Gathers are per stage (the whole stage's weights during one compute action), not per
layer. Collectives must pair up across ranks whose pipelines have different micro-batch counts:
before the optimizer step every rank adds empty rounds (gathers whose result it discards,
reductions of zeros) up to the most any member of the group does per step, known to every rank
from the layout. Weights are equal on every rank within a step, so which round pairs with which
does not change a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from hexicore.pipeline.actions import Op

GATHER_OPS = frozenset((Op.F, Op.B, Op.I, Op.W))
REDUCE_OPS = frozenset((Op.B, Op.W))


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


@torch.no_grad()
def adamw_(w: torch.Tensor, g: torch.Tensor, avg: torch.Tensor, sq: torch.Tensor, t: int, *, lr: float,
           betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """One step of ``torch.optim.AdamW`` on ``w`` in place (decoupled decay, bias-corrected
    moments; Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Alg. 2)."""
    b1, b2 = betas
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


def post_sum(flat: torch.Tensor, bounds: list[tuple[int, int]], i: int, handle) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Start the sum over the group of ``flat`` for member ``i``'s piece: a reduce-scatter of
    the pieces padded to the largest on NCCL, an all-reduce on gloo (no reduce-scatter there).
    Returns the work and how to read the piece once it is done."""
    lo, hi = bounds[i]
    if torch.distributed.get_backend(handle) == "nccl":
        size = max(b - a for a, b in bounds)
        padded = torch.zeros(size * len(bounds), dtype=flat.dtype, device=flat.device)
        for j, (a, b) in enumerate(bounds):
            padded[j * size: j * size + b - a] = flat[a:b]
        out = torch.empty(size, dtype=flat.dtype, device=flat.device)
        work = torch.distributed.reduce_scatter_tensor(out, padded, group=handle, async_op=True)
        return work, lambda: out[: hi - lo]
    work = torch.distributed.all_reduce(flat, group=handle, async_op=True)
    return work, lambda: flat[lo:hi]


def sum_piece(flat: torch.Tensor, bounds: list[tuple[int, int]], i: int, handle, wait: Callable,
              what: str) -> torch.Tensor:
    """:func:`post_sum`, waited for."""
    work, read = post_sum(flat, bounds, i, handle)
    wait([work], what)
    return read()


def compute_counts(layout, rank: int) -> tuple[int, int]:
    """Gather and reduce rounds per step of ``rank``: its compute actions and its backward
    actions that finish a gradient (``B``, ``W``)."""
    role = layout.role(rank)
    if role is None:
        return 0, 0
    acts = layout.pipelines[role.pipeline].actions.actions[role.pipe_rank]
    return sum(a.op in GATHER_OPS for a in acts), sum(a.op in REDUCE_OPS for a in acts)


def one_stage_per_pipeline(layout) -> bool:
    """Whether every pipeline is one stage on one pipeline rank (what ZeRO-3 runs on)."""
    return all(p.actions.stages == 1 and len(p.groups) == 1 for p in layout.pipelines)


def one_stage_per_rank(layout) -> bool:
    """Whether every pipeline rank holds exactly one stage chunk (no interleaving, no model
    copies): what per-micro-batch ZeRO-2 runs on, since each backward then finishes a gradient
    of everything the rank holds."""
    return all(p.actions.stages == len(p.groups) and len(p.actions.chains) == 1 for p in layout.pipelines)


@dataclass
class _Group:
    """One chunk group as this rank shards it: its piece ``bounds[i]`` of the flat bucket."""

    members: tuple[int, ...]
    handle: Any  # gradient sums
    chunks: list
    bounds: list[tuple[int, int]]
    i: int
    weights: torch.Tensor  # ZeRO-3: the fp32 piece of the weights (empty under ZeRO-2)
    grad: torch.Tensor  # summed gradient piece, accumulated over the step's micro-batches
    avg: torch.Tensor
    sq: torch.Tensor
    pad: tuple[int, int]  # empty (gather, reduce) rounds this rank adds per step

    @property
    def what(self) -> str:
        return f"ranks {list(self.members)}"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class ShardedState:
    """ZeRO-2 (``stage=2``, :func:`one_stage_per_rank` layouts) or ZeRO-3 (``stage=3``,
    :func:`one_stage_per_pipeline` layouts) for one rank (module docstring). ``params[(stage, name)]`` are the rank's parameters, full and
    initialised; ``weights`` the shard weight of every global rank (None: even); ``rounds[r]``
    the (gather, reduce) rounds of rank ``r`` per step (:func:`compute_counts`)."""

    def __init__(self, sync, params: dict, *, stage: int, weights: Sequence[float] | None,
                 rounds: dict[int, tuple[int, int]], lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float):
        self.sync, self.params, self.stage = sync, params, stage
        self.adam = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.t = 0
        self.groups: list[_Group] = []
        self.local: dict[int, torch.nn.Parameter] = {}
        for members, handle, chunks in sync.items:
            i = members.index(sync.rank)
            n = sum(c.numel for c, _, _ in chunks)
            bounds = shard_bounds(n, None if weights is None else [weights[r] for r in members], len(members))
            lo, hi = bounds[i]
            flat = self._weights(chunks)
            piece = flat[lo:hi].clone() if stage == 3 else flat[:0].clone()
            pad = tuple(max(rounds[r][k] for r in members) - rounds[sync.rank][k] for k in (0, 1))
            zeros = flat.new_zeros(hi - lo)
            self.groups.append(_Group(members, handle, chunks, bounds, i, piece, zeros, zeros.clone(), zeros.clone(),
                                      pad))
            for c, mine, _ in chunks:
                for h in mine:
                    p = params[(h.stage, c.name)]
                    self.local[id(p)] = p
        self.gathered = True
        self.pending: list = []  # gradient sums posted, not yet added: (group, work, read)
        self.grad_peak = 0  # most gradient bytes held after a compute action (local grads + pieces)
        if stage == 3:
            self.free()

    def synced(self) -> set[tuple[int, str]]:
        """``(stage, name)`` of the local tensors this object updates (the rest: plain AdamW)."""
        return {(h.stage, c.name) for g in self.groups for c, mine, _ in g.chunks for h in mine}

    def _weights(self, chunks) -> torch.Tensor:
        return torch.cat([self.sync._view(self.params[(mine[0].stage, c.name)].data, c, mine[0]).reshape(-1)
                          for c, mine, _ in chunks])

    def state_bytes(self) -> int:
        """Bytes of AdamW moments this rank keeps."""
        return sum(_nbytes(g.avg) + _nbytes(g.sq) for g in self.groups)

    def kept_bytes(self, stages: dict) -> dict[str, int]:
        """Measured bytes this rank keeps between compute actions, by part: weights (allocated
        parameter storage plus ZeRO-3 pieces), gradients (:attr:`grad_peak`), optimizer moments
        of the sharded tensors."""
        params = {id(p): p for st in stages.values() for p in st.module.parameters()}.values()
        weights = sum(p.data.untyped_storage().nbytes() for p in params) + sum(_nbytes(g.weights) for g in self.groups)
        return {"weights": weights, "gradients": self.grad_peak, "optimizer": self.state_bytes()}

    # ------------------------------------------------------------ weights
    def free(self) -> None:
        """Stage 3: drop the gathered weights (the parameters keep shape, not storage)."""
        for p in self.local.values():
            p.data.untyped_storage().resize_(0)
        self.gathered = False

    @torch.no_grad()
    def gather(self, wait: Callable, *, keep: bool = True, only: Sequence[bool] | None = None) -> None:
        """All-gather every group's weight pieces into the local parameters (``keep=False``: an
        empty round, the result discarded; ``only``: per group, whether it takes part)."""
        if keep and not self.gathered:
            for p in self.local.values():
                p.data.untyped_storage().resize_(_nbytes(p))
        for k, g in enumerate(self.groups):
            if only is None or only[k]:
                flat = gather_pieces(g.weights, g.bounds, self.sync.gather_handles[g.members], wait,
                                     f"ZeRO weight all-gather with {g.what}")
                if keep:
                    self._write(g.chunks, flat)
        self.gathered = self.gathered or keep

    def _write(self, chunks, flat: torch.Tensor) -> None:
        """Copy a whole flat bucket into every local holder's view (through ``.data``)."""
        k = 0
        for c, mine, _ in chunks:
            for h in mine:
                v = self.sync._view(self.params[(h.stage, c.name)].data, c, h)
                v.copy_(flat[k: k + c.numel].view_as(v))
            k += c.numel

    def before(self, op: Op, wait: Callable) -> None:
        """Before a compute action: stage 3 gathers the weights."""
        if self.stage == 3 and op in GATHER_OPS:
            self.gather(wait)

    def after(self, op: Op, wait: Callable) -> None:
        """After a compute action: a finished gradient is summed into the pieces; stage 3 frees."""
        if op in REDUCE_OPS:
            self.reduce(wait)
        grads = {id(p): p.grad for p in self.params.values() if p.grad is not None}
        held = sum(_nbytes(t) for t in grads.values()) + sum(_nbytes(g.grad) for g in self.groups)
        self.grad_peak = max(self.grad_peak, held)
        if self.stage == 3 and op in GATHER_OPS:
            self.free()

    # ---------------------------------------------------------- gradients
    @torch.no_grad()
    def reduce(self, wait: Callable, *, empty: bool = False, only: Sequence[bool] | None = None) -> None:
        """Sum the group's gradient buckets, add this rank's piece to its gradient shard, free
        the local gradients (``empty``: contribute zeros; ``only``: per group, whether it takes part)."""
        for k, g in enumerate(self.groups):
            if only is not None and not only[k]:
                continue
            if empty:
                flat = g.grad.new_zeros(g.bounds[-1][1])
            else:
                for c, mine, _ in g.chunks:
                    for h in mine:
                        p = self.params[(h.stage, c.name)]
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                flat = self.sync.bucket(self.params, g.chunks)
            self._harvest(wait, everything=False)
            work, read = post_sum(flat, g.bounds, g.i, g.handle)
            self.pending.append((g, work, read))
        for p in self.local.values():
            p.grad = None

    def _harvest(self, wait: Callable, *, everything: bool) -> None:
        """Add finished gradient sums to their pieces (``everything``: wait for all of them)."""
        left = []
        for g, work, read in self.pending:
            if everything:
                wait([work], f"ZeRO gradient reduce-scatter with {g.what}")
            elif not work.is_completed():
                left.append((g, work, read))
                continue
            g.grad += read()
        self.pending = left

    # --------------------------------------------------------------- step
    def step(self, params: dict, wait: Callable) -> None:
        """Empty rounds up to the group's most, then AdamW on the pieces; stage 2 all-gathers
        the updated weights into the local copies."""
        for k in range(max((g.pad[0] for g in self.groups), default=0) if self.stage == 3 else 0):
            self.gather(wait, keep=False, only=[g.pad[0] > k for g in self.groups])
        for k in range(max((g.pad[1] for g in self.groups), default=0)):
            self.reduce(wait, empty=True, only=[g.pad[1] > k for g in self.groups])
        self._harvest(wait, everything=True)
        self.t += 1
        for g in self.groups:
            lo, hi = g.bounds[g.i]
            w = g.weights if self.stage == 3 else self._weights(g.chunks)[lo:hi].clone()
            adamw_(w, g.grad, g.avg, g.sq, self.t, **self.adam)
            g.grad.zero_()
            if self.stage == 2:
                self._write(g.chunks, gather_pieces(w, g.bounds, g.handle, wait,
                                                    f"ZeRO weight all-gather with {g.what}"))

    def materialize(self, wait: Callable) -> None:
        """Stage 3 after training: gather the full weights back for good (checkpoint, state)."""
        if self.stage == 3:
            self.gather(wait)
