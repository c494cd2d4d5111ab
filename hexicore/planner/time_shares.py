"""Time shares: a whole solve's search time divided among the sub-clusters
:func:`hexicore.planner.allocation.allocate` solves, for a solver whose own runs take a time
limit (cpsat, where the limit is CP-SAT's search time, as OR-Tools' ``max_time_in_seconds``;
building each model is not counted). hexiscale's search instead runs each sub-cluster in the
wall-clock time left before its deadline."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TimeShares"]


@dataclass
class TimeShares:
    """``limit`` seconds of search shared among the sub-clusters ``allocate`` solves, in
    proportion to their devices (a larger model takes longer to solve and to bound): before each
    solve ``allocate`` sets ``part``, that sub-cluster's devices over the devices of those it
    still means to solve, itself included (exhaustive mode: every one left that has memory for
    the state; a greedy step: its neighbours left and the largest again for the next step);
    :meth:`seconds` is that part of the seconds left, and the solver reports what its run took
    (:meth:`spend`), so time a sub-cluster did not use (proven early, or skipped) passes on to
    the others and a run that overran its share (presolve) leaves less. Once :attr:`spent`, no
    further sub-cluster is solved."""

    limit: float
    used: float = 0.0
    part: float = 1.0

    def seconds(self) -> float:
        return max(1e-3, self.limit - self.used) * self.part

    def spend(self, seconds: float) -> None:
        self.used += max(0.0, seconds)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit
