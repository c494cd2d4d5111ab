"""Plan / Pipeline / Stage and the plan JSON contract ``hexicore.plan/1`` (docs/formats.md).

A plan is the HexiScale paper's asymmetric DP x PP x TP layout: any number of pipelines, each
with its own batch share, stages, per-stage TP degree and layer range. This module holds
the data and the structural checks; memory and cost live in :mod:`hexicore.cost` and the full
check (structure + memory) in :func:`hexicore.planner.plan_check.validate_plan`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.cluster import Cluster, parse_cluster
from hexicore.core.errors import HexicoreError, PlanError
from hexicore.core.estimate import Estimate
from hexicore.core.model import ModelSpec, parse_model
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.core.settings import TrainSettings
from hexicore.core.solver_info import parse_solver

FORMAT = "hexicore.plan/1"


@dataclass(frozen=True)
class Stage:
    """A pipeline stage: ``tp`` devices running blocks ``[layers[0], layers[1])`` with TP.

    The leader (HexiScale §3.2) is ``devices[0]``: it receives activations from the previous
    stage's leader and broadcasts them inside the TP group.
    """

    devices: tuple[str, ...]
    tp: int
    layers: tuple[int, int]

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def leader(self) -> str:
        return self.devices[0]

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "tp": self.tp, "layers": list(self.layers)}


@dataclass(frozen=True)
class Pipeline:
    """One data-parallel replica: its batch share (sequences), stages and schedule (a
    :class:`ScheduleRef`; a ``{"name": ..., **params}`` mapping is converted)."""

    batch: int
    stages: tuple[Stage, ...]
    schedule: ScheduleRef = field(default_factory=ScheduleRef.default)

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, ScheduleRef):
            object.__setattr__(self, "schedule", ScheduleRef.from_mapping(self.schedule))

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for s in self.stages for d in s.devices)

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Each stage's blocks, in order: the ``rank_layers`` a schedule builds the lists for."""
        return tuple(s.n_layers for s in self.stages)

    def n_micro_batches(self, micro_batch: int) -> int:
        return self.batch // micro_batch

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "schedule": self.schedule.to_dict(), "stages": [s.to_dict() for s in self.stages]}


