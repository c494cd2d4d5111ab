"""Baseline solvers for side-by-side tables (the baselines of the HexiScale paper, §5):

* ``metis_like`` — Metis (ATC'24): one model layout, stages of uniform (dp, tp) groups laid over
  the devices in device-type order (every order of the types is tried), layers proportional to
  the stages' speed and re-partitioned (at most 3 times) where a stage runs out of memory;
* ``galvatron_like`` — Galvatron: symmetric DP x TP x PP over the devices in cluster order, the
  layers of the stages balanced by a dynamic programme over memory (minimise the largest stage
  memory, heterogeneity-blind for time);
* ``fsdp`` — fully sharded data parallelism (ZeRO-3): one single-GPU pipeline per rank with the
  whole model, per-rank batch proportional to speed, state sharded over all ranks (even or
  proportional to memory).

Each returns the fastest of its own candidates that fits, by the problem's cost model. The
symmetric ones use every device where some (dp, tp, pp) of that count is legal, else the most
devices that have one (:func:`~hexicore.planner.baselines.symmetric.layout_devices`, the slowest idle).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.cost.base import BoundCostModel
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.planner.allocation.sub_clusters import on_devices_for_objective
from hexicore.planner.baselines.symmetric import (factorisations, layout_devices, least_layers, least_micro_batches,
                                                  legal, symmetric_plan)
from hexicore.planner.fastest import priced_where_it_could_win
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.stage_layout.layers import layer_ranges
from hexicore.planner.stage_layout.pipeline_fit import holds_chunks
from hexicore.planner.stage_layout.stage_table import StageTable
from hexicore.planner.train_choice import at_stage

METIS_REPARTITIONS = 3  # Metis' LayerLoadBalancer re-partitions at most three times


def with_layers(plan: Plan, counts: list[int]) -> Plan:
    """The same stages with layer counts ``counts`` (shared by every pipeline)."""
    ranges = layer_ranges(counts)
    pipes = tuple(replace(p, stages=tuple(replace(s, layers=r) for s, r in zip(p.stages, ranges)))
                  for p in plan.pipelines)
    return replace(plan, pipelines=pipes)


def stage_caps(table: StageTable, plan: Plan) -> list[int]:
    """Per stage index, the most layers every replica of that stage holds in memory."""
    pp = len(plan.pipelines[0].stages)
    n_mb = plan.pipelines[0].n_micro_batches(plan.train.micro_batch)
    return [min(table.cap(p.stages[j].devices, j == 0, j == pp - 1, table.in_flight(pp, j, n_mb))
                for p in plan.pipelines) for j in range(pp)]


def proportional(total: int, weights: list[float], caps: list[int], least: list[int] | None = None) -> list[int] | None:
    """Largest-remainder split of ``total`` layers proportional to ``weights`` (>= ``least[j]``
    each, default 1), then up to three re-partitions moving the overflow of capped stages to the
    others."""
    n = len(weights)
    least = least or [1] * n
    if sum(max(c, 0) for c in caps) < total or any(c < k for c, k in zip(caps, least)) or sum(least) > total:
        return None
    raw = [total * w / sum(weights) for w in weights]
    out = [max(k, int(r)) for k, r in zip(least, raw)]
    for j in sorted(range(n), key=lambda j: raw[j] - int(raw[j]), reverse=True)[:max(0, total - sum(out))]:
        out[j] += 1
    while sum(out) > total:  # the minimum per stage lifted some: take them back, never below it
        out[max((j for j in range(n) if out[j] > least[j]), key=lambda j: (out[j] - raw[j], out[j]))] -= 1
    for _ in range(METIS_REPARTITIONS):
        if all(o <= c for o, c in zip(out, caps)):
            break
        out = [min(o, c) for o, c in zip(out, caps)]
        free = [j for j in range(n) if out[j] < caps[j]]
        left = overflow = total - sum(out)
        for j in sorted(free, key=lambda j: (-weights[j], j)):  # the overflow, by speed share
            give = min(caps[j] - out[j], left, math.ceil(overflow * weights[j] / sum(weights[f] for f in free)))
            out[j] += give
            left -= give
    return out if sum(out) == total and all(k <= o <= c for o, c, k in zip(out, caps, least)) else None


def best_fitting(problem: Problem, cands: list[tuple[dict, Plan]], name: str) -> Plan:
    """The fastest candidate that fits, priced only where it could win
    (:func:`hexicore.planner.fastest.priced_where_it_could_win`)."""
    held = [(params, p) for params, p in cands
            if all(holds_chunks(problem.pricing, q) for q in p.pipelines)]  # a layer per chunk of the schedule
    scored = priced_where_it_could_win(problem, held)
    fitting = scored.fitting
    if not fitting:
        short = f", {len(cands) - len(held)} with fewer layers than chunks on a rank" if len(held) < len(cands) else ""
        raise HexicoreError(f"{name}: no candidate fits in memory ({len(cands)} tried{short})", field="model")
    params, plan, est = min(fitting, key=lambda c: c[2].iteration_s)
    return plan.with_solver({"name": name, "params": params, "status": "HEURISTIC", "bound": None,
                             "candidates": len(cands), "priced": scored.priced, "fitting": len(fitting)})


def _table(problem: Problem, dp: int = 1) -> StageTable:
    """Cost pieces for plans of ``dp`` pipelines (the ZeRO shard count of the memory caps)."""
    book = problem.pricing
    return StageTable(problem.cluster, problem.model, problem.train, problem.cost, problem.schedule, dp=dp,
                      least_fn=book.least if book is not None else None)


@dataclass(frozen=True)
class MetisLikeSolver:
    """Metis-style search: device-type orders x uniform (dp, tp, pp) x speed-proportional layers.
    ``zero`` (``solver.zero=1``): the ZeRO stage used whatever ``train.zero`` says."""

    name: str = "metis_like"
    zero: int | None = None

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        """:meth:`on_all` of the problem's devices, or of the sub-clusters that best meet its
        objective (:func:`hexicore.planner.allocation.sub_clusters.on_devices_for_objective`)."""
        return on_devices_for_objective(problem, lambda sub, report: self.on_all(sub, progress=report),
                                        progress=progress)

    def on_all(self, problem: Problem, *, progress: Progress = no_progress) -> Plan:
        problem = at_stage(problem, self.zero)
        tables, cl = {}, problem.cluster
        types = sorted({d.gpu.name for d in cl.devices})
        cands = []
        for perm in itertools.permutations(types):
            devices = layout_devices(problem, [d.id for t in perm for d in cl.devices if d.gpu.name == t])
            for dp, tp, pp in factorisations(len(devices)):
                if not legal(problem, dp, tp, pp):
                    continue
                plan = symmetric_plan(problem, dp, tp, pp, devices)
                speed = [min(s.tp * min(cl.device(d).tflops for d in s.devices)
                             for s in (p.stages[j] for p in plan.pipelines)) for j in range(pp)]
                table = tables.setdefault(dp, _table(problem, dp))
                counts = proportional(problem.model.layers, speed, stage_caps(table, plan), least_layers(problem, pp))
                if counts is not None:
                    cands.append(({"order": list(perm), "dp": dp, "tp": tp, "pp": pp}, with_layers(plan, counts)))
        progress("metis_like: evaluated device-type orders x (dp, tp, pp)", 1.0)
        return best_fitting(problem, cands, self.name)


def memory_balanced(table: StageTable, plan: Plan, least: list[int] | None = None) -> list[int] | None:
    """Galvatron's memory-balanced stages: a DP over (stage, layers so far) minimising the
    largest per-device stage memory (GB), every stage within its devices' capacity and holding
    at least ``least[j]`` layers (default 1)."""
    L, pp = plan.model.layers, len(plan.pipelines[0].stages)
    n_mb = plan.pipelines[0].n_micro_batches(plan.train.micro_batch)
    priced = BoundCostModel.of_plan(table.cost, plan)

    def mem(j: int, l: int) -> float:
        worst = 0.0
        for p in plan.pipelines:
            s = p.stages[j]
            gb = priced.stage_memory_gb(s.devices, l, first=j == 0, last=j == pp - 1,
                                        in_flight=table.in_flight(pp, j, n_mb), dp=len(plan.pipelines))
            if gb > min(plan.cluster.device(d).memory_gb for d in s.devices):
                return float("inf")
            worst = max(worst, gb)
        return worst

    least = least or [1] * pp
    best = {0: (0.0, [])}
    for j in range(pp):
        nxt: dict[int, tuple[float, list[int]]] = {}
        for used, (score, counts) in best.items():
            for l in range(least[j], L - used - sum(least[j + 1:]) + 1):
                s = max(score, mem(j, l))
                if s == float("inf"):
                    break
                if used + l not in nxt or s < nxt[used + l][0]:
                    nxt[used + l] = (s, counts + [l])
        best = nxt
    return best[L][1] if L in best else None


@dataclass(frozen=True)
class GalvatronLikeSolver:
    """Galvatron-style: symmetric DP x TP x PP, memory-balanced stages, best by the cost model.
    ``zero`` (``solver.zero=1``): the ZeRO stage used whatever ``train.zero`` says."""

    name: str = "galvatron_like"
    zero: int | None = None

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        """:meth:`on_all` of the problem's devices, or of the sub-clusters that best meet its
        objective (:func:`hexicore.planner.allocation.sub_clusters.on_devices_for_objective`)."""
        return on_devices_for_objective(problem, lambda sub, report: self.on_all(sub, progress=report),
                                        progress=progress)

    def on_all(self, problem: Problem, *, progress: Progress = no_progress) -> Plan:
        problem = at_stage(problem, self.zero)
        table, cands = _table(problem), []
        devices = layout_devices(problem)
        for dp, tp, pp in factorisations(len(devices)):
            if legal(problem, dp, tp, pp):
                plan = symmetric_plan(problem, dp, tp, pp, devices)
                counts = memory_balanced(table, plan, least_layers(problem, pp))
                if counts is not None:
                    cands.append(({"dp": dp, "tp": tp, "pp": pp}, with_layers(plan, counts)))
        progress("galvatron_like: evaluated (dp, tp, pp) with memory-balanced stages", 1.0)
        return best_fitting(problem, cands, self.name)


def speed_shares(total: int, speeds: list[float], least: int = 1) -> list[int]:
    """``total`` micro-batches split proportional to ``speeds``, at least ``least`` each (largest
    remainder); ``len(speeds) * least <= total``."""
    raw = [total * v / sum(speeds) for v in speeds]
    out = [max(least, int(r)) for r in raw]
    while sum(out) > total:  # take back from those above their minimum, most over their share first
        out[max((j for j in range(len(out)) if out[j] > least), key=lambda j: (out[j] - raw[j], out[j]))] -= 1
    for j in sorted(range(len(out)), key=lambda j: raw[j] - out[j], reverse=True)[:total - sum(out)]:
        out[j] += 1
    return out


@dataclass(frozen=True)
class FsdpSolver:
    """Fully sharded data parallelism (ZeRO-3, as PyTorch FSDP): one single-GPU replica per
    device (the fastest ``min(devices, micro-batches / k)``, where the schedule needs ``k``
    micro-batches on one rank: 2 for DualPipeV, else 1), each device's batch proportional to its
    peak FLOP/s; the training state is sharded over all of them (``train.zero=3``), evenly or in
    proportion to each device's memory (``zero_split=memory``, Cephalo-style): both are priced
    and the fastest that fits is returned. ``hybrid`` (``solver.hybrid=true``): hybrid sharding
    instead (``zero_scope=machine``, PyTorch's HSDP): the state is sharded among the replicas of
    one machine and replicated across machines (:mod:`hexicore.cost.sharding`)."""

    name: str = "fsdp"
    hybrid: bool = False

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        """:meth:`on_all` of the problem's devices, or of the sub-clusters that best meet its
        objective (:func:`hexicore.planner.allocation.sub_clusters.on_devices_for_objective`)."""
        return on_devices_for_objective(problem, lambda sub, report: self.on_all(sub, progress=report),
                                        progress=progress)

    def on_all(self, problem: Problem, *, progress: Progress = no_progress) -> Plan:
        t, L = problem.train, problem.model.layers
        mbs = t.micro_batches
        least = least_micro_batches(problem, 1)
        devs = sorted(problem.cluster.devices, key=lambda d: (-d.tflops, -d.memory_gb))[:max(1, mbs // least)]
        counts = speed_shares(mbs, [d.tflops for d in devs], least=min(least, mbs))
        if not isinstance(self.hybrid, bool):
            raise HexicoreError(f"expected true or false, got {self.hybrid!r}", field="solver.hybrid")
        scope = "machine" if self.hybrid else "all"
        cands = []
        for split in ("even", "memory"):
            train = replace(t, zero=3, zero_split=split, zero_scope=scope)
            pipes = tuple(Pipeline(k * t.micro_batch, (Stage((d.id,), 1, (0, L)),), dict(problem.schedule))
                          for d, k in zip(devs, counts))
            cands.append(({"ranks": len(devs), "zero": 3, "zero_split": split, "zero_scope": scope},
                          Plan(problem.model, problem.cluster, train, pipes)))
        progress("fsdp: one ZeRO-3 replica per GPU" + (", sharded per machine" if self.hybrid else ""), 1.0)
        return best_fitting(problem, cands, self.name)


@hookimpl
def hexicore_solvers():
    yield PluginSpec(kind="solver", name="metis_like", factory=MetisLikeSolver,
                     description="Metis (ATC'24)-style baseline: type-ordered uniform (dp, tp) stages, proportional layers")
    yield PluginSpec(kind="solver", name="galvatron_like", factory=GalvatronLikeSolver,
                     description="Galvatron-style baseline: symmetric DP x TP x PP, memory-balanced stages")
    yield PluginSpec(kind="solver", name="fsdp", factory=FsdpSolver,
                     description="fully sharded data parallelism (ZeRO-3), one replica per GPU, batch by speed")
