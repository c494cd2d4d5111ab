"""Elastic replanning after losing devices: ``exclude=[A.1,B.0] warm_start=PLAN.json``.

Start from the previous plan instead of a cold search:

1. keep every pipeline that lost no device, with its stages and layers;
2. repair each broken pipeline: drop its dead devices; a stage that lost part of its TP group
   is re-cut into TP groups of allowed degrees (:func:`hexicore.planner.stages.tp_menus`, the cut with
   the fastest pipeline), a stage that lost all its devices disappears; that pipeline's layers
   are re-allocated exactly (:func:`hexicore.planner.stages.layout_pipeline`); two more variants are
   tried: the broken pipeline keeping its other stages' layers (a re-cut stage's layers split
   among its pieces: the fewest weights to move), and dropping the broken pipelines altogether;
3. batches are re-allocated over the pipelines, then a short search improves the result (the
   search's boundary polish and a few two-phase candidates, the caller's budget).

:func:`plan_diff` says how the new plan differs from the previous one (devices moved, layers
moved): what a runtime has to reload.
"""

from __future__ import annotations

from typing import Any, Sequence

from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.stages import Group, Layout, apply_menu, layout_pipeline, tp_menus


def check_warm_start(warm: Plan, problem: Any) -> None:
    """A warm start must be a plan of the same model (same layers) to be repaired."""
    if warm.model.layers != problem.model.layers or warm.model.name != problem.model.name:
        raise HexicoreError(f"the plan is for model {warm.model.name!r} ({warm.model.layers} layers), this run plans "
                            f"{problem.model.name!r} ({problem.model.layers} layers)", field="warm_start")


def kept_layers(ctx: Any, stages: Sequence[Any], n_mb_max: int) -> Layout | None:
    """The broken pipeline with every intact stage's layers kept: a stage that lost devices is
    re-cut by its first TP menu and its layers split evenly among the pieces; ``None`` when a
    whole stage died, a piece would get no layer, or memory does not allow it."""
    cl = ctx.problem.cluster
    groups, layers = [], []
    for s in stages:
        alive = tuple(d for d in s.devices if cl.has_device(d))
        if not alive:
            return None
        pieces = [alive] if len(alive) == len(s.devices) else \
            [tuple(g) for g in apply_menu(alive, tp_menus(len(alive), tuple(d for d in ctx.degrees if d <= len(alive)))[0])]
        if s.n_layers < len(pieces):
            return None
        q, r = divmod(s.n_layers, len(pieces))
        groups += pieces
        layers += [q + (1 if k < r else 0) for k in range(len(pieces))]
    return layout_pipeline(ctx.table, groups, n_mb_max, layers)


def repaired_stages(ctx: Any, stages: Sequence[Sequence[str]], n_mb_max: int) -> Layout | None:
    """One broken pipeline's surviving stages, re-cut and re-laid out (module docstring, 2)."""
    cl = ctx.problem.cluster
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
            degrees = tuple(d for d in ctx.degrees if d <= len(alive))
            base.append([tuple(g) for g in apply_menu(alive, tp_menus(len(alive), degrees)[0])])
    best = layout_pipeline(ctx.table, [g for b in base for g in b], n_mb_max)
    for k in broken:  # coordinate descent over the broken stages' cuts
        alive = tuple(d for b in base[k] for d in b)
        degrees = tuple(d for d in ctx.degrees if d <= len(alive))
        for menu in tp_menus(len(alive), degrees)[1:]:
            trial = base[:k] + [[tuple(g) for g in apply_menu(alive, menu)]] + base[k + 1:]
            lay = layout_pipeline(ctx.table, [g for b in trial for g in b], n_mb_max)
            if lay is not None and (best is None or max(lay.stage_s) < max(best.stage_s)):
                best, base = lay, trial
    return best


def repair(ctx: Any, warm: Plan) -> tuple[list[tuple[str, list[Layout]]], list[int]]:
    """Layout sets to try (label, layouts) and the indices of the broken pipelines."""
    cl = ctx.problem.cluster
    broken = [i for i, p in enumerate(warm.pipelines) if not all(cl.has_device(d) for d in p.devices)]
    n_mb_max = ctx.micro_batches - (len(warm.pipelines) - 1)
    kept: dict[int, Layout] = {}
    for i, p in enumerate(warm.pipelines):
        if i in broken:
            continue
        stages = [tuple(s.devices) for s in p.stages]
        lay = layout_pipeline(ctx.table, stages, n_mb_max, [s.n_layers for s in p.stages]) or \
            layout_pipeline(ctx.table, stages, n_mb_max)
        if lay is not None:
            kept[i] = lay
    fixed = {i: repaired_stages(ctx, [s.devices for s in warm.pipelines[i].stages], n_mb_max) for i in broken}
    out = []
    full = [kept.get(i) or fixed.get(i) for i in range(len(warm.pipelines))]
    if all(lay is not None for lay in full):
        out.append(("warm_start repaired", full))
    same = {i: kept_layers(ctx, warm.pipelines[i].stages, n_mb_max) for i in broken}
    full = [kept.get(i) or same.get(i) for i in range(len(warm.pipelines))]
    if broken and all(lay is not None for lay in full):
        out.append(("warm_start repaired, layers kept", full))
    if broken and kept:
        out.append(("warm_start, broken pipelines dropped", [kept[i] for i in sorted(kept)]))
    return out, broken


def placement(plan: Plan) -> dict[str, tuple]:
    """Per device: (layer range, TP degree, rank in the TP group) — what it holds."""
    return {d: (s.layers, s.tp, s.devices.index(d)) for p in plan.pipelines for s in p.stages for d in s.devices}


def plan_diff(old: Plan, new: Plan, cluster: Cluster | None = None) -> dict[str, Any]:
    """How ``new`` differs from ``old``: devices lost (gone from ``cluster``, the cluster the
    replan was asked for, default ``new``'s; devices a machine allocation left idle are moved,
    not lost), devices moved (their layer range, TP degree or TP rank changed, or they are newly
    used or now idle: their weights change), and layers moved = sum over the new plan's devices
    of the layers (as TP shards) that device did not hold before — the weights a runtime has to
    load."""
    cluster = new.cluster if cluster is None else cluster
    a, b = placement(old), placement(new)
    lost = sorted(d for d in a if not cluster.has_device(d))
    moved = sorted(d for d in set(a) | set(b) if d not in lost and a.get(d) != b.get(d))

    def shards(p: tuple | None) -> set:
        return set() if p is None else {(k, p[1], p[2]) for k in range(*p[0])}

    layers = sum(len(shards(b[d]) - shards(a.get(d))) for d in b)
    same = sum(1 for p in new.pipelines if any(tuple(p.stages) == tuple(q.stages) for q in old.pipelines))
    return {"excluded": list(cluster.excluded), "lost": lost, "pipelines_kept": same,
            "pipelines_before": len(old.pipelines), "pipelines_after": len(new.pipelines),
            "devices_moved": len(moved), "moved": moved[:32], "layers_moved": layers,
            "previous_iteration_s": old.estimate.iteration_s if old.estimate else None}


def describe(diff: dict[str, Any]) -> str:
    """One line for ``hexicore plan``."""
    ex = ", ".join(diff["excluded"]) or "none"
    return (f"replan: excluded {ex}; {diff['pipelines_kept']}/{diff['pipelines_after']} pipelines unchanged "
            f"(were {diff['pipelines_before']}); {diff['devices_moved']} devices moved, "
            f"{diff['layers_moved']} layer shards to load")
