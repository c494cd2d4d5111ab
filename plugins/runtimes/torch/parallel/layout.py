"""Process groups of a layout on one rank: its TP group and its data-parallel chunk groups.

Built once per run from the layout. ``torch.distributed.new_group`` is collective over the whole
world, so every rank creates every group in the same order, members or not, and keeps the
handles of the groups it belongs to: first a TP group per stage (pipeline by pipeline), then one
group per set of ranks that hold the same gradient chunks across pipelines (:mod:`.dp_sync`:
chunks of the smallest shard size, grouped by layer and parameter, not by stage), then, for a
tied embedding, the embedding group of every rank holding a copy (:mod:`.tied`), and, when some
ranks stay idle, the group of the used ranks (:mod:`.grad_norm`'s all-reduce). P2P between
consecutive stages uses the default group (leader to leader, HexiScale §3.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from . import tied_embedding as tied
from .data.sync import DPSync, full_shapes, sync_plan
from .assignment import Layout, Role
from .tensor import TPGroup
from .data.hybrid import communicators, machine_sets as hybrid_sets
from .assignment import zero3_runs
from .data.zero import unit_sizes


@dataclass
class Groups:
    """This rank's communicators (``None`` where it has no peers)."""

    rank: int
    world: int
    role: Role | None
    tp: TPGroup
    tp_leader: int
    dp: DPSync | None = None
    tied: tied.TiedSync | None = None
    norm: Any = None  # the ranks a layout uses, who all-reduce the step's gradient norm (None: the world)
    norm_ranks: int = 1  # how many they are


def build_groups(layout: Layout, rank: int, world: int, zero: int = 0, *, machines: tuple[str, ...] | None = None,
                 weights: tuple[float, ...] | None = None) -> Groups:
    """Create (collectively) every TP and DP group of ``layout``; return this rank's. ZeRO-3
    (:mod:`.zero`) gets a second group per member set for the weight gathers, so gathers and
    gradient sums pair up in order on their own communicators (hybrid: per machine subset of a
    chunk group, :func:`.hybrid.machine_sets`). Hybrid sharding (``machines``: the machine of
    every global rank; ``weights``: shard weights or None) adds the machine subsets and
    cross-machine segments of every chunk group (:func:`.hybrid.communicators`; ZeRO-3 cuts
    them unit by unit, :func:`.zero_units.unit_sizes`)."""
    role = layout.role(rank)
    tp, leader = TPGroup(), rank
    for p in layout.pipelines:
        for g in p.groups:
            if g.tp > 1:
                handle = dist.new_group(list(g.ranks)) if world > 1 else None
                if rank in g.ranks:
                    tp, leader = TPGroup(g.ranks.index(rank), g.tp, handle), g.leader
    shapes = full_shapes(layout.model)
    emb = tied.members(layout)
    if emb:  # the tied embedding has its own group (all copies, all pipelines): :mod:`.tied`
        shapes = {n: s for n, s in shapes.items() if n not in ("model.embed_tokens.weight", "lm_head.weight")}
    plan = sync_plan(layout, shapes)
    handles: dict[tuple[int, ...], Any] = {}
    for members in plan.members():
        handle = dist.new_group(list(members)) if world > 1 else None
        if rank in members:
            handles[members] = handle
    gathers: dict[tuple[int, ...], Any] = {}
    zero3 = zero == 3 and zero3_runs(layout)
    if zero3:
        for members in plan.members() if machines is None else hybrid_sets(plan.members(), machines):
            handle = dist.new_group(list(members)) if world > 1 else None
            if rank in members:
                gathers[members] = handle
    hybrid: dict[tuple[int, ...], Any] = {}
    if machines is not None and zero:
        sizes = {m: sum(c.numel for c, _, _ in plan.groups[m]) for m in plan.members()}
        atoms = {m: unit_sizes(plan.groups[m], layout.model.layers) for m in plan.members()} if zero3 else None
        for members in communicators(sizes, weights, machines, atoms):
            handle = dist.new_group(list(members)) if world > 1 else None
            if rank in members:
                hybrid[members] = handle
    dp = DPSync(plan, rank, role.pipeline, handles) if role is not None else None
    if dp is not None:
        dp.gather_handles, dp.hybrid_handles = gathers, hybrid
    tied_sync = None
    if len(emb) > 1 and world > 1:
        handle = dist.new_group(list(emb))
        if rank in emb:
            tied_sync = tied.TiedSync(handle, role.tp_rank)
    used = sorted({r for p in layout.pipelines for g in p.groups for r in g.ranks})  # idle ranks stay out
    norm = dist.new_group(used) if 1 < len(used) < world else None
    return Groups(rank, world, role, tp, leader, dp or None, tied_sync, norm, len(used))
