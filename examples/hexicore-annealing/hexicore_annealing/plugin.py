"""The plugin module named in this package's ``hexicore`` entry point.

It yields one typed record. ``config`` is a dataclass: hexicore stores it in Hydra's
ConfigStore as ``solver/annealing``, so ``hexicore plan solver=annealing solver.steps=500``
works although this package ships no YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hexicore.hookspecs import PluginSpec, hookimpl

from hexicore_annealing.solver import AnnealingSolver


@dataclass
class AnnealingConfig:
    """``solver.*`` keys of ``solver=annealing``."""

    name: str = "annealing"
    steps: int = 300
    temperature: float = 0.05   # initial acceptance temperature, relative to the start score
    cooling: float = 0.99       # geometric cooling per step
    d_dp: Optional[int] = None  # number of pipelines; null tries 1..4 (bounded by devices)
    time_limit: Optional[float] = None


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="annealing", factory=AnnealingSolver, config=AnnealingConfig,
                     description="simulated annealing over device partitions, scored by hexicore's cost model")
