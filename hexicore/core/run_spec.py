"""What a runtime plugin receives: :class:`RunSpec`, one training run as typed data.

The app layer (``hexicore train``, :mod:`hexicore.app.training`) builds it from the composed
config — reading the plan, checking it with the cost model, resolving every default — and hands
it to the runtime with the registry: ``runtime.run(spec, registry=registry)`` (the interface is
documented on :meth:`hexicore.hookspecs.HexicoreSpecs.hexicore_runtimes`). A runtime never reads
the config itself.

The parts:

* the layout: :class:`PlanLayout` (a checked plan: pipelines, stages, devices, batch shares),
  :class:`PipelineLayout` (one pipeline of equal stages, no plan) or :class:`ReferenceLayout`
  (the whole model in one process, ``parallel=none``), with the model and, for plans, the cluster;
* the schedule reference of every pipeline (its ``schedule`` section, defaults resolved);
* :class:`~hexicore.core.settings.TrainSettings` (batch, sequence length, dtype, recomputation,
  steps, seed), :class:`~hexicore.core.settings.CheckpointSettings` (checkpoint interval, resume,
  initial weights) and :class:`~hexicore.core.settings.OutputSettings` (``out=``, ``overwrite=``);
* :class:`RuntimeSettings` (which runtime and its config section, read-only; the runtime checks
  the keys, since only it knows them);
* the cost model's verdict on a plan (:class:`~hexicore.core.estimate.Estimate`) and the
  validator's warnings: the app checks a plan before any runtime sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Union

from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.estimate import Estimate
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.core.settings import CheckpointSettings, OutputSettings, TrainSettings, check_fields, rule, whole


@dataclass(frozen=True)
class PlanLayout:
    """Run a plan: its pipelines, stages and devices (devices numbered in plan order are the
    global ranks). ``source`` names the plan file in errors and in ``metrics.json``."""

    plan: Plan
    source: str | None = None

    @property
    def pipelines(self) -> int:
        return len(self.plan.pipelines)


@dataclass(frozen=True)
class PipelineLayout:
    """Run one pipeline of ``ranks`` stages of near-equal layer counts, ``tp`` devices each."""

    ranks: int = rule(4, whole())
    tp: int = rule(1, whole())

    def __post_init__(self) -> None:
        check_fields(self, "pipeline")

    @property
    def pipelines(self) -> int:
        return 1


@dataclass(frozen=True)
class ReferenceLayout:
    """Run the whole model in one process (``parallel=none``): the reference the pipelined
    runs are compared with (same micro-batches, same data, same initial weights)."""

    @property
    def pipelines(self) -> int:
        return 0


RunLayout = Union[PlanLayout, PipelineLayout, ReferenceLayout]


@dataclass(frozen=True)
class RuntimeSettings:
    """Which runtime runs, and its config section (without ``name``) as a read-only mapping."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def __reduce__(self) -> tuple:  # a mapping proxy does not pickle; its copy does
        return (RuntimeSettings, (self.name, dict(self.params)))


@dataclass(frozen=True)
class RunSpec:
    """One training run, as the app layer resolved and checked it (see the module docstring).

    ``schedules[i]`` is pipeline ``i``'s :class:`~hexicore.core.schedule_ref.ScheduleRef` (it
    reads like the section: ``ref["name"]``, ``dict(ref)``): one per plan pipeline, one for a :class:`PipelineLayout`, none for
    the :class:`ReferenceLayout`. ``estimate`` is the cost model's verdict on a plan (set for a
    :class:`PlanLayout`, whose memory the app has checked), ``warnings`` the validator's.
    ``model_source`` is ``model_file=`` when it is a Hugging Face config (its special token
    ids, generation config and tokenizer go to ``out/final/``: :mod:`hexicore.core.hf_export`)."""

    layout: RunLayout
    model: ModelSpec
    schedules: tuple[ScheduleRef, ...]
    train: TrainSettings
    runtime: RuntimeSettings
    checkpoint: CheckpointSettings = CheckpointSettings()
    output: OutputSettings = OutputSettings()
    cluster: Cluster | None = None
    estimate: Estimate | None = None
    warnings: tuple[str, ...] = ()
    model_source: str | None = None  # the Hugging Face config.json (or its directory) the model was read from

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedules", tuple(ScheduleRef.from_mapping(s) for s in self.schedules))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if len(self.schedules) != self.layout.pipelines:
            raise HexicoreError(f"{len(self.schedules)} schedules for {self.layout.pipelines} pipelines",
                                field="schedule")

    @property
    def plan(self) -> Plan | None:
        """The plan of a :class:`PlanLayout` run (else None)."""
        return self.layout.plan if isinstance(self.layout, PlanLayout) else None
