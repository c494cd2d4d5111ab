"""The state of one HexiScale search (§4.4): the problem, the plugins built by name, the stage
tables, the caches and the moving averages that steer the cut (:class:`SearchContext`), and the
pieces of the search that read or update that state: the numbers of pipelines to try, the cut
to try next, a layout's PIPELINE-TIME under the schedule options and the options it fits.
:func:`make_context` builds it from a :class:`~hexicore.planner.problem.Problem`; a scored plan
is a :class:`Candidate` (``INF``: one that does not fit)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Sequence

from hexicore.core.device_graph import DeviceGraph
from hexicore.core.errors import HexicoreError
from hexicore.core.estimate import Estimate
from hexicore.core.plan import Plan
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost import GIB, CostModel
from hexicore.cost.precision import SHARDED_PARTS, state_bytes
from hexicore.planner.partition.cut import Partitioner, Refiner, StageOrderer
from hexicore.planner.pricing import ScheduleBook, is_auto, options, timed_cost
from hexicore.planner.problem import Problem
from hexicore.planner.search.search_config import SearchConfig
from hexicore.planner.search.workers import available_cores
from hexicore.planner.stage_layout.batch import affine_time
from hexicore.planner.stage_layout.stage_table import StageLayout, StageTable, layout_pipeline

INF = math.inf
#: the best distinct candidates each training setting keeps for the final exact pricing: the
#: search's model errs by a few percent between schedules (a V-shaped or greedy order against
#: 1F1B's), so its runners-up may be faster exactly
POOL = 3


@dataclass(frozen=True)
class Candidate:
    """A scored plan; ``origin`` says where it came from (``search``, ``seed:megatron``, ...)."""

    score: float
    plan: Plan | None
    estimate: Estimate | None
    origin: str
    layouts: tuple[StageLayout, ...] = ()
    info: dict = field(default_factory=dict, compare=False)


def layout_key(plan: Plan) -> tuple:
    """``plan``'s layout up to devices swapped inside a machine (they share its GPU type and its
    links, so such plans price alike): per pipeline its batch, schedule and per stage the
    machines of its devices and its layers, the pipelines in any order. The pool keeps one plan
    of each (on 24 GPUs of three types, every option on, two of a setting's three kept plans and
    three of the six priced exactly were one layout, its devices permuted)."""
    def stage(s: Any) -> tuple:
        return tuple(sorted(plan.cluster.device(d).machine for d in s.devices)), s.layers

    return tuple(sorted((p.batch, repr(p.schedule), tuple(stage(s) for s in p.stages)) for p in plan.pipelines))


def state_gb(problem: Problem, sharded_only: bool = False) -> float:
    """Training state of the whole model (weights, gradients, optimizer) in GiB (the cost
    model's precision recipe, :func:`hexicore.cost.precision.state_bytes`, if it has one);
    ``sharded_only``: the parts ``train.zero`` shards."""
    probe = getattr(problem.cost, "state_bytes", None)
    per = probe(problem.train) if probe is not None else state_bytes(problem.train.dtype)
    parts = per.parts()
    keep = SHARDED_PARTS[problem.train.zero_stage] if sharded_only else tuple(parts)
    return problem.model.total_params() * sum(parts[k] for k in keep) / GIB


@dataclass
class SearchContext:
    """Per-solve state: the problem, plugins built by name, caches, the moving averages."""

    problem: Problem
    config: SearchConfig
    table: StageTable
    partitioner: Partitioner
    refiner: Refiner | None
    orderer: StageOrderer
    graph: DeviceGraph
    micro_batches: int
    degrees: tuple[int, ...]
    phase2_cache: dict = field(default_factory=dict)
    layout_cache: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)
    ema_dp: float | None = None
    ema_pp: float | None = None
    evaluated: int = 0
    book: ScheduleBook | None = None  # set when pipelines are priced by their schedules
    exact_cost: CostModel | None = None  # the cost model the final plan is priced with (the search's is modelled)
    options: tuple[ScheduleRef, ...] = ()  # the schedules a pipeline may get (schedule=auto: several)
    tables: dict = field(default_factory=dict)  # per option: a StageTable with its memory caps
    auto_best: Candidate | None = None  # schedule=auto: best candidate with chosen schedules
    dp_tables: dict = field(default_factory=dict)  # train.zero > 0: per number of pipelines, its tables
    parts_cache: dict = field(default_factory=dict)  # phase 1 per (D_dp, cut, shifts, seed)
    class_ids: dict = field(default_factory=dict)  # machine class -> small id (phase 2's shared_phase2)
    workers: int = 1  # processes the search may use (hexicore.planner.search.prefetch)
    ahead: dict = field(default_factory=dict)  # ((part key, seed) -> layout) computed ahead (prefetch.walk_ahead)
    choice: int = 0  # which training setting this context prices: 0 = problem.train, i = train_options[i - 1]
    others: tuple["SearchContext", ...] = ()  # the lead context's contexts for problem.train_options
    best_score: float = INF  # the least score assembled under this context's training setting
    best_found: Candidate | None = None  # the candidate of that score (a walk's anchor)
    pool: list = field(default_factory=list)  # the POOL best distinct candidates assembled here (finalize's extra)
    side_best: Candidate | None = None  # the lead's best candidate under the other training settings
    losses: int = 0  # candidates in a row this (other) setting lost by far on (candidate.other_settings)
    cut_misses: set = field(default_factory=set)  # numbers of pipelines where neither cut fitted (candidate.two_phase)

    def keep(self, candidate: Candidate) -> None:
        """Remember ``candidate`` among the :data:`POOL` best distinct plans assembled under this
        context (the search's model ranks them; the final pricing re-prices them exactly)."""
        if candidate.plan is None or candidate.score == INF:
            return
        if len(self.pool) >= POOL and candidate.score >= self.pool[-1].score:
            return
        key = layout_key(candidate.plan)
        same = [c for c in self.pool if layout_key(c.plan) == key]
        if same and same[0].score <= candidate.score:
            return
        self.pool = sorted([c for c in self.pool if c not in same] + [candidate], key=lambda c: c.score)[:POOL]

    def track_side(self, candidates: Sequence[Candidate]) -> None:
        """Other training settings: remember the best candidate (the lead's walk ignores them)."""
        for c in candidates:
            if c.plan is not None and (self.side_best is None or c.score < self.side_best.score):
                self.side_best = c

    def steering(self, best: Candidate) -> Candidate:
        """The candidate the walk moves around: the lead setting's best, or where nothing fits
        the lead setting yet, the best under the others."""
        return best if best.score < INF or self.side_best is None else self.side_best

    def contexts(self) -> tuple["SearchContext", ...]:
        """This (lead) context and those of the other training settings, by ``choice``."""
        return (self,) + self.others

    def of(self, candidate: Candidate) -> "SearchContext":
        """The context whose training setting ``candidate`` was assembled under."""
        return self.contexts()[candidate.info.get("choice", 0)]

    @cached_property
    def roomy(self) -> "SearchContext":
        """The context whose setting leaves a stage the most memory (the highest ZeRO stage, then
        the smallest micro-batch): phase 2 lays a part out there when the lead's memory holds
        no layout of it."""
        return min(self.contexts(), key=lambda c: (-c.problem.train.zero_stage, c.problem.train.micro_batch))

    @cached_property
    def machine_graph(self) -> DeviceGraph:
        """Machines as nodes (:meth:`hexicore.core.device_graph.DeviceGraph.machines_of`)."""
        return DeviceGraph.machines_of(self.problem.cluster)

    @property
    def auto(self) -> bool:
        """``schedule=auto``: several schedule options, chosen per pipeline."""
        return len(self.options) > 1

    @property
    def cost(self) -> CostModel:
        """The cost model the search prices with (the stage table's; modelled under a schedule book)."""
        return self.table.cost

    def at_pipelines(self, d_dp: int) -> "SearchContext":
        """Under ``train.zero`` > 0 a stage's memory depends on the number of pipelines (the shard
        count): point ``self``'s stage tables at ``d_dp`` (their caps; times and hops are shared).
        Without ZeRO nothing changes. Caches keyed by ``n_mb_max`` already differ per ``d_dp``."""
        if self.problem.train.zero_stage == 0 or self.table.dp == d_dp:
            return self
        self.dp_tables.setdefault(self.table.dp, self.tables)
        if d_dp not in self.dp_tables:
            self.dp_tables[d_dp] = {o: t.variant(dp=d_dp) for o, t in self.tables.items()}
        self.tables = self.dp_tables[d_dp]
        self.table = self.tables[self.options[0]] if self.options else self.table.variant(dp=d_dp)
        return self

    def pipeline_time(self, layout: StageLayout, n_mb_max: int | None = None, rank_only: bool = False,
                      choose: bool = False) -> Callable[[int], float]:
        """PIPELINE-TIME(n_mb) of a layout: with a schedule book the fastest option's modelled time
        (:mod:`hexicore.planner.pricing`), else the cost model's timer if it has one, else App. A.
        ``rank_only`` (phase 2 ranking orders and TP menus): App. A's closed form with a schedule
        book too — thousands of layouts, cheap; :func:`hexicore.planner.search.candidate.assemble`
        prices each candidate's pipelines by their schedules. ``choose``: the fastest of all options (schedule=auto), else the first."""
        if self.book is not None and not rank_only:
            opts = self.variants(layout, self.micro_batches if n_mb_max is None else n_mb_max, choose)
            return lambda n: min((self.book.model(o, lay.stage_s, lay.hop_s, n) for o, lay in opts), default=INF)
        timer = getattr(self.cost, "pipeline_timer", None)
        if timer is None or self.book is not None:
            return affine_time(*layout.fill_step())
        sched, mb = self.problem.schedule, self.problem.train.micro_batch
        return lambda n: timer(layout.pipeline(n * mb, sched), layout.stage_s, layout.hop_s, n)

    def variants(self, layout: StageLayout, n_mb_max: int, choose: bool = False) -> list[tuple[ScheduleRef, StageLayout]]:
        """The options a layout may run under, each with a layout that fits the option's memory:
        the layout itself where its layers fit the option's peak activations, else its stages
        re-laid out under the option's caps; options that fit no way are left out (cached).
        ``choose``: every option, else the first only. An option that needs more ranks than the
        layout has is left out where it is one of several (``choose``) or names no schedule to
        price fewer ranks as; else it stays, priced as that one (``Pricing.fewer_ranks``, as
        every plan check prices it), so a one-rank pipeline is a candidate under Hanayo alone."""
        key = ("variants", layout.stages, layout.layers, n_mb_max, choose)
        if key not in self.layout_cache:
            out = []
            for o in self.options if choose else self.options[:1]:
                if not self.book.usable(o, len(layout.stages)) and \
                        (choose or self.book.schedule(o).pricing.fewer_ranks is None):
                    continue
                table = self.tables[o]
                lay = layout_pipeline(table, layout.stages, n_mb_max, layout.layers) or \
                    layout_pipeline(table, layout.stages, n_mb_max)
                if lay is not None:
                    out.append((o, lay))
            self.layout_cache[key] = out
        return self.layout_cache[key]

    def least_micro_batches(self, layout: StageLayout, n_mb_max: int, choose: bool = False) -> int:
        """The fewest micro-batches a layout's pipeline runs with under any of its options
        (``Pricing.micro_batches_per_rank``; 1 without a schedule book)."""
        if self.book is None:
            return 1
        ranks = len(layout.stages)
        return min((self.book.min_micro_batches(o, ranks) for o, _ in self.variants(layout, n_mb_max, choose)),
                   default=1)

    def track_auto(self, candidates: Sequence[Candidate]) -> None:
        """schedule=auto: remember the best candidate whose schedules were chosen."""
        for c in candidates:
            if self.auto_best is None or c.score < self.auto_best.score:
                self.auto_best = c

    def pipeline_counts(self) -> list[int]:
        """:meth:`dp_range` of every training setting's context together (the lead's error where
        none has any)."""
        found: set[int] = set()
        error = None
        for c in self.contexts():
            try:
                found.update(c.dp_range())
            except HexicoreError as exc:
                error = error or exc
        if not found:
            raise error
        return sorted(found)

    def dp_range(self) -> list[int]:
        """Candidate numbers of pipelines: ``dp_min..dp_max``, bounded by the devices, the
        micro-batches and memory (every pipeline holds a whole model's training state)."""
        p, config = self.problem, self.config
        n = len(p.cluster.devices)
        if config.dp_max is not None and config.dp_max > n:
            raise HexicoreError(f"dp_max={config.dp_max} exceeds the cluster's {n} devices", field="solver.dp_max")
        usable = sum(d.memory_gb - getattr(p.cost, "reserve_gb", 0.0) for d in p.cluster.devices)
        by_memory = max(1, int(usable // state_gb(p)))
        if p.train.zero_stage:  # sharded parts are held once in all, the rest once per pipeline
            shared = state_gb(p, sharded_only=True)
            copies = state_gb(p) - shared
            by_memory = n if copies <= 0 else max(1, int((usable - shared) // copies))
        hi = min(n, self.micro_batches, by_memory, config.dp_max or n)
        lo = config.dp_min
        if lo > hi:
            raise HexicoreError(f"no number of pipelines in [{lo}, {config.dp_max or n}] is possible (at most {hi}: "
                                f"{n} devices, {self.micro_batches} micro-batches, memory for {by_memory} model copies)",
                                field="solver.dp_min")
        return list(range(lo, hi + 1))

    def choose_objective(self, rng: random.Random) -> str:
        """§4.4: "at the end of each iteration we simulate the DP communication and pipeline
        execution costs and update their moving averages; the next iteration's partition option
        follows them". We compare the two communication terms the cut decides: the DP sync time
        (``ema_dp``) and the slowest pipeline's hop time (``ema_pp``, micro-batches x hops). DP
        dominating -> ``max_cut`` (DP gets the fast links), else ``min_cut`` (the pipelines get
        them). With probability ``explore`` the other option is tried."""
        pick = "max_cut" if (self.ema_dp or 0.0) > (self.ema_pp or 0.0) else "min_cut"
        if rng.random() < self.config.explore:
            pick = "min_cut" if pick == "max_cut" else "max_cut"
        return pick

    def update_averages(self, dp_s: float, pp_s: float) -> None:
        """§4.4's moving averages of the DP sync time and the slowest pipeline's hop time (weight
        ``config.ema`` on the newest), which steer the next cut (:meth:`choose_objective`)."""
        a = self.config.ema
        self.ema_dp = dp_s if self.ema_dp is None else a * dp_s + (1 - a) * self.ema_dp
        self.ema_pp = pp_s if self.ema_pp is None else a * pp_s + (1 - a) * self.ema_pp


def shared_table(memo: dict | None, table: StageTable) -> StageTable:
    """``table`` with the caches of an earlier search's table in ``memo`` when both price the same
    machines under the same model, train, cost model and schedule (a sub-cluster of whole
    machines differs only in its excluded devices) and the cost model is ``class_priced``: every
    cache key is then a machine class, a device group or a stage count, the same in both."""
    if memo is None or not getattr(table.cost, "class_priced", False):
        return table
    key = (table.model, table.train, table.schedule, table.dp, table.cluster.machines, table.cluster.links)
    old = memo.get(key)
    if old is None or old.cost is not table.cost:
        memo[key] = table
        return table
    return replace(old, cluster=table.cluster)


def make_context(problem: Problem, config: SearchConfig, memo: dict | None = None) -> SearchContext:
    """Build the plugins by name from the registry (docs/plugins.md) and the caches (``memo``:
    stage tables shared across the searches of one allocation, :func:`shared_table`); the
    contexts of ``problem.train_options`` share the lead's device graph, plugins, schedule
    book and phase-1 cache (none of them depends on the training setting)."""
    reg = problem.registry
    if reg is None:
        raise HexicoreError("the hexiscale search needs problem.registry to build its plugins", field="solver")
    lead = _context(problem, config, memo, None)
    others = tuple(replace(_context(replace(problem, train=train, train_options=()), config, memo, lead), choice=i + 1)
                   for i, train in enumerate(problem.train_options))
    lead.others = others
    return lead


def _context(problem: Problem, config: SearchConfig, memo: dict | None, lead: SearchContext | None) -> SearchContext:
    """One training setting's context (the lead's graph, plugins and book where given)."""
    reg = problem.registry
    cost = problem.cost if config.cost_model is None else reg.create("cost_model", config.cost_model)
    if lead is None:
        book = problem.pricing if config.cost_model is None else None  # the book problem.cost is priced with
        if book is None and is_auto(problem.schedule):
            book = ScheduleBook(reg)
        m = problem.model
        shared = {"partitioner": reg.create("partitioner", config.partitioner),
                  "refiner": reg.create("refiner", config.refiner) if config.refiner else None,
                  "orderer": reg.create("orderer", config.orderer, tau=config.tau),
                  "graph": problem.cluster.device_graph(),
                  "degrees": tuple(d for d in range(1, config.max_tp + 1) if m.tp_divides(d)),
                  "workers": config.workers or available_cores()}
    else:
        book = lead.book
        shared = {"partitioner": lead.partitioner, "refiner": lead.refiner, "orderer": lead.orderer,
                  "graph": lead.graph, "degrees": lead.degrees, "workers": lead.workers,
                  "parts_cache": lead.parts_cache, "class_ids": lead.class_ids}
    exact, opts = cost, (problem.schedule,)
    if book is not None:  # pipelines priced by their schedules: modelled in the search, exact at the end
        opts = options(problem.schedule)
        exact, cost = timed_cost(cost, book), timed_cost(cost, book, modelled=True)
    table = shared_table(memo, StageTable(problem.cluster, problem.model, problem.train, cost, opts[0],
                                          least_fn=book.least if book is not None else None))
    tables = {o: table if i == 0 else table.variant(schedule=o)
              for i, o in enumerate(opts)}
    context = SearchContext(problem, config, table, micro_batches=problem.train.micro_batches, book=book,
                            exact_cost=exact, options=opts, tables=tables, **shared)
    if lead is not None and "machine_graph" in lead.__dict__:
        context.__dict__["machine_graph"] = lead.machine_graph
    return context
