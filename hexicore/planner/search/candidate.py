"""One candidate of the HexiScale two-phase planner (HexiScale §4.2-4.3): the scored plans
(:class:`Candidate`) the loop of :mod:`hexicore.planner.search.loop` compares, and how one is made
from the search's state (:class:`hexicore.planner.search.context.SearchContext`).

The :class:`~hexicore.planner.search.context.Candidate` record lives with the search's state.

1. phase 1 — partition the device graph into ``D_dp`` parts (one per pipeline) with the
   configured partitioner, min-cut or max-cut, then the refiner
   (:func:`hexicore.planner.partition.phase1.split`);
2. phase 2, per part — partition it again into ``k_i`` groups of well-connected GPUs (min-cut),
   order the groups with the stage orderer (top-tau), choose each group's local strategy (TP
   degree and number of stages, inside one machine) by the cost model, and allocate layers
   exactly (:func:`hexicore.planner.stage_layout.phase2.phase2`);
3. allocate the global batch over the pipelines (:mod:`hexicore.planner.stage_layout.batch`,
   gradient accumulation) and score the plan with the cost model, out of memory = infinity
   (:func:`assemble`); variants: :func:`aligned` layer ranges, :func:`relayout` of a given
   plan, :func:`polish` of stage boundaries.
"""

from __future__ import annotations

import time
from typing import Sequence

from hexicore.core.plan import Plan
from hexicore.planner.partition.phase1 import split
from hexicore.planner.search.context import INF, Candidate, SearchContext
from hexicore.planner.stage_layout.alignment import align_to, machine_contiguous
from hexicore.planner.stage_layout.batch import allocate_batch
from hexicore.planner.stage_layout.phase2 import phase2
from hexicore.planner.stage_layout.stage_table import StageLayout, StageTable, layout_pipeline, rows_key
from hexicore.planner.stage_layout.tp_menus import Group


def throughput_bound(layouts: Sequence[StageLayout], micro_batches: int) -> float:
    """A lower bound on the time any schedule takes to run ``micro_batches`` over ``layouts``'
    pipelines: pipeline i passes at most one micro-batch per ``b_i = max_j STAGE_ij`` (its
    slowest stage, forward and backward; no schedule runs a stage's micro-batches faster), so
    with the batch split at best ``M / sum_i 1 / b_i`` (no bubble, no hop, no DP sync): the
    schedule pricer's tier-0 bound (``n x max_j STAGE_j`` for one pipeline) with the batch split
    over the pipelines relaxed to fractions."""
    rate = sum(1.0 / max(lay.stage_s) for lay in layouts if lay.stage_s and max(lay.stage_s) > 0)
    return micro_batches / rate if rate > 0 else 0.0


