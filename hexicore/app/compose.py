"""From a composed config to objects and results: the one path shared by the CLI and the
library API (config -> cluster/model -> solver -> plan; docs/design.md, data flow)."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from hexicore.core import schema
from hexicore.core.cluster import Cluster, parse_cluster
from hexicore.cost import CostModel, Estimate
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.hf_config import is_hf_config, load_hf_config, weights_folder
from hexicore.core.model import ModelSpec, parse_model
from hexicore.core.plan import Plan
from hexicore.core.settings import CheckpointSettings, TrainSettings
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.planner.pricing import AUTO, ScheduleBook, native_cost, plan_cost, schedule_pricing
from hexicore.planner.allocation.objective import Objective
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.train_choice import solve_choices
from hexicore.registry import Registry, accepts
from hexicore.planner.plan_check import check_schedules, validate_plan


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _choice(cfg: DictConfig, group: str) -> str:
    """``group=<choice>`` as the source label of a config-group error."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"{group}={HydraConfig.get().runtime.choices.get(group)}"
    except Exception:  # noqa: BLE001 - outside a Hydra run (compose API): no choices recorded
        name = OmegaConf.select(cfg, f"{group}.name", default=None)  # a preset's name is its choice
        return f"{group}={name}" if isinstance(name, str) and name else f"config {group}"


def on_command_line(exc: HexicoreError, cfg: DictConfig | None = None,
                    fields: Mapping[str, str] | None = None) -> HexicoreError:
    """``exc`` as an error about this command's own values: one raised without a source (a
    schedule plugin, the runtime or a settings check, which cannot know where their values came
    from) names ``command line`` and its field as the user wrote it (``fields`` renames a
    library's word: a schedule's ``micro_batches`` is ``pipeline.micro_batches`` for simulate), or
    for a ``model.*`` field the model's source (``model_file``, else ``model=<choice>``). An error
    that names its source (a file) is returned as it is."""
    if exc.source:
        return exc
    field = (fields or {}).get(exc.field or "", exc.field)
    source = "command line"
    if cfg is not None and field and field.split(".")[0] == "model":
        source = str(cfg.get("model_file") or _choice(cfg, "model"))
    out = copy.copy(exc)  # the same class (PlanError, ScheduleError, ...)
    out.source, out.field = source, field
    return out


def one_schedule(name: str, command: str, registry: Registry) -> None:
    """Refuse ``schedule=auto`` where ``command`` runs one schedule it names (simulate, train
    without a plan): ``auto`` is the planner's choice of a schedule per pipeline."""
    if name == AUTO:
        raise HexicoreError(f"schedule=auto is for hexicore plan only (it picks a schedule per pipeline); hexicore "
                            f"{command} takes one of: {', '.join(registry.names('schedule'))}", source="command line",
                            field="schedule")


def load_cluster(cfg: DictConfig) -> Cluster:
    """``cluster_file=PATH`` if given, else the ``cluster`` group; then ``exclude=[...]``."""
    if cfg.get("cluster_file"):
        path = str(cfg.cluster_file)
        cluster = parse_cluster(schema.load_yaml(path, "cluster"), path)
        source = path
    else:
        source = _choice(cfg, "cluster")
        cluster = parse_cluster(_plain(cfg.cluster), source, "cluster")
    excl = _plain(cfg.get("exclude")) or []
    if isinstance(excl, str):
        excl = [excl]
    if excl:
        cluster = cluster.exclude([str(x) for x in schema.as_list(excl, "command line", "exclude")],
                                  source="command line")
    return cluster


#: the keys that choose or change a model or a cluster (a plan carries its own)
MODEL_AND_CLUSTER = ("model", "cluster", "model_file", "cluster_file", "exclude")


def _model_or_cluster_overrides() -> list[str]:
    """The keys of :data:`MODEL_AND_CLUSTER` (or below them, ``model.layers``) this Hydra job's
    command line gives; [] outside a Hydra job."""
    try:
        from hydra.core.hydra_config import HydraConfig

        task = list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001 - no Hydra job (library use, compose API)
        return []
    keys = [o.split("=", 1)[0].lstrip("+~") for o in task]
    return [k for k in keys if k.split(".")[0] in MODEL_AND_CLUSTER]


