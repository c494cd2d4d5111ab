"""The cost-model interface every cost plugin implements, and the units it shares.

A cost model prices a whole plan (:meth:`CostModel.estimate`) and the pieces the planner
combines thousands of times (stage time, hop time, stage memory). The planner binds a cost model
to one problem's cluster, model and training setup once (:func:`bind`, a
:class:`BoundCostModel`) and asks for the pieces with what varies per stage only. Schedule-aware pricing swaps in
a ``pipeline_timer`` and an ``activation`` function (see :mod:`hexicore.planner.pricing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence

from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.estimate import Estimate
from hexicore.core.model import ModelSpec
from hexicore.core.placement import Placement
from hexicore.core.plan import Pipeline, Plan
from hexicore.core.settings import TrainSettings

GIB = 2**30
#: Achieved fraction of peak tensor FLOP/s in training kernels when a GPU type has no entry in
#: ``efficiency``. Megatron-LM reports 52-57% MFU for GPT models on A100 clusters
#: (Narayanan et al., SC'21, Table 1); 0.55 is that middle, for every type unless configured.
DEFAULT_EFFICIENCY = 0.55

PipelineTimer = Callable[[Pipeline, Sequence[float], Sequence[float], int], float]
#: ``activation(pipeline, j, n_mb)``: peak in-flight micro-batches of stage j (units of one
#: micro-batch through the stage's whole share, docs/formats.md) under the pipeline's schedule
ActivationFn = Callable[[Pipeline, int, int], float]
#: ``placement(pipeline, n_mb)``: which blocks, embeddings and heads each rank of the pipeline
#: holds under its schedule (:class:`hexicore.core.placement.Placement`), or None for the plain
#: placement (stage j's blocks, the embedding on the first stage, the head on the last)
PlacementFn = Callable[[Pipeline, int], Optional[Placement]]


def default_in_flight(ranks: int, stage_index: int, n_mb: int) -> int:
    """In-flight micro-batches at stage j of a P-stage pipeline when no schedule supplies its
    peak activations (the cost model's default, HexiScale App. A's memory model): each stage
    holds the micro-batches that entered the pipeline before its first backward could run,
    ``P - j``, at most ``n_mb`` (at least one). Schedules declare their own (``peaks``): 1F1B's
    rule is this one."""
    return max(1, min(n_mb, ranks - stage_index))


def fill_drain_time(stage_times: Sequence[Any], hop_times: Sequence[Any], n_mb: int) -> Any:
    """PIPELINE-TIME of HexiScale App. A (the 1F1B/GPipe shape), the cost model's own closed form:
    ``sum_j (STAGE_j + HOP_j) + (n_mb - 1) * max_j (STAGE_j + HOP_j)``, HOP of the last stage 0.
    Exact for 1F1B with equal stages and free links; numbers of any kind (the CP-SAT solver's
    integer tables too). Schedules priced otherwise: :mod:`hexicore.pipeline.pricer`."""
    per = [s + h for s, h in zip(stage_times, list(hop_times) + [0])]
    return sum(per) + (n_mb - 1) * max(per)


class CostModel(Protocol):
    """What a solver needs from a cost model."""

    name: str

    def estimate(self, plan: Plan) -> Estimate: ...

    def stage_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                n_layers: int, *, first: bool, last: bool) -> float: ...

    def hop_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, src: Sequence[str],
              dst: Sequence[str]) -> float: ...

    def stage_memory_gb(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                        n_layers: int, *, first: bool, last: bool, in_flight: int, dp: int = 1) -> float: ...


@dataclass(frozen=True)
class BoundCostModel:
    """A cost model bound to one problem's cluster, model and training setup (:func:`bind`): its
    per-stage pieces take only what varies between stages — the devices, the layers, the stage's
    position and in-flight micro-batches — so ``(cluster, model, train)`` is given once, not at
    every call. Works for any cost model that implements :class:`CostModel` (a plugin need not
    know of it): each method calls the cost model's own with the bound ``(cluster, model, train)``."""

    cost: Any
    cluster: Cluster
    model: ModelSpec
    train: TrainSettings

    @classmethod
    def of_plan(cls, cost: Any, plan: Plan) -> "BoundCostModel":
        """``cost`` bound to ``plan``'s cluster, model and training setup."""
        return cls(cost, plan.cluster, plan.model, plan.train)

    def stage_s(self, devices: Sequence[str], n_layers: int, *, first: bool = False, last: bool = False) -> float:
        """STAGE(d_ij) of App. A: one micro-batch's forward + backward through ``n_layers`` blocks on
        ``devices`` (:meth:`CostModel.stage_s`)."""
        return self.cost.stage_s(self.cluster, self.model, self.train, devices, n_layers, first=first, last=last)

    def hop_s(self, source: Sequence[str], destination: Sequence[str]) -> float:
        """COMM-PP-HOP between two consecutive stages, one micro-batch (:meth:`CostModel.hop_s`)."""
        return self.cost.hop_s(self.cluster, self.model, self.train, source, destination)

    def stage_memory_gb(self, devices: Sequence[str], n_layers: int, **held: Any) -> float:
        """Peak memory of each device of a stage in GiB (:meth:`CostModel.stage_memory_gb`; ``held``:
        its keywords, ``first``, ``last``, ``in_flight``, ``dp``, ...)."""
        return self.cost.stage_memory_gb(self.cluster, self.model, self.train, devices, n_layers, **held)