def assemble(context: SearchContext, layouts: Sequence[StageLayout], origin: str, info: dict | None = None,
             choose: bool = False, beat: float = INF) -> Candidate:
    """Batch allocation over the pipelines, then the full cost-model estimate (OOM = inf).
    With a schedule book each pipeline gets the option fastest at its micro-batches — among
    all options with ``choose`` (schedule=auto; such candidates leave the search's moving
    averages alone, so the first option's trajectory is the same as searching it alone).
    ``beat``: bounds first — where the slowest pipeline's modelled time after the batch
    allocation (what the iteration waits for at least), or before it the pipelines' throughput
    (:func:`throughput_bound`), is already above it, no estimate is made and the candidate
    scores inf (its ``info`` holds that lower bound, ``least_s``)."""
    p = context.problem
    least = throughput_bound(layouts, context.micro_batches) if beat < INF else 0.0
    if least > beat * (1 + 1e-9):  # no schedule's choice or batch split beats ``beat``
        return Candidate(INF, None, None, origin, info={"least_s": least})
    n_mb_max = context.micro_batches - (len(layouts) - 1)
    times = [context.pipeline_time(lay, n_mb_max, choose=choose) for lay in layouts]
    counts = allocate_batch(times, context.micro_batches,
                            [context.least_micro_batches(lay, n_mb_max, choose) for lay in layouts])
    if counts is None:
        return Candidate(INF, None, None, origin)
    slowest = max(t(n) for t, n in zip(times, counts)) if beat < INF else 0.0
    if slowest > beat * (1 + 1e-9):  # ``least_s``: what the iteration takes at least
        return Candidate(INF, None, None, origin, info={"least_s": slowest})
    sections = [p.schedule] * len(layouts)
    if context.book is not None:  # per pipeline the option that is fastest at its micro-batches
        picks = []
        for lay, n in zip(layouts, counts):
            opts = [ol for ol in context.variants(lay, n_mb_max, choose)  # (the ranks: variants)
                    if n >= context.book.min_micro_batches(ol[0], len(lay.stages))]
            if not opts:
                return Candidate(INF, None, None, origin)
            picks.append(min(opts, key=lambda ol: context.book.model(ol[0], ol[1].stage_s, ol[1].hop_s, n)))
        sections, layouts = [o for o, _ in picks], [lay for _, lay in picks]
    pipes = tuple(lay.pipeline(n * p.train.micro_batch, sec) for lay, n, sec in zip(layouts, counts, sections))
    plan = Plan(p.model, p.cluster, p.train, pipes)
    est = context.cost.estimate(plan)
    context.evaluated += 1
    score = est.iteration_s if est.fits else INF
    if est.fits and not choose:
        slow = max(range(len(pipes)), key=lambda i: est.pipeline_s[i])
        context.update_averages(est.dp_s, counts[slow] * sum(layouts[slow].hop_s))
    cand = Candidate(score, plan, est, origin, tuple(layouts), {**(info or {}), "choice": context.choice})
    if score < context.best_score:
        context.best_score, context.best_found = score, cand
    context.keep(cand)
    return cand


#: the other training settings are priced on a candidate whose lead-setting score is within this
#: (relative) of the best so far, or that does not fit the lead's memory (bounds first: a
#: micro-batch size or ZeRO stage moves an iteration by a few percent, rarely by a quarter)
OTHERS_WITHIN = 0.25


def two_phase(context: SearchContext, d_dp: int, objective: str, k_shift: Sequence[int], seed: int,
              side: bool = False, deadline: float = INF) -> Candidate:
    """One candidate of §4.2-4.3 for ``D_dp`` pipelines under cut ``objective``
    (:func:`one_cut`); where its parts hold no layout that fits, the other cut's (the moving
    averages pick the cut by which communication dominates, not by memory: on 32 GPUs of four
    types at batch 4096, ZeRO-2, the max-cut parts of 27-31 pipelines never fit and the min-cut
    ones of 28 gave the best plan, 223.6 s against the 224.9 the walk found without them). Not
    with ``side`` (the side sweep takes both cuts), nor where neither cut fitted before at this
    number of pipelines (``SearchContext.cut_misses``: a number too large or too small for the
    memory, which the walk visits again and again; trying both there every time slowed 1F1B's
    searches on 64 GPUs of eight types by 15%)."""
    cand = one_cut(context, d_dp, objective, k_shift, seed, side, deadline)
    if cand.score < INF or side or d_dp in context.cut_misses or time.monotonic() > deadline:
        return cand
    other = one_cut(context, d_dp, "max_cut" if objective == "min_cut" else "min_cut", k_shift, seed, side, deadline)
    if other.score == INF:
        context.cut_misses.add(d_dp)
    return other if other.score < cand.score else cand


