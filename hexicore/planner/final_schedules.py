"""``schedule=auto``'s final re-pricing: the installed schedules not among its ``options`` are
tried on the final plan's pipelines only (``final_options``): those too costly to price inside
the search (a synthesis per pipeline shape, ``synth``) and the remaining named ones.

The search and its exact re-choice (:func:`hexicore.planner.pricing.choose_exact`) use
``schedule=auto``'s ``options``; the search's final candidates then get the final options
priced by one simulation each (:func:`hexicore.planner.search.loop.with_final_options`: a
runner-up may win under one), and the solver calls :func:`reschedule` once more, with every
final option, on the plan it returns (after the allocation over sub-clusters, so once per
``hexicore plan``). Per pipeline
(layers, devices and batch fixed), each of ``final_options`` (conf/schedule/auto.yaml's by
default) is built for the pipeline's own stage and hop times; a schedule whose ``Pricing``
declares ``memory_cap`` gets the pipeline's own per-rank cap (the most in-flight
micro-batches every stage's devices hold, :func:`hexicore.planner.stage_layout.pipeline_fit.memory_caps`); an
option that refuses the pipeline (e.g. too few micro-batches) is skipped. It replaces the pipeline's schedule only
when it is faster and its exact peak activations fit every stage
(:func:`hexicore.planner.stage_layout.pipeline_fit.fits`); the new plan is kept only when its full estimate
fits and is not slower, else the new schedules are taken one pipeline at a time, each kept
only so. So ``auto`` with final options is never slower than without them, and
the plan records the chosen schedule of every pipeline (with what a runtime needs to rebuild it,
the schedule's ``resolve``).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Mapping

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.pricer import worth_pricing
from hexicore.pipeline.spec import ScheduleSpec
from hexicore.planner.allocation.objective import rate
from hexicore.planner.stage_layout.pipeline_fit import capped, fits
from hexicore.planner.pricing import AUTO, ScheduleBook, auto_defaults, placed_bound, resolve_placed, timed_cost
from hexicore.planner.problem import Problem, Progress, no_progress

#: ``schedule=auto``'s key for the schedules tried on the final plan only
FINAL = "final_options"


def final_options(schedule: Mapping[str, Any]) -> tuple[ScheduleRef, ...]:
    """``schedule=auto``'s ``final_options``: conf/schedule/auto.yaml's while ``options`` are
    its defaults too (absent or equal); a problem that lists its own ``options`` gets exactly
    those unless it names other ``final_options`` as well; ``[]`` turns the final re-pricing
    off. None for any other schedule."""
    ref = ScheduleRef.from_mapping(schedule)
    if ref.name != AUTO:
        return ()
    shipped = auto_defaults()
    default = _refs(shipped.get(FINAL), FINAL)
    given = _refs(ref.get(FINAL), FINAL) if FINAL in ref.params else default
    own_options = "options" in ref.params and _refs(ref.get("options"), "options") != _refs(shipped.get("options"),
                                                                                           "options")
    return () if own_options and given == default else given


def _refs(raw: Any, key: str) -> tuple[ScheduleRef, ...]:
    out = []
    for i, o in enumerate(raw or []):
        if not isinstance(o, Mapping) or not isinstance(o.get("name"), str) or o["name"] == AUTO:
            raise HexicoreError(f"each entry must be a mapping with a schedule name, got {o!r}",
                                field=f"schedule.{key}[{i}]")
        out.append(ScheduleRef.from_mapping(o))
    return tuple(out)


def _pricing(problem: Problem) -> tuple[Any, ScheduleBook] | None:
    """The schedule-priced cost model and book the plan is checked with (None: a cost model the
    schedules cannot price)."""
    if problem.pricing is not None:
        return problem.cost, problem.pricing
    if not hasattr(problem.cost, "activation") or not hasattr(problem.cost, "pipeline_timer"):
        return None
    book = ScheduleBook(problem.registry)
    return timed_cost(problem.cost, book), book


def reschedule(problem: Problem, plan: Plan, progress: Progress = no_progress, deadline: float | None = None,
               most_simulations: int | None = None) -> Plan:
    """The module docstring's final re-pricing of ``plan`` (``problem.schedule`` is ``auto``
    with final options; otherwise ``plan`` is returned as it is). The solver section's
    ``schedules`` and ``schedule_s`` (seconds per option tried, per pipeline) and the rate
    figures follow the new plan. Past ``deadline`` (``time.monotonic()``, the solver's time
    budget) no further option is tried (the options are tried in their listed order).
    ``most_simulations``: only the options whose ``Pricing.simulations`` are at most this (1:
    those priced by one simulation, as the search's final candidates are, before the winner
    gets a synthesis too)."""
    refs = final_options(problem.schedule)
    priced = _pricing(problem) if refs and problem.registry is not None else None
    if priced is None:
        return plan
    cost, book = priced
    if most_simulations is not None:  # (the book that prices the plan says what each costs)
        refs = tuple(r for r in refs if book.schedule(r).pricing.simulations <= most_simulations)
        if not refs:
            return plan
    base = cost.estimate(plan)
    pipes, seen_all, shapes, simulation_s = [], [], {}, 0.0
    built: set = set()  # the costlier options built so far, per times and cap (their lists are cached)
    for i, p in enumerate(plan.pipelines):
        progress(f"auto: final schedules for pipeline {i + 1}/{len(plan.pipelines)}", i / len(plan.pipelines))
        stage_s, hop_s = cost.pipeline_pieces(plan, p)
        n = p.n_micro_batches(plan.train.micro_batch)
        key = (tuple(stage_s), tuple(hop_s), n, p.stages, p.schedule)
        if key not in shapes:
            ref, seen, simulation_s = _choose(book, cost, plan, p, refs, stage_s, hop_s, n, deadline, simulation_s,
                                              built)
            shapes[key] = ref, seen
        ref, seen = shapes[key]
        pipes.append(Pipeline(p.batch, p.stages, ref))
        seen_all.append(seen)
    new = replace(plan, pipelines=tuple(pipes))
    est = cost.estimate(new) if new != plan else base
    if not est.fits or est.iteration_s > base.iteration_s + 1e-12:
        new, est = _one_by_one(cost, plan, base, pipes)
    info = dict(plan.solver or {})
    tried = info.get("schedule_s") or [{} for _ in plan.pipelines]
    info["schedule_s"] = [{**a, **b} for a, b in zip(tried, seen_all)]
    info["schedules"] = [q.schedule.to_dict() for q in new.pipelines]
    new = new.with_estimate(est) if plan.estimate is not None else new
    if "tokens_per_s" in info:
        info.update(rate(new))
    return new.with_solver(info)


def _one_by_one(cost: Any, plan: Plan, base: Any, pipes: list[Pipeline]) -> tuple[Plan, Any]:
    """The pipelines' new schedules taken one at a time, in order, each kept when the whole
    plan's estimate still fits and is no slower (together they may not be: a schedule that moves
    the embedding or head to another stage moves its data-parallel sync too)."""
    cur, est = plan, base
    for i, q in enumerate(pipes):
        if q == cur.pipelines[i]:
            continue
        trial = replace(cur, pipelines=cur.pipelines[:i] + (q,) + cur.pipelines[i + 1:])
        e = cost.estimate(trial)
        if e.fits and e.iteration_s <= est.iteration_s + 1e-12:
            cur, est = trial, e
    return cur, est


def _choose(book: ScheduleBook, cost: Any, plan: Plan, p: Pipeline, refs: tuple[ScheduleRef, ...],
            stage_s: list, hop_s: list, n: int, deadline: float | None = None,
            simulation_s: float = 0.0, built: set | None = None) -> tuple[ScheduleRef, dict, float]:
    """One pipeline: its schedule, or the fastest final option that is faster and fits; an
    option whose lower bound leaves no room to beat the best so far
    (:func:`~hexicore.pipeline.pricer.worth_pricing`) is not built, nor any past ``deadline``,
    nor one that would end past it: an option of one simulation by the slowest one seen so far
    (of this pipeline, or ``simulation_s`` of the plan's earlier ones: cached prices take no time),
    a costlier one by its ``Pricing.simulations`` times one simulation of the pipeline's own
    schedule, timed afresh (:func:`fresh_simulation_s`: what those counts were measured against,
    and what :func:`costly_final_s` reserves by; the slowest one-simulation option, e.g.
    DualPipe-V's greedy build, is 2-3 of those and left a reserved synthesis unbegun). A costlier option already built for the same times and cap
    (``built``, shared by the plan's pipelines: the schedule caches its lists per times) costs
    nothing and is tried whatever the time left. Returns the schedule, the seconds per option
    tried and that slowest simulation."""
    began = time.monotonic()
    best, best_s = p.schedule, book.exact(p.schedule, stage_s, hop_s, n)
    one = max(simulation_s, time.monotonic() - began)  # one simulation of a pipeline, about (the slowest seen)
    own = None  # one fresh simulation of this pipeline's own schedule: what ``simulations`` counts in
    seen = {}
    for ref in refs:
        many = book.schedule(ref).pricing.simulations
        known = None if many <= 1 else repr((capped(book, cost, plan, p, ref), stage_s, hop_s, n))
        if built is not None and known in built:
            many = 0  # (built for these times and cap on an earlier pipeline: cached, tried past the deadline too)
        if deadline is not None and time.monotonic() > deadline and many:
            continue
        if not book.runs(ref, len(p.stages), n):
            continue
        if deadline is not None and many > 1 and own is None:  # (the prices above may have been cached)
            own = fresh_simulation_s(book, p.schedule, stage_s, hop_s, n)
        if deadline is not None and many and time.monotonic() + many * (own if many > 1 else one) > deadline:
            continue  # (``Pricing.simulations``: a synthesis would end past the budget)
        if known is not None and built is not None:
            built.add(known)
        if not worth_pricing(placed_bound(book, cost, plan, p, ref), best_s):
            continue
        ref = capped(book, cost, plan, p, ref)
        began = time.monotonic()
        try:
            chosen, secs = resolve_placed(book, cost, plan, Pipeline(p.batch, p.stages, ref))
        except HexicoreError:
            continue  # the schedule refuses this pipeline (e.g. too few micro-batches for it)
        if book.schedule(ref).pricing.simulations == 1:
            one = max(one, time.monotonic() - began)
        seen[chosen.name] = round(secs, 6)
        if secs < best_s - 1e-12 and fits(book, cost, plan, Pipeline(p.batch, p.stages, chosen)):
            best, best_s = chosen, secs
    return best, seen, max(one, own or 0.0)


def fresh_simulation_s(book: ScheduleBook, ref: ScheduleRef, stage_s: list, hop_s: list, n: int) -> float:
    """Seconds to build and simulate ``ref``'s lists for this pipeline once, uncached: what
    ``Pricing.simulations`` multiplies (a pipeline's own schedule was priced in the search, so its
    price costs nothing now and says nothing of a simulation's cost)."""
    began = time.monotonic()
    try:
        book.schedule(ref).simulate(ScheduleSpec.from_pieces(stage_s, hop_s, n))
    except HexicoreError:
        return 0.0
    return time.monotonic() - began


def costly_final_s(problem: Problem, plan: Plan, within: float = math.inf) -> float:
    """About how long :func:`reschedule` takes on ``plan`` with every final option, where some
    are costlier than one simulation (a synthesis, Hanayo's waves): per distinct pipeline shape,
    each such option's ``Pricing.simulations`` times one fresh simulation of the pipeline's own
    schedule (:func:`fresh_simulation_s`, as :func:`_choose` estimates them), twice (an option is
    resolved again where its own placement moves the head or the embedding:
    :func:`hexicore.planner.pricing.resolve_placed`). 0 where every option takes one simulation
    (they are priced on the final candidates already). ``within``: the seconds there are; the
    options are taken in their listed order and one that would not end within them is left out,
    as :func:`_choose` leaves it out (so a later, cheaper one still counts)."""
    refs = final_options(problem.schedule)
    priced = _pricing(problem) if refs and problem.registry is not None else None
    if priced is None:
        return 0.0
    cost, book = priced
    counts = [book.schedule(r).pricing.simulations for r in refs]
    if max(counts, default=1) <= 1:
        return 0.0
    one, shapes = 0.0, set()  # one simulation of each distinct pipeline shape, summed
    for p in plan.pipelines:
        stage_s, hop_s = cost.pipeline_pieces(plan, p)
        n = p.n_micro_batches(plan.train.micro_batch)
        key = (tuple(stage_s), tuple(hop_s), n, p.schedule)  # (a schedule's lists are cached per times)
        if key not in shapes:
            shapes.add(key)
            one += fresh_simulation_s(book, p.schedule, stage_s, hop_s, n)
    total = 0.0
    for c in counts:
        need = (2 * c if c > 1 else c) * one
        if total + need <= within:
            total += need
    return total