def bind(cost: Any, cluster: Cluster, model: ModelSpec, train: TrainSettings) -> BoundCostModel:
    """``cost`` bound to one problem (:class:`BoundCostModel`)."""
    return BoundCostModel(cost, cluster, model, train)


def cost_label(cost: Any) -> str:
    """``cost model NAME``: the source of an error about what a cost model returned."""
    return f"cost model {getattr(cost, 'name', None) or type(cost).__name__}"


def bad_number(values: Iterable[Any]) -> Any:
    """The first of ``values`` that is not a real number >= 0 (NaN, negative, a string, None), else None."""
    for v in values:
        try:
            ok = not isinstance(v, bool) and float(v) >= 0  # NaN compares False
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return v if v is not None else "None"
    return None


def check_seconds(values: Iterable[Any], cost: Any, what: str) -> None:
    """Refuse a piece a cost model priced (``what``: ``stage_s``, ``hop_s``) that is not a time:
    every value a number >= 0 (infinity is a time too: never fits); a one-line
    :class:`HexicoreError` naming the cost model, before a search ranks plans by it."""
    bad = bad_number(values)
    if bad is not None:
        raise HexicoreError(f"returned {bad!r}; times are numbers of seconds >= 0", source=cost_label(cost),
                            field=what)


def check_estimate(est: Any, cost: Any) -> None:
    """Refuse an estimate that cannot be written into a plan: not an :class:`Estimate`, or a
    time, rate or memory figure that is not a finite number >= 0 (a cost model's NaN, infinity
    or negative seconds); a one-line :class:`HexicoreError` naming the cost model and the field."""
    if not isinstance(est, Estimate):
        raise HexicoreError(f"estimate() returned {type(est).__name__}, not an Estimate", source=cost_label(cost))
    for name, values in (("iteration_s", [est.iteration_s]), ("pipeline_s", est.pipeline_s), ("dp_s", [est.dp_s]),
                         ("mfu", [est.mfu]), ("tokens_per_s", [est.tokens_per_s]),
                         ("memory_gb", list(est.memory_gb.values()))):
        bad = bad_number(values)
        if bad is None:
            bad = next((v for v in values if math.isinf(float(v))), None)
        if bad is not None:
            raise HexicoreError(f"the cost model's estimate gave {bad!r}; it must be a finite number >= 0",
                                source=cost_label(cost), field=f"estimate.{name}")
