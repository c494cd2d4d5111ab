"""Who runs what: global ranks, pipelines, TP groups and the layer range of every stage chunk.

Pure Python (no torch), so a plan the runtime cannot run fails with one line *before* any
process starts. A :class:`RankAssignment` is the runtime's view of a plan (docs/formats.md): each
pipeline is an action list (:mod:`hexicore.pipeline.actions`) whose pipeline rank ``q`` is a
:class:`StageGroup` — the TP group of global ranks of plan stage ``q``, leader first
(HexiScale §3.2: activations go leader -> leader, then the leader broadcasts in its TP group).

Chunks: a schedule may give a pipeline rank several stages (interleaved 1F1B, Chimera's two
copies, Hanayo's 2W wave stages). Walking the first chain in data order, the stages a rank holds
share its plan layer count as evenly as possible (earlier chunks take the remainder), so the
chain covers ``[0, L)`` exactly once. Further chains of the same length are model copies
(Chimera): the stage at position k holds the same blocks as position k of the first chain —
these *replicas* start from the same weights and REDUCE sums their gradients.

Pipelines may differ in everything (HexiScale's asymmetric plans): batch share, number of
stages, layer cuts, TP degree per stage, schedule. Gradients are synced per layer and parameter
among whoever holds them (:mod:`.data.sync`), so no shape has to match across pipelines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hexicore.pipeline.actions import Action, ActionList, Op
from hexicore.core.errors import PlanError
from hexicore.core.model import HF_MODEL_TYPES, ModelSpec
from hexicore.core.schedule_ref import freeze


@dataclass(frozen=True)
class StageGroup:
    """One pipeline rank: the global ranks of its TP group (``ranks[0]`` leads) and layer count."""

    ranks: tuple[int, ...]
    layers: int

    @property
    def tp(self) -> int:
        return len(self.ranks)

    @property
    def leader(self) -> int:
        return self.ranks[0]


@dataclass(frozen=True)
class PipelinePart:
    """One pipeline: rows ``[offset, offset + batch)`` of the global batch, its ranks and actions."""

    index: int
    offset: int
    batch: int
    groups: tuple[StageGroup, ...]
    actions: ActionList
    chunk_layers: tuple[tuple[int, int], ...]  # per action-list stage: blocks [start, end)

    def first_of_chain(self, stage: int) -> bool:
        return any(c[0] == stage for c in self.actions.chains)

    def last_of_chain(self, stage: int) -> bool:
        return any(c[-1] == stage for c in self.actions.chains)

    def chain_index(self, stage: int) -> int:
        return next(i for i, c in enumerate(self.actions.chains) if stage in c)

    def replicas(self, stage: int) -> tuple[int, ...]:
        """Stages holding the same blocks as ``stage`` (itself included), in chain order."""
        c = self.chain_index(stage)
        pos = self.actions.chains[c].index(stage)
        return tuple(ch[pos] for ch in self.actions.chains)


@dataclass(frozen=True)
class Role:
    """A global rank's place: pipeline, pipeline rank, TP rank."""

    pipeline: int
    pipe_rank: int
    tp_rank: int


@dataclass(frozen=True)
class RankAssignment:
    """Every pipeline of a run over ``world`` global ranks (ranks beyond the pipelines idle)."""

    model: ModelSpec
    world: int
    global_batch: int
    micro_batch: int
    seq_len: int
    pipelines: tuple[PipelinePart, ...]
    #: ``train.vocab_parallel``: TP groups split the embedding and the head by vocabulary rows
    vocab_parallel: bool = False

    def role(self, rank: int) -> Role | None:
        for p in self.pipelines:
            for q, g in enumerate(p.groups):
                if rank in g.ranks:
                    return Role(p.index, q, g.ranks.index(rank))
        return None

    @property
    def schedule_name(self) -> str:
        """The schedule's name; pipelines under different schedules: their names joined by ``+``."""
        names = [str(p.actions.schedule.get("name", "?")) for p in self.pipelines]
        return "+".join(dict.fromkeys(names))


