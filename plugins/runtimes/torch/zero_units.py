"""Units of the sharded training state, the rounds that pair their collectives across ranks, and
the shard arithmetic (pieces, AdamW on a piece, gathers and sums of pieces).

A *unit* is what ZeRO-3 gathers at once, as PyTorch's FSDP wraps a transformer model: the
embedding (key ``-1``), each block (its layer index), and the final norm with the head (key
``layers``). Every unit is an *atom*
of a chunk group's flat bucket, sharded on its own (a unit is gathered and its gradient summed
alone): member ``j`` owns a slice of every atom (:func:`apportion`), its *piece* is those slices,
atom after atom.

Pairing (the module docstring of :mod:`.zero`): every rank knows, from the layout, every rank's
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
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hexicore.pipeline.actions import Op

if TYPE_CHECKING:
    import torch

# torch is imported by the shard kernels below only: the layout predicates (zero3_runs, ...) serve
# `plan` and `evaluate`, which must neither need torch nor pay its import (seconds)

EMBED_UNIT = -1


def unit_of(name: str, layers: int) -> int:
    """The unit of parameter ``name``: ``-1`` embedding, ``i`` block ``i``, ``layers`` norm + head."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return int(parts[2])
    if parts[:2] == ["model", "embed_tokens"]:
        return EMBED_UNIT
    return layers


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


def one_stage_per_pipeline(layout) -> bool:
    """Whether every pipeline is one plan stage (one pipeline rank, TP group) with one model copy:
    its ranks never wait on another pipeline's activations, however many chunks its schedule
    gives that rank (interleaved 1F1B, Hanayo, V schedules on a one-stage pipeline)."""
    return all(len(p.groups) == 1 and len(p.actions.chains) == 1 for p in layout.pipelines)


def mirrored(layout) -> bool:
    """Whether the pipelines mirror each other: the same stage chunks, TP degrees, batch and
    action lists, one model copy each (no Chimera copies)."""
    p0 = layout.pipelines[0]
    return all(len(p.actions.chains) == 1 and p.batch == p0.batch and p.chunk_layers == p0.chunk_layers
               and [g.tp for g in p.groups] == [g.tp for g in p0.groups] and p.actions.actions == p0.actions.actions
               for p in layout.pipelines)


def zero3_runs(layout) -> bool:
    """Whether ZeRO-3 runs on ``layout`` (:mod:`.zero`): every pipeline one stage (any
    schedules, batches, TP degrees), or pipelines that mirror each other (:func:`mirrored`).
    Gathers are blocking and pair rank by rank; between pipelines whose stage ranks also wait
    on each other's activations, pairing the ``k``-th needs of ranks at different points of
    different schedules could deadlock, so other multi-stage layouts are refused."""
    return one_stage_per_pipeline(layout) or mirrored(layout)


def rounds(needs: dict[int, list[tuple[int, ...]]], members: Sequence[int], atom_of: dict[int, int]) -> list[tuple[int, ...]]:
    """Per round ``k``, the atoms of the group its members need (union; empty rounds are skipped
    by every member alike)."""
    n = max((len(needs[r]) for r in members), default=0)
    return [tuple(sorted({atom_of[u] for r in members if k < len(needs[r]) for u in needs[r][k] if u in atom_of}))
            for k in range(n)]


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
    import torch

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


def post_reduce(b: Bucket, atoms: tuple[int, ...], flats: dict[int, torch.Tensor], dtype, device) -> tuple[Any, Callable]:
    """Start the sum over the group of the gradients of ``atoms`` (``flats[a]``: this rank's
    whole flat of atom ``a``, zeros where absent): a reduce-scatter of the members' slices padded
    to the largest on NCCL, an all-reduce on gloo (no reduce-scatter there). Returns the work and
    how to read this rank's slices (atom after atom) once it is done (one member: no collective)."""
    import torch

    whole = [flats[a] if a in flats else torch.zeros(b.span[a][1] - b.span[a][0], dtype=dtype, device=device)
             for a in atoms]
    m = len(b.members)
    if m == 1:  # this rank's slices are the whole atoms
        return Done(), lambda: torch.cat(whole)
    if torch.distributed.get_backend(b.handle) == "nccl":
        sizes = [sum(b.size(a, j) for a in atoms) for j in range(m)]
        size = max(sizes)
        padded = torch.zeros(size * m, dtype=dtype, device=device)
        for j in range(m):
            seg = torch.cat([w[b.bounds[a][j][0]: b.bounds[a][j][1]] for a, w in zip(atoms, whole)])
            padded[j * size: j * size + seg.numel()] = seg
        out = torch.empty(size, dtype=dtype, device=device)
        work = torch.distributed.reduce_scatter_tensor(out, padded, group=b.handle, async_op=True)
        return work, lambda: out[: sizes[b.i]]
    flat = torch.cat(whole)
    work = torch.distributed.all_reduce(flat, group=b.handle, async_op=True)
    starts = [sum(w.numel() for w in whole[:k]) for k in range(len(whole))]
    return work, lambda: torch.cat([flat[s + b.bounds[a][b.i][0]: s + b.bounds[a][b.i][1]]
                                    for a, s in zip(atoms, starts)])


def adamw_(w: torch.Tensor, g: torch.Tensor, avg: torch.Tensor, sq: torch.Tensor, t: int, *, lr: float,
           betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """One step of ``torch.optim.AdamW`` on ``w`` in place (decoupled decay, bias-corrected
    moments; Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Alg. 2)."""
    import torch

    b1, b2 = betas
    with torch.no_grad():
        w.mul_(1 - lr * weight_decay)
        avg.lerp_(g, 1 - b1)
        sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (sq.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
        w.addcdiv_(avg, denom, value=-lr / (1 - b1 ** t))


def gather_pieces(piece: torch.Tensor, bounds: list[tuple[int, int]], handle, wait: Callable, what: str) -> torch.Tensor:
    """All-gather every member's piece (padded to the largest) into the whole flat bucket."""
    import torch

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
    import torch

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
