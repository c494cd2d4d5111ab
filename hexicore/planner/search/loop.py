"""The HexiScale two-phase iterative planner (HexiScale §4), exposed as solver ``hexiscale``.

One candidate (§4.2-4.3: phase 1 partitions the devices into pipelines, phase 2 lays out each
pipeline, then the batch is allocated and the plan scored) is built by
:mod:`hexicore.planner.search.candidate`; this module is the loop around it.

The loop (§4.4) sweeps ``D_dp``, then walks around the best ``D_dp`` varying ``k_i`` and the
partition seed; min-cut vs max-cut follows a moving average of the simulated DP sync time vs the
pipelines' hop time (whichever communication dominates is given the fast links). The symmetric
plans of the ``seeds`` solvers (``megatron``) and a warm-start plan are candidates too, so the
result is never worse than they are under the same cost model. The best plan is finally polished
by moving single stage boundaries under the full estimate (DP sync included).

Everything pluggable comes from ``problem.registry`` by name; the core imports no plugin. The
search's state is :class:`hexicore.planner.search.context.SearchContext`; one candidate is made
by :mod:`hexicore.planner.search.candidate`.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.allocation.objective import Objective
from hexicore.planner.final_schedules import costly_final_s, reschedule
from hexicore.planner.plan_check import validate_plan
from hexicore.planner.pricing import ScheduleBook, choose_exact, is_auto, plan_cost, resolve_plan
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.replan.diff import plan_diff
from hexicore.planner.replan.repair import replan_search
from hexicore.planner.search.candidate import assemble, polish, relayout, two_phase
from hexicore.planner.search.context import INF, Candidate, SearchContext, layout_key, make_context, state_gb
from hexicore.planner.search.prefetch import prefetch, walk_ahead
from hexicore.planner.search.search_config import SearchConfig
from hexicore.planner.search.workers import Forked, available_cores, fork_start
from hexicore.planner.stage_layout.pipeline_fit import holds_chunks

log = logging.getLogger("hexicore")


#: what a stage needs, which can leave a device no stage under ``solver.use_all_devices``
EVERY_STAGE = ("each stage a block per chunk of its schedule, at a TP degree dividing the model's heads, KV heads "
               "and FFN width, each pipeline the micro-batches its schedule runs with")


def no_fit_error(problem: Problem, every_device: bool = False) -> HexicoreError:
    """Nothing fits: say how much memory the model's state alone needs; ``every_device``
    (``solver.use_all_devices``): also that every device had to hold a stage, and how to let
    the planner leave some idle."""
    cluster, model, train = problem.cluster, problem.model, problem.train
    every = (f"; with solver.use_all_devices=true every device must hold a pipeline stage ({EVERY_STAGE}): "
             "solver.use_all_devices=false lets the planner leave devices idle") \
        if every_device and len(cluster.devices) > 1 else ""
    chunks = _chunk_limit(problem)
    if chunks:  # no depth gives every chunk a block: memory is not the reason
        return HexicoreError(f"model {model.name!r} fits on no plan of {cluster.name!r}: {chunks}{every}",
                             field="model")
    gb = state_gb(problem)
    need = f"{gb:.1f}" if gb >= 0.05 else f"{gb:.2g}"  # a tiny model's state: not "0.0"
    return HexicoreError(f"model {model.name!r} fits on no plan of {cluster.name!r}: its training state alone needs "
                         f"{need} GB plus activations (micro-batch {train.micro_batch}, sequence "
                         f"{train.seq_len}); the cluster has {sum(d.memory_gb for d in cluster.devices):g} GB in all, "
                         f"at most {max(d.memory_gb for d in cluster.devices):g} GB per GPU{_depth_limit(problem)}"
                         f"{every}", field="model")


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
    m = problem.train.micro_batches
    return (f"; schedule {problem.schedule['name']!r} needs {per_rank} micro-batches per pipeline rank, so "
            f"{m} micro-batches allow at most {m // per_rank} stages in all pipelines together")


def seed_candidates(context: SearchContext, seed: int) -> list[Candidate]:
    """The seeds' plans (as they are and re-laid out) and the warm start (§4.4). With schedule-priced
    pipelines the seed solvers rank their layouts by the search's modelled times, as the search
    ranks its own candidates (the exact times of a simulated or synthesised schedule cost a
    simulation per layout); the final plan is re-priced exactly (:func:`finalize`)."""
    out = []
    # a seed lays out these devices (the allocation picks them), at TP degrees the search allows
    p = replace(context.problem, objective=Objective(), max_tp=context.config.max_tp)
    if context.book is not None:  # the seed solvers see the first option (schedule=auto is no schedule itself)
        p = replace(p, schedule=context.options[0], cost=context.cost)
    for name in context.config.seeds:
        try:
            plan = p.registry.create("solver", name).solve(p, time_limit=None, seed=seed, progress=no_progress)
        except HexicoreError:
            continue  # that solver finds nothing that fits: no seed from it
        if context.book is not None:  # priced under the first option (schedule=auto is no schedule itself)
            plan = replace(plan, pipelines=tuple(replace(q, schedule=context.options[0]) for q in plan.pipelines))
        est = context.cost.estimate(plan)  # the seed itself, exactly as its solver made it
        runs = all(holds_chunks(context.book, q) for q in plan.pipelines)  # a layer per chunk of its schedule
        out.append(Candidate(est.iteration_s if est.fits and runs else INF, plan.with_solver({}), est, f"seed:{name}",
                             info={"d_dp": len(plan.pipelines)}))
        out.append(relayout(context, plan, f"seed:{name} +batches", keep_layers=True))
        out.append(relayout(context, plan, f"seed:{name} +layers", keep_layers=False))
    if p.warm_start is not None:
        out.append(relayout(context, p.warm_start, "warm_start", keep_layers=True))
        out.append(relayout(context, p.warm_start, "warm_start +layers", keep_layers=False))
    return out


def idle_devices(problem: Problem, plan: Plan | None) -> list[str]:
    """The devices of the problem's cluster that hold no stage of ``plan``, in cluster order."""
    used = set(plan.devices) if plan is not None else set()
    return [d.id for d in problem.cluster.devices if d.id not in used]


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


