"""Elastic replanning after losing devices: ``exclude=[A.1,B.0] warm_start=PLAN.json``.

Start from the previous plan instead of a cold search:

1. keep every pipeline that lost no device, with its stages and layers;
2. repair each broken pipeline: drop its dead devices; a stage that lost part of its TP group
   is re-cut into TP groups of allowed degrees (:func:`hexicore.planner.stage_layout.tp_menus.tp_menus`, the cut with
   the fastest pipeline), a stage that lost all its devices disappears; that pipeline's layers
   are re-allocated exactly (:func:`hexicore.planner.stage_layout.stage_table.layout_pipeline`); two more variants are
   tried: the broken pipeline keeping its other stages' layers (a re-cut stage's layers split
   among its pieces: the fewest weights to move), and dropping the broken pipelines altogether;
3. batches are re-allocated over the pipelines, then a short search improves the result (the
   search's boundary polish and a few two-phase candidates, the caller's budget).

How the new plan differs from the previous one: :mod:`hexicore.planner.replan.diff`.
"""

from __future__ import annotations

import random
import time
from typing import Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan, Stage
from hexicore.planner.problem import Problem, Progress
from hexicore.planner.search.candidate import assemble, relayout, two_phase
from hexicore.planner.search.context import Candidate, SearchContext
from hexicore.planner.stage_layout.stage_table import StageLayout, layout_pipeline
from hexicore.planner.stage_layout.tp_menus import Group, apply_menu, tp_menus


def check_warm_start(warm: Plan, problem: Problem) -> None:
    """A warm start must be a plan of the same model (same layers) to be repaired."""
    if warm.model.layers != problem.model.layers or warm.model.name != problem.model.name:
        raise HexicoreError(f"the plan is for model {warm.model.name!r} ({warm.model.layers} layers), this run plans "
                            f"{problem.model.name!r} ({problem.model.layers} layers)", field="warm_start")


def kept_layers(context: SearchContext, stages: Sequence[Stage], n_mb_max: int) -> StageLayout | None:
    """The broken pipeline with every intact stage's layers kept: a stage that lost devices is
    re-cut by its first TP menu and its layers split evenly among the pieces; ``None`` when a
    whole stage died, a piece would get no layer, or memory does not allow it."""
    cl = context.problem.cluster
    groups, layers = [], []
    for s in stages:
        alive = tuple(d for d in s.devices if cl.has_device(d))
        if not alive:
            return None
        degrees = tuple(d for d in context.degrees if d <= len(alive))
        pieces = [alive] if len(alive) == len(s.devices) else \
            [tuple(g) for g in apply_menu(alive, tp_menus(len(alive), degrees)[0])]
        if s.n_layers < len(pieces):
            return None
        q, r = divmod(s.n_layers, len(pieces))
        groups += pieces
        layers += [q + (1 if k < r else 0) for k in range(len(pieces))]
    return layout_pipeline(context.table, groups, n_mb_max, layers)


def repaired_stages(context: SearchContext, stages: Sequence[Sequence[str]], n_mb_max: int) -> StageLayout | None:
    """One broken pipeline's surviving stages, re-cut and re-laid out (module docstring, 2)."""
    cl = context.problem.cluster
    base: list[list[Group]] = []
    broken: list[int] = []
    for devs in stages:
        alive = tuple(d for d in devs if cl.has_device(d))
        if not alive:
            continue
        if len(alive) == len(devs):
            base.append([alive])
        else:
            broken.append(len(base))
            degrees = tuple(d for d in context.degrees if d <= len(alive))
            base.append([tuple(g) for g in apply_menu(alive, tp_menus(len(alive), degrees)[0])])
    best = layout_pipeline(context.table, [g for b in base for g in b], n_mb_max)
    for k in broken:  # coordinate descent over the broken stages' cuts
        alive = tuple(d for b in base[k] for d in b)
        degrees = tuple(d for d in context.degrees if d <= len(alive))
        for menu in tp_menus(len(alive), degrees)[1:]:
            trial = base[:k] + [[tuple(g) for g in apply_menu(alive, menu)]] + base[k + 1:]
            lay = layout_pipeline(context.table, [g for b in trial for g in b], n_mb_max)
            if lay is not None and (best is None or max(lay.stage_s) < max(best.stage_s)):
                best, base = lay, trial
    return best


def repair(context: SearchContext, warm: Plan) -> tuple[list[tuple[str, list[StageLayout]]], list[int]]:
    """Layout sets to try (label, layouts) and the indices of the broken pipelines."""
    cl = context.problem.cluster
    broken = [i for i, p in enumerate(warm.pipelines) if not all(cl.has_device(d) for d in p.devices)]
    n_mb_max = context.micro_batches - (len(warm.pipelines) - 1)
    kept: dict[int, StageLayout] = {}
    for i, p in enumerate(warm.pipelines):
        if i in broken:
            continue
        stages = [tuple(s.devices) for s in p.stages]
        lay = layout_pipeline(context.table, stages, n_mb_max, [s.n_layers for s in p.stages]) or \
            layout_pipeline(context.table, stages, n_mb_max)
        if lay is not None:
            kept[i] = lay
    fixed = {i: repaired_stages(context, [s.devices for s in warm.pipelines[i].stages], n_mb_max) for i in broken}
    out = []
    full = [kept.get(i) or fixed.get(i) for i in range(len(warm.pipelines))]
    if all(lay is not None for lay in full):
        out.append(("warm_start repaired", full))
    same = {i: kept_layers(context, warm.pipelines[i].stages, n_mb_max) for i in broken}
    full = [kept.get(i) or same.get(i) for i in range(len(warm.pipelines))]
    if broken and all(lay is not None for lay in full):
        out.append(("warm_start repaired, layers kept", full))
    if broken and kept:
        out.append(("warm_start, broken pipelines dropped", [kept[i] for i in sorted(kept)]))
    return out, broken


def replan_search(context: SearchContext, dps: list[int], rng: random.Random, deadline: float,
                  progress: Progress) -> Candidate:
    """Elastic replanning (module docstring): the repaired previous plan, then
    ``replan_iterations`` two-phase candidates around its number of pipelines."""
    warm = context.problem.warm_start
    check_warm_start(warm, context.problem)
    sets, broken = repair(context, warm)
    progress(f"hexiscale: replanning ({len(broken)} broken pipelines)", 0.1)
    cands = [assemble(context, lays, label, {"d_dp": len(lays), "repaired": broken}) for label, lays in sets]
    cands += [relayout(context, warm, "warm_start +layers", keep_layers=False)]
    best = min(cands, key=lambda c: c.score)
    d0 = best.info.get("d_dp", len(warm.pipelines))
    for it in range(context.config.replan_iterations):
        if time.monotonic() > deadline:
            break
        d_dp = min(max(d0 + (0, -1, 1)[it % 3], dps[0]), dps[-1])
        cand = two_phase(context, d_dp, context.choose_objective(rng), (0,), rng.randrange(2**31))
        if cand.score < best.score:
            best = cand
    return best
