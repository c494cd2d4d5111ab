"""From a composed config to a :class:`~hexicore.core.run_spec.RunSpec` and the runtime that runs it.

``hexicore train`` (and the runtime check of ``hexicore evaluate``) build the run here, in the
app layer: the model or the plan file, the plan's check by the cost model (the same check as
``hexicore evaluate``, so a plan that does not fit never reaches a runtime), every default of
``train`` and ``schedule`` resolved, and the runtime's config section. The runtime plugin then
receives only the spec and the registry (docs/runtime.md); it never reads the config.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from omegaconf import DictConfig

from hexicore.app import compose as app
from hexicore.core import schema
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.core.errors import HexicoreError
from hexicore.core.hf_config import is_hf_config
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.run_spec import PipelineLayout, PlanLayout, ReferenceLayout, RunSpec, RuntimeSettings
from hexicore.core.settings import OutputSettings, TrainSettings
from hexicore.registry import Registry

SRC = "command line"
PARALLEL = ("none", "pipeline")


def runtime_settings(cfg: DictConfig) -> RuntimeSettings:
    """The ``runtime`` group: its ``name`` and the rest of its section."""
    params = app.group_params(cfg, "runtime")
    return RuntimeSettings(str(params.pop("name", "torch")), params)


def run_settings(cfg: DictConfig, model: ModelSpec, plan: Plan | None = None,
                 out: str | None = None) -> dict[str, Any]:
    """The run's ``train``, ``checkpoint`` and ``output`` settings (:mod:`hexicore.core.settings`)
    as :class:`RunSpec` keywords; a plan's batch sizes and sequence length win over the config's
    (:func:`hexicore.app.compose.train_settings`)."""
    return {"train": app.train_settings(cfg, model, plan, run=True), "checkpoint": app.checkpoint_settings(cfg),
            "output": OutputSettings(out=out, overwrite=cfg.get("overwrite"))}


def build_run_spec(cfg: DictConfig, registry: Registry, out: str | None = None) -> RunSpec:
    """The run ``cfg`` asks for: ``parallel=none`` | ``plan_file=PATH`` | ``schedule`` +
    ``pipeline.ranks``. A plan is checked by the configured cost model first (what
    ``hexicore evaluate`` checks); a plan that does not fit is a one-line error here."""
    parallel = str(cfg.get("parallel", "pipeline"))
    if parallel not in PARALLEL:
        raise HexicoreError(f"unknown parallel {parallel!r}; choose one of: {', '.join(PARALLEL)}", field="parallel")
    runtime = runtime_settings(cfg)
    if not cfg.get("plan_file"):  # nothing to price without a plan, but a cost= given is checked all the same
        app.build_cost_model(cfg, registry)
    if parallel == "none":
        model = app.load_model(cfg)
        return RunSpec(ReferenceLayout(), model, (), runtime=runtime, model_source=model_source(cfg),
                       **run_settings(cfg, model, out=out))
    schedule = app.group_params(cfg, "schedule", registry) or ScheduleRef.default().to_dict()
    if cfg.get("plan_file"):
        plan, path = app.load_plan_file(cfg)  # parse + hexicore.core.plan.check_structure
        plan = as_trained(plan, app.train_settings(cfg, plan.model, plan, run=True))
        plan, est, warnings = app.evaluate(plan, app.build_cost_model(cfg, registry), source=path, registry=registry)
        return plan_run_spec(cfg, plan, schedule, runtime, source=path, out=out, estimate=est, warnings=warnings)
    app.one_schedule(str(schedule.get("name")), "train pipeline.ranks=P", registry)
    model = app.load_model(cfg)
    ranks = schema.integer((cfg.get("pipeline") or {}).get("ranks"), SRC, "pipeline.ranks", minimum=None)
    if ranks < 1:
        raise HexicoreError(f"pipeline.ranks must be at least 1, got {ranks}", field="pipeline.ranks")
    return RunSpec(PipelineLayout(ranks), model, (schedule,), runtime=runtime, model_source=model_source(cfg),
                   **run_settings(cfg, model, out=out))


def model_source(cfg: DictConfig) -> str | None:
    """``model_file=`` when it is a Hugging Face config (or the directory holding one): where
    the run's special token ids, generation config and tokenizer come from; None for model YAMLs."""
    path = cfg.get("model_file")
    return str(path) if path and is_hf_config(str(path)) else None


def as_trained(plan: Plan, settings: TrainSettings) -> Plan:
    """``plan`` with the dtype, recomputation, sequence length, vocabulary parallelism and DP sync
    overlap the run trains (``train.*`` given beside ``plan_file=`` override the plan's), so that
    its estimate — metrics.json's ``predicted``, and the memory check before launch — prices the
    run that is measured."""
    t = replace(plan.train, dtype=settings.dtype, recompute=settings.recompute, seq_len=settings.seq_len,
                vocab_parallel=settings.vocab_parallel, dp_overlap=settings.dp_overlap)
    return plan if t == plan.train else replace(plan, train=t)


def plan_run_spec(cfg: DictConfig, plan: Plan, schedule: Mapping[str, Any], runtime: RuntimeSettings, *,
                  source: str | None, out: str | None = None, estimate: Any = None,
                  warnings: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """A plan run; each pipeline runs its own schedule section, ``schedule`` where it has none."""
    schedules = tuple(dict(p.schedule) if p.schedule else dict(schedule) for p in plan.pipelines)
    return RunSpec(PlanLayout(plan, source), plan.model, schedules, runtime=runtime,
                   **run_settings(cfg, plan.model, plan, out), cluster=plan.cluster, estimate=estimate, warnings=tuple(warnings))


def create_runtime(spec: RunSpec, registry: Registry) -> Any:
    """The runtime plugin ``spec.runtime.name`` (its factory takes no parameters: the run's
    settings travel in the spec)."""
    return registry.create("runtime", spec.runtime.name)


def runtime_refusal(cfg: DictConfig, plan: Plan, est, path: str, registry: Registry) -> list[str]:
    """What the configured runtime's ``check_plan`` refuses in this plan's layout (structure
    only: no framework, no devices needed), as a warning for ``hexicore plan`` and ``evaluate``
    (``hexicore train`` then exits 2 with the same line); nothing when the runtime or the train
    settings cannot even be built, and nothing when the runtime refuses the model itself (an
    architecture it does not train: planning any decoder is what plan and evaluate are for, and
    ``hexicore train`` says it once)."""
    try:
        settings = runtime_settings(cfg)
        spec = plan_run_spec(cfg, plan, app.group_params(cfg, "schedule", registry) or ScheduleRef.default().to_dict(), settings,
                             source=path, estimate=est)
        runtime = create_runtime(spec, registry)
    except HexicoreError:
        return []
    check = getattr(runtime, "check_plan", None)
    if check is None:
        return []
    try:
        check(replace(spec, layout=ReferenceLayout(), schedules=()), registry=registry)
    except HexicoreError:
        return []  # the model itself: train's to say
    try:
        check(spec, registry=registry)
    except HexicoreError as exc:
        return [f"runtime {settings.name} cannot run this plan: {exc}"]
    return []
