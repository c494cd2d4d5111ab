"""The library API: the command line's ``plan``, ``evaluate`` and ``simulate`` as functions
that return typed results (docs/cli.md).

Configs are composed exactly as the CLI composes them (Hydra's compose API over
``hexicore.conf`` plus every plugin's structured config), so ``hexicore.plan(cluster="hetero1")``
and ``hexicore plan cluster=hetero1`` give the same plan::

    import hexicore
    plan = hexicore.plan(cluster="paper_case", model="llama2_13b", solver="megatron",
                         overrides=["train.global_batch=32"])
    plan.estimate.iteration_s, plan.estimate.mfu, plan.estimate.memory_gb["A.0"]
    plan.save("plan.json")                    # plan.to_json() is the same text
    again = hexicore.load_plan("plan.json")   # == hexicore.Plan.from_json(text)
    sim = hexicore.simulate("hanayo", ranks=4, micro_batches=8, overrides=["schedule.waves=2"])
    sim.bubble_ratio, sim.peak_activations, sim.to_dict()   # to_dict(): summary.json

Every function checks its arguments and raises :class:`hexicore.core.errors.HexicoreError` (one
line naming the file, config field or argument) on bad input: ``overrides`` is a list of
``key=value`` strings (a single string is one override; ``None`` is none), a group name takes one
value (a sweep such as ``"hetero1,hetero2"`` needs the command line's ``-m``), an override the
call would not read (``out=``, ``overwrite=``, ``plan_file=``) is refused, and an output path
that cannot be written is one line too. :meth:`Plan.save` follows the CLI's ownership rules: it
replaces an absent path or another plan file, and refuses a directory or any other file unless
``overwrite=True``; ``simulate(out=DIR)`` likewise replaces only its own four files in ``DIR``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hexicore.app.results import SimulationResult
from hexicore.core import schema
from hexicore.core.errors import HexicoreError
from hexicore.core.fields import is_number, is_whole
from hexicore.core.plan import Plan
from hexicore.core.schedule_ref import DEFAULT_SCHEDULE


def _arguments(fn: Callable) -> Callable:
    """A library call's errors about its configuration name the argument or key alone: the
    checks it shares with the CLI say ``command line``, which here it is not."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HexicoreError as exc:
            if exc.source != "command line":
                raise
            raise type(exc)(exc.message, field=exc.field) from None

    return call