def load_plan_file(cfg: DictConfig) -> tuple[Plan, str]:
    """``plan_file=PATH`` parsed and structurally checked, with its path. The plan carries its
    model and cluster, so a ``model_file=``/``cluster_file=``, ``model=``/``cluster=``, a
    ``model.*``/``cluster.*`` key or ``exclude=`` beside it, which would be ignored, is refused."""
    given = [key for key in ("model_file", "cluster_file") if cfg.get(key)] + _model_or_cluster_overrides()
    if given:
        raise HexicoreError("has no effect beside plan_file= (the plan carries its model and cluster): drop it",
                            source="command line", field=given[0])
    path = str(cfg.plan_file)
    return Plan.load(path), path


def load_model(cfg: DictConfig) -> ModelSpec:
    """``model_file=PATH`` if given (a model YAML, or a Hugging Face ``config.json`` or the
    directory holding one: :mod:`hexicore.core.hf_config`), else the ``model`` group (with any
    ``model.x=`` overrides)."""
    if cfg.get("model_file"):
        path = str(cfg.model_file)
        if is_hf_config(path):
            return load_hf_config(path)
        if Path(path).is_dir():
            raise HexicoreError("a directory without config.json: give a model YAML, a Hugging Face config.json "
                                "or the directory holding one", source=path, field="model_file")
        return parse_model(schema.load_yaml(path, "model"), path)
    return parse_model(_plain(cfg.model), _choice(cfg, "model"), "model")


def train_settings(cfg: DictConfig, model: ModelSpec, plan: Plan | None = None, *, run: bool = False) -> TrainSettings:
    """The ``train`` section (and, for a ``run``, ``train.steps`` and ``seed``) as
    :class:`TrainSettings`; what is not given takes the class's defaults, the sequence length the
    model's. Beside a plan, the plan's batch sizes and sharding win over the config's, and its
    sequence length, dtype, recomputation, vocabulary parallelism and DP sync overlap are the
    defaults of ``train.seq_len``, ``train.dtype``, ``train.recompute``, ``train.vocab_parallel``
    and ``train.dp_overlap`` (``null`` in the schema), so a plan trains as it was planned unless
    they are given. Planning ignores ``train.steps``."""
    given = {k: v for k, v in (_plain(cfg.get("train")) or {}).items() if v is not None}
    given.pop("checkpoint_every", None)  # a checkpoint setting: checkpoint_settings()
    if not run:
        given.pop("steps", None)
    if plan is not None:
        for key in ("global_batch", "micro_batch", "zero", "zero_split", "zero_scope"):
            given.pop(key, None)
    section = {**(plan.train.to_dict() if plan is not None else {"seq_len": model.seq_len}), **given}
    train = TrainSettings.from_dict(section, "command line")
    if run and train.micro_batch == "auto":
        raise HexicoreError("auto is the planner's choice (hexicore plan train.micro_batch=auto); a run needs a "
                            "whole number, or plan_file= with the plan's", source="command line",
                            field="train.micro_batch")
    model.check_seq_len(train.seq_len, "command line")
    if run:
        train = replace(train, seed=seed_value(cfg.get("seed") or 0, "command line", "seed"))
    return train


def checkpoint_settings(cfg: DictConfig) -> CheckpointSettings:
    """``train.checkpoint_every``, ``resume=`` and ``init_from=`` (the runtime section's
    ``shard_mb`` is the runtime's to read)."""
    every = (cfg.get("train") or {}).get("checkpoint_every")
    resume = cfg.get("resume")
    return CheckpointSettings(
        every=schema.integer(every, "command line", "train.checkpoint_every", minimum=0) if every else 0,
        resume=str(resume) if resume else None, init_from=start_weights(cfg))


#: ``init_from=none``: a fresh initialisation, even when ``model_file=`` holds weights
FRESH = "none"