def walk_step(context: SearchContext, best: Candidate, rng: random.Random,
              dps: list[int]) -> tuple[int, str, tuple[int, ...]]:
    """One step of the walk around the best (§4.4): ``D_dp`` next to the best's, the cut
    (:func:`choose_objective`) and a shift of every pipeline's number of groups ``k_i``."""
    base = best.info.get("d_dp", rng.choice(dps))  # (the default is drawn at every step)
    d_dp = min(max(base + rng.choice((-1, 0, 0, 1)), dps[0]), dps[-1])
    objective = context.choose_objective(rng)
    return d_dp, objective, tuple(rng.choice(context.config.k_shifts) for _ in range(d_dp))


def speculate(context: SearchContext, best: Candidate, rng: random.Random, start: int,
              dps: list[int]) -> dict[int, tuple]:
    """The walk's candidates from iteration ``start`` on as the loop will draw them if ``best``
    and the moving averages stay as they are (``rng`` untouched), computed ahead on the spare
    cores (:func:`hexicore.planner.search.prefetch.walk_ahead`): ``iteration -> (D_dp, cut, shifts, seed)``."""
    draws = random.Random()
    draws.setstate(rng.getstate())
    out = {}
    for it in range(start, context.config.iterations):
        step = walk_step(context, best, draws, dps)
        out[it] = (*step, draws.randrange(2**31))
    walk_ahead(context, list(out.values()), context.workers)
    return out


def ends_by(deadline: float, took: float) -> bool:
    """Whether a step begun now that takes as long as the last one (``took`` seconds) ends by
    ``deadline`` (``time.monotonic()``): the anytime search begins no step it expects to
    overrun its budget with."""
    return time.monotonic() + took <= deadline


def search_loop(context: SearchContext, dps: list[int], rng: random.Random, deadline: float, best: Candidate,
                progress: Progress, yield_at: float = INF, interlude: Callable[[], None] | None = None,
                strict: bool = False) -> Candidate:
    """The §4.4 loop: the initial D_dp sweep, then a walk around the best. With spare cores
    the sweep's fixed cuts are laid out ahead (:func:`prefetch`) and the walk
    is guessed and laid out ahead from :data:`WALK_AHEAD_FROM` devices (:func:`speculate`, at
    most three times); the plan is the
    one-process plan either way. A sweep still under way at ``yield_at`` ends there (its
    candidates are too slow for the budget: :data:`LEAD_SHARE`); the walk runs to ``deadline``.
    ``interlude``: called once between the sweep and the walk (the other training settings'
    own sweep, :meth:`SideWalk.sweep`: breadth before depth, so a short budget sees every setting's
    numbers of pipelines before walking around one). Past ``deadline`` the loop goes on until
    something fits, unless ``strict``."""
    n = context.config.iterations
    sweep = initial_sweep(dps, n)
    ahead = context.workers > 1 and len(context.graph) <= context.config.machine_graph_above
    guessed: dict[int, tuple] = {}
    guesses = 0
    if ahead:
        # the sweep's fixed cuts: their phase 2 ahead, in parallel
        fixed = list(itertools.takewhile(lambda s: s[1] is not None, sweep[:n]))
        draws = random.Random()
        draws.setstate(rng.getstate())  # the loop's own seeds, one draw per candidate
        prefetch(context, [(d, o, draws.randrange(2**31)) for d, o in fixed], context.workers)
    took = 0.0  # the last candidate's seconds: one that would end past the deadline is not begun
    for it in range(n):
        if not ends_by(min(deadline, yield_at) if it < len(sweep) else deadline, took) and \
                (strict or best.score < INF or context.steering(best).score < INF):
            break  # anytime: the best so far once anything fits; until then the search goes on
        if it == len(sweep) and interlude is not None:
            interlude()
            if not ends_by(deadline, took):
                break
        if it < len(sweep):
            d_dp, objective = sweep[it]
            objective = objective or context.choose_objective(rng)
            shifts: Sequence[int] = (0,)
        else:
            if ahead and it not in guessed and guesses < 3 and n - it > 1 and len(context.graph) >= WALK_AHEAD_FROM:
                guessed, guesses = speculate(context, context.steering(best), rng, it, dps), guesses + 1
            d_dp, objective, shifts = walk_step(context, context.steering(best), rng, dps)
        seed = rng.randrange(2**31)
        if guessed.get(it, (d_dp, objective, shifts, seed)) != (d_dp, objective, shifts, seed):
            guessed = {}  # the walk left the guess: guess again from the next step
        began = time.monotonic()
        cand = two_phase(context, d_dp, objective, shifts, seed, deadline=deadline)
        took = time.monotonic() - began
        if cand.score < best.score:
            best = cand
        shown = f"{best.score:.3f} s" if best.score < INF else "none fits yet"
        priced = sum(c.evaluated for c in context.contexts())
        progress(f"hexiscale: candidate {it + 1}/{n} (D_dp={d_dp}, {objective}), {priced} priced, best {shown}",
                 (it + 1) / (n + 1))
    return best


