"""The HexiScale planner: a :class:`~hexicore.planner.problem.Problem` in, a plan out.

By phase of HexiScale §4:

* :mod:`~hexicore.planner.search` — the two-phase iterative search (§4.4): the loop, one
  candidate, the search's state (:class:`~hexicore.planner.search.context.SearchContext`), its
  settings, and the worker processes that lay candidates out ahead;
* :mod:`~hexicore.planner.partition` — phase 1 (§4.2): the device graph cut into one part per
  pipeline (the partitioner / refiner / stage-orderer interfaces and their graph-cut helpers);
* :mod:`~hexicore.planner.stage_layout` — phase 2 (§4.3): TP menus, the stage table, exact layer
  allocation, aligned layer ranges, whether a pipeline fits its devices under its schedule, and
  the batch split over pipelines;
* :mod:`~hexicore.planner.allocation` — which machines a plan uses, under an objective (cost,
  budget, throughput floor), and the devices it leaves idle;
* :mod:`~hexicore.planner.baselines` — Megatron-LM's symmetric layouts the baseline solvers share;
* :mod:`~hexicore.planner.replan` — elastic replanning from a previous plan, and how plans differ;
* schedule-aware pricing (:mod:`~hexicore.planner.pricing`, :mod:`~hexicore.planner.fastest`,
  :mod:`~hexicore.planner.final_schedules`, through each schedule plugin's declared pricing);
* the solver ``hexiscale`` (:mod:`~hexicore.planner.hexiscale`), ``train.zero=auto``
  (:mod:`~hexicore.planner.zero_stage`) and the full plan check (:mod:`~hexicore.planner.plan_check`).

May import: :mod:`hexicore.pipeline`, :mod:`hexicore.cost`, :mod:`hexicore.core`. Never the app
layer, never a plugin module (plugins are found through the registry passed in).
"""