def one_cut(context: SearchContext, d_dp: int, objective: str, k_shift: Sequence[int], seed: int,
            side: bool = False, deadline: float = INF) -> Candidate:
    """One candidate of §4.2-4.3 for ``D_dp`` pipelines (under the lead training setting); with
    other training settings (``train.zero=auto``, ``train.micro_batch=auto``) the same parts
    priced under each (:func:`other_settings`) where the lead setting's candidate is within
    :data:`OTHERS_WITHIN` of the best so far or does not fit (always with ``side``: the walk
    of the other settings), kept aside (:meth:`SearchContext.track_side`): the lead's walk is
    the one it takes alone. Past ``deadline`` (``time.monotonic()``, the search's time budget)
    no further setting is priced."""
    origin = f"search D_dp={d_dp} {objective}"
    context.at_pipelines(d_dp)
    parts, ks = split(context, d_dp, objective, k_shift, seed)
    key = (tuple(tuple(p) for p in parts), tuple(ks))
    info = {"d_dp": len(parts), "objective": objective, "k": ks}
    if key in context.seen:
        cand = context.seen[key]
        if side:  # the lead's candidate is known: only the other settings are priced
            context.track_side(other_settings(context, parts, ks, list(cand.layouts) or None, seed, origin, info,
                                              _side_beat(context, cand), cand.score, every=True,
                                              deadline=deadline))
        return cand
    layouts = lay_out_parts(context, parts, ks, seed)
    cand = Candidate(INF, None, None, origin)
    if layouts is not None:
        n_mb_max = context.micro_batches - (len(parts) - 1)
        cand = min([assemble(context, layouts, origin, info)] + aligned(context, layouts, n_mb_max, origin, info),
                   key=lambda c: c.score)
        if context.auto:  # the same layouts with every pipeline's schedule chosen (kept aside)
            beat = auto_beat(context)
            context.track_auto([assemble(context, layouts, origin, info, True, beat)]
                               + aligned(context, layouts, n_mb_max, origin, info, True, beat))
    incumbent = min(c.best_score for c in context.contexts())
    if context.others and (side or cand.score == INF or cand.score <= incumbent * (1 + OTHERS_WITHIN)):
        context.track_side(other_settings(context, parts, ks, layouts, seed, origin, info, _side_beat(context, cand),
                                          cand.score, every=side, deadline=deadline))
    context.seen[key] = cand
    return cand


def auto_beat(context: SearchContext) -> float:
    """What a candidate with chosen schedules (``schedule=auto``) must beat to matter: the best
    such candidate under any training setting (the one the search polishes)."""
    return min((c.auto_best.score for c in context.contexts() if c.auto_best is not None), default=INF)


def _side_beat(context: SearchContext, cand: Candidate) -> float:
    """What another setting's candidate must beat to count: the lead's and the best aside."""
    return min(cand.score, context.side_best.score if context.side_best is not None else INF)


def lay_out_parts(context: SearchContext, parts: Sequence[Sequence[str]], ks: Sequence[int],
                  seed: int) -> list[StageLayout] | None:
    """Phase 2 of every part under ``context``'s training setting; None where one has no layout
    (or there are fewer micro-batches than parts)."""
    n_mb_max = context.micro_batches - (len(parts) - 1)
    if n_mb_max < 1:
        return None
    layouts = []
    for i, (p, k) in enumerate(zip(parts, ks)):
        lay = phase2(context, p, k, n_mb_max, seed + i)
        if lay is None:
            return None
        layouts.append(lay)
    return layouts


def relaid(context: SearchContext, layouts: Sequence[StageLayout], n_mb_max: int) -> list[StageLayout] | None:
    """``layouts`` (laid out under another training setting) under ``context``'s: the same
    stages, the layers allocated exactly under its stage times and memory caps; None where a
    pipeline fits no way."""
    out = []
    for lay in layouts:
        new = layout_pipeline(context.table, lay.stages, n_mb_max)
        if new is None:
            return None
        out.append(new)
    return out


#: a setting's candidate is also assembled with every pipeline's schedule chosen
#: (``schedule=auto``) only where its first option's candidate fits and beats the best so far,
#: or its slowest pipeline misses that by at most this (relative): what choosing a schedule
#: with fewer bubbles gains over the first option's at most, as a rule
CHOOSE_WITHIN = 0.15
#: successive halving of the other training settings, compared on the same parts: a setting
#: whose candidate is (at least) more than SETTING_WITHIN slower than the best setting's on the
#: same parts, or does not fit where that one does, SETTING_LOSSES times in a row is no longer priced on the lead's candidates (the
#: side walk, which sweeps the numbers of pipelines only other settings allow, still prices
#: it): a micro-batch size or ZeRO stage that far behind on every layout rarely overtakes
SETTING_LOSSES = 3
SETTING_WITHIN = 0.15
#: the side sweep (:func:`other_settings` with ``every``) leaves out a losing setting whose best
#: is more than this many times the best of all (:func:`hopeless`)
HOPELESS = 2.0


