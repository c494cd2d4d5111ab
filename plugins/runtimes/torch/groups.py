"""Process groups of a layout on one rank: its TP group and its data-parallel group.

``torch.distributed.new_group`` is collective over the whole world, so every rank creates every
group in the same order, members or not, and keeps the handles of the groups it belongs to.
P2P between pipeline stages uses the default group (leader to leader, HexiScale §3.2).
Asymmetric data parallelism (issue 7) will add its shard-chunk groups here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from .layout import Layout, Role
from .tensor_parallel import TPGroup


@dataclass
class Groups:
    """This rank's communicators (``None`` where it has no peers)."""

    rank: int
    world: int
    role: Role | None
    tp: TPGroup
    tp_leader: int
    dp: Any = None


def build_groups(layout: Layout, rank: int, world: int) -> Groups:
    """Create (collectively) every TP and DP group of ``layout``; return this rank's."""
    role = layout.role(rank)
    tp, leader, dp = TPGroup(), rank, None
    for p in layout.pipelines:
        for g in p.groups:
            if g.tp > 1:
                handle = dist.new_group(list(g.ranks)) if world > 1 else None
                if rank in g.ranks:
                    tp, leader = TPGroup(g.ranks.index(rank), g.tp, handle), g.leader
    if len(layout.pipelines) > 1:
        for q, g in enumerate(layout.pipelines[0].groups):
            for t in range(g.tp):
                members = list(layout.dp_peers(Role(0, q, t)))
                handle = dist.new_group(members) if world > 1 else None
                if rank in members:
                    dp = handle
    return Groups(rank, world, role, tp, leader, dp)
