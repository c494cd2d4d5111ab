"""This rank's parallel layout (torchtitan's ``ParallelDims``): its pipeline, pipeline rank and stage
chunks, its TP group, its data-parallel chunk groups and ZeRO settings, the tied-embedding group.

Built once per rank from the run's :class:`~.assignment.RankAssignment`
(:meth:`ParallelLayout.build`). ``torch.distributed.new_group`` is collective over the whole
world, so every rank creates every group in the same order, members or not, and keeps the
handles of the groups it belongs to: first a TP group per stage (pipeline by pipeline), then one
group per set of ranks that hold the same gradient chunks across pipelines (:mod:`.data.sync`:
chunks of the smallest shard size, grouped by layer and parameter, not by stage), ZeRO-3's
gather groups and hybrid sharding's communicators, then, for a tied embedding, the embedding
group of every rank holding a copy (:mod:`.tied_embedding`), and, when some ranks stay idle, the
group of the used ranks (:mod:`.data.grad_norm`'s all-reduce). P2P between consecutive stages
uses the default group (leader to leader, HexiScale §3.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from . import tied_embedding
from .assignment import PipelinePart, RankAssignment, Role, zero3_runs
from .data.hybrid import communicators, machine_sets as hybrid_sets
from .data.sync import DPSync, full_shapes, sync_plan
from .data.zero_state import unit_sizes
from .tensor import TPGroup


@dataclass(frozen=True)
class ParallelLayout:
    """Everything parallel about one global rank: where it sits in the run (``assignment``,
    ``role``: pipeline, pipeline rank, TP rank; None for an idle rank), its communicators (``tp``
    and its ``tp_leader``; ``data``, the data-parallel chunk groups it syncs gradients in, and
    its ZeRO pieces' holders; ``tied``, the embedding group; ``norm_group`` of the ``norm_ranks``
    ranks that all-reduce the gradient norm, None: the world) and how its training state is
    sharded (``zero`` stage, ``machines`` under hybrid sharding, ``shard_weights`` under uneven
    shards)."""

    rank: int
    world: int
    assignment: RankAssignment
    role: Role | None
    tp: TPGroup
    tp_leader: int
    data: DPSync | None = None
    tied: tied_embedding.TiedSync | None = None
    norm_group: Any = None
    norm_ranks: int = 1
    zero: int = 0
    machines: tuple[str, ...] | None = None
    shard_weights: tuple[float, ...] | None = None

    @property
    def pipeline(self) -> PipelinePart | None:
        """The pipeline this rank runs a stage of (None: an idle rank)."""
        return None if self.role is None else self.assignment.pipelines[self.role.pipeline]

    @property
    def pipe_rank(self) -> int | None:
        return None if self.role is None else self.role.pipe_rank

    @property
    def stage_chunks(self) -> tuple[int, ...]:
        """The action-list stages (chunks) this rank holds, in id order."""
        return () if self.role is None else tuple(self.pipeline.actions.stages_of(self.role.pipe_rank))

    @property
    def is_tp_leader(self) -> bool:
        """Whether this rank sends and receives its stage's activations (TP rank 0)."""
        return self.tp.rank == 0

    @classmethod
    def build(cls, assignment: RankAssignment, rank: int, world: int, zero: int = 0, *,
              machines: tuple[str, ...] | None = None, shard_weights: tuple[float, ...] | None = None
              ) -> "ParallelLayout":
        """Create (collectively) every TP and DP group of ``assignment``; return this rank's
        layout. ZeRO-3 (:mod:`.data.zero_state`) gets a second group per member set for the weight
        gathers, so gathers and gradient sums pair up in order on their own communicators
        (hybrid: per machine subset of a chunk group, :func:`.data.hybrid.machine_sets`). Hybrid
        sharding (``machines``: the machine of every global rank; ``shard_weights``: shard weights
        or None) adds the machine subsets and cross-machine segments of every chunk group
        (:func:`.data.hybrid.communicators`; ZeRO-3 cuts them unit by unit,
        :func:`.data.zero_state.unit_sizes`)."""
        role = assignment.role(rank)
        vocab = assignment.vocab_parallel
        tp, leader = TPGroup(vocab_parallel=vocab), rank
        for part in assignment.pipelines:
            for group in part.groups:
                if group.tp > 1:
                    handle = dist.new_group(list(group.ranks)) if world > 1 else None
                    if rank in group.ranks:
                        tp, leader = TPGroup(group.ranks.index(rank), group.tp, handle, vocab), group.leader
        data = _data_groups(assignment, rank, world, role, zero, machines, shard_weights)
        embedding = tied_embedding.members(assignment)
        tied_sync = None
        if len(embedding) > 1 and world > 1:
            handle = dist.new_group(list(embedding))
            if rank in embedding:
                tied_sync = tied_embedding.TiedSync(handle, role.tp_rank)
        # idle ranks stay out of the gradient norm's all-reduce
        used = sorted({r for part in assignment.pipelines for group in part.groups for r in group.ranks})
        norm = dist.new_group(used) if 1 < len(used) < world else None
        return cls(rank, world, assignment, role, tp, leader, data or None, tied_sync, norm, len(used), zero,
                   machines, shard_weights)


def _data_groups(assignment: RankAssignment, rank: int, world: int, role: Role | None, zero: int,
                 machines: tuple[str, ...] | None, shard_weights: tuple[float, ...] | None) -> DPSync | None:
    """This rank's :class:`~.data.sync.DPSync`, creating (collectively) every chunk group, ZeRO-3's
    gather groups and hybrid sharding's communicators (:meth:`ParallelLayout.build`)."""
    shapes = full_shapes(assignment.model)
    if tied_embedding.members(assignment):  # the tied embedding has its own group (all copies, all pipelines)
        shapes = {n: s for n, s in shapes.items() if n not in ("model.embed_tokens.weight", "lm_head.weight")}
    plan = sync_plan(assignment, shapes)
    handles: dict[tuple[int, ...], Any] = {}
    for members in plan.members():
        handle = dist.new_group(list(members)) if world > 1 else None
        if rank in members:
            handles[members] = handle
    gathers: dict[tuple[int, ...], Any] = {}
    zero3 = zero == 3 and zero3_runs(assignment)
    if zero3:
        for members in plan.members() if machines is None else hybrid_sets(plan.members(), machines):
            handle = dist.new_group(list(members)) if world > 1 else None
            if rank in members:
                gathers[members] = handle
    hybrid: dict[tuple[int, ...], Any] = {}
    if machines is not None and zero:
        sizes = {m: sum(c.numel for c, _, _ in plan.groups[m]) for m in plan.members()}
        atoms = {m: unit_sizes(plan.groups[m], assignment.model.layers) for m in plan.members()} if zero3 else None
        for members in communicators(sizes, shard_weights, machines, atoms):
            handle = dist.new_group(list(members)) if world > 1 else None
            if rank in members:
                hybrid[members] = handle
    data = DPSync(plan, rank, role.pipeline, handles) if role is not None else None
    if data is not None:
        data.gather_handles, data.hybrid_handles = gathers, hybrid
    return data