def finalize(context: SearchContext, cands: Sequence[Candidate], deadline: float = INF,
             always: int = 0) -> tuple[Plan, dict]:
    """With schedule-priced pipelines: re-price the candidates exactly (the search ranked them by
    modelled times) and keep the best that fits under its schedules' exact peaks (the check
    ``hexicore evaluate`` makes); ``schedule=auto`` first re-chooses each pipeline's
    schedule exactly (:func:`hexicore.planner.pricing.choose_exact`, the pipeline's own schedule
    among the choices, so no pipeline gets slower), any other schedule records itself as resolved
    for its pipeline's times (:func:`hexicore.planner.pricing.resolve_plan`). A candidate that
    does not fit exactly is never returned: none fitting is an error naming the device. Past
    ``deadline`` (the search's time budget, ``time.monotonic()``) no schedule but a pipeline's
    own is priced (:func:`choose_exact`) and, once one fits, no candidate past the first
    ``always`` (the polished ones; the runners-up follow: on 32 GPUs of four types at batch 4096
    an exact estimate takes up to 0.44 s, and the runners-up took the search from 4.7 to 5.4 s
    of its 4.5 s budget); the candidates' final options end where the
    best so far's synthesis needs the rest (:func:`synthesis_reserve`)."""
    if context.book is None:  # priced exactly all along: the best candidate
        plan = min((c for c in cands if c.plan is not None), key=lambda c: c.score).plan
        if not context.exact_cost.estimate(plan).fits:
            raise unfit_error(context, plan)
        return plan, {}
    out: list = []
    priced = set()  # the same layout may come twice (a setting's best polished and the auto choice's,
    # under other schedules, which the exact pricing re-chooses alike): priced once
    took = 0.0  # the longest final options so far: none begun that would end past ``deadline``
    reserve = 0.0  # kept at the end for the best so far's costlier final options (:func:`synthesis_reserve`)
    for i, c in enumerate(cands):
        key = (tuple((p.batch, p.stages) for p in c.plan.pipelines), c.plan.train) if c.plan is not None else None
        if key is None or key in priced:
            continue
        if i >= always and time.monotonic() > deadline and any(e[0] < INF for e in out):
            break  # anytime: past the budget no runner-up (one plan fits)
        priced.add(key)
        if context.auto:
            plan, tried = choose_exact(context.book, context.exact_cost, c.plan, context.options, deadline)
        else:
            plan, tried = resolve_plan(context.book, context.exact_cost, c.plan), []
        est = plan_cost(context.exact_cost, plan, context.book).estimate(plan)  # as evaluate prices it
        entry = (est.iteration_s if est.fits else INF, len(out), plan, c.origin, tried)
        if context.auto and entry[0] < INF and ends_by(deadline - reserve, took):
            began = time.monotonic()
            entry = with_final_options(context, entry, deadline - reserve)
            took = max(took, time.monotonic() - began)
        out.append(entry)
        if context.auto and entry[0] < INF and entry is min(out, key=lambda e: e[:2]):
            reserve = synthesis_reserve(context, entry[2], deadline)
    score, _, plan, origin, tried = min(out, key=lambda c: c[:2])
    if score == INF:
        raise unfit_error(context, plan)
    info = {"origin": origin, "schedules": [p.schedule.to_dict() for p in plan.pipelines]}
    if tried:
        info["schedule_s"] = tried
    return plan, info


def synthesis_reserve(context: SearchContext, plan: Plan, deadline: float) -> float:
    """The seconds :func:`finalize` keeps at the end of the budget (the runners-up get no final
    options in them) for the costlier final options the returned plan gets after it (``synth``'s
    synthesis, Hanayo's waves: :func:`hexicore.planner.final_schedules.reschedule`): the estimate
    on ``plan``, the best final candidate so far, of those that fit the time left, in their listed
    order (:func:`~hexicore.planner.final_schedules.costly_final_s`); none where none fits (they
    would not begin: the runners-up have the time). On 40 GPUs of four types, Llama-2 7B, every option
    on, the quick synthesis of the winner's pipelines gives 13.29 s against DualPipe-V's 13.79,
    where the runners-up's final options had left it 0.18 s of the 0.55 s it needs."""
    left = deadline - time.monotonic()
    if left == INF or left <= 0:
        return 0.0
    need = costly_final_s(context.problem, plan, left)  # (the costly options that fit the time left)
    return need if need <= left else 0.0


