"""The HexiScale two-phase iterative planner (§4, REFERENCE.md §2), exposed as solver ``hexiscale``.

One candidate (§4.2-4.3):

1. phase 1 — partition the device graph into ``D_dp`` parts (one per pipeline) with the
   configured partitioner, min-cut or max-cut, then the refiner;
2. phase 2, per part — partition it again into ``k_i`` groups of well-connected GPUs (min-cut),
   order the groups with the stage orderer (top-tau), choose each group's local strategy (TP
   degree and number of stages, inside one machine) by the cost model, and allocate layers
   exactly (:mod:`hexicore.planner.layers`);
3. allocate the global batch over the pipelines (:mod:`hexicore.planner.batch`, gradient accumulation)
   and score the plan with the cost model (out of memory = infinity).

The loop (§4.4) sweeps ``D_dp``, then walks around the best ``D_dp`` varying ``k_i`` and the
partition seed; min-cut vs max-cut follows a moving average of the simulated DP sync time vs the
pipelines' hop time (whichever communication dominates is given the fast links). The symmetric
plans of the ``seeds`` solvers (``megatron``) and a warm-start plan are candidates too, so the
result is never worse than they are under the same cost model. The best plan is finally polished
by moving single stage boundaries under the full estimate (DP sync included).

Everything pluggable comes from ``problem.registry`` by name; the core imports no plugin.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from hexicore.planner.batch import allocate_batch, affine_time
from hexicore.cost import GIB, Estimate
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.pricing import ScheduleBook, choose_exact, is_auto, options, timed_cost
from hexicore.planner.replan import check_warm_start, plan_diff, repair
from hexicore.planner.search_config import SearchConfig
from hexicore.planner.stages import (Group, Layout, StageTable, align_to, apply_menu, layout_pipeline, machine_contiguous,
                             split_by_machine, tp_menus)

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

    @property
    def auto(self) -> bool:
        return len(self.options) > 1

    @property
    def cost(self):
        return self.table.cost


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


def unit_orders(ctx: Context, part: Sequence[str], k: int, seed: int) -> list[list[Group]]:
    """Phase 2 (i)+(iii): ``k`` well-connected groups; each group split per machine into units
    (TP stays inside a machine, §3.2); the units ordered by the orderer (its few best paths when
    it offers ``orders``). Ordering units rather than whole groups keeps a machine's pieces
    adjacent even when the partitioner spread it over two groups (intra-machine links are the
    fastest, so top-tau joins them)."""
    sub = ctx.graph.subgraph(part)
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

    def score(order, menus, choice) -> tuple[float, Layout | None]:
        stages = tuple(g for u, m, c in zip(order, menus, choice) for g in apply_menu(u, m[c]))
        key = (stages, n_mb_max)
        if key not in ctx.layout_cache:
            ctx.layout_cache[key] = layout_pipeline(ctx.table, stages, n_mb_max)
        lay = ctx.layout_cache[key]
        return (INF, None) if lay is None else (pipeline_time_fn(ctx, lay, n_mb_max, True)(n_nominal), lay)

    starts = []
    tried = set()
    for order in (o for units in orders for o in (units, units[::-1])):
        if tuple(order) in tried:
            continue
        tried.add(tuple(order))
        menus = [tp_menus(len(u), tuple(d for d in ctx.degrees if d <= len(u))) for u in order]
        for d in ctx.degrees:
            choice = [min(range(len(ms)), key=lambda i: (sum(abs(t - d) for t in ms[i]), i)) for ms in menus]
            starts.append((score(order, menus, choice), len(starts), order, menus, choice))
    (cur, _, order, menus, choice) = min(starts, key=lambda s: (s[0][0], s[1]))
    for _ in range(ctx.cfg.strategy_passes):
        improved = False
        for u in range(len(order)):
            for c in range(len(menus[u])):
                if c == choice[u]:
                    continue
                trial = choice[:u] + [c] + choice[u + 1:]
                s = score(order, menus, trial)
                if s[0] < cur[0] - 1e-12:
                    cur, choice, improved = s, trial, True
        if not improved:
            break
    return cur


def phase2(ctx: Context, part: Sequence[str], k: int, n_mb_max: int, seed: int) -> Layout | None:
    """One pipeline's layout from its devices (cached per part, k and batch bound)."""
    tf = ctx.problem.cluster.total_tflops
    n_nom = max(1, round(ctx.micro_batches * sum(ctx.problem.cluster.device(d).tflops for d in part) / tf))
    key = (frozenset(part), k, n_mb_max)
    if key not in ctx.phase2_cache:
        ctx.phase2_cache[key] = best_strategy(ctx, unit_orders(ctx, part, k, seed), n_nom, n_mb_max)[1]
    return ctx.phase2_cache[key]


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
                            ctx.micro_batches)
    if counts is None:
        return Candidate(INF, None, None, origin)
    sections = [p.schedule] * len(layouts)
    if ctx.book is not None:  # per pipeline the option that is fastest at its micro-batches
        picks = []
        for lay, n in zip(layouts, counts):
            opts = variants(ctx, lay, n_mb_max, choose)
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
    parts = ctx.partitioner.partition(ctx.graph, d_dp, objective=objective, balance=ctx.cfg.max_balance, seed=seed)
    if ctx.refiner is not None and d_dp > 1:
        parts = ctx.refiner.refine(ctx.graph, parts, objective=objective, balance=ctx.cfg.max_balance)
    parts = sorted((sorted(p) for p in parts if p), key=lambda p: p[0])
    cl = ctx.problem.cluster
    ks = [min(len(p), max(1, len({cl.device(d).machine for d in p}) + k_shift[i % len(k_shift)]))
          for i, p in enumerate(parts)]
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
    with cheap DP links, REFERENCE.md §4: "cross-machine DP on machine B covers 5 layers").
    ``only``: the pipelines whose boundaries may move (all by default); ``choose``: as in
    :func:`assemble`."""
    if best.plan is None or not best.layouts:
        return best
    n_mb_max = ctx.micro_batches - (len(best.layouts) - 1)
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


# --------------------------------------------------------------------------- the loop
def state_gb(problem: Problem) -> float:
    """Training state of the whole model (weights, gradients, optimizer) in GiB."""
    per = getattr(problem.cost, "state_bytes_per_param", None) or 4 * problem.train.dtype_bytes
    return problem.model.total_params() * per / GIB


def dp_range(ctx: Context) -> list[int]:
    """Candidate numbers of pipelines: ``dp_min..dp_max``, bounded by the devices, the
    micro-batches and memory (every pipeline holds a whole model's training state)."""
    p, cfg = ctx.problem, ctx.cfg
    n = len(p.cluster.devices)
    if cfg.dp_max is not None and cfg.dp_max > n:
        raise HexicoreError(f"dp_max={cfg.dp_max} exceeds the cluster's {n} devices", field="solver.dp_max")
    usable = sum(d.memory_gb - getattr(p.cost, "reserve_gb", 0.0) for d in p.cluster.devices)
    by_memory = max(1, int(usable // state_gb(p)))
    hi = min(n, ctx.micro_batches, by_memory, cfg.dp_max or n)
    lo = cfg.dp_min
    if lo > hi:
        raise HexicoreError(f"no number of pipelines in [{lo}, {cfg.dp_max or n}] is possible (at most {hi}: "
                            f"{n} devices, {ctx.micro_batches} micro-batches, memory for {by_memory} model copies)",
                            field="solver.dp_min")
    return list(range(lo, hi + 1))


def choose_objective(ctx: Context, rng: random.Random) -> str:
    """§4.4: "at the end of each iteration we simulate the DP communication and pipeline
    execution costs and update their moving averages; the next iteration's partition option
    follows them". We compare the two communication terms the cut decides: the DP sync time
    (``ema_dp``) and the slowest pipeline's hop time (``ema_pp``, micro-batches x hops). DP
    dominating -> ``max_cut`` (DP gets the fast links), else ``min_cut`` (the pipelines get
    them). With probability ``explore`` the other option is tried."""
    pick = "max_cut" if (ctx.ema_dp or 0.0) > (ctx.ema_pp or 0.0) else "min_cut"
    if rng.random() < ctx.cfg.explore:
        pick = "min_cut" if pick == "max_cut" else "max_cut"
    return pick


def no_fit_error(problem: Problem) -> HexicoreError:
    """Nothing fits: say how much memory the model's state alone needs (issue 3, item 6)."""
    c, m, t = problem.cluster, problem.model, problem.train
    return HexicoreError(f"model {m.name!r} fits on no plan of {c.name!r}: its training state alone needs "
                         f"{state_gb(problem):.1f} GB plus activations (micro-batch {t.micro_batch}, sequence "
                         f"{t.seq_len}); the cluster has {sum(d.memory_gb for d in c.devices):g} GB in all, at most "
                         f"{max(d.memory_gb for d in c.devices):g} GB per GPU", field="model")


def make_context(problem: Problem, cfg: SearchConfig) -> Context:
    """Build the plugins by name from the registry (DESIGN.md §2) and the caches."""
    reg = problem.registry
    if reg is None:
        raise HexicoreError("the hexiscale search needs problem.registry to build its plugins", field="solver")
    cost = problem.cost if cfg.cost_model is None else reg.create("cost_model", cfg.cost_model)
    refiner = reg.create("refiner", cfg.refiner) if cfg.refiner else None
    orderer = reg.create("orderer", cfg.orderer, tau=cfg.tau)
    m = problem.model
    degrees = tuple(d for d in range(1, cfg.max_tp + 1) if m.heads % d == 0 and m.kv_heads % d == 0)
    book = problem.pricing if cfg.cost_model is None else None  # the book problem.cost is priced with
    if book is None and is_auto(problem.schedule):
        book = ScheduleBook(reg)
    exact, opts = cost, (problem.schedule,)
    if book is not None:  # pipelines priced by their schedules: modelled in the search, exact at the end
        opts = options(problem.schedule)
        exact, cost = timed_cost(cost, book), timed_cost(cost, book, modelled=True)
    table = StageTable(problem.cluster, m, problem.train, cost, opts[0])
    tables = {o: table if i == 0 else replace(table, schedule=o, _caps={}, _flight={}, _rows={})
              for i, o in enumerate(opts)}
    return Context(problem, cfg, table, reg.create("partitioner", cfg.partitioner), refiner, orderer,
                   problem.cluster.graph(), problem.train.global_batch // problem.train.micro_batch, degrees,
                   book=book, exact_cost=exact, options=opts, tables=tables)


def seed_candidates(ctx: Context, seed: int) -> list[Candidate]:
    """The seeds' plans (as they are and re-laid out) and the warm start (§4.4 + issue 3)."""
    out = []
    p = ctx.problem
    if ctx.book is not None:  # the seed solvers see the first option (schedule=auto is no schedule itself)
        p = replace(p, schedule=ctx.options[0], cost=ctx.exact_cost)
    for name in ctx.cfg.seeds:
        try:
            plan = p.registry.create("solver", name).solve(p, time_limit=None, seed=seed, progress=no_progress)
        except HexicoreError:
            continue  # that solver finds nothing that fits: no seed from it
        if ctx.book is not None:  # priced under the first option (schedule=auto is no schedule itself)
            plan = replace(plan, pipelines=tuple(replace(q, schedule=ctx.options[0]) for q in plan.pipelines))
        est = ctx.cost.estimate(plan)  # the seed itself, exactly as its solver made it
        out.append(Candidate(est.iteration_s if est.fits else INF, plan.with_solver({}), est, f"seed:{name}",
                             info={"d_dp": len(plan.pipelines)}))
        out.append(relayout(ctx, plan, f"seed:{name} +batches", keep_layers=True))
        out.append(relayout(ctx, plan, f"seed:{name} +layers", keep_layers=False))
    if p.warm_start is not None:
        out.append(relayout(ctx, p.warm_start, "warm_start", keep_layers=True))
        out.append(relayout(ctx, p.warm_start, "warm_start +layers", keep_layers=False))
    return out


def initial_sweep(dps: list[int], iterations: int) -> list[tuple[int, str | None]]:
    """The loop's first candidates: every D_dp with both cuts when the iterations allow it,
    else about half the iterations spread evenly over the D_dp range (cut chosen by the moving
    averages, ``None``); the rest of the iterations walk around the best."""
    if iterations >= 2 * len(dps):
        return [(d, o) for d in dps for o in ("min_cut", "max_cut")]
    m = max(1, iterations // 2)
    if m == 1:
        return [(dps[0], None)]
    return [(d, None) for d in sorted({dps[round(i * (len(dps) - 1) / (m - 1))] for i in range(m)})]


def search_loop(ctx: Context, dps: list[int], rng: random.Random, deadline: float, best: Candidate,
                progress: Progress) -> Candidate:
    """The §4.4 loop: the initial D_dp sweep, then a walk around the best."""
    n = ctx.cfg.iterations
    sweep = initial_sweep(dps, n)
    for it in range(n):
        if time.monotonic() > deadline:
            break
        if it < len(sweep):
            d_dp, objective = sweep[it]
            objective = objective or choose_objective(ctx, rng)
            shifts: Sequence[int] = (0,)
        else:
            base = best.info.get("d_dp", rng.choice(dps))
            d_dp = min(max(base + rng.choice((-1, 0, 0, 1)), dps[0]), dps[-1])
            objective = choose_objective(ctx, rng)
            shifts = tuple(rng.choice(ctx.cfg.k_shifts) for _ in range(d_dp))
        cand = two_phase(ctx, d_dp, objective, shifts, rng.randrange(2**31))
        if cand.score < best.score:
            best = cand
        shown = f"{best.score:.3f} s" if best.score < INF else "none fits yet"
        progress(f"hexiscale: candidate {it + 1}/{n} (D_dp={d_dp}, {objective}), best {shown}", (it + 1) / (n + 1))
    return best


def replan_search(ctx: Context, dps: list[int], rng: random.Random, deadline: float,
                  progress: Progress) -> Candidate:
    """Elastic replanning (:mod:`hexicore.planner.replan`): the repaired previous plan, then
    ``replan_iterations`` two-phase candidates around its number of pipelines."""
    warm = ctx.problem.warm_start
    check_warm_start(warm, ctx.problem)
    sets, broken = repair(ctx, warm)
    progress(f"hexiscale: replanning ({len(broken)} broken pipelines)", 0.1)
    cands = [assemble(ctx, lays, label, {"d_dp": len(lays), "repaired": broken}) for label, lays in sets]
    cands += [relayout(ctx, warm, "warm_start +layers", keep_layers=False)]
    best = min(cands, key=lambda c: c.score)
    d0 = best.info.get("d_dp", len(warm.pipelines))
    for it in range(ctx.cfg.replan_iterations):
        if time.monotonic() > deadline:
            break
        d_dp = min(max(d0 + (0, -1, 1)[it % 3], dps[0]), dps[-1])
        cand = two_phase(ctx, d_dp, choose_objective(ctx, rng), (0,), rng.randrange(2**31))
        if cand.score < best.score:
            best = cand
    return best


def finalize(ctx: Context, cands: Sequence[Candidate]) -> tuple[Plan, dict]:
    """With schedule-priced pipelines: re-price the candidates exactly (the search ranked them by
    modelled times) and keep the best; ``schedule=auto`` first re-chooses each pipeline's
    schedule exactly (:func:`hexicore.planner.pricing.choose_exact`, the pipeline's own schedule
    among the choices, so no pipeline gets slower)."""
    if ctx.book is None:
        return cands[0].plan, {}
    out = []
    for c in cands:
        if c.plan is None:
            continue
        plan, tried = choose_exact(ctx.book, ctx.exact_cost, c.plan, ctx.options) if ctx.auto else (c.plan, [])
        est = ctx.exact_cost.estimate(plan)
        out.append((est.iteration_s if est.fits else INF, len(out), plan, c.origin, tried))
    _, _, plan, origin, tried = min(out, key=lambda c: c[:2])
    info = {"origin": origin, "schedules": [p.schedule.to_dict() for p in plan.pipelines]}
    if tried:
        info["schedule_s"] = tried
    return plan, info


def run_search(problem: Problem, cfg: SearchConfig, *, time_limit: float | None = None, seed: int = 0,
               progress: Progress = no_progress) -> Plan:
    """The iterative two-phase search of §4.4; returns the best plan found (never worse than
    the seeds' whose number of pipelines lies in the configured D_dp range). ``time_limit`` (s)
    stops the loop early; everything else is seeded. A ``warm_start`` plan is repaired and
    improved (:func:`replan_search`) instead of a cold search.

    ``schedule=auto``: the loop runs exactly as for its first option alone (that option prices
    every candidate and steers the walk); each candidate's layouts are also assembled with every
    pipeline's schedule chosen (:func:`assemble` ``choose``), the best of those is polished under
    the choice, and the final plan is the exactly re-priced better of it and the first option's
    own (polished) result, with schedules re-chosen — so auto is never worse than its first
    option searched alone under the same cost model."""
    t0 = time.monotonic()
    deadline = t0 + time_limit if time_limit else INF
    ctx = make_context(problem, cfg)
    dps = dp_range(ctx)
    rng = random.Random(seed)
    replanned = problem.warm_start is not None and cfg.replan_iterations is not None
    if replanned:
        best = replan_search(ctx, dps, rng, deadline, progress)
        replanned = best.plan is not None  # nothing repaired fits: fall back to the full search
    if not replanned:
        progress("hexiscale: seeding with symmetric plans", 0.0)
        seeds = [c for c in seed_candidates(ctx, seed) if c.plan is None or len(c.plan.pipelines) in dps]
        best = search_loop(ctx, dps, rng, deadline, min(seeds or [Candidate(INF, None, None, "none")],
                                                        key=lambda c: c.score), progress)
    if best.plan is None:
        raise no_fit_error(problem)
    progress("hexiscale: polishing stage boundaries", cfg.iterations / (cfg.iterations + 1))
    # a repaired plan: the kept pipelines were polished before; only the repaired ones move
    only = best.info.get("repaired") if replanned and best.origin.startswith("warm_start repaired") else None
    best = polish(ctx, best, deadline, only)
    cands = [best]
    if ctx.auto:
        track_auto(ctx, [assemble(ctx, best.layouts, best.origin, best.info, True)])
        cands.insert(0, polish(ctx, ctx.auto_best, deadline, only, True))
    plan, sched_info = finalize(ctx, cands)
    progress(f"hexiscale: done, {best.score:.3f} s", 1.0)
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    info = {"name": "hexiscale", "params": params, "status": "HEURISTIC", "bound": None, "origin": best.origin,
            "candidates": ctx.evaluated, "d_dp": len(plan.pipelines), "seed": seed, **sched_info}
    if replanned:
        info["replan"] = plan_diff(problem.warm_start, plan)
    return plan.with_solver(info)
