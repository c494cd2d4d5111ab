"""The chain rule of the action IR: which stage comes before and after a stage.

An action list's ``chains[c]`` lists chain c's stages in data order; micro-batch ``mb`` runs
through ``chains[mb_chain[mb]]``. ``F(s, mb)`` needs the output of the stage before ``s`` on
that chain (the first stage reads the batch), ``B(s, mb)`` / ``I(s, mb)`` the input gradient of
the stage after it (the last stage starts from the loss). Stage ``s`` of chain c sends its
forward output to the next stage and its input gradient to the previous one.

:class:`ChainLinks` is the one place that rule is written down; the comm pass, the validator,
both simulator paths, the greedy scheduler and :meth:`hexicore.pipeline.actions.ActionList.next_stage`
read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hexicore.core.errors import ScheduleError

#: table entry for "no such stage" (first/last stage of a chain, or a stage off the chain)
NONE = -1


@dataclass(frozen=True, eq=False)
class ChainLinks:
    """Per chain ``c`` and stage ``s`` (``0 <= s < stages``): ``prev[c][s]`` / ``next[c][s]``,
    the stage before / after ``s`` on chain c, and ``pos[c][s]``, the position of ``s`` on
    chain c. :data:`NONE` (-1) where there is no such stage or ``s`` is not on chain c. A stage
    listed twice on one chain keeps its last position."""

    stages: int
    prev: tuple[tuple[int, ...], ...]
    next: tuple[tuple[int, ...], ...]
    pos: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, chains: Sequence[Sequence[int]], stages: int | None = None) -> "ChainLinks":
        """The tables of ``chains`` over ``stages`` stages (default: the largest listed + 1);
        a chain naming a stage outside ``[0, stages)`` is a :class:`ScheduleError`."""
        if stages is None:
            stages = max((s for chain in chains for s in chain), default=-1) + 1
        prev, nxt, pos = [], [], []
        for c, chain in enumerate(chains):
            p, n, k = [NONE] * stages, [NONE] * stages, [NONE] * stages
            for i, s in enumerate(chain):
                if not 0 <= s < stages:
                    raise ScheduleError(f"chain {c}: stage {s} is out of range [0, {stages})", field="chains")
                p[s] = chain[i - 1] if i else NONE
                n[s] = chain[i + 1] if i + 1 < len(chain) else NONE
                k[s] = i
            prev.append(tuple(p))
            nxt.append(tuple(n))
            pos.append(tuple(k))
        return cls(stages, tuple(prev), tuple(nxt), tuple(pos))

    def on(self, chain: int, stage: int) -> bool:
        """Whether ``stage`` lies on ``chain``."""
        return 0 <= stage < self.stages and self.pos[chain][stage] != NONE

    def next_stage(self, chain: int, stage: int) -> int | None:
        """The stage after ``stage`` on ``chain`` (None: the last one, or not on the chain)."""
        s = self.next[chain][stage] if 0 <= stage < self.stages else NONE
        return None if s == NONE else s

    def prev_stage(self, chain: int, stage: int) -> int | None:
        """The stage before ``stage`` on ``chain`` (None: the first one, or not on the chain)."""
        s = self.prev[chain][stage] if 0 <= stage < self.stages else NONE
        return None if s == NONE else s

    def position(self, stage: int) -> int | None:
        """Position of ``stage`` on the first chain holding it (replicas of one model part sit at
        the same position of different chains, e.g. Chimera's two directions)."""
        for row in self.pos:
            if 0 <= stage < self.stages and row[stage] != NONE:
                return row[stage]
        return None

    def lists(self) -> tuple[list[list[int | None]], list[list[int | None]]]:
        """``prev`` and ``next`` as per-chain lists with None for :data:`NONE` (hot loops)."""
        def conv(t: tuple[tuple[int, ...], ...]) -> list[list[int | None]]:
            return [[None if s == NONE else s for s in row] for row in t]
        return conv(self.prev), conv(self.next)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """``prev`` and ``next`` as ``(chains, stages)`` int64 arrays (the array passes)."""
        shape = (len(self.prev), self.stages)
        return (np.asarray(self.prev, dtype=np.int64).reshape(shape),
                np.asarray(self.next, dtype=np.int64).reshape(shape))

    def per_stage(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(prev, next, chain)`` per stage as int64 arrays (:data:`NONE` where missing; a stage
        on no chain has chain -1); None when a stage lies on two chains."""
        pos = np.asarray(self.pos, dtype=np.int64).reshape(len(self.pos), self.stages)
        on = pos != NONE
        if (on.sum(axis=0) > 1).any():
            return None
        chain = np.where(on.any(axis=0), on.argmax(axis=0), NONE)
        prev, nxt = self.tables()
        c, s = np.maximum(chain, 0), np.arange(self.stages)
        if not len(self.pos):
            return np.full(self.stages, NONE), np.full(self.stages, NONE), chain
        return np.where(chain >= 0, prev[c, s], NONE), np.where(chain >= 0, nxt[c, s], NONE), chain
