"""One candidate of the HexiScale two-phase planner (HexiScale §4.2-4.3): the search state
(:class:`Context`), phase 2 and the scored plans (:class:`Candidate`) the loop of
:mod:`hexicore.planner.search` compares.

1. phase 1 — partition the device graph into ``D_dp`` parts (one per pipeline) with the
   configured partitioner, min-cut or max-cut, then the refiner (:func:`two_phase`);
2. phase 2, per part — partition it again into ``k_i`` groups of well-connected GPUs (min-cut),
   order the groups with the stage orderer (top-tau), choose each group's local strategy (TP
   degree and number of stages, inside one machine) by the cost model, and allocate layers
   exactly (:mod:`hexicore.planner.layers`; :func:`phase2`);
3. allocate the global batch over the pipelines (:mod:`hexicore.planner.batch`, gradient
   accumulation) and score the plan with the cost model, out of memory = infinity
   (:func:`assemble`); variants: :func:`aligned` layer ranges, :func:`relayout` of a given
   plan, :func:`polish` of stage boundaries.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

from hexicore.core.estimate import Estimate
from hexicore.core.plan import Plan
from hexicore.planner.batch import affine_time, allocate_batch
from hexicore.planner.partition import ordered_subgraph
from hexicore.planner.pricing import ScheduleBook
from hexicore.planner.problem import Problem
from hexicore.planner.search_config import SearchConfig
from hexicore.planner.phase1 import split
from hexicore.planner.shared_layouts import shared_phase2
from hexicore.planner.alignment import align_to, machine_contiguous
from hexicore.planner.stages import (Group, Layout, StageTable, joined, layout_pipeline,
                                     split_by_machine, tp_menus, uniform_choice, unit_pieces)

INF = math.inf


@dataclass(frozen=True)
class Candidate:
    """A scored plan; ``origin`` says where it came from (``search``, ``seed:megatron``, ...)."""

    score: float
    plan: Plan | None
    estimate: Estimate | None
    origin: str
    layouts: tuple[Layout, ...] = ()
    info: dict = field(default_factory=dict, compare=False)


@dataclass
class Context:
    """Per-solve state: the problem, plugins built by name, caches, the moving averages."""

    problem: Problem
    cfg: SearchConfig
    table: StageTable
    partitioner: Any
    refiner: Any
    orderer: Any
    graph: Any
    micro_batches: int
    degrees: tuple[int, ...]
    phase2_cache: dict = field(default_factory=dict)
    layout_cache: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)
    ema_dp: float | None = None
    ema_pp: float | None = None
    evaluated: int = 0
    book: ScheduleBook | None = None  # set when pipelines are priced by their schedules
    exact_cost: Any = None  # the cost model the final plan is priced with (the search's is modelled)
    options: tuple = ()  # ScheduleRefs a pipeline may get (schedule=auto: several)
    tables: dict = field(default_factory=dict)  # per option: a StageTable with its memory caps
    auto_best: Candidate | None = None  # schedule=auto: best candidate with chosen schedules
    dp_tables: dict = field(default_factory=dict)  # train.zero > 0: per number of pipelines, its tables
    parts_cache: dict = field(default_factory=dict)  # phase 1 per (D_dp, cut, shifts, seed)
    class_ids: dict = field(default_factory=dict)  # machine class -> small id (shared_layouts)
    workers: int = 1  # processes the search may use (hexicore.planner.prefetch)
    ahead: dict = field(default_factory=dict)  # ((part key, seed) -> layout) computed ahead (prefetch.walk_ahead)

    @cached_property
    def machine_graph(self) -> Any:
        """Machines as nodes (:meth:`hexicore.core.device_graph.DeviceGraph.machines_of`)."""
        from hexicore.core.device_graph import DeviceGraph

        return DeviceGraph.machines_of(self.problem.cluster)

    @property
    def auto(self) -> bool:
        return len(self.options) > 1

    @property
    def cost(self):
        return self.table.cost


def at_dp(ctx: Context, d_dp: int) -> Context:
    """Under ``train.zero`` > 0 a stage's memory depends on the number of pipelines (the shard
    count): point ``ctx``'s stage tables at ``d_dp`` (their caps; times and hops are shared).
    Without ZeRO nothing changes. Caches keyed by ``n_mb_max`` already differ per ``d_dp``."""
    if ctx.problem.train.zero_stage == 0 or ctx.table.dp == d_dp:
        return ctx
    ctx.dp_tables.setdefault(ctx.table.dp, ctx.tables)
    if d_dp not in ctx.dp_tables:
        ctx.dp_tables[d_dp] = {o: t.variant(dp=d_dp) for o, t in ctx.tables.items()}
    ctx.tables = ctx.dp_tables[d_dp]
    ctx.table = ctx.tables[ctx.options[0]] if ctx.options else ctx.table.variant(dp=d_dp)
    return ctx


# ----------------------------------------------------------------------------- phase 2
def pipeline_time_fn(ctx: Context, layout: Layout, n_mb_max: int | None = None, rank_only: bool = False,
                     choose: bool = False):
    """PIPELINE-TIME(n_mb) of a layout: with a schedule book the fastest option's modelled time
    (:mod:`hexicore.planner.pricing`), else the cost model's timer if it has one, else App. A.
    ``rank_only`` (phase 2 ranking orders and TP menus): App. A's closed form with a schedule
    book too — thousands of layouts, cheap; :func:`assemble` prices each candidate's pipelines
    by their schedules. ``choose``: the fastest of all options (schedule=auto), else the first."""
    if ctx.book is not None and not rank_only:
        opts = variants(ctx, layout, ctx.micro_batches if n_mb_max is None else n_mb_max, choose)
        return lambda n: min((ctx.book.model(o, lay.stage_s, lay.hop_s, n) for o, lay in opts), default=INF)
    timer = getattr(ctx.cost, "pipeline_timer", None)
    if timer is None or ctx.book is not None:
        return affine_time(*layout.fill_step())
    sched, mb = ctx.problem.schedule, ctx.problem.train.micro_batch
    return lambda n: timer(layout.pipeline(n * mb, sched), layout.stage_s, layout.hop_s, n)


def variants(ctx: Context, layout: Layout, n_mb_max: int, choose: bool = False) -> list[tuple[Any, Layout]]:
    """The options a layout may run under, each with a layout that fits the option's memory:
    the layout itself where its layers fit the option's peak activations, else its stages
    re-laid out under the option's caps; options that fit no way are left out (cached).
    ``choose``: every option, else the first only."""
    key = ("variants", layout.stages, layout.layers, n_mb_max, choose)
    if key not in ctx.layout_cache:
        out = []
        for o in ctx.options if choose else ctx.options[:1]:
            if not ctx.book.usable(o, len(layout.stages)):
                continue
            table = ctx.tables[o]
            lay = layout_pipeline(table, layout.stages, n_mb_max, layout.layers) or \
                layout_pipeline(table, layout.stages, n_mb_max)
            if lay is not None:
                out.append((o, lay))
        ctx.layout_cache[key] = out
    return ctx.layout_cache[key]


def least_micro_batches(ctx: Context, layout: Layout, n_mb_max: int, choose: bool = False) -> int:
    """The fewest micro-batches a layout's pipeline runs with under any of its options
    (``Pricing.micro_batches_per_rank``; 1 without a schedule book)."""
    if ctx.book is None:
        return 1
    ranks = len(layout.stages)
    return min((ctx.book.min_micro_batches(o, ranks) for o, _ in variants(ctx, layout, n_mb_max, choose)), default=1)


def unit_orders(ctx: Context, part: Sequence[str], k: int, seed: int) -> list[list[Group]]:
    """Phase 2 (i)+(iii): ``k`` well-connected groups; each group split per machine into units
    (TP stays inside a machine, §3.2); the units ordered by the orderer (its few best paths when
    it offers ``orders``). Ordering units rather than whole groups keeps a machine's pieces
    adjacent even when the partitioner spread it over two groups (intra-machine links are the
    fastest, so top-tau joins them)."""
    sub = ordered_subgraph(ctx.graph, part)
    groups = ctx.partitioner.partition(sub, k, objective="min_cut", balance=ctx.cfg.group_balance, seed=seed) \
        if k > 1 else [list(part)]
    units = [list(u) for g in groups if g for u in split_by_machine(ctx.problem.cluster, g)]
    many = getattr(ctx.orderer, "orders", None)
    paths = many(units, sub, ctx.cfg.orders) if many is not None else [ctx.orderer.order(units, sub)]
    return [merge_adjacent(ctx, path) for path in paths]


def merge_adjacent(ctx: Context, path: Sequence[Sequence[str]]) -> list[Group]:
    """Consecutive units of one machine become one unit, so its TP menu spans all of them."""
    out: list[list[str]] = []
    machine = ctx.problem.cluster.device
    for u in path:
        if out and machine(out[-1][0]).machine == machine(u[0]).machine:
            out[-1].extend(u)
        else:
            out.append(list(u))
    return [tuple(u) for u in out]


def best_strategy(ctx: Context, orders: list[list[Group]], n_nominal: int, n_mb_max: int) -> tuple[float, Layout | None]:
    """Phase 2 (ii): per unit a TP menu (:func:`tp_menus`) — the unit's TP degrees and number of
    stages — chosen by the cost model: each candidate order (and its reverse; top-tau scores
    bandwidth only, memory favours some ends) is scored with every uniform strategy (all units
    at TP degree d where they can be); on the best order and start, coordinate descent over the
    units' menus, scored by the pipeline's time at its nominal number of micro-batches."""

    memo: dict = {}

    def score(o: int, choice: list[int]) -> tuple[float, Layout | None]:
        key = (o, tuple(choice))
        if key not in memo:
            stages, rk = joined(pieces[o], choice, n_mb_max)
            lay = layout_pipeline(ctx.table, stages, n_mb_max, key=rk)
            memo[key] = (INF, None) if lay is None else (pipeline_time_fn(ctx, lay, n_mb_max, True)(n_nominal), lay)
        return memo[key]

    starts = []
    tried = set()
    pieces: list = []  # per order tried: unit_pieces
    for order in (o for units in orders for o in (units, units[::-1])):
        if tuple(order) in tried:
            continue
        tried.add(tuple(order))
        menus = [tp_menus(len(u), tuple(d for d in ctx.degrees if d <= len(u))) for u in order]
        pieces.append(unit_pieces(ctx.table, order, menus))
        for d in ctx.degrees:
            choice = [uniform_choice(ms, d) for ms in menus]
            starts.append((score(len(pieces) - 1, choice), len(starts), len(pieces) - 1, menus, choice))
    (cur, _, o, menus, choice) = min(starts, key=lambda s: (s[0][0], s[1]))
    for _ in range(ctx.cfg.strategy_passes):
        improved = False
        for u in range(len(menus)):
            for c in range(len(menus[u])):
                if c == choice[u]:
                    continue
                trial = choice[:u] + [c] + choice[u + 1:]
                s = score(o, trial)
                if s[0] < cur[0] - 1e-12:
                    cur, choice, improved = s, trial, True
        if not improved:
            break
    return cur


def phase2(ctx: Context, part: Sequence[str], k: int, n_mb_max: int, seed: int) -> Layout | None:
    """One pipeline's layout from its devices (cached per part, k and batch bound; on large
    clusters per signature of the part, :mod:`hexicore.planner.shared_layouts`)."""
    if len(ctx.graph) > ctx.cfg.machine_graph_above:  # large clusters: per part signature (shared_layouts)
        return shared_phase2(ctx, part, k, n_mb_max, seed, lambda *a: _phase2(ctx, *a))
    key = (frozenset(part), k, n_mb_max)
    if key not in ctx.phase2_cache:  # laid out ahead with this very seed, or now
        hit = ctx.ahead.pop((key, seed), ctx)
        ctx.phase2_cache[key] = _phase2(ctx, part, k, n_mb_max, seed) if hit is ctx else hit
    return ctx.phase2_cache[key]


def _phase2(ctx: Context, part: Sequence[str], k: int, n_mb_max: int, seed: int) -> Layout | None:
    if len({ctx.problem.cluster.device(d).machine for d in part}) > ctx.problem.model.layers:
        return None  # a stage per machine at least: more stages than layers, no layout exists
    tf = ctx.problem.cluster.total_tflops
    n_nom = max(1, round(ctx.micro_batches * sum(ctx.problem.cluster.device(d).tflops for d in part) / tf))
    return best_strategy(ctx, unit_orders(ctx, part, k, seed), n_nom, n_mb_max)[1]


# ---------------------------------------------------------------------- candidates
def assemble(ctx: Context, layouts: Sequence[Layout], origin: str, info: dict | None = None,
             choose: bool = False) -> Candidate:
    """Batch allocation over the pipelines, then the full cost-model estimate (OOM = inf).
    With a schedule book each pipeline gets the option fastest at its micro-batches — among
    all options with ``choose`` (schedule=auto; such candidates leave the search's moving
    averages alone, so the first option's trajectory is the same as searching it alone)."""
    p = ctx.problem
    n_mb_max = ctx.micro_batches - (len(layouts) - 1)
    counts = allocate_batch([pipeline_time_fn(ctx, lay, n_mb_max, choose=choose) for lay in layouts],
                            ctx.micro_batches, [least_micro_batches(ctx, lay, n_mb_max, choose) for lay in layouts])
    if counts is None:
        return Candidate(INF, None, None, origin)
    sections = [p.schedule] * len(layouts)
    if ctx.book is not None:  # per pipeline the option that is fastest at its micro-batches
        picks = []
        for lay, n in zip(layouts, counts):
            opts = [ol for ol in variants(ctx, lay, n_mb_max, choose) if ctx.book.runs(ol[0], len(lay.stages), n)]
            if not opts:
                return Candidate(INF, None, None, origin)
            picks.append(min(opts, key=lambda ol: ctx.book.model(ol[0], ol[1].stage_s, ol[1].hop_s, n)))
        sections, layouts = [o for o, _ in picks], [lay for _, lay in picks]
    pipes = tuple(lay.pipeline(n * p.train.micro_batch, sec) for lay, n, sec in zip(layouts, counts, sections))
    plan = Plan(p.model, p.cluster, p.train, pipes)
    est = ctx.cost.estimate(plan)
    ctx.evaluated += 1
    score = est.iteration_s if est.fits else INF
    if est.fits and not choose:
        slow = max(range(len(pipes)), key=lambda i: est.pipeline_s[i])
        pp = counts[slow] * sum(layouts[slow].hop_s)
        a = ctx.cfg.ema
        ctx.ema_dp = est.dp_s if ctx.ema_dp is None else a * est.dp_s + (1 - a) * ctx.ema_dp
        ctx.ema_pp = pp if ctx.ema_pp is None else a * pp + (1 - a) * ctx.ema_pp
    return Candidate(score, plan, est, origin, tuple(layouts), dict(info or {}))


def two_phase(ctx: Context, d_dp: int, objective: str, k_shift: Sequence[int], seed: int) -> Candidate:
    """One candidate of §4.2-4.3 for ``D_dp`` pipelines."""
    origin = f"search D_dp={d_dp} {objective}"
    at_dp(ctx, d_dp)
    parts, ks = split(ctx, d_dp, objective, k_shift, seed)
    key = (tuple(tuple(p) for p in parts), tuple(ks))
    if key in ctx.seen:
        return ctx.seen[key]
    n_mb_max = ctx.micro_batches - (len(parts) - 1)
    layouts = []
    for i, (p, k) in enumerate(zip(parts, ks)):
        lay = phase2(ctx, p, k, n_mb_max, seed + i)
        if lay is None:
            ctx.seen[key] = Candidate(INF, None, None, origin)
            return ctx.seen[key]
        layouts.append(lay)
    info = {"d_dp": len(parts), "objective": objective, "k": ks}
    cand = min([assemble(ctx, layouts, origin, info)] + aligned(ctx, layouts, n_mb_max, origin, info),
               key=lambda c: c.score)
    ctx.seen[key] = cand
    if ctx.auto:  # the same layouts with every pipeline's schedule chosen (kept aside)
        track_auto(ctx, [assemble(ctx, layouts, origin, info, True)]
                   + aligned(ctx, layouts, n_mb_max, origin, info, True))
    return cand


def track_auto(ctx: Context, cands: Sequence[Candidate]) -> None:
    """schedule=auto: remember the best candidate whose schedules were chosen."""
    for c in cands:
        if ctx.auto_best is None or c.score < ctx.auto_best.score:
            ctx.auto_best = c


def aligned(ctx: Context, layouts: Sequence[Layout], n_mb_max: int, origin: str, info: dict,
            choose: bool = False) -> list[Candidate]:
    """Variants where every pipeline copies one pipeline's machine order and per-machine layer
    ranges (:func:`align_to`): when the pipelines share machines (typically after a max-cut
    partition) their DP sync then stays inside machines. Each pipeline serves as the template
    once (at most ``ctx.cfg.align_templates``)."""
    if len(layouts) < 2:
        return []
    out = []
    for t, template in enumerate(layouts[:ctx.cfg.align_templates]):
        template = machine_contiguous(ctx.table, template, n_mb_max)
        if template is None:
            continue
        new = [template if i == t else align_to(ctx.table, template, lay.stages, n_mb_max)
               for i, lay in enumerate(layouts)]
        if all(lay is not None for lay in new) and any(a is not b for a, b in zip(new, layouts)):
            out.append(assemble(ctx, new, origin + " aligned", info, choose))
    return out


def relayout(ctx: Context, plan: Plan, origin: str, keep_layers: bool) -> Candidate:
    """A given plan's stages (e.g. megatron's) as a candidate, with its own layers or with the
    exact layer allocation; batches re-allocated. Devices no longer in the cluster are dropped."""
    cl = ctx.problem.cluster
    pipes = [[tuple(d for d in s.devices if cl.has_device(d)) for s in p.stages] for p in plan.pipelines]
    kept = [[g for g in p if g] for p in pipes]
    kept = [p for p in kept if p]
    same = all(len(a) == len(b.stages) for a, b in zip(kept, plan.pipelines)) and len(kept) == len(plan.pipelines)
    n_mb_max = ctx.micro_batches - (len(kept) - 1)
    at_dp(ctx, len(kept))
    layouts = []
    for i, stages in enumerate(kept):
        layers = [s.n_layers for s in plan.pipelines[i].stages] if keep_layers and same else None
        lay = layout_pipeline(ctx.table, stages, n_mb_max, layers)
        if lay is None:
            return Candidate(INF, None, None, origin)
        layouts.append(lay)
    return assemble(ctx, layouts, origin, {"d_dp": len(layouts)})


def polish(ctx: Context, best: Candidate, deadline: float, only: Sequence[int] | None = None,
           choose: bool = False) -> Candidate:
    """Hill-climb stage boundaries one layer at a time under the full estimate, for at most
    ``polish_rounds`` sweeps and ``polish_evals`` estimates (and the time limit) (the layer
    allocation of phase 2 ignores DP sync; moving boundaries can align the pipelines' layers
    with cheap DP links, as in the HexiScale paper's worked case where cross-machine DP on one
    machine covers 5 layers).
    ``only``: the pipelines whose boundaries may move (all by default); ``choose``: as in
    :func:`assemble`."""
    if best.plan is None or not best.layouts:
        return best
    n_mb_max = ctx.micro_batches - (len(best.layouts) - 1)
    at_dp(ctx, len(best.layouts))
    budget = ctx.evaluated + ctx.cfg.polish_evals  # a count, not a clock: the result stays seeded
    for _ in range(ctx.cfg.polish_rounds):
        improved = False
        for i, lay in enumerate(best.layouts):
            if only is not None and i not in only:
                continue
            for j in range(len(lay.layers) - 1):
                for delta in (1, -1):
                    if time.monotonic() > deadline or ctx.evaluated >= budget:
                        return best
                    layers = list(lay.layers)
                    layers[j] += delta
                    layers[j + 1] -= delta
                    new = layout_pipeline(ctx.table, lay.stages, n_mb_max, layers)
                    if new is None:
                        continue
                    layouts = best.layouts[:i] + (new,) + best.layouts[i + 1:]
                    cand = assemble(ctx, layouts, best.origin + " +polish", best.info, choose)
                    if cand.score < best.score - 1e-9:
                        best, lay, improved = cand, new, True
        if not improved:
            break
    return best