def with_final_options(context: SearchContext, entry: tuple, deadline: float) -> tuple:
    """``schedule=auto``: a final candidate (``(exact seconds, order, plan, origin, tried)``) with
    ``final_options`` tried on its pipelines — those priced by one simulation
    (:func:`hexicore.planner.final_schedules.reschedule`; the winner gets the costlier ones after
    the search) — where one makes it faster: a runner-up may win under a schedule the search did
    not price (on a 40-GPU cluster of four types, 13.79 s with DualPipe-V against the search's
    best, 14.48 s under ZB-H1). :func:`finalize` gives them to each candidate right after
    pricing it exactly, in the search's order, while the budget allows: depth first (on 24 GPUs
    of three types, GPT-Neo, the lead setting's 1F1B plan, priced second, wins under ZB-H2).

    Where an option was faster for a pipeline but held back (it did not fit: DualPipe-V keeps the
    embedding and the head on one device) and ``train.zero=auto`` allows a higher ZeRO stage, the
    same layout is tried again under the next one (:func:`higher_zero`), whose shards leave that
    device room: the schedule and the ZeRO stage chosen together for a layout (hetero3, Llama
    30B, every option on: 20.18 s under ZeRO-1 and ZB-H1; ZeRO-2 lets DualPipe-V fit)."""
    best, plan = entry, entry[2]
    for zero in (plan.train.zero_stage, *higher_zero(context, plan)):
        if zero != plan.train.zero_stage and time.monotonic() > deadline:
            break
        trial = plan if zero == plan.train.zero_stage else replace(plan, train=replace(plan.train, zero=zero))
        new = reschedule(context.problem, trial, deadline=deadline, most_simulations=1)
        est = plan_cost(context.exact_cost, new, context.book).estimate(new)
        if new != plan and est.fits and est.iteration_s < best[0] - 1e-12:
            seen = new.solver.get("schedule_s") or [{} for _ in new.pipelines]
            tried = [{**a, **b} for a, b in zip(entry[4] or [{} for _ in new.pipelines], seen)]
            best = (est.iteration_s, entry[1], new.with_solver({}), entry[3], tried)
        if not held_back(new, est):
            break
    return best


def higher_zero(context: SearchContext, plan: Plan) -> list[int]:
    """The ZeRO stages above ``plan``'s that the search's training settings allow (``train.zero=auto``
    makes a setting per stage), up to ZeRO-2 (ZeRO-3 re-gathers every micro-batch: another plan)."""
    allowed = {c.problem.train.zero_stage for c in context.contexts()}
    return [z for z in (1, 2) if z > plan.train.zero_stage and z in allowed]


def held_back(plan: Plan, estimate) -> bool:
    """Whether a final option priced faster than a pipeline's chosen schedule was not taken (the
    re-choice's ``schedule_s``: seconds per option tried, per pipeline)."""
    seen = (plan.solver or {}).get("schedule_s") or []
    return any(s and min(s.values()) < t - 1e-9 for s, t in zip(seen, estimate.pipeline_s))


@dataclass(frozen=True)
class Searched:
    """What one search found, before the exact pricing (:func:`finish`): its context, the
    polished candidates (the ``schedule=auto`` choice first) and the run's facts."""

    context: SearchContext
    candidates: tuple[Candidate, ...]
    best: Candidate
    seed: int
    replanned: bool
    deadline: float = INF  # the exact pricing's time budget ends (``time.monotonic()``, :func:`finish`)
    polished: int = 0  # the first candidates, polished: priced exactly past the deadline too (:func:`finalize`)

    @property
    def plan(self) -> Plan:
        """The best candidate's plan with its modelled estimate: what an allocation compares
        sub-clusters by (the final plan is priced exactly, :func:`finish`)."""
        top = min(self.candidates, key=lambda c: c.score)
        return top.plan.with_estimate(top.estimate).with_solver({"bound": flops_bound(top.plan)})


def unfit_error(context: SearchContext, plan: Plan) -> HexicoreError:
    """The search's best plan does not fit under its schedules' exact peaks (the modelled ones
    it ranked by were lower): why, as the plan check says it (:func:`validate_plan`)."""
    try:
        validate_plan(plan, context.exact_cost)
    except HexicoreError as exc:
        why = str(exc)
    else:
        why = "it does not fit its devices' memory"
    return HexicoreError(f"the search's best plan does not fit under its schedules' exact peak activations: {why}",
                         field="schedule")


def run_search(problem: Problem, config: SearchConfig, *, time_limit: float | None = None, seed: int = 0,
               progress: Progress = no_progress, memo: dict | None = None, prices_until: float | None = None) -> Plan:
    """The iterative two-phase search of §4.4 (:func:`search`), its best plan priced exactly
    (:func:`finish`; ``prices_until`` as in :func:`search`)."""
    return finish(search(problem, config, time_limit=time_limit, seed=seed, progress=progress, memo=memo,
                         prices_until=prices_until), progress)


