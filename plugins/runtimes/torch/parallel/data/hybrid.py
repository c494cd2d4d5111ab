"""Hybrid sharding (``train.zero_scope=machine``): who shares a chunk group's pieces, and which
pieces are summed across machines.

PyTorch's HSDP ("shard inside a machine, replicate across"; hexicore/cost/sharding.py prices it)
over the chunk groups of :mod:`.sync`. The holders of one chunk group (its member ranks) are
split by machine; inside machine ``m`` the flat bucket of ``n`` elements is cut among that
machine's holders exactly as :func:`.sync.shard_bounds` cuts it among all holders (even, or in
proportion to the members' shard weights) — so every holder keeps ``n * w_d / sum_{machine} w``
elements of AdamW state, the cost model's
:func:`hexicore.cost.sharding.kept_params` for ``zero_scope=machine``.

Machines with different holder counts cut the bucket at different places, so a piece of one
machine has no single counterpart in another. The scheme chosen: the bucket is cut at the
union of every machine's cuts; each resulting *segment* lies in exactly one piece per machine,
and is all-reduced among those pieces' holders (one rank per machine). With equal holder counts
(and weights) the segments are the pieces themselves; otherwise a holder of the machine with
the fewest holders ``k`` sums its ``n / k`` elements in several segments with different
partners, the bytes the cost model's ``cross`` term prices (``P / k`` per holder of that
machine). A step, per chunk group: reduce-scatter inside the machine, all-reduce of each
segment across machines, AdamW on the piece (identical on every machine: same sum, same
moments), all-gather inside the machine.

ZeRO-3 (:class:`.zero_state.ShardedState`, the cost model's ``1.5 x intra`` per micro-batch plus
``cross`` at the step): a bucket is cut unit by unit (:func:`.sync.apportion` among the
machine's holders), so the segments are cut per unit too (:func:`atom_segments`); gathers and
per-micro-batch gradient reduce-scatters run among the machine's holders only, and at the step,
before AdamW, :func:`sum_across` all-reduces each segment of the gradient piece with the other
machines (one holder each).

Every rank derives the same splits and communicator member sets from the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .sync import apportion, shard_bounds


@dataclass(frozen=True)
class Split:
    """How one rank shares one chunk group's flat bucket: ``peers`` (the ranks whose pieces
    tile the bucket, this rank among them), their ``bounds``, this rank's index ``i`` and the
    ``cross`` segments ``(lo, hi, ranks)`` of its piece summed with other machines."""

    peers: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    i: int
    cross: tuple[tuple[int, int, tuple[int, ...]], ...] = ()

    @property
    def piece(self) -> tuple[int, int]:
        return self.bounds[self.i]


def by_machine(members: Sequence[int], machines: Sequence[str]) -> list[tuple[int, ...]]:
    """``members`` grouped by the machine of each rank, machines in order of first appearance."""
    out: dict[str, list[int]] = {}
    for r in members:
        out.setdefault(machines[r], []).append(r)
    return [tuple(g) for g in out.values()]


def _bounds(peers: Sequence[int], n: int, weights: Sequence[float] | None) -> list[tuple[int, int]]:
    return shard_bounds(n, None if weights is None else [weights[r] for r in peers], len(peers))


def segments(members: Sequence[int], n: int, weights: Sequence[float] | None,
             machines: Sequence[str]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Every non-empty segment ``(lo, hi, ranks)`` of the bucket between the union of the
    machines' cuts, with the one holder per machine whose piece contains it (module docstring)."""
    groups = by_machine(members, machines)
    return _between_cuts(groups, [_bounds(g, n, weights) for g in groups], n)