def other_settings(context: SearchContext, parts: Sequence[Sequence[str]], ks: Sequence[int],
                   layouts: Sequence[StageLayout] | None, seed: int, origin: str, info: dict,
                   beat: float, here: float = INF, every: bool = False, deadline: float = INF) -> list[Candidate]:
    """The lead's parts under each other training setting (``context.others``): the lead's
    stages re-laid out under the setting (or, where the lead's memory holds no layout of a
    part, the setting's own phase 2: the stages of the roomiest setting's re-laid instead lost
    320 GPUs at batch 1024 its plan at micro-batch 2, 97.9 s against 217)
    (:func:`relaid`) and assembled — bounds first, against the best so far (``beat``), and not
    where a lower ZeRO stage at the same micro-batch size gives the same layers: sharding only
    adds traffic (and ZeRO-3 its weight gathers) where it frees no memory the layout uses.
    With ``schedule=auto`` the schedules are chosen only where :data:`CHOOSE_WITHIN` allows;
    settings that keep losing (:data:`SETTING_LOSSES`) to the best on these parts (``here``: the
    lead's score on them, then the least of the settings') are left out unless ``every``; past
    ``deadline`` (``time.monotonic()``) no further setting is priced."""
    out: list[Candidate] = []
    laid = {} if layouts is None else {_size_stage(context): [lay.layers for lay in layouts]}
    for other in context.others:  # (micro-batch, ZeRO stage) -> layers, in ZeRO order per size
        n_mb_max = other.micro_batches - (len(parts) - 1)
        if time.monotonic() > deadline:
            break
        if n_mb_max < 1 or (other.losses >= SETTING_LOSSES and (not every or hopeless(context, other))):
            continue
        other.at_pipelines(len(parts))
        mine = relaid(other, layouts, n_mb_max) if layouts is not None else lay_out_parts(other, parts, ks, seed)
        if mine is None:
            other.losses += here < INF  # (it holds no layout of parts another setting runs: a loss)
            continue
        size, stage = _size_stage(other)
        layers = [lay.layers for lay in mine]
        laid[size, stage] = layers
        if any(laid.get((size, lower)) == layers for lower in range(stage)):
            continue  # dominated: the same layers under a lower ZeRO stage, which only moves less
        cand = assemble(other, mine, origin, info, beat=beat)
        least = cand.score if cand.score < INF else cand.info.get("least_s")
        if least is not None:
            other.losses = other.losses + 1 if least > here * (1 + SETTING_WITHIN) else 0
        elif here < INF:  # it does not fit where another setting's candidate does: a loss
            other.losses += 1
        least = least or 0.0
        beat, here = min(beat, cand.score), min(here, cand.score)
        out.append(cand)
        if other.auto and least <= beat * (1 + CHOOSE_WITHIN):
            other.track_auto([assemble(other, mine, origin, info, True, auto_beat(context))])
    return out


def hopeless(lead: SearchContext, other: SearchContext) -> bool:
    """Whether the side sweep leaves ``other`` (a setting that lost :data:`SETTING_LOSSES` times
    in a row) out too: it never fitted, or its best is more than :data:`HOPELESS` times the best
    of all settings. More pipelines than the lead allows put more layers on each device, so a
    setting that fits none of the lead's numbers of pipelines fits none of those either; one
    that far behind does not close the gap by a layout (hetero3, Llama 30B, every option on:
    the 12 settings of micro-batches 2-8, none fitting or 20-30x behind, took 0.7 s of a 6 s
    search)."""
    best = min(c.best_score for c in lead.contexts())
    return other.best_score == INF or other.best_score > HOPELESS * best


