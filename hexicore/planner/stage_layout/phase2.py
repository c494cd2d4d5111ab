"""Phase 2 of the HexiScale search (§4.3): one pipeline's layout from the devices phase 1 gave it.

(i) the part is cut again into ``k`` groups of well-connected GPUs (min-cut), each group split per
machine into units (TP stays inside a machine, §3.2); (iii) the units are ordered by the stage
orderer (top-tau, its few best paths); (ii) each unit's local strategy — a TP menu, its TP degrees
and number of stages (:mod:`hexicore.planner.stage_layout.tp_menus`) — is chosen by the cost model
(:func:`best_strategy`); the layers are allocated exactly
(:func:`hexicore.planner.stage_layout.stage_table.layout_pipeline`).

Shared by interchangeable parts on large clusters (:func:`shared_phase2`): above
``solver.machine_graph_above`` devices phase 1 hands out whole machines, and most parts of one
candidate are made of the same machine classes (same GPU type and links, the classes of
:meth:`hexicore.planner.stage_layout.stage_table.StageTable.signature`). Under a ``class_priced``
cost model two such parts have the same layouts with their devices renamed: a stage's time,
memory and hops depend only on its machine's class, its size and whether the next stage shares
its machine. So one part is laid out per signature — the part's machines ordered by class then
name, each with its device count — and that layout's devices are renamed for every other part of
the signature. Phase 2 then costs per distinct signature rather than per part (thousands of parts
in a 4096-GPU search). The search below the threshold is unchanged.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from hexicore.planner.partition.cut import ordered_subgraph
from hexicore.planner.search.context import SearchContext
from hexicore.planner.stage_layout.stage_table import StageLayout, joined, layout_pipeline, unit_pieces
from hexicore.planner.stage_layout.tp_menus import Group, split_by_machine, tp_menus, uniform_choice


def unit_orders(context: SearchContext, part: Sequence[str], k: int, seed: int) -> list[list[Group]]:
    """Phase 2 (i)+(iii): ``k`` well-connected groups; each group split per machine into units
    (TP stays inside a machine, §3.2); the units ordered by the orderer (its few best paths when
    it offers ``orders``). Ordering units rather than whole groups keeps a machine's pieces
    adjacent even when the partitioner spread it over two groups (intra-machine links are the
    fastest, so top-tau joins them)."""
    sub = ordered_subgraph(context.graph, part)
    groups = context.partitioner.partition(sub, k, objective="min_cut", balance=context.config.group_balance,
                                           seed=seed) if k > 1 else [list(part)]
    units = [list(u) for g in groups if g for u in split_by_machine(context.problem.cluster, g)]
    many = getattr(context.orderer, "orders", None)
    paths = many(units, sub, context.config.orders) if many is not None else [context.orderer.order(units, sub)]
    return [merge_adjacent(context, path) for path in paths]


def merge_adjacent(context: SearchContext, path: Sequence[Sequence[str]]) -> list[Group]:
    """Consecutive units of one machine become one unit, so its TP menu spans all of them."""
    out: list[list[str]] = []
    machine = context.problem.cluster.device
    for u in path:
        if out and machine(out[-1][0]).machine == machine(u[0]).machine:
            out[-1].extend(u)
        else:
            out.append(list(u))
    return [tuple(u) for u in out]


def best_strategy(context: SearchContext, orders: list[list[Group]], n_nominal: int,
                  n_mb_max: int) -> tuple[float, StageLayout | None]:
    """Phase 2 (ii): per unit a TP menu (:func:`tp_menus`) — the unit's TP degrees and number of
    stages — chosen by the cost model: each candidate order (and its reverse; top-tau scores
    bandwidth only, memory favours some ends) is scored with every uniform strategy (all units
    at TP degree d where they can be); on the best order and start, coordinate descent over the
    units' menus, scored by the pipeline's time at its nominal number of micro-batches."""

    memo: dict = {}
    cluster = context.problem.cluster

    def cap(unit: Group) -> int:  # the cluster file's per-machine max_tp
        found = cluster.max_tp(unit)
        return len(unit) if found is None else found

    def score(o: int, choice: list[int]) -> tuple[float, StageLayout | None]:
        key = (o, tuple(choice))
        if key not in memo:
            stages, rk = joined(pieces[o], choice, n_mb_max)
            lay = layout_pipeline(context.table, stages, n_mb_max, key=rk)
            memo[key] = (math.inf, None) if lay is None else \
                (context.pipeline_time(lay, n_mb_max, True)(n_nominal), lay)
        return memo[key]

    starts = []
    tried = set()
    pieces: list = []  # per order tried: unit_pieces
    for order in (o for units in orders for o in (units, units[::-1])):
        if tuple(order) in tried:
            continue
        tried.add(tuple(order))
        menus = [tp_menus(len(u), tuple(d for d in context.degrees if d <= min(len(u), cap(u)))) for u in order]
        pieces.append(unit_pieces(context.table, order, menus))
        for d in context.degrees:
            choice = [uniform_choice(ms, d) for ms in menus]
            starts.append((score(len(pieces) - 1, choice), len(starts), len(pieces) - 1, menus, choice))
    (cur, _, o, menus, choice) = min(starts, key=lambda s: (s[0][0], s[1]))
    for _ in range(context.config.strategy_passes):
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


def phase2(context: SearchContext, part: Sequence[str], k: int, n_mb_max: int, seed: int) -> StageLayout | None:
    """One pipeline's layout from its devices (cached per part, k and batch bound; on large
    clusters per signature of the part, :func:`shared_phase2`)."""
    if len(context.graph) > context.config.machine_graph_above:  # large clusters: per part signature (shared_phase2)
        return shared_phase2(context, part, k, n_mb_max, seed, lambda *a: lay_out_part(context, *a))
    key = (frozenset(part), k, n_mb_max)
    if key not in context.phase2_cache:  # laid out ahead with this very seed, or now
        hit = context.ahead.pop((key, seed), context)
        context.phase2_cache[key] = lay_out_part(context, part, k, n_mb_max, seed) if hit is context else hit
    return context.phase2_cache[key]


def lay_out_part(context: SearchContext, part: Sequence[str], k: int, n_mb_max: int, seed: int) -> StageLayout | None:
    """Phase 2 proper, uncached: ``part``'s best layout over its orders and TP menus, scored at the
    part's nominal micro-batches (its share of the cluster's TFLOP/s); None when it has more machines
    than the model has layers."""
    if len({context.problem.cluster.device(d).machine for d in part}) > context.problem.model.layers:
        return None  # a stage per machine at least: more stages than layers, no layout exists
    tf = context.problem.cluster.total_tflops
    n_nom = max(1, round(context.micro_batches * sum(context.problem.cluster.device(d).tflops for d in part) / tf))
    return best_strategy(context, unit_orders(context, part, k, seed), n_nom, n_mb_max)[1]


def canonical(context: SearchContext, part: Sequence[str]) -> tuple[list[str], tuple] | None:
    """The part's devices in canonical order (machines by class, then name; devices by index)
    and its signature; None when the cost model is not ``class_priced``."""
    classes = context.table.machine_class
    if classes is None:
        return None
    cl = context.problem.cluster
    by: dict[str, list] = {}
    for d in part:
        by.setdefault(cl.device(d).machine, []).append(cl.device(d))
    ids = context.class_ids
    order = sorted(by, key=lambda m: (ids.setdefault(classes[m], len(ids)), m))
    canon = [d.id for m in order for d in sorted(by[m], key=lambda dev: dev.index)]
    return canon, tuple((ids[classes[m]], len(by[m])) for m in order)


def shared_phase2(context: SearchContext, part: Sequence[str], k: int, n_mb_max: int, seed: int,
                  lay_out: Callable[[list[str], int, int, int], StageLayout | None]) -> StageLayout | None:
    """``lay_out(devices, k, n_mb_max, seed)`` (phase 2 proper) once per signature, renamed for ``part``."""
    found = canonical(context, part)
    if found is None:
        return lay_out(list(part), k, n_mb_max, seed)
    canon, sig = found
    key = ("shared", sig, k, n_mb_max)
    if key not in context.phase2_cache:
        context.phase2_cache[key] = (tuple(canon), lay_out(canon, k, n_mb_max, seed))
    rep, lay = context.phase2_cache[key]
    if lay is None or rep == tuple(canon):
        return lay
    rename = dict(zip(rep, canon))
    return StageLayout(tuple(tuple(rename[d] for d in g) for g in lay.stages), lay.layers, lay.stage_s, lay.hop_s)
