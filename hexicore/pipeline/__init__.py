"""Pipeline schedules as per-rank action lists.

The action IR (:mod:`~hexicore.pipeline.actions`, with an array form in
:mod:`~hexicore.pipeline.arrays` and the chain rule in :mod:`~hexicore.pipeline.chains`), the
shared communication pass (:mod:`~hexicore.pipeline.comm`), the validator
(:mod:`~hexicore.pipeline.validate`), the simulator — one function,
:func:`~hexicore.pipeline.simulate.simulate`, with its array engine behind it
(:mod:`~hexicore.pipeline.simulate_fast`, :mod:`~hexicore.pipeline.fast_graph`) and its inputs and
results in :mod:`~hexicore.pipeline.timing` — the schedule interface and
helpers for schedule plugins (:mod:`~hexicore.pipeline.schedule`), the greedy list scheduler
(:mod:`~hexicore.pipeline.greedy`), Chrome traces and timelines
(:mod:`~hexicore.pipeline.timeline`) and PyTorch CSV interop (:mod:`~hexicore.pipeline.torch_csv`).

May import: :mod:`hexicore.core`. Never the planner, the cost model or the app layer. Inside:
chains, arrays -> actions -> timing, comm -> fast_graph -> simulate_fast -> simulate -> validate,
greedy, schedule (one way, no circle: tests/test_layout.py).
"""