def search(problem: Problem, config: SearchConfig, *, time_limit: float | None = None, seed: int = 0,
           progress: Progress = no_progress, memo: dict | None = None, strict: bool = False,
           prices_until: float | None = None) -> Searched:
    """The iterative two-phase search of §4.4; returns the best candidates found (never worse
    than the seeds' whose number of pipelines lies in the configured D_dp range), priced by the
    search's model. ``time_limit`` (s) stops the loop early; everything else is seeded. A
    ``warm_start`` plan is repaired and improved (:func:`replan_search`) instead of a cold search.

    ``schedule=auto``: the loop runs exactly as for its first option alone (that option prices
    every candidate and steers the walk); each candidate's layouts are also assembled with every
    pipeline's schedule chosen (:func:`assemble` ``choose``), the best of those is polished under
    the choice, and the final plan is the exactly re-priced better of it and the first option's
    own (polished) result, with schedules re-chosen (:func:`finish`). Other training settings
    (``problem.train_options``) are priced on the same candidates (:func:`.candidate.two_phase`), the best
    of all steering the walk. ``strict``: the time limit holds even where nothing fits yet (a sub-cluster's
    search, the whole cluster's having a plan): out of time, a one-line error on ``solver.time_limit``.
    ``prices_until``: when the exact pricing (:func:`finish`) must end, ``time.monotonic()``
    (default: the search's own deadline; a solver keeps a share of its budget for it); a
    companion search may run beside it (:func:`companion_start`)."""
    t0 = time.monotonic()
    deadline = t0 + time_limit if time_limit else INF
    walk_ends = t0 + (1 - POLISH_SHARE) * time_limit if time_limit else INF  # (the polish has the rest)
    context = make_context(problem, config, memo)
    dps = context.pipeline_counts()
    rng = random.Random(seed)
    replanned = problem.warm_start is not None and config.replan_iterations is not None
    companion = None
    if replanned:
        best = replan_search(context, dps, rng, deadline, progress)
        replanned = best.plan is not None  # nothing repaired fits: fall back to the full search
    if not replanned:
        progress("hexiscale: seeding with symmetric plans", 0.0)
        seeds = [c for c in all_seeds(context, seed) if c.plan is None or len(c.plan.pipelines) in dps]
        partial = []  # use_all_devices: a seed on fewer devices (megatron leaves the slowest idle where no
        if config.use_all_devices:  # symmetric layout of every device is legal) only where no plan of all fits
            partial = [c for c in seeds if c.plan is not None and idle_devices(problem, c.plan)]
            seeds = [c for c in seeds if c.plan is None or not idle_devices(problem, c.plan)]
        companion = companion_start(problem, config, walk_ends, seed)
        own = lead_pipeline_counts(context) or dps  # the lead setting's walk is the one it takes alone
        lead_ends = INF if set(dps) <= set(own) else time.monotonic() + LEAD_SHARE * (walk_ends - time.monotonic())
        side = SideWalk(context, own, dps, random.Random(seed + 1), walk_ends, progress, seed=seed + 1)
        best = search_loop(context, own, rng, walk_ends, min(seeds or [Candidate(INF, None, None, "none")],
                                                         key=lambda c: c.score), progress, lead_ends,
                           side.sweep if context.others else None, strict)
        if context.others:
            side.sweep()
            side.walk()
        if best.plan is None and partial and min(c.score for c in partial) < INF:
            best = min(partial, key=lambda c: c.score)
            log.warning("solver.use_all_devices=true: no plan that gives every device a pipeline stage fits (%s); "
                        "devices %s are left idle", EVERY_STAGE, ", ".join(idle_devices(problem, best.plan)))
    side = context.side_best if context.side_best is not None and context.side_best.score < INF else None
    if best.plan is None and side is None:
        if strict and time.monotonic() > deadline:
            raise HexicoreError(f"no plan found within the time limit of {time_limit:g} s", field="solver.time_limit")
        raise no_fit_error(problem, config.use_all_devices)
    progress("hexiscale: polishing stage boundaries", config.iterations / (config.iterations + 1))
    # a repaired plan: the kept pipelines were polished before; only the repaired ones move
    only = best.info.get("repaired") if replanned and best.origin.startswith("warm_start repaired") else None
    cands = []
    polishes = [f for f in (best, side) if f is not None and f.plan is not None] + ([None] if context.auto else [])
    weights = [AUTO_POLISH if f is None else 1 for f in polishes]
    for i, found in enumerate(polishes):  # the lead setting's best and the best under the others, then
        ends = share_of(deadline, weights[i] / sum(weights[i:]))  # the schedule=auto choice, each in its share
        if found is None:
            chosen = min((c for c in context.contexts() if c.auto_best is not None), key=lambda c: c.auto_best.score)
            cands.insert(0, polish(chosen, chosen.auto_best, ends, only, True))
            continue
        own = context.of(found)
        cands.append(polish(own, found, ends, only))
        if context.auto:
            own.track_auto([assemble(own, cands[-1].layouts, found.origin, found.info, True)])
    top = min(cands, key=lambda c: c.score)
    prices_until = deadline if prices_until is None else prices_until
    polished = sum(c.plan is not None for c in cands)
    if time.monotonic() < prices_until:  # (while the exact pricing has time)
        cands += runners_up(context, cands, top, dps)
    cands += companion_found(context, companion)  # (after the runners-up: priced while the budget lasts)
    return Searched(context, tuple(c for c in cands if c.plan is not None), top, seed, replanned, prices_until,
                    polished)


