"""Cost models: the interface (:mod:`hexicore.cost.base`) and the analytic model of HexiScale
App. A (:mod:`hexicore.cost.analytic`).

May import: :mod:`hexicore.core` only.
"""

from hexicore.core.estimate import Estimate
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.config import cost_model_from_config
from hexicore.cost.base import (DEFAULT_EFFICIENCY, GIB, ActivationFn, CostModel, PipelineTimer, PlacementFn,
                                default_in_flight)

__all__ = ["AnalyticCostModel", "ActivationFn", "CostModel", "DEFAULT_EFFICIENCY", "Estimate", "GIB",
           "PipelineTimer", "PlacementFn", "cost_model_from_config", "default_in_flight"]
