"""hexicore: plan and run LLM training on heterogeneous GPU clusters.

Library API (composed exactly as the command line composes its configs)::

    import hexicore
    plan = hexicore.plan(cluster="paper_case", model="llama2_13b")
    plan.estimate.iteration_s, plan.to_json()
    hexicore.simulate("hanayo", ranks=4, micro_batches=8).bubble_ratio

Layout (imports run one way, app -> planner -> pipeline / cost -> core; see docs/design.md):
:mod:`hexicore.core` (data), :mod:`hexicore.cost` (cost models), :mod:`hexicore.pipeline`
(action lists, simulator), :mod:`hexicore.planner` (the HexiScale search), :mod:`hexicore.app`
(CLI, commands, library API), :mod:`hexicore.hookspecs` and :mod:`hexicore.registry` (plugins).

The names below are loaded on first use (PEP 562 ``__getattr__``), so ``import hexicore`` reads
no plan, cluster or plugin code, and never Hydra, torch, OR-Tools or matplotlib.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "plan": "hexicore.app.api", "evaluate": "hexicore.app.api", "load_plan": "hexicore.app.api",
    "simulate": "hexicore.app.api", "compose": "hexicore.app.api",
    "SimulationResult": "hexicore.app.results",
    "Plan": "hexicore.core.plan", "Pipeline": "hexicore.core.plan", "Stage": "hexicore.core.plan",
    "TrainSettings": "hexicore.core.plan", "Estimate": "hexicore.core.estimate",
    "Cluster": "hexicore.core.cluster", "ModelSpec": "hexicore.core.model",
    "HexicoreError": "hexicore.core.errors",
    "Registry": "hexicore.registry", "PluginSpec": "hexicore.hookspecs", "hookimpl": "hexicore.hookspecs",
}

__all__ = ["plan", "evaluate", "load_plan", "simulate", "compose", "SimulationResult", "Plan", "Pipeline", "Stage",
           "TrainSettings", "Estimate", "Cluster", "ModelSpec", "HexicoreError", "Registry", "PluginSpec", "hookimpl"]

if TYPE_CHECKING:  # what static checkers and IDEs see
    from hexicore.app.api import compose, evaluate, load_plan, plan, simulate
    from hexicore.app.results import SimulationResult
    from hexicore.core.cluster import Cluster
    from hexicore.core.errors import HexicoreError
    from hexicore.core.estimate import Estimate
    from hexicore.core.model import ModelSpec
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings
    from hexicore.hookspecs import PluginSpec, hookimpl
    from hexicore.registry import Registry


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hexicore' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
