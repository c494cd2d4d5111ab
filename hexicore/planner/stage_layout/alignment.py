"""Aligned layer ranges across pipelines (HexiScale §4.3; docs/background.md): layers held on one
machine by every pipeline synchronise their gradients over that machine's fast links (App. A
COMM-DP-LAYER), so a pipeline may be laid out like a template — the same machine order and the
same layer range on every machine."""

from __future__ import annotations

from typing import Sequence

from hexicore.planner.stage_layout.layers import allocate_layers
from hexicore.planner.stage_layout.stage_table import StageLayout, StageTable, layout_pipeline, stage_rows
from hexicore.planner.stage_layout.tp_menus import Group


def by_machine(table: StageTable, stages: Sequence[Group], machines: Sequence[str] = ()) -> list[tuple[str, list[Group]]]:
    """Stages grouped by machine (a stage's machine = its leader's), machines in the order of
    ``machines`` first, then of first appearance; stages keep their relative order."""
    out: dict[str, list[Group]] = {m: [] for m in machines}
    for g in stages:
        out.setdefault(table.cluster.device(g[0]).machine, []).append(g)
    return [(m, gs) for m, gs in out.items() if gs]


def align_to(table: StageTable, template: StageLayout, stages: Sequence[Group], n_mb_max: int) -> StageLayout | None:
    """Lay ``stages`` out like ``template`` (whose stages must be contiguous per machine): the
    same machine order and the same layer range on every machine, split exactly (min-max) among
    this pipeline's stages on that machine. Layers held on one machine by every pipeline
    synchronise their gradients over that machine's fast links (App. A COMM-DP-LAYER); ``None``
    if the machines differ or a range does not fit."""
    t_blocks = by_machine(table, template.stages)
    order = [m for m, _ in t_blocks]
    blocks = by_machine(table, stages, order)
    if [m for m, _ in blocks] != order:
        return None
    ordered = [g for _, gs in blocks for g in gs]
    rows, caps, _ = stage_rows(table, ordered, n_mb_max)
    least = table.least(len(ordered))
    counts, j, k = [], 0, 0
    for (m, gs), (_, tgs) in zip(blocks, t_blocks):
        share = sum(template.layers[k:k + len(tgs)])
        k += len(tgs)
        part = allocate_layers(rows[j:j + len(gs)], caps[j:j + len(gs)], share, least[j:j + len(gs)])
        if part is None:
            return None
        counts.extend(part)
        j += len(gs)
    return layout_pipeline(table, ordered, n_mb_max, counts)


def machine_contiguous(table: StageTable, layout: StageLayout, n_mb_max: int) -> StageLayout | None:
    """``layout`` with its stages regrouped so that each machine's stages are consecutive
    (machines in order of first appearance), layers re-allocated; itself if already so."""
    ordered = [g for _, gs in by_machine(table, layout.stages) for g in gs]
    return layout if tuple(ordered) == layout.stages else layout_pipeline(table, ordered, n_mb_max)
