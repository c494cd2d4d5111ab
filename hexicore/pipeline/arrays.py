"""Array form of per-rank action lists (the same IR as :mod:`hexicore.pipeline.actions`, held as numpy).

An :class:`~hexicore.pipeline.actions.ActionList` may hold its actions as :class:`ActionArrays` — one
flat int array per field (op code, stage, micro-batch, peer; -1 for None) in rank order, with
``offsets[r]:offsets[r+1]`` rank r's slice — and builds the ``Action`` objects only when
``.actions`` is read (:func:`hexicore.pipeline.actions.from_arrays`). Large schedules (Hanayo
with P = 64, W = 8, M = 512: ~3M actions) are built, given their communication
(:func:`hexicore.pipeline.comm.insert_comm`), validated and simulated
(:mod:`hexicore.pipeline.simulate_fast`) in this form; the object view and the JSON stay the contract.

Imports nothing else of hexicore: the records module builds on this one, not the other way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

#: array code of each op of the IR: its position in :data:`hexicore.pipeline.actions.OPS`
#: (tests/pipeline/test_fast_paths.py checks the two agree); keyed by the op's name
CODE = {op: i for i, op in enumerate(("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE", "STEP"))}
F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE, STEP = CODE.values()


@dataclass(frozen=True, eq=False)
class ActionArrays:
    """Flat per-action fields (rank-major) and rank offsets; see the module docstring."""

    op: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    peer: np.ndarray
    offsets: np.ndarray

    @property
    def ranks(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return len(self.op)

    def rank_of(self) -> np.ndarray:
        """Rank of every action."""
        return np.repeat(np.arange(self.ranks, dtype=np.int64), np.diff(self.offsets))

    @classmethod
    def build(cls, op: Sequence[int] | np.ndarray, stage, mb, peer, counts: Sequence[int]) -> "ActionArrays":
        off = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=off[1:])
        return cls(np.asarray(op, dtype=np.int8), np.asarray(stage, dtype=np.int32), np.asarray(mb, dtype=np.int32),
                   np.asarray(peer, dtype=np.int32), off)

    @classmethod
    def from_lists(cls, lists: Iterable[Iterable[Any]]) -> "ActionArrays":
        """Encode per-rank lists of actions (anything with ``op``, ``stage``, ``mb``, ``peer``)."""
        rows = [list(acts) for acts in lists]
        flat = [a for acts in rows for a in acts]
        none = -1
        return cls.build([CODE[a.op] for a in flat], [none if a.stage is None else a.stage for a in flat],
                         [none if a.mb is None else a.mb for a in flat],
                         [none if a.peer is None else a.peer for a in flat], [len(r) for r in rows])

    def select(self, keep: np.ndarray) -> "ActionArrays":
        """The actions where ``keep`` is true (rank order kept)."""
        counts = np.bincount(self.rank_of()[keep], minlength=self.ranks)
        return ActionArrays.build(self.op[keep], self.stage[keep], self.mb[keep], self.peer[keep], counts)

    def append_per_rank(self, code: int) -> "ActionArrays":
        """Every rank's list with one more action ``code`` (stage, mb, peer None), e.g. STEP."""
        at = self.offsets[1:]
        return ActionArrays.build(np.insert(self.op, at, code), np.insert(self.stage, at, -1),
                                  np.insert(self.mb, at, -1), np.insert(self.peer, at, -1), np.diff(self.offsets) + 1)

    def is_comm(self) -> np.ndarray:
        return (self.op >= SEND_F) & (self.op <= RECV_B)


def tile_blocks(block: ActionArrays, block_mbs: int, repeats: int, rest: ActionArrays | None = None) -> ActionArrays:
    """Per rank: ``block`` repeated ``repeats`` times with micro-batches shifted by ``block_mbs``
    each time, then ``rest`` (micro-batches shifted past the repeats). Compute actions only."""
    parts_op, parts_st, parts_mb, counts = [], [], [], []
    P = block.ranks
    for r in range(P):
        a, b = block.offsets[r], block.offsets[r + 1]
        n = b - a
        shift = np.repeat(np.arange(repeats, dtype=np.int32) * block_mbs, n)
        parts_op.append(np.tile(block.op[a:b], repeats))
        parts_st.append(np.tile(block.stage[a:b], repeats))
        parts_mb.append(np.tile(block.mb[a:b], repeats) + shift)
        c = n * repeats
        if rest is not None:
            x, y = rest.offsets[r], rest.offsets[r + 1]
            parts_op.append(rest.op[x:y])
            parts_st.append(rest.stage[x:y])
            parts_mb.append(rest.mb[x:y] + repeats * block_mbs)
            c += y - x
        counts.append(c)
    op, st, mb = (np.concatenate(p) if p else np.zeros(0, np.int32) for p in (parts_op, parts_st, parts_mb))
    return ActionArrays.build(op, st, mb, np.full(len(op), -1, dtype=np.int32), counts)