# ------------------------------------------------------------------ building
def split_even(total: int, parts: int) -> list[int]:
    """``total`` into ``parts`` near-equal integers, larger first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def chunk_layers(actions: ActionList, rank_layers: list[int], source: str | None = None) -> tuple[tuple[int, int], ...]:
    """Blocks ``[start, end)`` of every stage: each chain walks ``[0, L)`` in data order."""
    out: dict[int, tuple[int, int]] = {}
    for ci, chain in enumerate(actions.chains):
        if ci and len(chain) == len(actions.chains[0]):  # a model copy (Chimera): replicas match by position
            for s, s0 in zip(chain, actions.chains[0]):
                out[s] = out[s0]
            continue
        mine = {r: [s for s in chain if actions.stage_rank[s] == r] for r in range(actions.ranks)}
        share = {r: split_even(rank_layers[r], len(ss)) for r, ss in mine.items() if ss}
        start = 0
        for s in chain:
            r = actions.stage_rank[s]
            n = share[r][mine[r].index(s)]
            if n < 1:
                raise PlanError(f"schedule {actions.schedule.get('name', '?')!r} gives rank {r} {len(mine[r])} "
                                f"stages but it holds only {rank_layers[r]} layers (more stages than layers)",
                                source=source, field="layers")
            out[s] = (start, start + n)
            start += n
        if start != sum(rank_layers):
            raise PlanError(f"chain {list(chain)} does not visit every rank that holds layers", source=source,
                            field="chains")
    missing = [s for s in range(actions.stages) if s not in out]
    if missing:
        raise PlanError(f"stages {missing} belong to no chain", source=source, field="chains")
    return tuple(out[s] for s in range(actions.stages))


def check_model(model: ModelSpec, tp: int, source: str | None = None, field: str = "tp") -> None:
    """TP must divide query heads, kv heads and the FFN width (Megatron sharding)."""
    if model.arch != "llama":
        raise PlanError(f"the torch runtime trains Llama-style models, not arch {model.arch!r}", source=source,
                        field="model.arch")
    if model.hf_model_type and model.hf_model_type not in HF_MODEL_TYPES:
        raise PlanError(f"the torch runtime trains Hugging Face {', '.join(HF_MODEL_TYPES)} models, not "
                        f"{model.hf_model_type} (planning reads any decoder's shape)", source=source,
                        field="model.hf_model_type")
    for what, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn)):
        if n % tp:
            raise PlanError(f"tensor-parallel degree {tp} does not divide the model's {what} ({n})", source=source,
                            field=field)


def check_actions(actions: ActionList, source: str | None = None) -> None:
    """Structural checks the executor relies on (ops name stages of their own rank, peers exist)."""
    for r, acts in enumerate(actions.actions):
        for a in acts:
            if a.op is Op.STEP:
                continue
            if a.stage is None or not 0 <= a.stage < actions.stages:
                raise PlanError(f"rank {r}: action {a} names no valid stage", source=source, field="actions")
            if actions.stage_rank[a.stage] != r:
                raise PlanError(f"rank {r}: action {a} is for stage {a.stage}, which runs on rank "
                                f"{actions.stage_rank[a.stage]}", source=source, field="actions")
            if (a.is_compute or a.is_comm) and (a.mb is None or not 0 <= a.mb < actions.micro_batches):
                raise PlanError(f"rank {r}: action {a} names no valid micro-batch", source=source, field="actions")
            if a.is_comm and (a.peer is None or not 0 <= a.peer < actions.ranks):
                raise PlanError(f"rank {r}: action {a} names no valid peer", source=source, field="actions")


def check_fifo(actions: ActionList, source: str | None = None) -> None:
    """Every link's receives come in the order of its sends (NCCL matches P2P without tags)."""
    sent: dict[tuple[int, int], list] = {}
    got: dict[tuple[int, int], list] = {}
    for r, acts in enumerate(actions.actions):
        for a in acts:
            if a.op is Op.SEND_F or a.op is Op.SEND_B:
                to = actions.next_stage(a.stage, a.mb) if a.op is Op.SEND_F else actions.prev_stage(a.stage, a.mb)
                sent.setdefault((r, a.peer), []).append((a.op[-1], to, a.mb))
            elif a.op is Op.RECV_F or a.op is Op.RECV_B:
                got.setdefault((a.peer, r), []).append((a.op[-1], a.stage, a.mb))
    for link in sorted(set(sent) | set(got)):
        if sent.get(link, []) != got.get(link, []):
            raise PlanError(f"rank {link[1]} receives from rank {link[0]} in another order than it sends; NCCL needs "
                            "each link in order (use the shared comm pass, hexicore.pipeline.comm.insert_comm)",
                            source=source, field="actions")


