"""The HexiScale two-phase iterative planner (HexiScale §4), exposed as solver ``hexiscale``.

One candidate (§4.2-4.3: phase 1 partitions the devices into pipelines, phase 2 lays out each
pipeline, then the batch is allocated and the plan scored) is built by
:mod:`hexicore.planner.candidates`; this module is the loop around it.

The loop (§4.4) sweeps ``D_dp``, then walks around the best ``D_dp`` varying ``k_i`` and the
partition seed; min-cut vs max-cut follows a moving average of the simulated DP sync time vs the
pipelines' hop time (whichever communication dominates is given the fast links). The symmetric
plans of the ``seeds`` solvers (``megatron``) and a warm-start plan are candidates too, so the
result is never worse than they are under the same cost model. The best plan is finally polished
by moving single stage boundaries under the full estimate (DP sync included).

Everything pluggable comes from ``problem.registry`` by name; the core imports no plugin. The
candidate pieces (``INF``, ``Candidate``, ``Context``, ``assemble``, ``phase2``, ...) are
importable from here as well.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import asdict, replace
from typing import Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.cost import GIB
from hexicore.cost.precision import SHARDED_PARTS, state_bytes
from hexicore.planner.candidates import (INF, Candidate, Context, aligned, assemble, best_strategy, merge_adjacent,
                                         phase2, pipeline_time_fn, polish, relayout, track_auto, two_phase,
                                         unit_orders, variants)
from hexicore.planner.objective import Objective
from hexicore.planner.parallel import available_cores
from hexicore.planner.prefetch import prefetch, walk_ahead
from hexicore.planner.fit import holds_chunks
from hexicore.planner.pricing import ScheduleBook, choose_exact, is_auto, options, resolve_plan, timed_cost
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.replan import check_warm_start, plan_diff, repair
from hexicore.planner.search_config import SearchConfig
from hexicore.planner.stages import StageTable

__all__ = ["INF", "Candidate", "Context", "aligned", "assemble", "best_strategy", "choose_objective", "dp_range",
           "finalize", "initial_sweep", "make_context", "merge_adjacent", "no_fit_error", "phase2",
           "pipeline_time_fn", "polish", "relayout", "replan_search", "run_search", "search_loop",
           "seed_candidates", "state_gb", "track_auto", "two_phase", "unit_orders", "variants"]

def state_gb(problem: Problem, sharded_only: bool = False) -> float:
    """Training state of the whole model (weights, gradients, optimizer) in GiB (the cost
    model's precision recipe, :func:`hexicore.cost.precision.state_bytes`, if it has one);
    ``sharded_only``: the parts ``train.zero`` shards."""
    probe = getattr(problem.cost, "state_bytes", None)
    per = probe(problem.train) if probe is not None else state_bytes(problem.train.dtype)
    parts = per.parts()
    keep = SHARDED_PARTS[problem.train.zero_stage] if sharded_only else tuple(parts)
    return problem.model.total_params() * sum(parts[k] for k in keep) / GIB


def dp_range(ctx: Context) -> list[int]:
    """Candidate numbers of pipelines: ``dp_min..dp_max``, bounded by the devices, the
    micro-batches and memory (every pipeline holds a whole model's training state)."""
    p, cfg = ctx.problem, ctx.cfg
    n = len(p.cluster.devices)
    if cfg.dp_max is not None and cfg.dp_max > n:
        raise HexicoreError(f"dp_max={cfg.dp_max} exceeds the cluster's {n} devices", field="solver.dp_max")
    usable = sum(d.memory_gb - getattr(p.cost, "reserve_gb", 0.0) for d in p.cluster.devices)
    by_memory = max(1, int(usable // state_gb(p)))
    if p.train.zero_stage:  # sharded parts are held once in all, the rest once per pipeline
        shared = state_gb(p, sharded_only=True)
        copies = state_gb(p) - shared
        by_memory = n if copies <= 0 else max(1, int((usable - shared) // copies))
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
    """Nothing fits: say how much memory the model's state alone needs."""
    c, m, t = problem.cluster, problem.model, problem.train
    chunks = _chunk_limit(problem)
    if chunks:  # no depth gives every chunk a block: memory is not the reason
        return HexicoreError(f"model {m.name!r} fits on no plan of {c.name!r}: {chunks}", field="model")
    gb = state_gb(problem)
    need = f"{gb:.1f}" if gb >= 0.05 else f"{gb:.2g}"  # a tiny model's state: not "0.0"
    return HexicoreError(f"model {m.name!r} fits on no plan of {c.name!r}: its training state alone needs "
                         f"{need} GB plus activations (micro-batch {t.micro_batch}, sequence "
                         f"{t.seq_len}); the cluster has {sum(d.memory_gb for d in c.devices):g} GB in all, at most "
                         f"{max(d.memory_gb for d in c.devices):g} GB per GPU{_depth_limit(problem)}", field="model")


def _chunk_limit(problem: Problem) -> str:
    """Where the schedule's chunks need more blocks than the model has at every pipeline depth
    (a block per chunk, ``ScheduleBook.least``), why; else ''."""
    book, ref = problem.pricing, dict(problem.schedule)
    if book is None or is_auto(ref):
        return ""
    layers, depths = problem.model.layers, range(1, len(problem.cluster.devices) + 1)
    try:
        fewest = min(sum(book.least(ref, p)) for p in depths if book.usable(ref, p))
    except (HexicoreError, ValueError):  # ValueError: no depth runs the schedule
        return ""
    if fewest <= layers:
        return ""
    return (f"schedule {ref['name']!r} cuts each pipeline rank's blocks into chunks of a block at least, which "
            f"needs {fewest} blocks on its shortest pipeline, and the model has {layers}")


def _depth_limit(problem: Problem) -> str:
    """Where the schedule needs several micro-batches per rank (``Pricing.micro_batches_per_rank``),
    the pipeline depth that leaves, as a clause; else ''."""
    if is_auto(problem.schedule) or problem.registry is None:
        return ""
    try:
        per_rank = ScheduleBook(problem.registry).schedule(problem.schedule).pricing.micro_batches_per_rank
    except HexicoreError:
        return ""
    if per_rank <= 1:
        return ""
    m = problem.train.global_batch // problem.train.micro_batch
    return (f"; schedule {problem.schedule['name']!r} needs {per_rank} micro-batches per pipeline rank, so "
            f"{m} micro-batches allow at most {m // per_rank} stages in all pipelines together")


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


def make_context(problem: Problem, cfg: SearchConfig, memo: dict | None = None) -> Context:
    """Build the plugins by name from the registry (docs/plugins.md) and the caches (``memo``:
    stage tables shared across the searches of one allocation, :func:`shared_table`)."""
    reg = problem.registry
    if reg is None:
        raise HexicoreError("the hexiscale search needs problem.registry to build its plugins", field="solver")
    cost = problem.cost if cfg.cost_model is None else reg.create("cost_model", cfg.cost_model)
    refiner = reg.create("refiner", cfg.refiner) if cfg.refiner else None
    orderer = reg.create("orderer", cfg.orderer, tau=cfg.tau)
    m = problem.model
    degrees = tuple(d for d in range(1, cfg.max_tp + 1) if m.tp_divides(d))
    book = problem.pricing if cfg.cost_model is None else None  # the book problem.cost is priced with
    if book is None and is_auto(problem.schedule):
        book = ScheduleBook(reg)
    exact, opts = cost, (problem.schedule,)
    if book is not None:  # pipelines priced by their schedules: modelled in the search, exact at the end
        opts = options(problem.schedule)
        exact, cost = timed_cost(cost, book), timed_cost(cost, book, modelled=True)
    table = shared_table(memo, StageTable(problem.cluster, m, problem.train, cost, opts[0],
                                          least_fn=book.least if book is not None else None))
    tables = {o: table if i == 0 else table.variant(schedule=o)
              for i, o in enumerate(opts)}
    return Context(problem, cfg, table, reg.create("partitioner", cfg.partitioner), refiner, orderer,
                   problem.cluster.device_graph(), problem.train.global_batch // problem.train.micro_batch, degrees,
                   book=book, exact_cost=exact, options=opts, tables=tables,
                   workers=cfg.workers or available_cores())


def seed_candidates(ctx: Context, seed: int) -> list[Candidate]:
    """The seeds' plans (as they are and re-laid out) and the warm start (§4.4). With schedule-priced
    pipelines the seed solvers rank their layouts by the search's modelled times, as the search
    ranks its own candidates (the exact times of a simulated or synthesised schedule cost a
    simulation per layout); the final plan is re-priced exactly (:func:`finalize`)."""
    out = []
    p = replace(ctx.problem, objective=Objective())  # a seed lays out these devices (the allocation picks them)
    if ctx.book is not None:  # the seed solvers see the first option (schedule=auto is no schedule itself)
        p = replace(p, schedule=ctx.options[0], cost=ctx.cost)
    for name in ctx.cfg.seeds:
        try:
            plan = p.registry.create("solver", name).solve(p, time_limit=None, seed=seed, progress=no_progress)
        except HexicoreError:
            continue  # that solver finds nothing that fits: no seed from it
        if ctx.book is not None:  # priced under the first option (schedule=auto is no schedule itself)
            plan = replace(plan, pipelines=tuple(replace(q, schedule=ctx.options[0]) for q in plan.pipelines))
        est = ctx.cost.estimate(plan)  # the seed itself, exactly as its solver made it
        runs = all(holds_chunks(ctx.book, q) for q in plan.pipelines)  # a layer per chunk of its schedule
        out.append(Candidate(est.iteration_s if est.fits and runs else INF, plan.with_solver({}), est, f"seed:{name}",
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


#: devices from which the walk is guessed and laid out ahead (:func:`speculate`): below, a
#: candidate costs less than forking for it
WALK_AHEAD_FROM = 128


def walk_step(ctx: Context, best: Candidate, rng: random.Random, dps: list[int]) -> tuple[int, str, tuple[int, ...]]:
    """One step of the walk around the best (§4.4): ``D_dp`` next to the best's, the cut
    (:func:`choose_objective`) and a shift of every pipeline's number of groups ``k_i``."""
    base = best.info.get("d_dp", rng.choice(dps))  # (the default is drawn at every step)
    d_dp = min(max(base + rng.choice((-1, 0, 0, 1)), dps[0]), dps[-1])
    objective = choose_objective(ctx, rng)
    return d_dp, objective, tuple(rng.choice(ctx.cfg.k_shifts) for _ in range(d_dp))


def speculate(ctx: Context, best: Candidate, rng: random.Random, start: int, dps: list[int]) -> dict[int, tuple]:
    """The walk's candidates from iteration ``start`` on as the loop will draw them if ``best``
    and the moving averages stay as they are (``rng`` untouched), computed ahead on the spare
    cores (:func:`hexicore.planner.prefetch.walk_ahead`): ``iteration -> (D_dp, cut, shifts, seed)``."""
    draws = random.Random()
    draws.setstate(rng.getstate())
    out = {}
    for it in range(start, ctx.cfg.iterations):
        step = walk_step(ctx, best, draws, dps)
        out[it] = (*step, draws.randrange(2**31))
    walk_ahead(ctx, list(out.values()), ctx.workers)
    return out


def search_loop(ctx: Context, dps: list[int], rng: random.Random, deadline: float, best: Candidate,
                progress: Progress) -> Candidate:
    """The §4.4 loop: the initial D_dp sweep, then a walk around the best. With spare cores
    and no time limit the sweep's fixed cuts are laid out ahead (:func:`prefetch`) and the walk
    is guessed and laid out ahead from :data:`WALK_AHEAD_FROM` devices (:func:`speculate`, at
    most three times); the plan is the
    one-process plan either way."""
    n = ctx.cfg.iterations
    sweep = initial_sweep(dps, n)
    ahead = ctx.workers > 1 and deadline == INF and len(ctx.graph) <= ctx.cfg.machine_graph_above
    guessed: dict[int, tuple] = {}
    guesses = 0
    if ahead:
        # the sweep's fixed cuts: their phase 2 ahead, in parallel
        fixed = list(itertools.takewhile(lambda s: s[1] is not None, sweep[:n]))
        draws = random.Random()
        draws.setstate(rng.getstate())  # the loop's own seeds, one draw per candidate
        prefetch(ctx, [(d, o, draws.randrange(2**31)) for d, o in fixed], ctx.workers)
    for it in range(n):
        if time.monotonic() > deadline:
            break
        if it < len(sweep):
            d_dp, objective = sweep[it]
            objective = objective or choose_objective(ctx, rng)
            shifts: Sequence[int] = (0,)
        else:
            if ahead and it not in guessed and guesses < 3 and n - it > 1 and len(ctx.graph) >= WALK_AHEAD_FROM:
                guessed, guesses = speculate(ctx, best, rng, it, dps), guesses + 1
            d_dp, objective, shifts = walk_step(ctx, best, rng, dps)
        seed = rng.randrange(2**31)
        if guessed.get(it, (d_dp, objective, shifts, seed)) != (d_dp, objective, shifts, seed):
            guessed = {}  # the walk left the guess: guess again from the next step
        cand = two_phase(ctx, d_dp, objective, shifts, seed)
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
    among the choices, so no pipeline gets slower), any other schedule records itself as resolved
    for its pipeline's times (:func:`hexicore.planner.pricing.resolve_plan`)."""
    if ctx.book is None:
        return cands[0].plan, {}
    out = []
    for c in cands:
        if c.plan is None:
            continue
        if ctx.auto:
            plan, tried = choose_exact(ctx.book, ctx.exact_cost, c.plan, ctx.options)
        else:
            plan, tried = resolve_plan(ctx.book, ctx.exact_cost, c.plan), []
        est = ctx.exact_cost.estimate(plan)
        out.append((est.iteration_s if est.fits else INF, len(out), plan, c.origin, tried))
    _, _, plan, origin, tried = min(out, key=lambda c: c[:2])
    info = {"origin": origin, "schedules": [p.schedule.to_dict() for p in plan.pipelines]}
    if tried:
        info["schedule_s"] = tried
    return plan, info


def run_search(problem: Problem, cfg: SearchConfig, *, time_limit: float | None = None, seed: int = 0,
               progress: Progress = no_progress, memo: dict | None = None) -> Plan:
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
    ctx = make_context(problem, cfg, memo)
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