def start_weights(cfg: DictConfig) -> str | None:
    """The Hugging Face directory a run's weights come from, as ``from_pretrained`` would have
    it: ``init_from=DIR``; else ``model_file=DIR`` when that directory holds weights (and the run
    does not resume); None for a fresh initialisation (``init_from=none``, or no weights given)."""
    given = cfg.get("init_from")
    if given is not None and str(given).strip().lower() == FRESH:
        return None
    if given:
        return str(given)
    path = cfg.get("model_file")
    if path and not cfg.get("resume"):
        return weights_folder(str(path))
    return None


#: Schedule keys every schedule config declares (null where unused) so that one sweep can vary
#: them across schedules: ``hexicore simulate -m schedule=gpipe,hanayo schedule.waves=1,2,4``.
SHARED_SCHEDULE_KEYS = ("waves", "chunks")


def group_params(cfg: DictConfig, group: str, registry: Registry | None = None) -> dict[str, Any]:
    """A config group's section as a dict. For ``schedule`` (which needs the ``registry``), the
    shared sweep keys are dropped where they are null or where the named schedule takes no
    such parameter."""
    node = _plain(cfg.get(group)) or {}
    params = dict(schema.as_mapping(node, _choice(cfg, group), group))
    if group == "schedule":
        if registry is None:
            raise TypeError("group_params(cfg, 'schedule', registry): the schedule's parameters depend on the "
                            "registry's schedule plugin")
        params = _schedule_params(params, registry)
    return params


def _schedule_params(params: dict[str, Any], registry: Registry) -> dict[str, Any]:
    try:
        factory = registry.spec("schedule", str(params.get("name"))).factory
    except HexicoreError:
        factory = None  # unknown schedule (e.g. ``auto``): leave the keys for its own handling
    return {k: v for k, v in params.items()
            if k not in SHARED_SCHEDULE_KEYS or (v is not None and (factory is None or accepts(factory, k)))}


def build_cost_model(cfg: DictConfig, registry: Registry) -> CostModel:
    params = group_params(cfg, "cost")
    name = str(params.pop("name", "analytic"))
    return registry.create("cost_model", name, **params)


def memory_cost(cfg: DictConfig, registry: Registry) -> CostModel:
    """The configured cost model with each pipeline's schedule's peak activations (as the planner
    prices memory), for the per-device memory breakdown."""
    cost = build_cost_model(cfg, registry)
    return native_cost(cost, ScheduleBook(registry)) if hasattr(cost, "activation") else cost


def check_cost_cluster(cost: CostModel, cluster: Cluster) -> None:
    """A cost model that carries its own data about a cluster (``profiled``: measured links per
    machine) checks it against the cluster priced, once, before any search (``check_cluster``)."""
    check = getattr(cost, "check_cluster", None)
    if check is not None:
        check(cluster)


def build_problem(cfg: DictConfig, registry: Registry, warm_start: Plan | None = None) -> Problem:
    cluster = load_cluster(cfg)
    model = load_model(cfg)
    train = train_settings(cfg, model)
    if warm_start is None and cfg.get("warm_start"):
        warm_start = Plan.load(str(cfg.warm_start))
    usable = {d.id for d in cluster.devices}
    if warm_start is not None and not any(d in usable for d in warm_start.devices):
        raise HexicoreError(f"the plan runs on cluster {warm_start.cluster.name!r}, none of whose devices this run's "
                            f"cluster {cluster.name!r} has: nothing to start from", source="command line",
                            field="warm_start")
    schedule = ScheduleRef.from_mapping(group_params(cfg, "schedule", registry) or None,
                                        source=_choice(cfg, "schedule"))
    cost = build_cost_model(cfg, registry)
    check_cost_cluster(cost, cluster)
    try:
        cost, book = schedule_pricing(cost, schedule, registry)
    except HexicoreError as exc:  # a schedule parameter the plugin refuses (schedule.waves=0)
        raise on_command_line(exc, cfg) from None
    if warm_start is not None and cfg.get("warm_start"):  # its schedules checked as evaluate checks them
        check_schedules(warm_start, book or ScheduleBook(registry), str(cfg.warm_start))
    objective = Objective(str(cfg.get("objective") or "throughput"), _opt_float(cfg.get("budget_per_hour")),
                          _opt_float(cfg.get("min_tokens_per_s")))
    return Problem(cluster, model, train, cost, schedule, registry, warm_start, pricing=book, objective=objective)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


