"""Solver ``megatron``: the symmetric DP x TP x PP baseline (REFERENCE.md §4).

What a Megatron-LM user would run: every (DP, TP, PP) with DP*TP*PP = devices, TP dividing the
attention and KV heads, PP <= layers, the global batch split equally over DP in whole
micro-batches; ranks laid out in Megatron's order (TP innermost, then DP, then PP) over the
cluster's device order; equal layers per stage (the first ``L mod PP`` stages take one more);
the best of them by the cost model, among those that fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.planner.problem import Problem, Progress, no_progress


def even_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Near-equal contiguous ranges: the first ``n_layers % n_stages`` stages get one more."""
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for j in range(n_stages):
        hi = lo + base + (1 if j < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def factorisations(n: int) -> Iterator[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp * tp * pp == n."""
    for dp in range(1, n + 1):
        if n % dp:
            continue
        rest = n // dp
        for tp in range(1, rest + 1):
            if rest % tp == 0:
                yield dp, tp, rest // tp


def symmetric_plan(problem: Problem, dp: int, tp: int, pp: int, devices: list[str] | None = None) -> Plan:
    """The Megatron layout of (dp, tp, pp) over ``devices`` (default: the cluster's order).

    Global rank r has tp index r % tp, dp index (r // tp) % dp, pp index r // (tp * dp).
    """
    devices = list(devices if devices is not None else (d.id for d in problem.cluster.devices))
    train, model = problem.train, problem.model
    ranges = even_layers(model.layers, pp)
    pipelines = []
    for i in range(dp):
        stages = []
        for j in range(pp):
            base = j * tp * dp + i * tp
            stages.append(Stage(tuple(devices[base:base + tp]), tp, ranges[j]))
        pipelines.append(Pipeline(train.global_batch // dp, tuple(stages), dict(problem.schedule)))
    return Plan(model, problem.cluster, train, tuple(pipelines))


def legal(problem: Problem, dp: int, tp: int, pp: int) -> bool:
    """Megatron's constraints: TP divides the heads and KV heads, PP <= layers, and the global
    batch divides into DP equal shares of whole micro-batches."""
    m, t = problem.model, problem.train
    return (m.heads % tp == 0 and m.kv_heads % tp == 0 and pp <= m.layers
            and t.global_batch % (dp * t.micro_batch) == 0)


@dataclass
class MegatronSolver:
    """Exhaustive search over Megatron's symmetric layouts; returns the fastest that fits."""

    name: str = "megatron"

    def candidates(self, problem: Problem) -> list[tuple[tuple[int, int, int], Plan, Any]]:
        n = len(problem.cluster.devices)
        out = []
        for dp, tp, pp in factorisations(n):
            if legal(problem, dp, tp, pp):
                plan = symmetric_plan(problem, dp, tp, pp)
                out.append(((dp, tp, pp), plan, problem.evaluate(plan)))
        return out

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        cands = self.candidates(problem)
        progress("megatron: evaluated symmetric layouts", 1.0)
        fitting = [c for c in cands if c[2].fits]
        if not fitting:
            tried = ", ".join(f"({dp},{tp},{pp})" for (dp, tp, pp), _, _ in cands) or "none legal"
            raise HexicoreError(f"model {problem.model.name!r} fits on no symmetric (DP,TP,PP) arrangement of the "
                                f"cluster (tried {tried})", field="model")
        (dp, tp, pp), plan, est = min(fitting, key=lambda c: (c[2].iteration_s, c[0]))
        return plan.with_solver({"name": self.name, "params": {"dp": dp, "tp": tp, "pp": pp},
                                 "status": "HEURISTIC", "bound": None,
                                 "candidates": len(cands), "fitting": len(fitting)})


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="megatron", factory=MegatronSolver,
                     description="symmetric Megatron DP x TP x PP baseline, best by the cost model")
