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
"""

from __future__ import annotations

__version__ = "0.1.0"

from hexicore.app.api import compose, evaluate, load_plan, plan, simulate
from hexicore.core.errors import HexicoreError

__all__ = ["plan", "evaluate", "load_plan", "simulate", "compose", "HexicoreError"]