def companion_start(problem: Problem, config: SearchConfig, deadline: float, seed: int) -> Forked | None:
    """Under ``train.micro_batch=auto`` with a spare core and a budget: the same search led by
    the next micro-batch size (its settings and the larger sizes'), in a forked process at the
    lowest priority, to ``deadline``; None otherwise (no budget: the plan depends on the seed
    alone). This search prices the other sizes on its lead's stages re-laid out, which suit a
    larger micro-batch less: on 40 GPUs of three types (Llama-2 7B, batch 256, every option on)
    micro-batch 2 scored 9.42 s that way, and its own search finds 7.80 against micro-batch
    1's 8.21. Its best polished candidate comes back as layouts (a plan's objects do not all
    pickle) and is priced after this search's runners-up, while the budget lasts (priced before them, it pushed hetero3's 19.41 s runner-up past the budget: 19.94)."""
    sizes = sorted({t.micro_batch for t in (problem.train,) + problem.train_options})
    if len(sizes) < 2 or deadline == INF or available_cores() < 2 or problem.warm_start is not None:
        return None
    rest = [t for t in (problem.train,) + problem.train_options if t.micro_batch >= sizes[1]]
    second = replace(problem, train=rest[0], train_options=tuple(rest[1:]))

    def run(_: int) -> list[tuple[dict, tuple]]:
        os.nice(19)  # a core the search leaves idle, never one it uses
        found = search(second, config, time_limit=max(0.05, deadline - time.monotonic()), seed=seed)
        top = sorted(found.candidates[:found.polished], key=lambda c: c.score)[:1]
        return [(c.plan.train.to_dict(), tuple(c.layouts), c.origin) for c in top if c.layouts]
    return fork_start(run, [0], 1)


def companion_found(context: SearchContext, companion: Forked | None) -> list[Candidate]:
    """:func:`companion_start`'s best candidate, assembled under this search's context of its setting."""
    if companion is None:
        return []
    try:
        (found,) = companion.result()
    except HexicoreError:
        return []
    out = []
    for train, layouts, origin in found:
        own = next((c for c in context.contexts() if c.problem.train.to_dict() == train), None)
        if own is not None:
            cand = assemble(own, list(layouts), f"{origin} (companion)", {"d_dp": len(layouts)})
            out += [cand] if cand.plan is not None else []
    return out


def share_of(deadline: float, share: float) -> float:
    """When ``share`` of the time left until ``deadline`` ends."""
    return deadline if deadline == INF else time.monotonic() + (deadline - time.monotonic()) * share


def runners_up(context: SearchContext, cands: Sequence[Candidate], top: Candidate, dps: Sequence[int]) -> list[Candidate]:
    """The search's runners-up priced exactly too (:func:`finalize`): from every training
    setting's pool, those within :data:`FINAL_WITHIN` of ``top``, up to :data:`FINAL_MOST`
    candidates with ``cands``; first each setting's best (another micro-batch size may win under a
    final option the search does not price), then the rest by score; none whose number of
    pipelines is outside ``dps`` or, under ``use_all_devices``, that leaves a device idle."""
    problem, config = context.problem, context.config
    have = {(layout_key(c.plan), c.plan.train) for c in cands if c.plan is not None}
    heads = sorted((own.pool[0] for own in context.contexts() if own.pool), key=lambda c: c.score)
    pooled = heads + sorted((c for own in context.contexts() for c in own.pool[1:]), key=lambda c: c.score)
    out: list[Candidate] = []
    for c in pooled:
        if len(cands) + len(out) >= FINAL_MOST:
            break
        if c.score > top.score * (1 + FINAL_WITHIN):
            continue
        if len(c.plan.pipelines) not in dps or (config.use_all_devices and idle_devices(problem, c.plan)):
            continue  # (seeds outside the D_dp range, or on fewer devices)
        key = (layout_key(c.plan), c.plan.train)  # (devices swapped inside a machine: the same plan)
        if key not in have:
            have.add(key)
            out.append(c)
    return out


def finish(found: Searched, progress: Progress = no_progress) -> Plan:
    """The searched candidates priced exactly (:func:`finalize`), the best as a plan with the
    search's solver info."""
    context, best, problem = found.context, found.best, found.context.problem
    plan, sched_info = finalize(context, found.candidates, found.deadline, found.polished)
    progress(f"hexiscale: done, {best.score:.3f} s", 1.0)
    config = context.config
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
    info = {"name": "hexiscale", "params": params, "status": "HEURISTIC", "bound": flops_bound(plan),
            "origin": best.origin,
            "candidates": sum(c.evaluated for c in context.contexts()), "d_dp": len(plan.pipelines),
            "seed": found.seed, **sched_info}
    modelled = [c.score for c in found.candidates if c.origin == sched_info.get("origin", best.origin)]
    if modelled and modelled[0] < INF:  # the search's modelled time of the plan kept (before the exact pricing)
        info["modelled_s"] = round(modelled[0], 6)
    if context.others:  # per training setting the best the search found (the plan's own: exactly priced)
        exact = plan_cost(context.exact_cost, plan, context.book).estimate(plan)
        info["train_s"] = [[c.problem.train.to_dict(),
                            exact.iteration_s if c.problem.train == plan.train
                            else (None if c.best_score == INF else c.best_score)] for c in context.contexts()]
    if config.use_all_devices and idle_devices(problem, plan):  # no plan of every device fits: it says so
        info["idle_devices"] = idle_devices(problem, plan)
    if found.replanned:
        info["replan"] = plan_diff(problem.warm_start, plan)
    return plan.with_solver(info)


