"""Time shares: a whole solve's time limit divided among the sub-clusters
:func:`hexicore.planner.allocation.allocate` solves, for a solver whose own runs take a time
limit (cpsat); hexiscale's search instead runs each sub-cluster in the time left."""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["TimeShares"]


@dataclass
class TimeShares:
    """A whole solve's time limit shared among the sub-clusters ``allocate`` solves, in proportion to their devices (a larger
    model takes longer to solve and to bound): before each solve ``allocate`` sets ``part``, that
    sub-cluster's devices over the devices of those it still means to solve, itself included
    (exhaustive mode: every one left that has memory for the state; a greedy step: its neighbours
    left and the largest again for the next step); :meth:`seconds` is that part of the time
    left, so time a sub-cluster did not use (proven early, or skipped) passes on to the others."""

    deadline: float  # time.monotonic() at which the whole solve ends
    part: float = 1.0

    def seconds(self) -> float:
        return max(1e-3, self.deadline - time.monotonic()) * self.part