#: the seeds a run or a search takes: what torch's and numpy's generators accept
SEEDS = (-(2**63), 2**64 - 1)


def seed_value(value: Any, source: str, field: str) -> int:
    """A seed: an integer within :data:`SEEDS` (a 40-digit seed no generator takes), else one line."""
    seed = schema.integer(value, source, field, minimum=None)
    if not SEEDS[0] <= seed <= SEEDS[1]:
        raise HexicoreError(f"a seed is an integer from -2^63 to 2^64 - 1, got {shown(seed, 40)}", source=source,
                            field=field)
    return seed


def solve(cfg: DictConfig, registry: Registry, progress: Progress = no_progress) -> tuple[Plan, list[str]]:
    """Run the configured solver; return the plan (estimate and solver sections filled) and
    the validator's warnings. A plan that does not fit is never returned."""
    problem = build_problem(cfg, registry)
    params = group_params(cfg, "solver")
    name = str(params.pop("name", "megatron"))
    source = _choice(cfg, "solver")
    time_limit = params.pop("time_limit", None)
    if time_limit is not None:
        time_limit = schema.number(time_limit, source, "solver.time_limit")
    seed = seed_value(params.pop("seed", cfg.get("seed", 0)) or 0, source, "solver.seed")
    solver = registry.create("solver", name, **params)
    t0 = time.perf_counter()
    try:
        plan = solve_choices(solver, problem, time_limit=time_limit, seed=seed, progress=progress)
    except HexicoreError as exc:
        if exc.source:
            raise
        if exc.field == "warm_start":  # the warm_start= key given beside this model
            where = "command line"
        else:
            where = cfg.get("model_file") or _choice(cfg, "model") if exc.field == "model" else f"solver {name}"
        raise exc.located(source=str(where)) from None
    seconds = time.perf_counter() - t0
    book = problem.pricing or ScheduleBook(registry)  # the estimate evaluate recomputes (:func:`plan_cost`)
    est, warnings = validate_plan(plan, plan_cost(problem.cost, plan, book), source=f"solver {name}", book=book)
    info = {"name": name, "seconds": round(seconds, 4), "params": {}, "status": "HEURISTIC", "bound": None}
    info.update(dict(plan.solver or {}))
    info["name"], info["seconds"] = name, round(seconds, 4)
    return plan.with_estimate(est).with_solver(info), warnings


def evaluate(plan: Plan, cost: CostModel, source: str | None = None, *,
             registry: Registry) -> tuple[Plan, Estimate, list[str]]:
    """Validate a plan from any source and attach a fresh estimate (pipelines whose schedule
    is not timed by the cost model's own formula priced by their schedules from ``registry``, as
    the planner's estimate is: :func:`hexicore.planner.pricing.plan_cost`)."""
    check_cost_cluster(cost, plan.cluster)
    book = ScheduleBook(registry)
    check_schedules(plan, book, source)
    try:
        est, warnings = validate_plan(plan, plan_cost(cost, plan, book), source, book=book)
    except HexicoreError as exc:
        if exc.source or source is None:
            raise
        raise exc.located(source=source) from None
    return plan.with_estimate(est), est, warnings


def output_dir(cfg: DictConfig) -> Path:
    """Hydra's output directory of this job (or the working directory outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001
        return Path.cwd()


def config_from_overrides(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config",
                          registry: Registry | None = None) -> DictConfig:
    """Compose the project config like the CLI does (Hydra compose API), with the structured
    configs of ``registry``'s plugins (default: every installed plugin, :meth:`Registry.default`)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hexicore.app.config_schema import store_schema

    store_schema()
    (registry if registry is not None else Registry.default()).store_configs()
    gh = GlobalHydra.instance()  # inside a Hydra app of the caller's (or a plugin's call): its
    outer, gh.hydra = gh.hydra, None  # Hydra is set aside while hexicore composes its own config
    try:
        with initialize_config_module(config_module="hexicore.conf", version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().hydra = outer
