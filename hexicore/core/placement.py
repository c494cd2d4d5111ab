"""Where a pipeline's model pieces live: per pipeline rank, the model copies it holds.

The plain placement — rank j holds plan stage j's contiguous blocks, the embedding on rank 0,
the head on rank P-1 — is the one the cost model's stage pieces assume (HexiScale App. A). A
schedule may place them otherwise: a rank may hold blocks of two model copies (bidirectional
pipelines), or a chain of chunks may end on rank 0 (V-shaped and wave layouts). A
:class:`Placement` says, per rank, which copies it holds: a :class:`Copy` is the blocks of one
chain on that rank — as many as plan stage ``source`` holds (the runtime cuts each chain so that
a rank's chunks of it share the rank's layer count; a further chain of the same length repeats
the first chain's blocks position by position) — with the chain's embedding if the chain starts
on the rank and its head if it ends there; ``traffic`` is the share of the micro-batches
that run through the copy (the chains share them evenly). Built from an action list's stage map and chains by
:func:`hexicore.pipeline.action_placement.placement`; the cost model prices memory and compute
through it (docs/cost-model.md, "Placement").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Copy:
    """One chain's part on a rank: the blocks of plan stage ``source`` (its layer count), the
    embedding (``embedding``), the final norm + head (``head``), run by ``traffic`` of the
    micro-batches; ``chain``: which chain (0: the copy whose gradients the data-parallel sync
    contributes, the others' summed into it)."""

    source: int
    embedding: bool = False
    head: bool = False
    traffic: float = 1.0
    chain: int = 0


@dataclass(frozen=True)
class Placement:
    """Per pipeline rank the copies it holds (``ranks[j]``, at least one each)."""

    ranks: tuple[tuple[Copy, ...], ...]

    @classmethod
    def plain(cls, n: int) -> "Placement":
        """Rank j holds stage j's blocks, the embedding on rank 0, the head on rank ``n - 1``."""
        return cls(tuple((Copy(j, j == 0, j == n - 1),) for j in range(n)))

    @property
    def is_plain(self) -> bool:
        return self == Placement.plain(len(self.ranks))

    def blocks(self, j: int, layers: Sequence[int]) -> int:
        """Blocks rank j keeps (every copy), for plan layer counts ``layers``."""
        return sum(layers[c.source] for c in self.ranks[j])

    def share_layers(self, j: int, layers: Sequence[int]) -> int:
        """Blocks of one in-flight micro-batch's activations on rank j: its largest copy (the
        schedules count in-flight micro-batches in units of one chain's share of the rank)."""
        return max(layers[c.source] for c in self.ranks[j])

    def embeddings(self, j: int) -> int:
        return sum(c.embedding for c in self.ranks[j])

    def heads(self, j: int) -> int:
        return sum(c.head for c in self.ranks[j])

    def lone_heads(self, j: int) -> int:
        """Heads on rank j whose chain's embedding is elsewhere (with tied embeddings each keeps
        its own copy of the embedding; a head next to its chain's embedding shares it)."""
        cs = self.ranks[j]
        return sum(c.head and not any(d.embedding and d.chain == c.chain for d in cs) for c in cs)

    def copies(self, j: int) -> int:
        return len(self.ranks[j])

    def primary(self, what: str) -> int:
        """The rank holding chain 0's ``"embedding"`` or ``"head"`` (plain: first / last rank)."""
        return next(j for j, cs in enumerate(self.ranks) if any(c.chain == 0 and getattr(c, what) for c in cs))

    def holders(self, k: int) -> tuple[int, ...]:
        """Ranks that keep a copy of plan stage ``k``'s blocks."""
        return tuple(j for j, cs in enumerate(self.ranks) if any(c.source == k for c in cs))

    def split_tp(self, tps: Sequence[int]) -> tuple[int, int] | None:
        """A rank keeping a copy of another stage's blocks at another TP degree (``tps``: per rank
        its TP degree), as ``(rank, source stage)``; None when every copy has its source's degree.
        A stage's blocks are one TP layout wherever they are kept (Chimera's mirrored stage
        ``P-1-j`` must have stage j's TP degree), so such a pipeline cannot run."""
        for j, cs in enumerate(self.ranks):
            for c in cs:
                if tps[c.source] != tps[j]:
                    return j, c.source
        return None