def pipeline_part(index: int, offset: int, batch: int, groups: list[StageGroup], actions: ActionList,
                  model: ModelSpec, micro_batch: int, source: str | None = None, check: bool = True) -> PipelinePart:
    if actions.ranks != len(groups):
        raise PlanError(f"action list has {actions.ranks} ranks but the pipeline has {len(groups)} stages",
                        source=source, field="pipelines")
    if actions.micro_batches * micro_batch != batch:
        raise PlanError(f"action list runs {actions.micro_batches} micro-batches of {micro_batch} but the "
                        f"pipeline's batch is {batch}", source=source, field="batch")
    if check:  # (False: the same list, already checked for another pipeline)
        check_actions(actions, source)
    for j, g in enumerate(groups):
        check_model(model, g.tp, source, f"pipelines[{index}].stages[{j}].tp")
    chunks = chunk_layers(actions, [g.layers for g in groups], source)
    if sum(g.layers for g in groups) != model.layers:
        raise PlanError(f"stages hold {sum(g.layers for g in groups)} layers, the model has {model.layers}",
                        source=source, field="layers")
    part = PipelinePart(index, offset, batch, tuple(groups), actions, chunks)
    for s in range(actions.stages):
        tps = {groups[actions.stage_rank[x]].tp for x in part.replicas(s)}
        if len(tps) > 1:
            raise PlanError(f"replicas {part.replicas(s)} of stage {s} have different TP degrees", source=source,
                            field=f"pipelines[{index}].stages")
    return part


def build_layout(model: ModelSpec, pipelines: list[tuple[int, list[StageGroup], ActionList]], *,
                 global_batch: int, micro_batch: int, seq_len: int, world: int | None = None,
                 source: str | None = None, vocab_parallel: bool = False) -> RankAssignment:
    """Check and assemble a layout; ``pipelines`` are ``(batch, stage groups, action list)``."""
    if seq_len > model.longest_seq:
        raise PlanError(f"sequence length {seq_len} exceeds the model's {model.longest_seq}", source=source,
                        field="train.seq_len")
    parts, offset, checked = [], 0, set()
    for i, (batch, groups, actions) in enumerate(pipelines):
        parts.append(pipeline_part(i, offset, batch, groups, actions, model, micro_batch, source,
                                   check=id(actions) not in checked))
        checked.add(id(actions))  # (one list shared by pipelines of one shape is checked once)
        offset += batch
    if offset != global_batch:
        raise PlanError(f"pipeline batches sum to {offset}, the global batch is {global_batch}", source=source,
                        field="train.global_batch")
    used = [r for p in parts for g in p.groups for r in g.ranks]
    if len(set(used)) != len(used):
        raise PlanError("a rank appears in two stages", source=source, field="pipelines")
    world = max(used) + 1 if world is None else world
    if max(used) >= world:
        raise PlanError(f"ranks up to {max(used)} need a world of {max(used) + 1}, got {world}", source=source)
    return RankAssignment(model, world, global_batch, micro_batch, seq_len, tuple(parts), vocab_parallel)


def reference_actions(micro_batches: int) -> ActionList:
    """``parallel=none``: one rank, one stage, all forwards then all backwards, then STEP."""
    acts = [Action(Op.F, 0, m) for m in range(micro_batches)] + [Action(Op.B, 0, m) for m in range(micro_batches)]
    return ActionList({"name": "none"}, 1, 1, micro_batches, (0,), (tuple(acts) + (Action(Op.STEP),),))


