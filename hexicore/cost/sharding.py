"""Who shares the sharded training state (ZeRO, Rajbhandari et al. SC'20) and what syncing it costs.

The holders of a layer chunk are one stage per pipeline (HexiScale §3.2's chunked data-parallel
groups, chunks of ``P / lcm(tp)``). ``train.zero_scope`` says among whom the sharded parts are
split:

* ``all`` — every holder keeps a share of each chunk (even, or ``w_d / sum w`` with
  ``zero_split=memory``, Cephalo-style, ``w`` = device memory);
* ``machine`` — hybrid sharding (PyTorch's HSDP, "shard inside a machine, replicate across"):
  a holder shares each chunk with the holders *in its own machine* only; the machines keep
  replicas of the sharded state.

Time, per layer (:func:`layer_sync_s`), as ``(intra, cross)``: ``intra`` is COMM-DP-LAYER
(App. A's ring, :meth:`~hexicore.cost.analytic.AnalyticCostModel.dp_layer_s`) among the holders
that share shards — all of them, or, hybrid, the slowest machine's; ``cross`` (hybrid only) is
the all-reduce, among the machines, of the shard pieces: COMM-DP-LAYER over one holder per
machine of ``P / k`` parameters, ``k`` the fewest holders any machine has (its pieces are the
largest); each piece position has its own such ring and they run side by side, so one is priced.
ZeRO-1/2 pay ``intra + cross`` at the step (ZeRO-2 also reduce-scatters each micro-batch's
gradients, ``0.5 x intra``, which paces a stage whose link is slower than its compute); ZeRO-3 pays
``1.5 x intra`` per micro-batch (gathers before forward and backward, reduce-scatter after) and
``cross`` at the step.

A tied embedding (``tied_embeddings``) is no sharded state: every stage holding a copy — each
pipeline's embedding and head stages — keeps it whole, and the copies' gradients are summed in
one all-reduce among all of them (Megatron-LM's embedding group, :func:`tied_sync_s`), paid at
the step whatever the ZeRO stage (in the ``cross`` slot), also with one pipeline.

Under ``train.vocab_parallel`` the embedding's and the head's ``V x H`` matrices are split by
vocabulary rows among a stage's TP ranks: they are synced (and sharded) like a block's TP-split
part, in chunks of ``V x H / lcm(tp)``, not among every TP rank (:func:`end_parts`); the tied
embedding group still sums a whole ``V x H`` buffer on every rank, each rank's rows in place.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from hexicore.core.placement import Placement
from hexicore.core.plan import Plan, Stage
from hexicore.cost.precision import sync_bytes, tied_whole, tp_replicated_layer_params, vocab_split

#: ZeRO-3 traffic per micro-batch in units of the stage's all-reduce term (COMM-DP-LAYER, factor 2 =
#: reduce-scatter + all-gather): all-gathers before forward and backward, gradients' reduce-scatter
ZERO3_PER_MICRO_BATCH = 1.5
#: ZeRO-2 traffic per micro-batch in the same units: the gradients' reduce-scatter (the weights'
#: all-gather is once a step)
ZERO2_PER_MICRO_BATCH = 0.5


def shard_weights(plan: Plan) -> dict[str, float] | None:
    """Uneven ZeRO shards (``train.zero_split=memory``): each device's weight is its memory
    (GB); ``None`` for even shards or no sharding."""
    if plan.train.zero_stage == 0 or plan.train.zero_split != "memory":
        return None
    return {d.id: d.memory_gb for d in plan.cluster.devices}


def peer_groups(plan: Plan, devices: Sequence[str]) -> list[list[int]]:
    """Indices of ``devices`` (one holder each) grouped by who shares shards: one group
    (``zero_scope=all``) or one per machine, in order of first appearance (``machine``)."""
    if plan.train.zero_scope != "machine":
        return [list(range(len(devices)))]
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        groups.setdefault(plan.cluster.device(d).machine, []).append(i)
    return list(groups.values())


def ends(cost: Any, plan: Plan, pipe: Any) -> tuple[int, int]:
    """The stages of ``pipe`` holding the embedding and the head whose gradients the data-parallel
    sync carries: the first and the last, or where the pipeline's schedule places chain 0's
    (the cost model's ``pipeline_placement``; Hanayo and V layouts end the chain on rank 0)."""
    pl = placement_of(cost, plan, pipe)
    return (0, len(pipe.stages) - 1) if pl is None else (pl.primary("embedding"), pl.primary("head"))


def kept_params(plan: Plan, cost: Any = None) -> dict[str, float] | None:
    """Per device, the parameters whose sharded state parts it keeps: for every chunk (``P /
    lcm(tp)`` of a block's TP-split part; HexiScale §3.2) its share ``w_d / sum w`` among the
    holders it shares shards with (:func:`peer_groups`; ``w = 1`` for even shards); a holder is
    each copy a rank keeps under its schedule's placement (:func:`copy_holders`: Chimera's two
    copies per pipeline shard a chunk among ``2 x dp``, a rank with two copies of it keeping two
    shares), the embedding and the head wherever a chain has them; what TP replicates (norms,
    row-parallel biases, embedding, head:
    :func:`hexicore.cost.precision.tp_replicated_layer_params`) is one chunk held by every TP
    rank of every holder. ``None`` where ``params / tp / dp`` is exact: even shards among all
    holders, one TP degree everywhere, one copy of each block per pipeline."""
    w = shard_weights(plan)
    tps = {s.tp for p in plan.pipelines for s in p.stages}
    pls = [placement_of(cost, plan, p) for p in plan.pipelines]
    copies = any(pl is not None and any(len(cs) > 1 for cs in pl.ranks) for pl in pls)
    if plan.train.zero_stage == 0 or len(plan.pipelines) <= 1 or \
            (w is None and plan.train.zero_scope != "machine" and len(tps) == 1 and not copies):
        return None
    weight = w or {}
    out = {d: 0.0 for p in plan.pipelines for s in p.stages for d in s.devices}

    def share(hs: Sequence[str], n_params: float) -> None:
        for g in peer_groups(plan, hs):
            tot = sum(weight.get(hs[i], 1.0) for i in g)
            for i in g:
                out[hs[i]] += n_params * weight.get(hs[i], 1.0) / tot

    def add(stages: Sequence[Stage], split: float, replicated: float) -> None:
        chunks = math.lcm(*(s.tp for s in stages))
        for c in range(chunks):
            share([s.devices[c * s.tp // chunks] for s in stages], split / chunks)
        share([d for s in stages for d in s.devices], replicated)

    m = plan.model
    rep = tp_replicated_layer_params(m)
    for k in range(m.layers):
        add([h for p, pl in zip(plan.pipelines, pls)
             for h in copy_holders(p, pl, lambda c: p.stages[c.source].layers[0] <= k < p.stages[c.source].layers[1])],
            m.layer_params() - rep, rep)
    tied = m.vocab * m.hidden if m.tied_embeddings else 0  # kept whole by every copy: tied_whole
    add([h for p, pl in zip(plan.pipelines, pls) for h in copy_holders(p, pl, lambda c: c.embedding)],
        *end_parts(plan, m.embedding_params() - tied, 0 if tied else 1))
    add([h for p, pl in zip(plan.pipelines, pls) for h in copy_holders(p, pl, lambda c: c.head)],
        *end_parts(plan, m.head_params(), 0 if tied else 1))
    for p in plan.pipelines if tied else ():
        for s, held in zip(p.stages, stage_holdings(cost, plan, p)):
            for d in s.devices:
                out[d] += tied_whole(m, held["first"], held["last"], held.get("tied_heads"), vocab_split(plan.train, s.tp))
    return out


def end_parts(plan: Plan, n_params: float, matrices: int) -> tuple[float, float]:
    """``(split, replicated)`` parameters of an embedding or head tensor group of ``n_params``
    that holds ``matrices`` (0 or 1) ``V x H`` matrices: under ``train.vocab_parallel`` the
    matrix is TP split (by vocabulary rows), the rest replicated; otherwise all replicated."""
    m = plan.model
    rows = matrices * m.vocab * m.hidden if plan.train.vocab_parallel else 0
    return float(rows), n_params - rows


def placement_of(cost: Any, plan: Plan, pipe: Any) -> Any:
    """``pipe``'s placement under its schedule (``cost.pipeline_placement``), None for the plain one."""
    probe = getattr(cost, "pipeline_placement", None) if cost is not None else None
    return probe(pipe, pipe.n_micro_batches(plan.train.micro_batch)) if probe is not None else None


def copy_holders(pipe: Any, pl: Any, keeps: Any) -> list[Stage]:
    """The stage (a rank's TP group) of every copy of ``pipe`` for which ``keeps(copy)`` holds,
    once per copy (a rank keeping two copies is listed twice); plain placement: stage j keeps
    its own blocks, the first stage the embedding, the last the head."""
    pl = Placement.plain(len(pipe.stages)) if pl is None else pl
    return [pipe.stages[j] for j, cs in enumerate(pl.ranks) for c in cs if keeps(c)]


def stage_holdings(cost: Any, plan: Plan, pipe: Any) -> list[dict[str, Any]]:
    """Per stage of ``pipe`` what it keeps (``cost.held``: blocks, embeddings, heads, tied
    copies under its schedule's placement), or the plain placement's embedding and head."""
    held = getattr(cost, "held", None) if cost is not None else None
    if held is not None:
        return held(pipe, pipe.n_micro_batches(plan.train.micro_batch))
    return [{"n_layers": s.n_layers, "first": j == 0, "last": j == len(pipe.stages) - 1}
            for j, s in enumerate(pipe.stages)]


def layer_sync_s(cost: Any, plan: Plan, holders: Sequence[Stage], n_params: float, links: dict,
                 w: dict[str, float] | None) -> tuple[float, float]:
    """``(intra, cross)`` seconds to sync one layer held by ``holders`` (module docstring)."""
    c, bt = plan.cluster, sync_bytes(cost, plan.train)
    if plan.train.zero_stage == 0 or plan.train.zero_scope != "machine":
        return cost.dp_layer_s(c, holders, n_params, bt, links, w), 0.0
    groups = peer_groups(plan, [s.devices[0] for s in holders])
    intra = max(cost.dp_layer_s(c, [holders[i] for i in g], n_params, bt, links, w) for g in groups)
    if len(groups) == 1:
        return intra, 0.0
    k = min(len(g) for g in groups)
    return intra, cost.dp_layer_s(c, [holders[g[0]] for g in groups], n_params / k, bt, links, None)


def every_rank(holders: Sequence[Stage]) -> tuple[Stage, ...]:
    """The holders of a tensor TP replicates, one single-device holder per TP rank: the torch
    runtime all-reduces such a tensor among every rank of every holder stage (one copy per TP
    rank, ``plugins/runtimes/torch/parallel/data/sync.py``), so its ring has ``sum tp`` members, each
    moving the whole tensor, not ``1/tp`` of it."""
    return tuple(Stage((d,), 1, s.layers) for s in holders for d in s.devices)


def _sync_s(cost: Any, plan: Plan, holders: Sequence[Stage], split: float, replicated: float, links: dict,
            w: dict[str, float] | None) -> tuple[float, float]:
    """``layer_sync_s`` of a tensor group with a TP-split part ``split`` and a TP-replicated part
    ``replicated`` (:func:`every_rank`); with every ``tp = 1`` one term, App. A's form."""
    if all(s.tp == 1 for s in holders):
        return layer_sync_s(cost, plan, holders, split + replicated, links, w)
    a = layer_sync_s(cost, plan, holders, split, links, w) if split else (0.0, 0.0)
    b = layer_sync_s(cost, plan, every_rank(holders), replicated, links, w) if replicated else (0.0, 0.0)
    return a[0] + b[0], a[1] + b[1]


def dp_stage_parts(cost: Any, plan: Plan) -> Mapping[tuple[int, int], tuple[float, float]]:
    """Per stage ``(pipeline, stage)``: ``(intra, cross)`` summed over its layers, the
    embedding and the head synced like a layer among the first/last stages (App. A's
    ``sum_{k in stage} COMM-DP-LAYER``; where a schedule places them elsewhere, on the stages
    :func:`ends` names); empty with one pipeline. Under TP the parts a stage
    replicates (norms, row-parallel biases, embedding, head) are synced among every TP rank
    (:func:`every_rank`), the rest in HexiScale §3.2's chunks.

    The last plan's is kept per cost model (plans are immutable): one estimate asks for it once
    per pipeline under ZeRO-3 (its stage times) and again for the step's sync."""
    memo = plan.cluster.memo
    hit = memo.get(("dp_stage_parts", id(cost)))
    if hit is None or hit[0] is not cost or hit[1] is not plan:
        memo[("dp_stage_parts", id(cost))] = hit = (cost, plan, _dp_stage_parts(cost, plan))
    return hit[2]


def _dp_stage_parts(cost: Any, plan: Plan) -> dict[tuple[int, int], tuple[float, float]]:
    """:func:`dp_stage_parts`, computed."""
    pipes = plan.pipelines
    pls = [placement_of(cost, plan, p) for p in pipes]
    copies = [pl is not None and any(len(pl.holders(j)) > 1 for j in range(len(pl.ranks))) for pl in pls]
    if len(pipes) <= 1 and not any(copies):  # nothing to sync but a tied embedding's copies
        return stage_sums(cost, plan, pls, lambda i, k: (0.0, 0.0), {}, None) if tied_holders(cost, plan) else {}
    m = plan.model
    holder = [[None] * m.layers for _ in pipes]
    for i, p in enumerate(pipes):
        for s in p.stages:
            for k in range(*s.layers):
                holder[i][k] = s
    if any(copies):  # a schedule keeping copies of stages (Chimera): copies_sync prices them
        return copies_sync(cost, plan, pls, holder)
    cache: dict[tuple, tuple[float, float]] = {}
    links: dict = {}
    w = shard_weights(plan)
    t = plan.train
    # across plans of one cluster (a search prices thousands that share most holder sets): a
    # layer's sync depends only on its holders' devices and TP degrees (without uneven shards)
    shared = plan.cluster.memo.setdefault(("layer_sync", id(cost), sync_bytes(cost, t), t.zero_stage, t.zero_scope), {}) \
        if w is None else {}

    def layer_cost(k: int) -> tuple[float, float]:
        hs = tuple(holder[i][k] for i in range(len(pipes)))
        key = tuple(id(s) for s in hs)
        if key not in cache:
            full = (m.layer_params(), rep, tuple((s.devices, s.tp) for s in hs))
            if full not in shared:
                shared[full] = (cost, _sync_s(cost, plan, hs, m.layer_params() - rep, rep, links, w))  # cost: its id stays its own
            cache[key] = shared[full][1]
        return cache[key]

    rep = tp_replicated_layer_params(m)
    per_layer = [layer_cost(k) for k in range(m.layers)]
    return stage_sums(cost, plan, [None] * len(pipes), lambda i, k: per_layer[k], links, w)


def stage_sums(cost: Any, plan: Plan, pls: Sequence[Any], layer: Any, links: dict,
               w: dict[str, float] | None, ends_parts: Any = None) -> dict[tuple[int, int], tuple[float, float]]:
    """Per stage ``(pipeline, rank)``: ``layer(i, k)`` summed over the blocks of every copy the
    rank keeps (``pls``: each pipeline's placement, None: its own stage's), plus the embedding's
    and the head's sync on the stages :func:`ends` names (with several pipelines; or
    ``ends_parts(i, j)``, a list of parts, where given) and a tied embedding group's."""
    pipes, m = plan.pipelines, plan.model
    at = [ends(cost, plan, p) for p in pipes]
    none = (0.0, 0.0)
    own = m.embedding_params() - (m.vocab * m.hidden if m.tied_embeddings else 0)  # a tied one: its group
    matrix = 0 if m.tied_embeddings else 1
    first = _sync_s(cost, plan, [p.stages[e] for p, (e, _) in zip(pipes, at)], *end_parts(plan, own, matrix), links, w) \
        if len(pipes) > 1 and own else none
    last = _sync_s(cost, plan, [p.stages[h] for p, (_, h) in zip(pipes, at)], *end_parts(plan, m.head_params(), matrix),
                   links, w) if len(pipes) > 1 else none
    group = tied_holders(cost, plan)
    tied = (0.0, tied_sync_s(cost, plan, [pipes[i].stages[j] for i, j in group], links)) if group else none
    out = {}
    for i, p in enumerate(pipes):
        for j in range(len(p.stages)):
            sources = [c.source for c in pls[i].ranks[j]] if pls[i] is not None else [j]
            parts = [layer(i, k) for src in sources for k in range(*p.stages[src].layers)]
            if ends_parts is not None:
                parts += ends_parts(i, j)
            else:
                parts += ([first] if j == at[i][0] else []) + ([last] if j == at[i][1] else [])
            parts += [tied] if (i, j) in group else []
            out[(i, j)] = (sum(x[0] for x in parts), sum(x[1] for x in parts))
    return out


def tied_holders(cost: Any, plan: Plan) -> tuple[tuple[int, int], ...]:
    """The stages ``(pipeline, stage)`` holding a copy of a tied embedding — each pipeline's
    embedding and head stages (:func:`ends`; Chimera's other chain uses the same two ranks) —
    when there are two or more of them (one stage holds both as one Parameter); else ``()``."""
    if not plan.model.tied_embeddings:
        return ()
    group = tuple(sorted({(i, j) for i, p in enumerate(plan.pipelines) for j in ends(cost, plan, p)}))
    return group if len(group) > 1 else ()


def tied_sync_s(cost: Any, plan: Plan, holders: Sequence[Stage], links: dict) -> float:
    """The embedding group's all-reduce of a tied embedding's gradient at the step
    (Megatron-LM's ``embedding_group``; ``plugins/runtimes/torch/parallel/tied_embedding.py``): ``vocab x hidden``
    summed among every rank of every holder stage (:func:`every_rank`), App. A's ring, whatever
    the ZeRO stage or scope (the copies are never sharded)."""
    c, m = plan.cluster, plan.model
    ranks = holders if all(s.tp == 1 for s in holders) else every_rank(holders)
    return cost.dp_layer_s(c, ranks, m.vocab * m.hidden, sync_bytes(cost, plan.train), links, None)


def copies_sync(cost: Any, plan: Plan, pls: Sequence[Any], holder: list[list[Stage]]) -> dict:
    """:func:`dp_stage_parts` where schedules keep copies of stages on other ranks (Chimera's up
    chain: rank r keeps stage P-1-r's blocks too; ``pls``: each pipeline's placement or None).
    The runtime first sums each stage's gradients between its copies (``REDUCE``: the holders of
    one pipeline exchange them, priced as their all-reduce), then all-reduces every chunk among
    all its holders of all pipelines (the copies join with zeros, so a layer's ring has every
    copy). A rank pays both for every copy it keeps; so for the embeddings and the heads, which
    every chain has (a stage's ``REDUCE`` carries its whole module: a tied copy too; the
    all-reduce all but a tied embedding, which its group sums)."""
    pipes, m, links, w = plan.pipelines, plan.model, {}, shard_weights(plan)
    rep = tp_replicated_layer_params(m)

    def ranks_of(i: int, j: int) -> tuple[int, ...]:
        return pls[i].holders(j) if pls[i] is not None else (j,)

    def stage_of(i: int, k: int) -> int:
        return pipes[i].stages.index(holder[i][k])

    memo: dict[tuple, tuple[float, float]] = {}  # layers of one stage share their holders

    def sync(hs: Sequence[Stage], split: float, replicated: float) -> tuple[float, float]:
        key = tuple(id(s) for s in hs)
        if key not in memo:
            memo[key] = _sync_s(cost, plan, hs, split, replicated, links, w) if len(hs) > 1 else (0.0, 0.0)
        return memo[key]

    per_layer = []
    for k in range(m.layers):
        own = [[pipes[i].stages[r] for r in ranks_of(i, stage_of(i, k))] for i in range(len(pipes))]
        reduce = [sync(hs, m.layer_params() - rep, rep) for hs in own]
        dp = sync([s for hs in own for s in hs], m.layer_params() - rep, rep) if len(pipes) > 1 else (0.0, 0.0)
        per_layer.append([(r[0] + dp[0], r[1] + dp[1]) for r in reduce])
    tied = m.vocab * m.hidden if m.tied_embeddings else 0
    matrix = 0 if tied else 1
    emb = end_sync(cost, plan, pls, "embedding", end_parts(plan, m.embedding_params(), 1),
                   end_parts(plan, m.embedding_params() - tied, matrix), links, w)
    head = end_sync(cost, plan, pls, "head", end_parts(plan, m.head_params() + tied, 1),
                    end_parts(plan, m.head_params(), matrix), links, w)
    return stage_sums(cost, plan, pls, lambda i, k: per_layer[k][i], links, w,
                      lambda i, j: [emb[i]] * _count(pls[i], j, "embedding") + [head[i]] * _count(pls[i], j, "head"))


def _count(pl: Any, j: int, what: str) -> int:
    return sum(bool(getattr(c, what)) for c in pl.ranks[j]) if pl is not None else 0


def end_sync(cost: Any, plan: Plan, pls: Sequence[Any], what: str, reduced: tuple[float, float],
             summed: tuple[float, float], links: dict, w: dict[str, float] | None) -> list[tuple[float, float]]:
    """Per pipeline the sync of one copy of its ``what`` (``"embedding"`` or ``"head"``, a
    TP-replicated tensor but for a vocabulary-parallel matrix: ``(split, replicated)``
    parameters, :func:`end_parts`) where copies keep it on several ranks: ``REDUCE`` of ``reduced``
    among its holders in the pipeline, then the all-reduce of ``summed`` among its
    holders of all pipelines (with several)."""
    pipes, none = plan.pipelines, (0.0, 0.0)
    hs = [[p.stages[j] for j in range(len(p.stages)) if _count(pl, j, what)] if pl is not None
          else [p.stages[0 if what == "embedding" else -1]] for p, pl in zip(pipes, pls)]
    every = [s for h in hs for s in h]
    dp = _sync_s(cost, plan, every, *summed, links, w) if len(pipes) > 1 and sum(summed) else none
    out = []
    for h in hs:
        r = _sync_s(cost, plan, h, *reduced, links, w) if len(h) > 1 else none
        out.append((r[0] + dp[0], r[1] + dp[1]))
    return out