def flops_bound(plan: Plan) -> float:
    """An iteration time no plan on ``plan``'s cluster beats: the model's FLOPs of one
    iteration (forward and backward, ``3 x tokens x FLOPs a token``, the MFU's numerator) at
    the cluster's peak rate (every MFU is at most 1); the gap beside a plan's time says how far
    the search may be from the best plan."""
    tokens = plan.train.global_batch * plan.train.seq_len
    return 3.0 * tokens * plan.model.model_flops_per_token(plan.train.seq_len) / (plan.cluster.total_tflops * 1e12)


#: the search's runners-up priced exactly at the end (:func:`finalize`): those modelled within
#: this (relative) of the best, up to FINAL_MOST candidates in all
FINAL_WITHIN = 0.05
FINAL_MOST = 6
#: under a time budget, the search's loop (and side walk) ends with this share of it left, for
#: polishing its best candidates (:func:`~hexicore.planner.search.candidate.polish`: the stages'
#: order, then their boundaries), which otherwise began at the deadline and did nothing: on
#: hetero3 (Llama 30B, every option on) moving the RTX 3090 pair of the best layout's pipelines
#: from the front to the end alone took 20.18 s to 18.51
POLISH_SHARE = 0.15
#: of that time, the ``schedule=auto`` choice's polish (the plan returned, as a rule) takes this
#: many shares, the lead setting's best and the best under the others one each
AUTO_POLISH = 2
#: under a time budget, where other training settings allow numbers of pipelines the lead's
#: memory does not (ZeRO frees memory: often more pipelines) and the lead's initial sweep is
#: still under way after this share of the time left after seeding (its candidates are slow: a
#: large cluster), the lead's loop ends there and the side walk (:class:`SideWalk`) has the
#: rest, so those are searched too; a lead that swept in time walks on to the deadline (no
#: budget: all of both run)
LEAD_SHARE = 0.5
#: each walk of the side walk takes this fraction (1 / SIDE_SHARE) of the loop's iterations:
#: all of them, as many as a search of that setting alone (24 GPUs of two types, Llama-2 13B,
#: every option on: with a third, ZeRO-1's walk swept four pipelines under one cut only and
#: ended at 100.0 s; with all, 91.9 s, its best alone). Under a time budget the walk ends there
SIDE_SHARE = 1
#: how many other training settings walk in the side walk (the fastest so far), taking turns
#: (the paper case, every option on: the second fastest, ZeRO-2, wins, 15.09 s against 15.39)
SIDE_FOCI = 2
#: under a time budget, the side walk's sweep takes at most this share of the time left when it
#: begins (its walks, and the lead's, have the rest)
SIDE_SWEEP_SHARE = 0.5

#: the side walk gives its steps to the focus with the fastest plan, but a focus the others have
#: taken this many steps past since its own last goes next (:meth:`SideWalk.walk`)
SIDE_LEAD_STEPS = 2


def coarse_to_fine(values: Sequence[int]) -> list[int]:
    """``values`` in an order that covers their range evenly at every prefix: the ends, then the
    middle of each gap, level by level (a search cut short has seen the whole range coarsely)."""
    if len(values) <= 2:
        return list(values)
    out, gaps = [values[0], values[-1]], [(0, len(values) - 1)]
    while gaps:
        nxt = []
        for lo, hi in gaps:
            if hi - lo > 1:
                mid = (lo + hi) // 2
                out.append(values[mid])
                nxt += [(lo, mid), (mid, hi)]
        gaps = nxt
    return out


