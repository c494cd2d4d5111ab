"""Solver ``hexiscale``: the two-phase planner of HexiScale §4 (:mod:`hexicore.planner.search`),
registered from the core through :mod:`hexicore.builtin`. Unless ``use_all_devices``, the search
runs on sub-clusters of whole machines too and the best plan under the problem's objective wins
(:mod:`hexicore.planner.allocation`). With ``schedule=auto`` the returned plan's pipelines then
try ``final_options`` (:mod:`hexicore.planner.final_schedules`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import time

from hexicore.core.fields import is_number, is_whole
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.allocation.sub_clusters import allocate
from hexicore.planner.final_schedules import reschedule
from hexicore.planner.pricing import is_auto
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.replan.diff import plan_diff
from hexicore.planner.search.loop import finish, run_search, search
from hexicore.planner.search.search_config import SearchConfig
from hexicore.planner.search.workers import available_cores


@dataclass(frozen=True)
class HexiScaleSolver:
    """``HexiScaleSolver(**params)`` with the keys of :class:`SearchConfig`. It prices every
    training setting of the problem (``train_options``: ``train.zero=auto``,
    ``train.micro_batch=auto``) inside its one search (``chooses_train``)."""

    config: SearchConfig
    name: str = "hexiscale"
    chooses_train: ClassVar[bool] = True

    @classmethod
    def from_params(cls, **params: Any) -> "HexiScaleSolver":
        return cls(SearchConfig.from_params(params))

    def solve(self, problem: Problem, *, time_limit: float | None = None, seed: int = 0,
              progress: Progress = no_progress) -> Plan:
        if time_limit is not None and (not is_number(time_limit)
                                       or time_limit <= 0):
            raise HexicoreError(f"time_limit must be a positive number of seconds or null, got {time_limit!r}",
                                field="solver.time_limit")
        if not is_whole(seed):
            raise HexicoreError(f"seed must be an integer, got {seed!r}", field="solver.seed")
        for name in self.config.seeds:  # a seed solver that is not there is refused, not skipped
            try:
                problem.registry.spec("solver", name)
            except HexicoreError as exc:
                raise HexicoreError(exc.message, field="solver.seeds") from None
        if time_limit is None:  # the search's own budget (anytime: the best plan found by then)
            time_limit = self.config.budget(len(problem.cluster.devices))
        deadline = None if time_limit is None else time.monotonic() + time_limit
        span = None if time_limit is None else time_limit * (1 - final_share(problem))  # the searches' part
        search_ends = None if deadline is None else deadline - time_limit + span
        if self.config.use_all_devices:
            plan = run_search(problem, self.config, time_limit=span, seed=seed, progress=progress,
                              prices_until=deadline)
            return reschedule(problem, plan, progress, deadline)
        memo: dict = {}  # stage tables shared by the searches on sub-clusters (search.shared_table)
        found: dict = {}  # (pipelines, train) of a searched plan -> the search, to price it exactly (finish)

        def one(sub: Problem, report: Progress) -> Plan:  # the same search on a sub-cluster, in the time left
            left = None if search_ends is None else max(1e-3, search_ends - time.monotonic())
            if found and left is not None and left < SUB_CLUSTER_SHARE * span:
                raise HexicoreError(f"{left:.2f} s left of the time budget: too little for a search of "
                                    f"{len(sub.cluster.devices)} devices", field="solver.time_limit")
            result = search(sub, self.config, time_limit=left, seed=seed, progress=report, memo=memo,
                            strict=bool(found), prices_until=deadline)
            plan = result.plan
            found[plan.pipelines, plan.train] = result
            return plan

        # a screen: a tenth of the iterations, no seed solvers (a symmetric plan of every device costs
        # much on a large cluster and says little about which machines to leave out), no polishing
        quick = replace(self.config, iterations=max(2, self.config.iterations // 10), polish_rounds=0, seeds=())

        def screen(sub: Problem, plan: Plan | None) -> Plan | None:
            """A short search (a tenth of the iterations; ``plan`` unused) under the lead training
            setting alone: sub-clusters compare alike, and cheaply (where nothing fits the lead
            setting the screen finds nothing, and the sub-cluster is left to the full searches)."""
            left = None if search_ends is None else search_ends - time.monotonic()
            if left is not None and left < SCREEN_SHARE * span:
                return None  # out of time: no screen (the sub-cluster is not searched)
            return search(replace(sub, train_options=()), quick, time_limit=left, seed=seed, progress=no_progress,
                          memo=memo, strict=True).plan

        plan = allocate(problem, one, exhaustive=self.config.allocation_exhaustive, progress=progress,
                        deadline=search_ends, screen=screen, screen_above=self.config.allocation_screen_above,
                        workers=self.config.workers or available_cores(),
                        finish=lambda p: finish(found[p.pipelines, p.train]))
        if problem.warm_start is not None and "replan" in plan.solver:  # against the cluster asked for
            plan = plan.with_solver({**plan.solver, "replan": plan_diff(problem.warm_start, plan, problem.cluster)})
        return reschedule(problem, plan, progress, deadline)


#: under a time budget, a sub-cluster's search or screen is begun only with at least this share
#: of the search's budget left (the whole cluster's always is): a search's seeding, first
#: candidates and exact pricing take their time however short its budget, so a late one
#: overruns it; and a sub-cluster's search stops at the budget even where nothing fits yet. On
#: 320 GPUs of six types (70B, batch 1024, 1F1B) the whole cluster's search takes 4.4-4.8 s of
#: the 6.4 s, and at a quarter the best neighbour (264 GPUs, 106 s against the whole cluster's
#: 115 s) was begun or not by a few milliseconds
SUB_CLUSTER_SHARE = 0.2
#: likewise for a screen (the first step's screens run in a forked process beside the whole
#: cluster's search, on the same cores: screening on to a fifth of the budget took hetero3's
#: search, Llama 30B with every option on, from 19.72 s to 20.40)
SCREEN_SHARE = 0.25
#: under a time budget, this share of it is kept for pricing the plan found exactly: the
#: search's candidates re-priced with their schedules re-chosen (:func:`finish`) and
#: ``schedule=auto``'s final options (:func:`reschedule`); the searches (and the allocation over
#: sub-clusters) have the rest. Without it a search that runs to its budget leaves the final
#: options no time (they took 0.2 s and gained 5% on a 40-GPU cluster of four types)
FINAL_SHARE = 0.15


def final_share(problem: Problem) -> float:
    """The share of the time budget kept for the exact pricing (:data:`FINAL_SHARE`): none where
    there is nothing to price after the search — a schedule whose time is the cost model's own
    formula (``problem.pricing`` is None: the search's prices are exact) and no final options.
    On 64 GPUs of eight types (Llama-2 13B, 1F1B) the kept 1.05 s of a 7 s budget went unused
    while the allocation's last step, whose 48-GPU sub-cluster holds the best plan (63.2 s
    against 65.7), was refused for want of it."""
    return 0.0 if problem.pricing is None and not is_auto(problem.schedule) else FINAL_SHARE