def _size_stage(context: SearchContext) -> tuple[int, int]:
    """The micro-batch size and ZeRO stage a context prices."""
    return context.problem.train.micro_batch, context.problem.train.zero_stage


def aligned(context: SearchContext, layouts: Sequence[StageLayout], n_mb_max: int, origin: str, info: dict,
            choose: bool = False, beat: float = INF) -> list[Candidate]:
    """Variants where every pipeline copies one pipeline's machine order and per-machine layer
    ranges (:func:`align_to`): when the pipelines share machines (typically after a max-cut
    partition) their DP sync then stays inside machines. Each pipeline serves as the template
    once (at most ``context.config.align_templates``). ``choose``, ``beat``: as in :func:`assemble`."""
    if len(layouts) < 2:
        return []
    out = []
    for t, template in enumerate(layouts[:context.config.align_templates]):
        template = machine_contiguous(context.table, template, n_mb_max)
        if template is None:
            continue
        new = [template if i == t else align_to(context.table, template, lay.stages, n_mb_max)
               for i, lay in enumerate(layouts)]
        if all(lay is not None for lay in new) and any(a is not b for a, b in zip(new, layouts)):
            out.append(assemble(context, new, origin + " aligned", info, choose, beat))
    return out


def relayout(context: SearchContext, plan: Plan, origin: str, keep_layers: bool, beat: float = INF) -> Candidate:
    """A given plan's stages (e.g. megatron's) as a candidate, with its own layers or with the
    exact layer allocation; batches re-allocated. Devices no longer in the cluster are dropped."""
    cl = context.problem.cluster
    pipes = [[tuple(d for d in s.devices if cl.has_device(d)) for s in p.stages] for p in plan.pipelines]
    kept = [[g for g in p if g] for p in pipes]
    kept = [p for p in kept if p]
    same = all(len(a) == len(b.stages) for a, b in zip(kept, plan.pipelines)) and len(kept) == len(plan.pipelines)
    n_mb_max = context.micro_batches - (len(kept) - 1)
    context.at_pipelines(len(kept))
    layouts = []
    for i, stages in enumerate(kept):
        layers = [s.n_layers for s in plan.pipelines[i].stages] if keep_layers and same else None
        lay = layout_pipeline(context.table, stages, n_mb_max, layers)
        if lay is None:
            return Candidate(INF, None, None, origin)
        layouts.append(lay)
    return assemble(context, layouts, origin, {"d_dp": len(layouts)}, beat=beat)


def polish(context: SearchContext, best: Candidate, deadline: float, only: Sequence[int] | None = None,
           choose: bool = False) -> Candidate:
    """The stages' order first (:func:`reorder`), then hill-climb stage boundaries one layer at a time under the full estimate, for at most
    ``polish_rounds`` sweeps and ``polish_evals`` estimates (and the time limit) (the layer
    allocation of phase 2 ignores DP sync; moving boundaries can align the pipelines' layers
    with cheap DP links, as in the HexiScale paper's worked case where cross-machine DP on one
    machine covers 5 layers).
    ``only``: the pipelines whose boundaries may move (all by default); ``choose``: as in
    :func:`assemble`."""
    if best.plan is None or not best.layouts:
        return best
    n_mb_max = context.micro_batches - (len(best.layouts) - 1)
    context.at_pipelines(len(best.layouts))
    budget = context.evaluated + context.config.polish_evals  # a count, not a clock: the result stays seeded
    if context.config.polish_rounds > 0:
        best = reorder(context, best, n_mb_max, deadline, budget, only, choose)
    for _ in range(context.config.polish_rounds):
        improved = False
        for i, lay in enumerate(best.layouts):
            if only is not None and i not in only:
                continue
            for j in range(len(lay.layers) - 1):
                for delta in (1, -1):
                    if time.monotonic() > deadline or context.evaluated >= budget:
                        return best
                    layers = list(lay.layers)
                    layers[j] += delta
                    layers[j + 1] -= delta
                    new = layout_pipeline(context.table, lay.stages, n_mb_max, layers)
                    if new is None:
                        continue
                    layouts = best.layouts[:i] + (new,) + best.layouts[i + 1:]
                    cand = assemble(context, layouts, best.origin + " +polish", best.info, choose)
                    if cand.score < best.score - 1e-9:
                        best, lay, improved = cand, new, True
        if not improved:
            break
    return best


