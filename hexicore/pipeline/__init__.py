"""Pipeline schedules as per-rank action lists, and what they cost.

The action IR and its files (:mod:`~hexicore.pipeline.actions`: the JSON contract and PyTorch's
CSV pipeline order; an array form in :mod:`~hexicore.pipeline.arrays`, the chain rule in
:mod:`~hexicore.pipeline.chains`), the shared communication pass (:mod:`~hexicore.pipeline.comm`),
the validator (:mod:`~hexicore.pipeline.validate`), the simulator — one function,
:func:`~hexicore.pipeline.simulate.simulate`, with its array engine behind it
(:mod:`~hexicore.pipeline.simulate_fast`, :mod:`~hexicore.pipeline.fast_graph`) and its inputs and
results in :mod:`~hexicore.pipeline.timing` — the schedule pricer and its tiers (closed form,
steady-state model, exact simulation: :mod:`~hexicore.pipeline.pricer`), the schedule interface
and helpers for schedule plugins (:mod:`~hexicore.pipeline.schedule`, what a schedule is built
for: :mod:`~hexicore.pipeline.spec`), the placement an action list implies
(:mod:`~hexicore.pipeline.action_placement`), the greedy list scheduler
(:mod:`~hexicore.pipeline.greedy`), schedule synthesis (:mod:`~hexicore.pipeline.synthesis`, with
:mod:`~hexicore.pipeline.improve`) and Chrome traces and timelines (:mod:`~hexicore.pipeline.timeline`).

May import: :mod:`hexicore.core`. Never the planner, the cost model or the app layer. Inside:
chains, arrays -> actions -> timing, comm -> fast_graph -> simulate_fast -> simulate -> validate
-> pricer -> schedule, greedy, synthesis (one way, no circle: tests/repository/test_layout.py).
"""
