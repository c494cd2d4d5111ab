"""The HexiScale planner: a :class:`~hexicore.planner.problem.Problem` in, a plan out.

The two-phase search (:mod:`~hexicore.planner.search`: the loop; :mod:`~hexicore.planner.candidates`:
partition, refine, order, lay out, score one candidate), per-pipeline layout (:mod:`~hexicore.planner.stages`, :mod:`~hexicore.planner.layers`),
batch allocation (:mod:`~hexicore.planner.batch`), the partitioner interfaces
(:mod:`~hexicore.planner.partition`), elastic replanning (:mod:`~hexicore.planner.replan`),
schedule-aware pricing (:mod:`~hexicore.planner.pricing`, through each schedule plugin's declared
pricing) and the full plan check (:mod:`~hexicore.planner.validate`).

May import: :mod:`hexicore.pipeline`, :mod:`hexicore.cost`, :mod:`hexicore.core`. Never the app
layer, never a plugin module (plugins are found through the registry passed in).
"""