def reference_layout(model: ModelSpec, *, global_batch: int, micro_batch: int, seq_len: int) -> RankAssignment:
    """The single-process reference: the whole model on rank 0, same micro-batches."""
    check_model(model, 1)
    mbs = _micro_batches(global_batch, micro_batch)
    return build_layout(model, [(global_batch, [StageGroup((0,), model.layers)], reference_actions(mbs))],
                        global_batch=global_batch, micro_batch=micro_batch, seq_len=seq_len, world=1)


def _micro_batches(batch: int, micro_batch: int, source: str | None = None) -> int:
    if batch % micro_batch:
        raise PlanError(f"batch {batch} is not a multiple of micro-batch {micro_batch}", source=source,
                        field="train.micro_batch")
    return batch // micro_batch


def schedule_actions(schedule: Mapping[str, Any], ranks: int, micro_batches: int, registry: Any,
                     source: str | None = None, rank_layers: Sequence[int] = (), fallback: bool = False) -> ActionList:
    """The action lists (with communication) of the schedule section ``schedule``, built by
    ``registry``'s schedule plugin of that name for ranks holding ``rank_layers`` blocks (where
    given: a schedule choosing its own chunk count stays within them). ``fallback``: a pipeline
    with fewer ranks than the schedule runs on runs its ``Pricing.fewer_ranks`` schedule, as the
    planner priced it (a one-rank Hanayo pipeline: 1F1B). They travel to the workers inside the
    :class:`RankAssignment`, so workers need no registry (a schedule registered only in the launching
    process runs too)."""
    from hexicore.core.errors import ScheduleError
    from hexicore.pipeline.comm import insert_comm
    from hexicore.pipeline.schedule import ScheduleSpec
    from hexicore.pipeline.validate import validate_actions

    params = dict(schedule)
    name = str(params.pop("name", "?"))
    sched = registry.create("schedule", name, **params)
    pricing = getattr(sched, "pricing", None)
    if fallback and pricing is not None and ranks < pricing.min_ranks and pricing.fewer_ranks is not None:
        sched = registry.create("schedule", pricing.fewer_ranks.name, **pricing.fewer_ranks.kwargs())

    actions = sched.actions(ScheduleSpec(ranks=ranks, micro_batches=micro_batches,
                                         rank_layers=tuple(int(x) for x in rank_layers)))
    if ranks > 1 and not any(a.is_comm for acts in actions.actions for a in acts):
        actions = insert_comm(actions)
    try:  # lists that deadlock or miss a backward are refused before any worker starts
        validate_actions(actions)
    except ScheduleError as exc:
        raise ScheduleError(exc.message, source=exc.source or f"schedule {name}", field=exc.field) from None
    return actions


def single_pipeline_layout(model: ModelSpec, schedule: Mapping[str, Any], ranks: int, *, registry: Any,
                           global_batch: int, micro_batch: int, seq_len: int, tp: int = 1,
                           actions: ActionList | None = None, vocab_parallel: bool = False) -> RankAssignment:
    """One pipeline of ``ranks`` equal stages (``tp`` ranks each) under a schedule (no plan file);
    its actions are ``actions`` or else built by ``registry`` (:func:`schedule_actions`)."""
    if ranks < 1:
        raise PlanError(f"pipeline.ranks must be at least 1, got {ranks}", field="pipeline.ranks")
    if ranks > model.layers:
        raise PlanError(f"{ranks} pipeline stages but the model has only {model.layers} layers (more stages than "
                        "layers)", field="pipeline.ranks")
    check_model(model, tp)
    mbs = _micro_batches(global_batch, micro_batch)
    blocks = split_even(model.layers, ranks)
    actions = actions or schedule_actions(schedule, ranks, mbs, registry, rank_layers=blocks)
    groups = [StageGroup(tuple(range(q * tp, (q + 1) * tp)), n) for q, n in enumerate(blocks)]
    return build_layout(model, [(global_batch, groups, actions)], global_batch=global_batch,
                        micro_batch=micro_batch, seq_len=seq_len, vocab_parallel=vocab_parallel)


