"""The planning problem a solver receives, and the solver interface (DESIGN.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from hexicore.core.cluster import Cluster
from hexicore.cost import CostModel, Estimate
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan, TrainConfig

Progress = Callable[[str, float], None]  # (message, fraction done in [0, 1])


def no_progress(message: str, fraction: float) -> None:
    """The default progress callback: silent."""


@dataclass(frozen=True)
class Problem:
    """Everything a solver may use: the cluster, the model, the training setup, a cost model,
    the schedule chosen in config, the registry (to build partitioners, refiners, orderers by
    name) and an optional warm-start plan."""

    cluster: Cluster
    model: ModelSpec
    train: TrainConfig
    cost: CostModel
    schedule: Mapping[str, Any] = field(default_factory=lambda: {"name": "1f1b"})
    registry: Any = None
    warm_start: Plan | None = None

    def evaluate(self, plan: Plan) -> Estimate:
        return self.cost.estimate(plan)


class Solver(Protocol):
    """``solve`` returns a plan (its ``estimate`` and ``solver`` sections may be left empty: the
    caller fills them). It raises :class:`hexicore.core.errors.HexicoreError` when nothing fits."""

    def solve(self, problem: Problem, *, time_limit: float | None, seed: int, progress: Progress) -> Plan: ...
