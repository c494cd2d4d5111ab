"""Solver ``hexiscale``: the two-phase planner of HexiScale §4 (:mod:`hexicore.planner.search`),
registered from the core through :mod:`hexicore.builtin`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.search import run_search
from hexicore.planner.search_config import SearchConfig


@dataclass(frozen=True)
class HexiScaleSolver:
    """``HexiScaleSolver(**params)`` with the keys of :class:`SearchConfig`."""

    config: SearchConfig
    name: str = "hexiscale"

    @classmethod
    def from_params(cls, **params: Any) -> "HexiScaleSolver":
        return cls(SearchConfig.from_params(params))

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                       or time_limit <= 0):
            raise HexicoreError(f"time_limit must be a positive number of seconds or null, got {time_limit!r}",
                                field="solver.time_limit")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise HexicoreError(f"seed must be an integer, got {seed!r}", field="solver.seed")
        return run_search(problem, self.config, time_limit=time_limit, seed=seed, progress=progress)
