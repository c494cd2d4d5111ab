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
* :class:`TrainSettings` (steps, batch, sequence length, dtype, seed, checkpoints, output);
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
from hexicore.core.model import DTYPE_BYTES, ModelSpec
from hexicore.core.plan import Plan


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

    ranks: int
    tp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise HexicoreError(f"must be a positive integer, got {self.ranks!r}", field="pipeline.ranks")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise HexicoreError(f"must be a positive integer, got {self.tp!r}", field="pipeline.tp")

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
class TrainSettings:
    """The ``train`` settings of a run (for a plan run, batch sizes are the plan's)."""

    steps: int
    global_batch: int
    micro_batch: int
    seq_len: int
    dtype: str = "fp32"
    recompute: bool = False
    seed: int = 0
    checkpoint_every: int = 0
    resume: str | None = None  # a checkpoint folder (step_N/) or a directory holding them
    out: str | None = None  # where metrics.json, final/ and checkpoints/ go
    init_from: str | None = None  # a Hugging Face checkpoint directory to start from (not with resume)
    overwrite: bool | None = None  # ``overwrite=``: may the run replace files in ``out`` that are not its own

    def __post_init__(self) -> None:
        for f in ("steps", "global_batch", "micro_batch", "seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HexicoreError(f"must be a positive integer, got {v!r}", field=f"train.{f}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise HexicoreError(f"must be a non-negative integer, got {self.checkpoint_every!r}",
                                field="train.checkpoint_every")
        if self.dtype not in DTYPE_BYTES:
            raise HexicoreError(f"unknown dtype {self.dtype!r}; choose one of: {', '.join(DTYPE_BYTES)}",
                                field="train.dtype")
        if self.global_batch % self.micro_batch:
            raise HexicoreError(f"global batch {self.global_batch} is not a multiple of micro-batch "
                                f"{self.micro_batch}", field="train.micro_batch")


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

    ``schedules[i]`` is pipeline ``i``'s schedule section (a mapping with ``name`` and the
    schedule's parameters): one per plan pipeline, one for a :class:`PipelineLayout`, none for
    the :class:`ReferenceLayout`. ``estimate`` is the cost model's verdict on a plan (set for a
    :class:`PlanLayout`, whose memory the app has checked), ``warnings`` the validator's.
    ``model_source`` is ``model_file=`` when it is a Hugging Face config (its special token
    ids, generation config and tokenizer go to ``out/final/``: :mod:`hexicore.core.hf_export`)."""

    layout: RunLayout
    model: ModelSpec
    schedules: tuple[Mapping[str, Any], ...]
    train: TrainSettings
    runtime: RuntimeSettings
    cluster: Cluster | None = None
    estimate: Estimate | None = None
    warnings: tuple[str, ...] = ()
    model_source: str | None = None  # the Hugging Face config.json (or its directory) the model was read from

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedules", tuple(self.schedules))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if len(self.schedules) != self.layout.pipelines:
            raise HexicoreError(f"{len(self.schedules)} schedules for {self.layout.pipelines} pipelines",
                                field="schedule")

    @property
    def plan(self) -> Plan | None:
        """The plan of a :class:`PlanLayout` run (else None)."""
        return self.layout.plan if isinstance(self.layout, PlanLayout) else None