def _between_cuts(groups: Sequence[tuple[int, ...]], bounds: Sequence[Sequence[tuple[int, int]]], n: int,
                  start: int = 0) -> list[tuple[int, int, tuple[int, ...]]]:
    """The non-empty ``(lo, hi, ranks)`` of a span of ``n`` elements between the union of every
    machine's cuts (``bounds[m]``, one range per holder of ``groups[m]``), offset by ``start``,
    with the one holder per machine whose range contains it."""
    cuts = sorted({x for bs in bounds for lo, hi in bs for x in (lo, hi)} | {0, n})
    return [(start + lo, start + hi, tuple(sorted(g[j] for g, bs in zip(groups, bounds)
                                                  for j, (x, y) in enumerate(bs) if x <= lo < y)))
            for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def split(members: Sequence[int], n: int, rank: int, weights: Sequence[float] | None,
          machines: Sequence[str] | None) -> Split:
    """This rank's :class:`Split` of a chunk group of ``members`` and ``n`` elements: among all
    members (``machines`` None), or hybrid, among its machine's holders plus cross segments."""
    members = tuple(members)
    if machines is None:
        return Split(members, tuple(_bounds(members, n, weights)), members.index(rank))
    peers = peers_of(members, rank, machines)
    bounds = tuple(_bounds(peers, n, weights))
    lo, hi = bounds[peers.index(rank)]
    cross = tuple(s for s in segments(members, n, weights, machines) if rank in s[2] and len(s[2]) > 1
                  and lo <= s[0] < hi)
    return Split(peers, bounds, peers.index(rank), cross)


def counted(members: Sequence[int], rank: int, machines: Sequence[str] | None) -> bool:
    """Whether ``rank``'s piece of a chunk group counts in the global gradient norm
    (:mod:`.grad_norm`): always, unless hybrid, where every machine holds the summed bucket and
    only the pieces of the group's first machine (that of its lowest rank) count."""
    return machines is None or rank in by_machine(sorted(members), machines)[0]


def peers_of(members: Sequence[int], rank: int, machines: Sequence[str] | None) -> tuple[int, ...]:
    """The ranks whose pieces tile a chunk group's bucket for ``rank``: all ``members``
    (``machines`` None) or those in its machine."""
    if machines is None:
        return tuple(members)
    return next(g for g in by_machine(members, machines) if rank in g)


def atom_segments(members: Sequence[int], sizes: Sequence[int], weights: Sequence[float] | None,
                  machines: Sequence[str]) -> list[tuple[int, int, tuple[int, ...]]]:
    """:func:`segments` of a bucket cut atom by atom (ZeRO-3: atoms of ``sizes`` elements, each
    machine apportioning every atom among its holders, :func:`.sync.apportion`): every
    non-empty ``(lo, hi, ranks)`` between the union of the machines' cuts inside each atom, in
    bucket offsets, with the one holder per machine whose slice contains it."""
    groups = by_machine(members, machines)
    cuts_of = [apportion(sizes, None if weights is None else [weights[r] for r in g], len(g)) for g in groups]
    out, start = [], 0
    for a, n in enumerate(sizes):
        out += _between_cuts(groups, [bs[a] for bs in cuts_of], n, start)
        start += n
    return out


def atom_cross(members: Sequence[int], sizes: Sequence[int], rank: int, weights: Sequence[float] | None,
               machines: Sequence[str]) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """The :func:`atom_segments` of ``rank``'s slices summed with other machines."""
    return tuple(s for s in atom_segments(members, sizes, weights, machines) if rank in s[2] and len(s[2]) > 1)


def machine_sets(groups: Sequence[tuple[int, ...]], machines: Sequence[str]) -> list[tuple[int, ...]]:
    """Every chunk group's machine subsets of more than one rank (deduplicated, in creation
    order): the ranks that gather ZeRO-3 weights and sum gradients per micro-batch together."""
    need = {g for members in groups for g in by_machine(members, machines) if len(g) > 1}
    return sorted(need, key=lambda m: (len(m), m))


def communicators(groups: dict[tuple[int, ...], int], weights: Sequence[float] | None,
                  machines: Sequence[str], atoms: dict[tuple[int, ...], list[int]] | None = None
                  ) -> list[tuple[int, ...]]:
    """Member sets of the extra communicators hybrid sharding needs, in the order every rank
    creates them: each chunk group's (``members -> n``) machine subsets and cross segments with
    more than one rank (ZeRO-3, ``atoms``: ``members ->`` atom sizes, :func:`atom_segments`),
    deduplicated, except the chunk groups themselves (they have one)."""
    need: set[tuple[int, ...]] = set(machine_sets(list(groups), machines))
    for members, n in groups.items():
        segs = segments(members, n, weights, machines) if atoms is None else \
            atom_segments(members, atoms[members], weights, machines)
        need.update(s[2] for s in segs if len(s[2]) > 1)
    return sorted(need - set(groups), key=lambda m: (len(m), m))


def sum_across(b, g: torch.Tensor, handle: Callable, wait: Callable) -> None:
    """ZeRO-3 at the step: sum, in place, every cross segment (``b.cross``) of this rank's
    gradient piece ``g`` of bucket ``b`` (:class:`.zero_state.Bucket`, its slices atom after
    atom) with the other machines' holders of it; the segments shared with the same ranks go
    in one all-reduce on ``handle(ranks)``, posted in sorted order of ``ranks`` (the same on
    every rank, so no two ranks wait on each other's later sum)."""
    runs: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for lo, hi, ranks in b.cross:
        a = next(a for a, (s, e) in enumerate(b.span) if s <= lo < e)
        at = b.offset(a) + lo - b.span[a][0] - b.bounds[a][b.i][0]
        runs.setdefault(ranks, []).append((at, at + hi - lo))
    posted = []
    for ranks in sorted(runs):
        flat = torch.cat([g[x:y] for x, y in runs[ranks]])
        posted.append((ranks, flat, torch.distributed.all_reduce(flat, group=handle(ranks), async_op=True)))
    for ranks, flat, work in posted:
        wait([work], f"ZeRO gradient sum across machines with ranks {list(ranks)}")
        k = 0
        for x, y in runs[ranks]:
            g[x:y].copy_(flat[k: k + y - x])
            k += y - x


__all__ = ["Split", "by_machine", "counted", "segments", "split", "peers_of", "atom_segments", "atom_cross", "machine_sets",
           "communicators", "sum_across"]
