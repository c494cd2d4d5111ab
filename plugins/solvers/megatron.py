"""Solver ``megatron``: the symmetric DP x TP x PP baseline (HexiScale §5 baselines).

What a Megatron-LM user would run: every (DP, TP, PP) with DP*TP*PP = devices, TP dividing the
attention heads, KV heads and FFN width, PP stages with a layer per chunk of the schedule (PP <=
layers for one chunk each), the global batch split equally over DP in whole micro-batches; ranks
laid out in Megatron's order (TP innermost, then DP, then PP) over the cluster's device order
(where no layout of every device is legal, over the most devices that have one, the slowest left
idle: :func:`~hexicore.planner.baselines.symmetric.layout_devices`); equal layers per stage (the first
``L mod PP`` stages take one more);
the best of them by the cost model, among those that fit in memory. The layouts themselves
are built by :mod:`hexicore.planner.baselines.symmetric` (shared with ``plugins/solvers/baselines.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.planner.allocation.sub_clusters import on_devices_for_objective
from hexicore.planner.baselines.symmetric import even_layers, factorisations, layout_devices, legal, symmetric_plan
from hexicore.planner.fastest import priced_where_it_could_win
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.stage_layout.pipeline_fit import holds_chunks
from hexicore.planner.train_choice import at_stage

__all__ = ["MegatronSolver", "even_layers", "factorisations", "legal", "symmetric_plan"]


@dataclass
class MegatronSolver:
    """Exhaustive search over Megatron's symmetric layouts; returns the fastest that fits.
    ``zero`` (``solver.zero=1``): the ZeRO stage these layouts use whatever ``train.zero`` says
    (Megatron-LM's ``--use-distributed-optimizer`` is ZeRO-1); None: ``train.zero``."""

    name: str = "megatron"
    zero: int | None = None

    def layouts(self, problem: Problem) -> list[tuple[tuple[int, int, int], Plan]]:
        """Every legal (DP, TP, PP) layout with a layer per chunk of the schedule, unpriced."""
        devices = layout_devices(problem)
        out = []
        for dp, tp, pp in factorisations(len(devices)):
            if legal(problem, dp, tp, pp):
                plan = symmetric_plan(problem, dp, tp, pp, devices)
                if all(holds_chunks(problem.pricing, p) for p in plan.pipelines):  # a layer per chunk
                    out.append(((dp, tp, pp), plan))
        return out

    def candidates(self, problem: Problem) -> list[tuple[tuple[int, int, int], Plan, Any]]:
        """Every layout of :meth:`layouts` with its estimate."""
        return [(key, plan, problem.evaluate(plan)) for key, plan in self.layouts(problem)]

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        """:meth:`on_all` of the problem's devices, or of the sub-clusters that best meet its
        objective (:func:`hexicore.planner.allocation.sub_clusters.on_devices_for_objective`)."""
        return on_devices_for_objective(problem, lambda sub, report: self.on_all(sub, progress=report),
                                        progress=progress)

    def on_all(self, problem: Problem, *, progress: Progress = no_progress) -> Plan:
        problem = at_stage(problem, self.zero)
        layouts = self.layouts(problem)
        cands = priced_where_it_could_win(problem, layouts)  # the fastest fitting, as pricing all
        progress("megatron: evaluated symmetric layouts", 1.0)
        fitting = cands.fitting
        if not fitting:
            tried = ", ".join(f"({dp},{tp},{pp})" for (dp, tp, pp) in cands.unfit) or "none legal"
            raise HexicoreError(f"model {problem.model.name!r} fits on no symmetric (DP,TP,PP) arrangement of the "
                                f"cluster (tried {tried})", field="model")
        (dp, tp, pp), plan, est = min(fitting, key=lambda c: (c[2].iteration_s, c[0]))
        return plan.with_solver({"name": self.name, "params": {"dp": dp, "tp": tp, "pp": pp},
                                 "status": "HEURISTIC", "bound": None,
                                 "candidates": len(layouts), "priced": cands.priced, "fitting": len(fitting)})


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="megatron", factory=MegatronSolver,
                     description="symmetric Megatron DP x TP x PP baseline, best by the cost model")