def machine_runs(table: StageTable, stages: Sequence[Group]) -> list[tuple[int, int]]:
    """``stages`` as runs of consecutive stages on one machine, ``(start, end)`` each: what
    :func:`reorder` moves (a machine's stages stay together, their hops on its own links)."""
    runs: list[tuple[int, int]] = []
    prev = None
    for i, g in enumerate(stages):
        machine = table.signature(g)[1]
        if runs and machine is not None and machine == prev:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
        prev = machine
    return runs


def moved(stages: Sequence[Group], runs: Sequence[tuple[int, int]], source: int, target: int) -> tuple[Group, ...]:
    """``stages`` with run ``source`` taken out and put back at run position ``target``."""
    blocks = [tuple(stages[a:b]) for a, b in runs]
    block = blocks.pop(source)
    blocks.insert(target, block)
    return tuple(g for b in blocks for g in b)


def reorder(context: SearchContext, best: Candidate, n_mb_max: int, deadline: float, budget: int,
            only: Sequence[int] | None = None, choose: bool = False) -> Candidate:
    """Hill-climb the order of every pipeline's machines (:func:`machine_runs`): one run moved
    to another position, the layers allocated again exactly
    (:func:`~hexicore.planner.stage_layout.stage_table.layout_pipeline`), kept where the full
    estimate improves (first improvement, passes until none does). Pipelines of the same stage
    classes (:func:`~hexicore.planner.stage_layout.stage_table.rows_key`: interchangeable
    machines, e.g. the aligned variants) move together, so their layers stay aligned.

    Why: top-tau orders the groups by bandwidth alone (§4.3 (iii)); where every hop crosses
    machines over the same links, every order ties and the order it returns is arbitrary. The
    position decides what a stage holds (under 1F1B stage j keeps P - j micro-batches in flight,
    the first holds the embedding and the last the head), so the order decides how many layers
    each GPU type's memory allows and where the slow ones sit: on hetero3 (Llama 30B, every option
    on) the four pipelines' RTX 3090 pair moved from the front to the end, 20.18 s -> 18.51 s.
    Past ``deadline`` or ``budget`` (``context.evaluated``) it stops; ``only``, ``choose``: as in
    :func:`polish`."""
    classes: dict[tuple, list[int]] = {}
    for i, lay in enumerate(best.layouts):
        if only is None or i in only:
            classes.setdefault(rows_key(context.table, lay.stages, n_mb_max)[0], []).append(i)
    for members in classes.values():
        improved = True
        while improved:
            improved = False
            runs, count = _runs_of(context, best, members)
            for source in range(count):
                for target in (count - 1, 0, *range(1, count - 1)):  # the ends first (what a position
                    # changes most: the first stage holds the most in flight and the embedding, the last the head)
                    if target == source or target == source - 1 or max(source, target) >= count:
                        continue  # (source - 1: the same swap as source - 1 -> source; count: runs merged)
                    if time.monotonic() > deadline or context.evaluated >= budget:
                        return best
                    layouts = list(best.layouts)
                    for m in members:
                        layouts[m] = layout_pipeline(context.table, moved(best.layouts[m].stages, runs[m], source,
                                                                          target), n_mb_max)
                    if any(layouts[m] is None for m in members):
                        continue
                    cand = assemble(context, layouts, best.origin + " +order", best.info, choose, best.score)
                    if cand.score < best.score - 1e-9:
                        best, improved = cand, True
                        runs, count = _runs_of(context, best, members)
    return best


def _runs_of(context: SearchContext, best: Candidate, members: Sequence[int]) -> tuple[dict, int]:
    """:func:`machine_runs` of ``members``' pipelines, and how many runs all of them have."""
    runs = {m: machine_runs(context.table, best.layouts[m].stages) for m in members}
    return runs, min(len(r) for r in runs.values())
