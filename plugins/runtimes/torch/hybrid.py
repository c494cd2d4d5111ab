"""Hybrid sharding (``train.zero_scope=machine``): who shares a chunk group's pieces, and which
pieces are summed across machines.

PyTorch's HSDP ("shard inside a machine, replicate across"; hexicore/cost/sharding.py prices it)
over the chunk groups of :mod:`.dp_sync`. The holders of one chunk group (its member ranks) are
split by machine; inside machine ``m`` the flat bucket of ``n`` elements is cut among that
machine's holders exactly as :func:`.zero.shard_bounds` cuts it among all holders (even, or in
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

Pure Python: every rank derives the same splits and communicator member sets from the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .zero import shard_bounds


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
    groups = [(g, _bounds(g, n, weights)) for g in by_machine(members, machines)]
    cuts = sorted({b for _, bs in groups for lo, hi in bs for b in (lo, hi)} | {0, n})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        if hi > lo:
            ranks = tuple(sorted(g[j] for g, bs in groups for j, (a, b) in enumerate(bs) if a <= lo < b))
            out.append((lo, hi, ranks))
    return out


def split(members: Sequence[int], n: int, rank: int, weights: Sequence[float] | None,
          machines: Sequence[str] | None) -> Split:
    """This rank's :class:`Split` of a chunk group of ``members`` and ``n`` elements: among all
    members (``machines`` None), or hybrid, among its machine's holders plus cross segments."""
    members = tuple(members)
    if machines is None:
        return Split(members, tuple(_bounds(members, n, weights)), members.index(rank))
    peers = next(g for g in by_machine(members, machines) if rank in g)
    bounds = tuple(_bounds(peers, n, weights))
    lo, hi = bounds[peers.index(rank)]
    cross = tuple(s for s in segments(members, n, weights, machines) if rank in s[2] and len(s[2]) > 1
                  and lo <= s[0] < hi)
    return Split(peers, bounds, peers.index(rank), cross)


def communicators(groups: dict[tuple[int, ...], int], weights: Sequence[float] | None,
                  machines: Sequence[str]) -> list[tuple[int, ...]]:
    """Member sets of the extra communicators hybrid sharding needs, in the order every rank
    creates them: each chunk group's (``members -> n``) machine subsets and cross segments with
    more than one rank, deduplicated, except the chunk groups themselves (they have one)."""
    need: set[tuple[int, ...]] = set()
    for members, n in groups.items():
        need.update(g for g in by_machine(members, machines) if len(g) > 1)
        need.update(s[2] for s in segments(members, n, weights, machines) if len(s[2]) > 1)
    return sorted(need - set(groups), key=lambda m: (len(m), m))


__all__ = ["Split", "by_machine", "segments", "split", "communicators"]
