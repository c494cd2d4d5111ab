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

Every function raises :class:`hexicore.core.errors.HexicoreError` (one line naming the file
or config field) on bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hexicore.app.results import SimulationResult
from hexicore.core.plan import Plan
from hexicore.core.schedule_ref import DEFAULT_SCHEDULE


def _overrides(groups: dict[str, str | None], extra: Sequence[str]) -> list[str]:
    return [f"{k}={v}" for k, v in groups.items() if v is not None] + list(extra)


def compose(overrides: Sequence[str] = ()):
    """The composed project config (an OmegaConf DictConfig) for ``overrides``."""
    from hexicore.app.compose import config_from_overrides
    from hexicore.app.cli import preflight

    preflight(list(overrides), library=True)
    return config_from_overrides(list(overrides))


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

    extra = list(overrides)
    if cluster_file is not None:
        extra.append(f"cluster_file={cluster_file}")
    if model_file is not None:
        extra.append(f"model_file={model_file}")
    cfg = compose(_overrides({"cluster": cluster, "model": model, "solver": solver, "schedule": schedule}, extra))
    result, _ = solve(cfg, Registry.default())
    return result


def simulate(schedule: str = DEFAULT_SCHEDULE, ranks: int = 4, micro_batches: int = 8, *, forward: float = 1.0,
             backward: float = 2.0, comm: float = 0.0, out: str | Path | None = None,
             overrides: Sequence[str] = ()) -> SimulationResult:
    """Build, validate and simulate a schedule's action lists like ``hexicore simulate``.

    Returns a :class:`~hexicore.app.results.SimulationResult` (``makespan``, ``bubble_ratio``,
    ``peak_activations`` per rank, ``closed_form_bubble``, the ``action_list``; ``to_dict()`` is
    ``summary.json``); ``out`` also writes the command's four files. ``overrides`` take schedule
    parameters, e.g. ``["schedule.waves=4"]``."""
    from hexicore.app.commands.simulate import build, write

    cfg = compose([f"schedule={schedule}", f"pipeline.ranks={ranks}", f"pipeline.micro_batches={micro_batches}",
                   f"timing.forward={forward}", f"timing.backward={backward}", f"timing.comm={comm}",
                   *overrides])
    al, res, summary = build(cfg, record=True if out is not None else None)
    if out is not None:
        write(Path(out), al, res, summary)
    return SimulationResult.from_summary(summary, al, res)


def load_plan(path: str | Path) -> Plan:
    """Read and structurally check a plan JSON (``hexicore.plan/1``); same as :meth:`Plan.load`."""
    return Plan.load(path)


def evaluate(plan_or_path: Plan | str | Path, *, overrides: Sequence[str] = ()) -> Plan:
    """Validate a plan (a :class:`Plan` or a plan JSON path) like ``hexicore evaluate`` and return
    it with a fresh :class:`~hexicore.core.estimate.Estimate` from the configured cost model."""
    from hexicore.app.compose import build_cost_model, evaluate as _evaluate
    from hexicore.registry import Registry

    p = plan_or_path if isinstance(plan_or_path, Plan) else Plan.load(plan_or_path)
    cfg = compose(list(overrides))
    registry = Registry.default()
    return _evaluate(p, build_cost_model(cfg, registry), registry=registry)[0]