def plan_layout(plan: Any, schedules: Sequence[Mapping[str, Any]], *, registry: Any, seq_len: int,
                source: str | None = None) -> RankAssignment:
    """A :class:`hexicore.core.plan.Plan` -> layout: devices numbered in plan order become global
    ranks; pipeline ``i`` runs ``schedules[i]`` (its own section, defaults resolved by the app),
    built by ``registry``."""
    model, train = plan.model, plan.train
    if len(schedules) != len(plan.pipelines):
        raise PlanError(f"{len(schedules)} schedules for {len(plan.pipelines)} pipelines", source=source,
                        field="pipelines")
    if any(s.n_layers < 1 for p in plan.pipelines for s in p.stages):
        raise PlanError("a stage holds no layers (more stages than layers)", source=source, field="layers")
    rank_of = {d: i for i, d in enumerate(plan.devices)}
    pipes, built = [], {}  # (schedule, ranks, micro-batches, blocks) -> its lists, built once
    for i, (p, sched) in enumerate(zip(plan.pipelines, schedules)):
        mbs = _micro_batches(p.batch, train.micro_batch, source)
        groups = [StageGroup(tuple(rank_of[d] for d in s.devices), s.n_layers) for s in p.stages]
        for j, s in enumerate(p.stages):
            check_model(model, s.tp, source, f"pipelines[{i}].stages[{j}].tp")
        key = (freeze(sched), len(groups), mbs, tuple(g.layers for g in groups))
        if key not in built:  # (pipelines of one shape run the same lists: 80 stages of 512 micro-batches
            # under ZB-H1 take 0.7 s to build, twice on a 320-GPU plan of two aligned pipelines)
            built[key] = schedule_actions(sched, len(groups), mbs, registry, source, list(key[3]), fallback=True)
        pipes.append((p.batch, groups, built[key]))
    return build_layout(model, pipes, global_batch=train.global_batch, micro_batch=train.micro_batch,
                        seq_len=seq_len, world=len(rank_of), source=source,
                        vocab_parallel=train.vocab_parallel)


# ------------------------------------------------------------------ ZeRO-3
# which assignments ZeRO-3 (parallel/data/zero_state.py) runs on: structural facts of the assignment,
# torch-free here because `plan` and `evaluate` check plans without torch
def one_stage_per_pipeline(layout) -> bool:
    """Whether every pipeline is one plan stage (one pipeline rank, TP group) with one model copy:
    its ranks never wait on another pipeline's activations, however many chunks its schedule
    gives that rank (interleaved 1F1B, Hanayo, V schedules on a one-stage pipeline)."""
    return all(len(p.groups) == 1 and len(p.actions.chains) == 1 for p in layout.pipelines)


def mirrored(layout) -> bool:
    """Whether the pipelines mirror each other: the same stage chunks, TP degrees, batch and
    action lists, one model copy each (no Chimera copies)."""
    p0 = layout.pipelines[0]
    return all(len(p.actions.chains) == 1 and p.batch == p0.batch and p.chunk_layers == p0.chunk_layers
               and [g.tp for g in p.groups] == [g.tp for g in p0.groups] and p.actions.actions == p0.actions.actions
               for p in layout.pipelines)


def zero3_runs(layout) -> bool:
    """Whether ZeRO-3 runs on ``layout`` (:mod:`.data.zero_state`): every pipeline one stage (any
    schedules, batches, TP degrees), or pipelines that mirror each other (:func:`mirrored`).
    Gathers are blocking and pair rank by rank; between pipelines whose stage ranks also wait
    on each other's activations, pairing the ``k``-th needs of ranks at different points of
    different schedules could deadlock, so other multi-stage layouts are refused."""
    return one_stage_per_pipeline(layout) or mirrored(layout)