def _override_list(overrides: Any) -> list[str]:
    """``overrides`` as a list of strings: one string is one override, None none."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(overrides, Mapping) or not isinstance(overrides, (list, tuple)):
        raise HexicoreError(f"expected a list of 'key=value' strings, got {type(overrides).__name__}",
                            field="overrides")
    for i, o in enumerate(overrides):
        if not isinstance(o, str):
            raise HexicoreError(f"expected a 'key=value' string such as 'train.global_batch=32', got "
                                f"{type(o).__name__} {o!r}", field=f"overrides[{i}]")
        if o.lstrip().startswith("-"):  # -m, --cfg job: the command line's flags, not a config's values
            raise HexicoreError(f"{o!r} is a command-line flag, not a 'key=value' override; the library composes "
                                "one config (sweeps and --cfg are the hexicore command's)", field=f"overrides[{i}]")
    return list(overrides)


#: keys a library call never reads, and what to do instead (the command line's files are written by the caller)
_UNREAD = {"out": "the library writes no file here: save the result (plan.save(path)) or give simulate(out=)",
           "overwrite": "the library writes no file here: plan.save(path, overwrite=True)",
           "plan_file": "give the plan itself: evaluate(plan_or_path)"}


def _refuse_lost(overrides: Sequence[str], given: Mapping[str, str] | None = None) -> None:
    """Refuse an override that would be lost without a word: of a key no library call reads
    (``out=``, :data:`_UNREAD`), or of a key one of this call's arguments sets (``given``: key ->
    argument, e.g. ``pipeline.ranks`` -> ``ranks``; the override would replace the argument)."""
    for i, o in enumerate(overrides):
        key = o.split("=", 1)[0].strip().lstrip("+~")
        if key in _UNREAD:
            raise HexicoreError(f"{o!r}: {key}= is not read by this call; {_UNREAD[key]}", field=f"overrides[{i}]")
        if given and key in given:
            raise HexicoreError(f"{o!r}: {key} is this call's {given[key]}= argument; give {given[key]}= instead of "
                                "the override", field=f"overrides[{i}]")


def _quoted(path: str) -> str:
    """``path`` as a Hydra override value read back verbatim: quoted (a comma, ``=``, space or
    bracket is part of the path, not a sweep or syntax), its quotes, the backslashes before them
    and any ``${`` escaped (a literal, not an interpolation)."""
    path = re.sub(r"(\\+)(?='|$|\$\{)", lambda m: m.group(1) * 2, path)
    return "'" + path.replace("'", "\\'").replace("${", "\\${") + "'"


def _name(value: Any, arg: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise HexicoreError(f"expected a name (a string), got {type(value).__name__} {value!r}", field=arg)
    return value


def _path(value: Any, arg: str) -> Path | None:
    return None if value is None else schema.path_arg(value, arg)


def _number(value: Any, arg: str, *, whole: bool = False) -> Any:
    if not (is_whole(value) if whole else is_number(value)):
        raise HexicoreError(f"expected {'an integer' if whole else 'a number'}, got {type(value).__name__} {value!r}",
                            field=arg)
    return value


def _overrides(groups: dict[str, str | None], extra: Sequence[str]) -> list[str]:
    return [f"{k}={_name(v, k)}" for k, v in groups.items() if v is not None] + list(extra)


@_arguments
def compose(overrides: Sequence[str] = ()):
    """The composed project config (an OmegaConf DictConfig) for ``overrides``."""
    from hexicore.app.compose import config_from_overrides
    from hexicore.app.cli import preflight
    from hexicore.app.config_schema import store_schema
    from hexicore.registry import Registry

    overrides = _override_list(overrides)
    store_schema()  # as the CLI does before its preflight: a plugin's structured config
    Registry.default().store_configs()  # (solver=annealing) is a known group option on the first call too
    preflight(overrides, library=True)
    return config_from_overrides(overrides)


@_arguments
def plan(cluster: str | None = None, model: str | None = None, solver: str | None = None, *,
         schedule: str | None = None, cluster_file: str | Path | None = None, model_file: str | Path | None = None,
         overrides: Sequence[str] = ()) -> Plan:
    """Solve for a plan like ``hexicore plan``: the named presets (or files), the configured
    solver, the validator. The plan's ``estimate`` is an :class:`~hexicore.core.estimate.Estimate`
    (``.iteration_s``, ``.mfu``, ``.tokens_per_s``, ``.memory_gb``, ...), its ``solver`` a mapping
    (``name``, ``seconds``, ``status``, ``bound``, ...). ``overrides`` are Hydra overrides
    (``["train.global_batch=32"]``)."""
    from hexicore.app.compose import solve
    from hexicore.registry import Registry

    extra = _override_list(overrides)
    args = {"cluster": cluster, "model": model, "solver": solver, "schedule": schedule, "cluster_file": cluster_file,
            "model_file": model_file}
    _refuse_lost(extra, {k: k for k, v in args.items() if v is not None})
    for key, value in (("cluster_file", cluster_file), ("model_file", model_file)):
        if _path(value, key) is not None:
            extra.append(f"{key}={_quoted(os.fspath(value))}")
    cfg = compose(_overrides({"cluster": cluster, "model": model, "solver": solver, "schedule": schedule}, extra))
    result, _ = solve(cfg, Registry.default())
    return result


@_arguments
def simulate(schedule: str = DEFAULT_SCHEDULE, ranks: int = 4, micro_batches: int = 8, *, forward: float = 1.0,
             backward: float = 2.0, comm: float = 0.0, out: str | Path | None = None,
             overrides: Sequence[str] = ()) -> SimulationResult:
    """Build, validate and simulate a schedule's action lists like ``hexicore simulate``.

    Returns a :class:`~hexicore.app.results.SimulationResult` (``makespan``, ``bubble_ratio``,
    ``peak_activations`` per rank, ``closed_form_bubble``, the ``action_list``; ``to_dict()`` is
    ``summary.json``); ``out`` also writes the command's four files. ``overrides`` take schedule
    parameters, e.g. ``["schedule.waves=4"]``."""
    from hexicore.app.commands.simulate import FILES, build, write
    from hexicore.core.ownership import check_dir

    for arg, value in (("ranks", ranks), ("micro_batches", micro_batches)):
        _number(value, arg, whole=True)
    for arg, value in (("forward", forward), ("backward", backward), ("comm", comm)):
        _number(value, arg)
    out = _path(out, "out")
    _refuse_lost(_override_list(overrides), {"schedule": "schedule", "pipeline.ranks": "ranks",
                                               "pipeline.micro_batches": "micro_batches", "timing.forward": "forward",
                                               "timing.backward": "backward", "timing.comm": "comm"})
    cfg = compose([f"schedule={_name(schedule, 'schedule')}", f"pipeline.ranks={ranks}",
                   f"pipeline.micro_batches={micro_batches}", f"timing.forward={forward}",
                   f"timing.backward={backward}", f"timing.comm={comm}", *_override_list(overrides)])
    if out is not None:
        check_dir(out, FILES)
    al, res, summary = build(cfg, record=True if out is not None else None)
    if out is not None:
        try:
            write(out, al, res, summary)
        except OSError as exc:
            raise HexicoreError(f"cannot write the simulation's files: {exc.strerror or exc}", source=str(out),
                                field="out") from None
    return SimulationResult.from_summary(summary, al, res)


def load_plan(path: str | Path) -> Plan:
    """Read and structurally check a plan JSON (``hexicore.plan/1``); same as :meth:`Plan.load`."""
    if path is None:
        raise HexicoreError("expected a plan JSON path, got None", field="path")
    return Plan.load(_path(path, "path"))


@_arguments
def evaluate(plan_or_path: Plan | str | Path, *, overrides: Sequence[str] = ()) -> Plan:
    """Validate a plan (a :class:`Plan` or a plan JSON path) like ``hexicore evaluate`` and return
    it with a fresh :class:`~hexicore.core.estimate.Estimate` from the configured cost model."""
    from hexicore.app.compose import build_cost_model, evaluate as _evaluate
    from hexicore.registry import Registry

    if not isinstance(plan_or_path, (Plan, str, os.PathLike)):
        raise HexicoreError(f"expected a Plan or a plan JSON path, got {type(plan_or_path).__name__}"
                            + (" (a mapping: use hexicore.Plan.from_dict)" if isinstance(plan_or_path, Mapping) else ""),
                            field="plan_or_path")
    _refuse_lost(_override_list(overrides))
    p = plan_or_path if isinstance(plan_or_path, Plan) else Plan.load(plan_or_path)
    cfg = compose(overrides)
    registry = Registry.default()
    return _evaluate(p, build_cost_model(cfg, registry), registry=registry)[0]
