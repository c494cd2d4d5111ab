"""Plugins that live in the core: the ``analytic`` and ``profiled`` cost models and the
``hexiscale`` solver (registered through the same ``hexicore`` entry-point group as every other
plugin)."""

from __future__ import annotations

from hexicore.cost import cost_model_from_config
from hexicore.hookspecs import PluginSpec, hookimpl


def _analytic(**params):
    return cost_model_from_config(params)


def _profiled(**params):
    from hexicore.cost.profiled import profiled_from_config

    return profiled_from_config(params)


@hookimpl
def hexicore_cost_models():
    yield PluginSpec(kind="cost_model", name="analytic", factory=_analytic,
                     description="HexiScale App. A analytic model (compute, TP/PP/DP comm with alpha, memory)")
    yield PluginSpec(kind="cost_model", name="profiled", factory=_profiled,
                     description="App. A priced with measured block times and links (cost.profile_file)")


def _hexiscale(**params):
    from hexicore.planner.hexiscale import HexiScaleSolver

    return HexiScaleSolver.from_params(**params)


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="hexiscale", factory=_hexiscale,
                     description="HexiScale two-phase planner: METIS partition, KL, top-tau order, "
                                 "asymmetric layers and batches (§4)")
