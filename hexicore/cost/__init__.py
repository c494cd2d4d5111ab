"""Cost models: the interface (:mod:`hexicore.cost.base`) and the analytic model of HexiScale
App. A (:mod:`hexicore.cost.analytic`).

May import: :mod:`hexicore.core` only.
"""

from hexicore.core.estimate import Estimate
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.base import (DEFAULT_EFFICIENCY, GIB, ActivationFn, BoundCostModel, CostModel, PipelineTimer,
                                PlacementFn, bind, default_in_flight)
from hexicore.cost.config import cost_model_from_config

__all__ = ["AnalyticCostModel", "ActivationFn", "BoundCostModel", "CostModel", "DEFAULT_EFFICIENCY", "Estimate", "GIB",
           "PipelineTimer", "PlacementFn", "bind", "cost_model_from_config", "default_in_flight"]
