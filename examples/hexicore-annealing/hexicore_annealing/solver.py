"""Solver ``annealing``: simulated annealing over partitions of the devices into pipelines.

A state assigns every device to one of ``D_dp`` pipelines. A move sends one device to another
pipeline or swaps two devices. Each pipeline is laid out by hexicore's own phase 2 (groups,
TP per machine, exact layer allocation) and the batch is split by hexicore's batch allocation;
the plan is scored by the configured cost model (out of memory = infinity). Worse states are
accepted with probability ``exp(-delta / T)``, ``T`` cooling geometrically (Kirkpatrick et al.
1983). The best state seen is returned; the symmetric ``megatron`` plan is the starting point
when it exists, so the result is never worse than it.

Only hexicore's public pieces are used: :func:`hexicore.planner.search.context.make_context`, ``phase2`` and
``assemble``, and :class:`hexicore.planner.search.search_config.SearchConfig` for their defaults.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Optional

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.search import INF, Candidate, SearchConfig, assemble, make_context, phase2


@dataclass
class AnnealingSolver:
    steps: int = 300
    temperature: float = 0.05
    cooling: float = 0.99
    d_dp: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise HexicoreError(f"steps must be a positive integer, got {self.steps!r}", field="solver.steps")
        if not 0 < self.cooling <= 1:
            raise HexicoreError(f"cooling must be in (0, 1], got {self.cooling!r}", field="solver.cooling")
        if self.temperature < 0:
            raise HexicoreError("temperature must be >= 0", field="solver.temperature")
        if self.d_dp is not None and (isinstance(self.d_dp, bool) or not isinstance(self.d_dp, int) or self.d_dp < 1):
            raise HexicoreError(f"d_dp must be a positive integer or null (try 1..4), got {self.d_dp!r}",
                                field="solver.d_dp")

    # ------------------------------------------------------------------ scoring
    def _score(self, ctx, parts: list[list[str]], seed: int) -> Candidate:
        parts = [sorted(p) for p in parts if p]
        n_mb_max = ctx.micro_batches - (len(parts) - 1)
        if n_mb_max < 1:
            return Candidate(INF, None, None, "annealing")
        layouts = []
        for i, p in enumerate(parts):
            k = len({ctx.problem.cluster.device(d).machine for d in p})
            lay = phase2(ctx, p, k, n_mb_max, seed + i)
            if lay is None:
                return Candidate(INF, None, None, "annealing")
            layouts.append(lay)
        return assemble(ctx, layouts, "annealing", {"d_dp": len(parts)})

    def _start(self, problem: Problem, d_dp: int, rng: random.Random) -> list[list[str]]:
        """Whole machines dealt round-robin by decreasing TFLOPS (keeps TP groups intact)."""
        machines: dict[str, list[str]] = {}
        for d in problem.cluster.devices:
            machines.setdefault(d.machine, []).append(d.id)
        order = sorted(machines.values(), key=lambda ds: -sum(problem.cluster.device(x).tflops for x in ds))
        parts: list[list[str]] = [[] for _ in range(d_dp)]
        for i, ds in enumerate(order):
            parts[i % d_dp].extend(ds)
        # too few machines for d_dp pipelines: split the largest parts device by device
        while any(not p for p in parts):
            big = max(parts, key=len)
            empty = next(p for p in parts if not p)
            empty.append(big.pop())
        return parts

    def _neighbour(self, parts: list[list[str]], rng: random.Random) -> list[list[str]]:
        new = [list(p) for p in parts]
        a = rng.randrange(len(new))
        if len(new) == 1 or not new[a]:
            return new
        b = rng.choice([i for i in range(len(new)) if i != a])
        i = rng.randrange(len(new[a]))
        if rng.random() < 0.5 and new[b]:
            j = rng.randrange(len(new[b]))
            new[a][i], new[b][j] = new[b][j], new[a][i]
        elif len(new[a]) > 1:
            new[b].append(new[a].pop(i))
        return new

    # -------------------------------------------------------------------- solve
    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        rng = random.Random(seed)
        deadline = time.monotonic() + time_limit if time_limit else math.inf
        ctx = make_context(problem, SearchConfig())
        n = len(problem.cluster.devices)
        if self.d_dp is not None and self.d_dp > min(n, ctx.micro_batches):  # _start would never fill every part
            raise HexicoreError(f"d_dp={self.d_dp} pipelines need as many devices and micro-batches; there are {n} "
                                f"devices and {ctx.micro_batches} micro-batches", field="solver.d_dp")
        counts = [self.d_dp] if self.d_dp else list(range(1, min(4, n, ctx.micro_batches) + 1))
        best = Candidate(INF, None, None, "annealing")
        try:
            seed_plan = problem.registry.create("solver", "megatron").solve(problem, seed=seed)
            start = [list(p.devices) for p in seed_plan.pipelines]
            if len(start) in counts:
                best = self._score(ctx, start, seed)
        except HexicoreError:
            pass
        for c_i, d_dp in enumerate(counts):
            cur_parts = self._start(problem, d_dp, rng)
            cur = self._score(ctx, cur_parts, seed)
            scale = cur.score if cur.score < INF else 1.0
            temp = self.temperature * scale
            for step in range(self.steps):
                if time.monotonic() > deadline:
                    break
                cand_parts = self._neighbour(cur_parts, rng)
                cand = self._score(ctx, cand_parts, seed)
                delta = cand.score - cur.score
                if delta <= 0 or (temp > 0 and cand.score < INF and rng.random() < math.exp(-delta / temp)):
                    cur_parts, cur = cand_parts, cand
                if cur.score < best.score:
                    best = cur
                temp *= self.cooling
                if step % 20 == 0:
                    shown = f"{best.score:.3f} s" if best.score < INF else "none fits yet"
                    progress(f"annealing: D_dp={d_dp} step {step}/{self.steps}, best {shown}",
                             (c_i + step / self.steps) / len(counts))
        if best.plan is None:
            raise HexicoreError(f"annealing found no plan that fits {problem.model.name!r} on "
                                f"{problem.cluster.name!r}", field="model")
        return best.plan.with_solver({"name": "annealing", "status": "HEURISTIC", "bound": None,
                                      "params": {"steps": self.steps, "temperature": self.temperature,
                                                 "cooling": self.cooling, "d_dp": self.d_dp},
                                      "d_dp": len(best.plan.pipelines), "seed": seed})
