"""Pipeline schedules as per-rank action lists.

The action IR (:mod:`~hexicore.pipeline.actions`, with an array form in
:mod:`~hexicore.pipeline.arrays`), the shared communication pass (:mod:`~hexicore.pipeline.comm`),
the validator (:mod:`~hexicore.pipeline.validate`), the event simulator with its array fast path
behind the same function (:mod:`~hexicore.pipeline.simulate`), the schedule interface and
helpers for schedule plugins (:mod:`~hexicore.pipeline.schedule`), the greedy list scheduler
(:mod:`~hexicore.pipeline.greedy`), Chrome traces and timelines
(:mod:`~hexicore.pipeline.timeline`) and PyTorch CSV interop (:mod:`~hexicore.pipeline.torch_csv`).

May import: :mod:`hexicore.core`. Never the planner, the cost model or the app layer.
"""
