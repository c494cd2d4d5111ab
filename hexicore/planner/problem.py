"""The planning problem a solver receives, and the solver interface (docs/plugins.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from hexicore.core.cluster import Cluster
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost import BoundCostModel, CostModel, Estimate, bind
from hexicore.planner.allocation.objective import Objective
from hexicore.planner.pricing import ScheduleBook
from hexicore.registry import Registry

Progress = Callable[[str, float], None]  # (message, fraction done in [0, 1])


def no_progress(message: str, fraction: float) -> None:
    """The default progress callback: silent."""


@dataclass(frozen=True)
class Problem:
    """Everything a solver may use: the cluster, the model, the training setup, a cost model,
    the schedule chosen in config (a :class:`ScheduleRef`; a mapping is converted; ``auto``:
    the planner chooses per pipeline), the registry (to build partitioners, refiners, orderers
    by name), an optional warm-start plan, and ``pricing``: the
    :class:`hexicore.planner.pricing.ScheduleBook` whose schedules price the pipelines in
    ``cost`` (None when the cost model's own PIPELINE-TIME does;
    :func:`hexicore.planner.pricing.schedule_pricing` builds both). ``objective``: what the
    allocation of devices optimises (:mod:`hexicore.planner.allocation.objective`; throughput by default).
    ``train_options``: other concrete training settings the solver may plan under instead of
    ``train`` (``train.zero=auto``, ``train.micro_batch=auto``:
    :func:`hexicore.planner.train_choice.solve_choices` fills them for a solver that declares
    ``chooses_train``; empty for any other). ``max_tp``: the largest TP degree a plan may give a
    stage (None: any the model's shapes allow; the hexiscale search passes its
    ``solver.max_tp`` to the solvers that seed it)."""

    cluster: Cluster
    model: ModelSpec
    train: TrainSettings
    cost: CostModel
    schedule: ScheduleRef = field(default_factory=ScheduleRef.default)
    registry: Registry | None = None
    warm_start: Plan | None = None
    pricing: ScheduleBook | None = None
    objective: Objective = field(default_factory=Objective)
    train_options: tuple[TrainSettings, ...] = ()
    max_tp: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, ScheduleRef):
            object.__setattr__(self, "schedule", ScheduleRef.from_mapping(self.schedule))

    def evaluate(self, plan: Plan) -> Estimate:
        return self.cost.estimate(plan)

    def bound_cost(self) -> BoundCostModel:
        """The problem's cost model bound to its cluster, model and train
        (:func:`hexicore.cost.base.bind`): stage, hop and memory pieces asked per stage only."""
        return bind(self.cost, self.cluster, self.model, self.train)


class Solver(Protocol):
    """``solve`` returns a plan (its ``estimate`` and ``solver`` sections may be left empty: the
    caller fills them). It raises :class:`hexicore.core.errors.HexicoreError` when nothing fits."""

    def solve(self, problem: Problem, *, time_limit: float | None, seed: int, progress: Progress) -> Plan: ...