@dataclass(frozen=True)
class Plan:
    """An asymmetric DP x PP x TP plan over a cluster for a model (docs/formats.md, "Plan JSON").

    ``estimate`` is the cost model's typed verdict (``plan.estimate.iteration_s``), None for a
    plan nobody has priced yet; a mapping given here is read with :meth:`Estimate.from_dict`.
    ``solver`` says who made the plan (a mapping, written as it is).
    """

    model: ModelSpec
    cluster: Cluster
    train: TrainSettings
    pipelines: tuple[Pipeline, ...]
    estimate: Estimate | None = None
    solver: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.estimate is not None and not isinstance(self.estimate, Estimate):
            object.__setattr__(self, "estimate", Estimate.from_dict(self.estimate))

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for p in self.pipelines for d in p.devices)

    def with_estimate(self, estimate: Estimate | Mapping[str, Any] | None) -> "Plan":
        """This plan with ``estimate`` attached (an :class:`Estimate`, or its JSON mapping)."""
        return replace(self, estimate=estimate)

    def with_solver(self, solver: Mapping[str, Any]) -> "Plan":
        return replace(self, solver=dict(solver))

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "train": self.train.to_dict(),
            "pipelines": [p.to_dict() for p in self.pipelines],
            "estimate": self.estimate.to_dict() if self.estimate is not None else None,
            "solver": dict(self.solver) if self.solver is not None else None,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The plan JSON text (``hexicore.plan/1``; :meth:`save` adds the final newline)."""
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path, *, overwrite: bool | None = None) -> Path:
        """Write the JSON atomically (a temporary file renamed into place). The rules of
        ``hexicore plan out=`` (:func:`hexicore.core.ownership.check_writable`): an absent path or
        another plan file is replaced; a directory or any other file is refused with a
        :class:`HexicoreError` unless ``overwrite=True`` (``overwrite=False`` refuses every existing file)."""
        from hexicore.core.ownership import check_writable

        check_writable(schema.path_arg(path, "path"), "hexicore.plan", overwrite=overwrite, field="path")
        try:
            return schema.write_text_atomic(path, self.to_json() + "\n")
        except OSError as exc:
            raise HexicoreError(f"cannot write the plan: {exc.strerror or exc}", source=str(path)) from None

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> "Plan":
        return parse_plan(data, source)

    @classmethod
    def from_json(cls, text: str, source: str | None = None) -> "Plan":
        """Parse plan JSON text; malformed JSON or a bad field is a one-line :class:`HexicoreError`."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise HexicoreError(f"expected the plan JSON text, got {type(text).__name__}", source=source, field="text")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HexicoreError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                                source=source) from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise HexicoreError(f"malformed JSON: {schema.value_error(exc)}", source=source) from None
        except RecursionError:
            raise HexicoreError(f"JSON nested deeper than {schema.MAX_DEPTH} levels", source=source) from None
        return parse_plan(data, source)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read and structurally check a plan JSON file."""
        return parse_plan(schema.load_json(schema.path_arg(path, "path"), "plan"), str(path))


#: a plan JSON's top-level fields (docs/formats.md); anything else is refused, never ignored
PLAN_KEYS = frozenset({"format", "model", "cluster", "train", "pipelines", "estimate", "solver"})
TRAIN_KEYS = frozenset(TrainSettings.PLAN_FIELDS)


def parse_plan(data: Any, source: str | None = None) -> Plan:
    """Parse and structurally check a plan mapping; errors name the file and the JSON field."""
    d = schema.as_mapping(data, source, None)
    schema.known_keys(d, PLAN_KEYS, source, None)
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise HexicoreError(f"unsupported format {fmt!r}; expected {FORMAT!r}", source=source, field="format")
    model = parse_model(schema.get(d, "model", source, None), source, "model")
    cluster = parse_cluster(schema.get(d, "cluster", source, None), source, "cluster")
    raw_train = schema.optional_mapping(d, "train", source, "train")
    schema.known_keys(raw_train, TRAIN_KEYS, source, "train")
    train = TrainSettings.from_dict(raw_train, source)
    if train.zero == "auto":  # a plan records the stage it was priced at
        raise HexicoreError("a plan records a ZeRO stage (0, 1, 2 or 3); auto is the planner's choice: plan with "
                            "train.zero=auto to resolve it", source=source, field="train.zero")
    model.check_seq_len(train.seq_len, source)
    if d.get("estimate") is not None:  # typed here, so that a bad field names this file
        d = {**d, "estimate": Estimate.from_dict(d["estimate"], source)}
    raw = schema.as_list(schema.get(d, "pipelines", source, None), source, "pipelines")
    pipelines = []
    for i, rp in enumerate(raw):
        pf = f"pipelines[{i}]"
        p = schema.as_mapping(rp, source, pf)
        schema.known_keys(p, {"batch", "stages", "schedule"}, source, pf)
        stages = []
        for j, rs in enumerate(schema.as_list(schema.get(p, "stages", source, pf), source, f"{pf}.stages")):
            sf = f"{pf}.stages[{j}]"
            s = schema.as_mapping(rs, source, sf)
            schema.known_keys(s, {"devices", "tp", "layers"}, source, sf)
            devs = schema.as_list(schema.get(s, "devices", source, sf), source, f"{sf}.devices")
            devs = tuple(schema.string(x, source, f"{sf}.devices") for x in devs)
            tp = schema.integer(s.get("tp", len(devs)), source, f"{sf}.tp")
            layers = schema.as_list(schema.get(s, "layers", source, sf), source, f"{sf}.layers")
            if len(layers) != 2:
                raise HexicoreError("expected [start, end)", source=source, field=f"{sf}.layers")
            lo = schema.integer(layers[0], source, f"{sf}.layers", minimum=0)
            hi = schema.integer(layers[1], source, f"{sf}.layers", minimum=0)
            stages.append(Stage(devs, tp, (lo, hi)))
        sched = ScheduleRef.from_section(p["schedule"], source, f"{pf}.schedule") if "schedule" in p \
            else ScheduleRef.default()  # absent: the format's default; given: an object with a name
        pipelines.append(Pipeline(schema.integer(schema.get(p, "batch", source, pf), source, f"{pf}.batch"),
                                  tuple(stages), sched))
    plan = Plan(model, cluster, train, tuple(pipelines),
                estimate=d.get("estimate"), solver=parse_solver(d.get("solver"), source))
    check_structure(plan, source)
    return plan


def check_structure(plan: Plan, source: str | None = None) -> list[str]:
    """Raise :class:`PlanError` on a plan that breaks the invariants of docs/formats.md; return
    the warnings.

    Checks: known, non-overlapping devices; ``tp`` equal to the stage's device count; stages
    covering ``[0, L)`` in order without gaps or overlaps; batches that are positive multiples of
    the micro-batch and sum to the global batch. A TP group spanning machines is legal (as in
    Megatron) and only produces a warning.
    """
    warnings: list[str] = []
    cluster, L, train = plan.cluster, plan.model.layers, plan.train
    if not plan.pipelines:
        raise PlanError("a plan needs at least one pipeline", source=source, field="pipelines")
    seen: dict[str, str] = {}
    for i, p in enumerate(plan.pipelines):
        pf = f"pipelines[{i}]"
        if not p.stages:
            raise PlanError("a pipeline needs at least one stage", source=source, field=f"{pf}.stages")
        expect = 0
        for j, s in enumerate(p.stages):
            sf = f"{pf}.stages[{j}]"
            if not s.devices:
                raise PlanError("a stage needs at least one device", source=source, field=f"{sf}.devices")
            for dev in s.devices:
                if not cluster.has_device(dev):
                    raise PlanError(f"unknown device {dev!r}", source=source, field=f"{sf}.devices")
                if dev in seen:
                    raise PlanError(f"device {dev!r} is also used by {seen[dev]}", source=source,
                                    field=f"{sf}.devices")
                seen[dev] = sf
            if s.tp != len(s.devices):
                raise PlanError(f"tp={s.tp} does not match the stage's {len(s.devices)} devices", source=source,
                                field=f"{sf}.tp")
            lo, hi = s.layers
            if hi <= lo:
                what = "empty" if hi == lo else "reversed: its end lies before its start"
                raise PlanError(f"layer range [{lo}, {hi}) is {what}; a stage holds [start, end) with end > start",
                                source=source, field=f"{sf}.layers")
            if lo != expect:
                raise PlanError(_discontinuity(lo, hi, expect, j), source=source, field=f"{sf}.layers")
            if hi > L:
                raise PlanError(f"layer range [{lo}, {hi}) exceeds the model's {L} layers", source=source,
                                field=f"{sf}.layers")
            expect = hi
            cap = cluster.max_tp(s.devices)
            if cap is not None and s.tp > cap:
                raise PlanError(f"tp={s.tp} is above max_tp {cap} of the machine its devices are on (the cluster "
                                "file's max_tp)", source=source, field=f"{sf}.tp")
            machines = {cluster.device(dv).machine for dv in s.devices}
            if len(machines) > 1:
                warnings.append(f"{sf}: TP group spans machines {', '.join(sorted(machines))}; priced at the "
                                "links it crosses")
        if expect != L:
            raise PlanError(f"stages cover layers [0, {expect}) but the model has {L}", source=source,
                            field=f"{pf}.stages")
        if p.batch % train.micro_batch:
            raise PlanError(f"batch {p.batch} is not a multiple of micro-batch {train.micro_batch}", source=source,
                            field=f"{pf}.batch")
    total = sum(p.batch for p in plan.pipelines)
    if total != train.global_batch:
        raise PlanError(f"pipeline batches sum to {total}, global batch is {train.global_batch}", source=source,
                        field="pipelines")
    return warnings


def _discontinuity(lo: int, hi: int, expect: int, j: int) -> str:
    """Why stage ``j`` of blocks ``[lo, hi)`` breaks the ``[0, L)`` cover (the previous stage
    ends at ``expect``)."""
    if j == 0:
        return f"the first stage starts at layer {lo}; a pipeline's stages cover [0, L) in order, from 0"
    if lo > expect:
        return f"layers start at {lo} but the previous stage ends at {expect}: a gap (no stage holds [{expect}, {lo}))"
    return (f"layers start at {lo} but the previous stage ends at {expect}: an overlap (both hold "
            f"[{lo}, {min(hi, expect)}))")