@dataclass
class SideWalk:
    """After (or inside, :func:`search_loop`'s ``interlude``) the lead setting's loop, the other
    training settings' own part of the search: :meth:`sweep`, the numbers of pipelines only they
    allow (both cuts), then :meth:`walk`, best first, a search of
    ``iterations / SIDE_SHARE`` candidates by each of the :data:`SIDE_FOCI` other settings whose
    best candidates are fastest (:func:`focus_steps`: its own sweep over the numbers of pipelines
    it allows, then a walk around its best), each with its own phase 2 (a ZeRO stage or
    micro-batch size that frees memory gives other stage strategies than the lead's stages
    re-laid out); the candidates are kept aside as in the loop. :meth:`sweep` runs once (a
    second call, after the loop's ``interlude``, does nothing)."""

    context: SearchContext
    own: list[int]
    dps: list[int]
    rng: random.Random
    deadline: float
    progress: Progress = no_progress
    took: float = 0.0  # the last step's seconds (:func:`ends_by`)
    swept: bool = False
    seed: int = 0  # each focus setting's walk draws from its own stream (:meth:`stream`)

    def stream(self, focus: SearchContext) -> random.Random:
        """The random draws of ``focus``'s walk: a stream of its own, seeded by the search's seed
        and the setting's micro-batch size and ZeRO stage, so what a setting's walk tries does not
        depend on how many draws the sweep, or the other focus, took before it (that varies with
        the time each step takes and with the other settings searched: on hetero3, Llama 30B,
        every option on, the ZeRO-1 walk found its four-pipeline plan at micro-batch 1 and not
        under ``train.micro_batch=auto``, whose sweep had taken fewer steps)."""
        train = focus.problem.train
        return random.Random(f"{self.seed}:walk:{train.micro_batch}:{train.zero_stage}")

    def sweep(self) -> None:
        """The numbers of pipelines the lead setting does not allow, both cuts (once), coarse to
        fine (:func:`coarse_to_fine`), for :data:`SIDE_SWEEP_SHARE` of the time left at most."""
        if self.swept:
            return
        self.swept = True
        context = self.context
        done = context.config.iterations / (context.config.iterations + 1)  # (the loop's share of the bar)
        ends = self.deadline if self.deadline == INF else \
            time.monotonic() + SIDE_SWEEP_SHARE * (self.deadline - time.monotonic())
        for d_dp in coarse_to_fine([d for d in self.dps if d not in self.own]):
            for objective in ("min_cut", "max_cut"):
                if ends_by(ends, self.took):
                    self.progress(f"hexiscale: other training settings, D_dp={d_dp} ({objective})", done)
                    began = time.monotonic()
                    two_phase(context, d_dp, objective, (0,), self.rng.randrange(2**31), side=True,
                              deadline=self.deadline)
                    self.took = time.monotonic() - began

    def walk(self) -> None:
        """The focus settings' searches to the deadline, best first: the step goes to the focus
        whose best plan is fastest, except that a focus the others have taken
        :data:`SIDE_LEAD_STEPS` steps past since its own last goes next (on hetero3, Llama 30B,
        every option on, ZeRO-1's walk, ahead of ZeRO-2's, reached its four-pipeline plan, the
        best after the final options, within the budget this way, and not taking strict turns)."""
        context = self.context
        done = context.config.iterations / (context.config.iterations + 1)
        foci = sorted((c for c in context.others if c.best_found is not None and c.best_found.score < INF),
                      key=lambda c: (c.best_found.score, c.choice))[:SIDE_FOCI]
        streams = {id(focus): self.stream(focus) for focus in foci}
        walks = {id(focus): (focus, focus_steps(focus, lead_pipeline_counts(focus) or self.dps, streams[id(focus)],
                                                context.config.iterations // SIDE_SHARE)) for focus in foci}
        waited = {key: 0 for key in walks}  # steps the others took since this focus's last
        while walks:
            if not ends_by(self.deadline, self.took):
                return
            ranked = sorted(walks, key=lambda key: (walks[key][0].best_score, walks[key][0].choice))
            key = next((k for k in ranked if waited[k] >= SIDE_LEAD_STEPS), ranked[0])
            focus, steps = walks[key]
            step = next(steps, None)
            if step is None:
                del walks[key]
                continue
            for other in walks:
                waited[other] = 0 if other == key else waited[other] + 1
            train = focus.problem.train
            self.progress(f"hexiscale: walk of ZeRO-{train.zero_stage}, micro-batch {train.micro_batch} "
                          f"(D_dp={step[0]}, {step[1]})", done)
            began = time.monotonic()
            context.track_side([two_phase(focus, *step, streams[key].randrange(2**31), deadline=self.deadline)])
            self.took = time.monotonic() - began


def focus_steps(context: SearchContext, dps: list[int], rng: random.Random, n: int):
    """The ``n`` steps ``(D_dp, cut, shifts)`` of one setting's search in the side walk:
    :func:`initial_sweep` over its numbers of pipelines, nearest its best so far first (found on
    the lead's parts: a walk the budget cuts short has searched where that setting is strongest;
    on 32 GPUs of four types at batch 4096 the ZeRO-2 walk swept from 5 pipelines up and ended
    at 31 before walking around its best, 24), then :func:`walk_step` around its best (read
    when the step is taken)."""
    sweep = initial_sweep(dps, n)[:n]
    near = (context.best_found.info or {}).get("d_dp") if context.best_found is not None else None
    if near is not None:
        sweep.sort(key=lambda step: abs(step[0] - near))  # (stable: the cuts of one D_dp stay in order)
    for d_dp, objective in sweep:
        yield d_dp, objective or context.choose_objective(rng), (0,)
    for _ in range(n - len(sweep)):
        yield walk_step(context, context.best_found, rng, dps)


def lead_pipeline_counts(context: SearchContext) -> list[int]:
    """The lead training setting's own numbers of pipelines (:meth:`SearchContext.dp_range`);
    none where its memory allows none."""
    try:
        return context.dp_range()
    except HexicoreError:
        return []


def all_seeds(context: SearchContext, seed: int) -> list[Candidate]:
    """The seed candidates (:func:`seed_candidates`) of the lead training setting; those of the
    roomiest one where none of the lead's fits (the seed solvers lay out under each) and, under
    every other setting, the seed plans re-laid out (:func:`relayout`, bounds first against the
    best seed) are kept aside (:meth:`SearchContext.track_side`)."""
    seeds = seed_candidates(context, seed)
    side: list[Candidate] = []
    if context.roomy is not context and min((c.score for c in seeds), default=INF) == INF:
        side = seed_candidates(context.roomy, seed)
    plans = [c.plan for c in seeds + side if c.plan is not None]
    beat = min((c.score for c in seeds + side), default=INF)
    for other in context.others:
        if not (side and other is context.roomy):
            side += [relayout(other, plan, "seed re-laid", keep_layers=False, beat=beat) for plan in plans]
    context.track_side(side)
    return seeds
