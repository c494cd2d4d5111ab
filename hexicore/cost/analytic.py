"""The ``analytic`` cost model of HexiScale Appendix A.

Symbols (docs/background.md): ``B_mb`` micro-batch, ``S`` sequence length, ``H`` hidden size,
``B_type`` bytes per element, ``n_mb`` micro-batches of a pipeline, ``d_ij`` the devices of
stage j of pipeline i, ``alpha``/``beta`` pairwise latency (s) and bandwidth (bytes/s).

Where the paper states a formula we implement it; where it leaves one out we say which form we
chose (``compute_s``, ``hop_s``, memory). Times: seconds of one micro-batch unless named otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from hexicore.core.cluster import Cluster
from hexicore.core.estimate import Estimate
from hexicore.core.model import ModelSpec
from hexicore.core.placement import Placement
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.settings import TrainSettings
from hexicore.cost.base import (DEFAULT_EFFICIENCY, GIB, ActivationFn, BoundCostModel, PipelineTimer, PlacementFn,
                                default_in_flight, fill_drain_time)
from hexicore.cost import overlap, sharding
from hexicore.cost.block_memory import block_bytes, casts_once, head_cast_bytes, weight_cast_bytes
from hexicore.cost.dp_ring import MIN_TERMS, ring_layer_s
from hexicore.cost.precision import (StateBytes, device_params, largest_unit_params, sharded_parts,
                                     state_bytes, tied_copies, tied_whole, vocab_matrix, vocab_split)
from hexicore.cost.split import forward_backward
from hexicore.cost.transfer import allreduce_s, broadcast_s, ring_pass_s, send_s

#: inputs :meth:`AnalyticCostModel.stage_memory_parts` keeps the answer for before it starts over
MEMORY_KEPT = 200_000


@dataclass(frozen=True)
class AnalyticCostModel:
    """HexiScale App. A with the gaps filled (see each method).

    ``efficiency`` maps GPU type -> achieved fraction of peak; ``state_bytes_per_param`` is the
    weight + gradient + optimizer bytes kept per parameter (default ``None``: the runtime's
    precision recipe, :func:`hexicore.cost.precision.state_bytes`, 16 B with AdamW over fp32
    master weights; an explicit number overrides it, e.g. 8 = the paper's ``48 H^2 B_type``
    per 12H^2-parameter layer in bf16); ``sync_bytes_per_param`` the bytes per parameter the
    data-parallel sync moves (default ``None``: the gradient part of that state);
    ``reserve_gb`` is memory no plan may use (CUDA context, allocator slack).
    ``pipeline_timer`` (injected by the planner from a schedule plugin) replaces App. A's
    PIPELINE-TIME formula; ``activation`` (injected likewise) replaces the default in-flight
    rule (:func:`hexicore.cost.base.default_in_flight`) with the schedule's peak activations;
    ``placement`` (injected likewise) says which blocks, embeddings and heads each rank holds
    where the schedule places them otherwise than stage j's blocks, the embedding on the first
    and the head on the last stage (:meth:`held`); ``gradient_chain`` (injected likewise) gives
    where a pipeline's schedule runs the last micro-batch's backward, chunk by chunk, which the
    overlapped data-parallel sync is priced with (:mod:`hexicore.cost.overlap`; None: App. A's
    own pipeline, stage by stage).
    """

    efficiency: Mapping[str, float] = field(default_factory=dict)
    default_efficiency: float = DEFAULT_EFFICIENCY
    state_bytes_per_param: float | None = None
    reserve_gb: float = 1.0
    pipeline_timer: PipelineTimer | None = None
    activation: ActivationFn | None = None
    placement: PlacementFn | None = None
    gradient_chain: Callable[[Pipeline], Sequence[tuple[int, float]] | None] | None = None
    name: str = "analytic"
    #: bytes per parameter data-parallel traffic moves (None: the state's gradient bytes,
    #: :func:`hexicore.cost.precision.sync_bytes`); apart from ``state_bytes_per_param``, so
    #: memory can follow another system's accounting while the sync keeps the runtime's wire
    sync_bytes_per_param: float | None = None
    #: prices a group of devices by its machine's GPU type and links only (the planner caches per machine class)
    class_priced: ClassVar[bool] = True
    #: :meth:`stage_memory_parts` per input (a pure function of the model, the training setting,
    #: the TP degree and the counts: the planner asks it thousands of times, for every group of
    #: every layout); new with every instance, so a ``replace``d model never reads another's
    _memory: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------- pieces
    def state_bytes(self, train: TrainSettings) -> StateBytes:
        """Per-parameter weights/gradients/optimizer bytes (:mod:`hexicore.cost.precision`)."""
        return state_bytes(train.dtype, self.state_bytes_per_param)

    def achieved_flops(self, cluster: Cluster, devices: Sequence[str]) -> float:
        """FLOP/s of a TP group: tp x the slowest member's peak x its efficiency."""
        per = min(cluster.device(d).tflops * self.efficiency.get(cluster.device(d).gpu.name, self.default_efficiency)
                  for d in devices)
        return per * 1e12 * len(devices)

    def compute_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                  n_layers: int, *, last: bool = False) -> float:
        """Compute of one micro-batch through a stage (the paper omits this formula).

        FLOPs = tokens x (n_layers x block forward FLOPs/token [+ head on the last stage]) x k,
        k = 4 with recomputation (forward, backward = 2x forward, recomputed forward), else 3;
        the blocks divided by the TP group's achieved FLOP/s (``achieved_flops``), the head by
        one member's (the runtime replicates the head: every TP rank computes all the logits),
        or under ``train.vocab_parallel`` by the group's (each rank its ``V / tp`` logits).
        """
        tokens = train.micro_batch * train.seq_len
        k = 4.0 if train.recompute else 3.0
        group = self.achieved_flops(cluster, devices)
        split = vocab_split(train, len(devices))
        head = model.head_flops_per_token() / (group / len(devices) * split) if last else 0.0
        return tokens * k * (n_layers * model.layer_flops_per_token(train.seq_len) / group + head)

    def tp_comm_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                  n_layers: int) -> float:
        """TP communication of one micro-batch, HexiScale App. A:
        ``c * max_d sum_{d' != d} (alpha + B_mb*S*H*B_type / (|d_ij| * beta))`` per layer, with
        c = 12 under recomputation (the paper) and 8 without (HexiScale's code)."""
        tp = len(devices)
        if tp <= 1 or n_layers == 0:
            return 0.0
        msg = train.micro_batch * train.seq_len * model.hidden * train.dtype_bytes
        key = ("tp", msg, *map(cluster.link_matrices[0].get, devices))  # the terms follow the machines
        worst = cluster.memo.get(key)
        if worst is None:
            worst = ring_pass_s(cluster, devices, msg)
            cluster.memo[key] = worst
        return (12.0 if train.recompute else 8.0) * n_layers * worst

    def vocab_comm_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str], *,
                     first: bool = False, last: bool = False) -> tuple[float, float]:
        """``(forward, backward)`` seconds of the all-reduces vocabulary parallelism adds to one
        micro-batch on a stage of ``devices`` (``train.vocab_parallel``, tp > 1; else 0), each
        priced as the blocks' TP all-reduces are (:func:`~hexicore.cost.transfer.allreduce_s`,
        two ring passes): on a first stage the embedding's output, ``B_mb*S*H*4`` (fp32, the
        residual stream's dtype), forward; on a last stage the cross-entropy's three per-token
        statistics, ``3 x B_mb*S*4`` (row max, target logit, sum of exponentials), forward, and
        the head input's gradient, ``B_mb*S*H*B_type``, backward
        (``plugins/runtimes/torch/parallel/vocab.py``)."""
        if vocab_split(train, len(devices)) <= 1:
            return 0.0, 0.0
        tokens = train.micro_batch * train.seq_len
        forward = (allreduce_s(cluster, devices, tokens * model.hidden * 4.0) if first else 0.0) + \
            (3.0 * allreduce_s(cluster, devices, tokens * 4.0) if last else 0.0)
        backward = allreduce_s(cluster, devices, tokens * model.hidden * train.dtype_bytes) if last else 0.0
        return forward, backward

    def stage_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                n_layers: int, *, first: bool = False, last: bool = False) -> float:
        """STAGE(d_ij) of App. A: forward + backward of one micro-batch = compute + TP comm (+ the
        all-reduces of vocabulary parallelism, :meth:`vocab_comm_s`)."""
        return self.compute_s(cluster, model, train, devices, n_layers, last=last) + \
            self.tp_comm_s(cluster, model, train, devices, n_layers) + \
            sum(self.vocab_comm_s(cluster, model, train, devices, first=first, last=last))

    def hop_leaders(self, cluster: Cluster, src: Sequence[str], dst: Sequence[str]) -> tuple[str, str]:
        """The leader pair of two consecutive stages (HexiScale §3.2): the fastest link."""
        return min(((a, b) for a in src for b in dst),
                   key=lambda ab: (cluster.alpha(*ab) + 1.0 / cluster.beta(*ab), ab))

    def hop_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, src: Sequence[str],
              dst: Sequence[str]) -> float:
        """COMM-PP-HOP (formula missing from the paper's digest): per micro-batch, the activation
        ``B_mb*S*H*B_type`` goes leader -> leader, then the receiving leader broadcasts it in its
        TP group (priced as its slowest direct send); the gradient goes back between the same
        leaders and the sending stage's leader broadcasts it in its own group, so the hop is
        ``2 x send + broadcast(dst) + broadcast(src)``, as the runtime moves them (a one-device
        stage broadcasts nothing: a hop between a TP group and one device has one broadcast,
        the gradient's or the activation's). Leaders are the pair with the fastest link.
        Remembered per machine pair where each side is one machine and no device is on both
        (such sends cost alike; overlapping groups, which a solver's tables may price, send
        nothing)."""
        msg = train.micro_batch * train.seq_len * model.hidden * train.dtype_bytes
        rows = cluster.link_matrices[0]
        one = {rows.get(d) for d in src}, {rows.get(d) for d in dst}
        single = len(one[0]) == len(one[1]) == 1 and None not in one[0] | one[1] and not set(src) & set(dst)
        key = ("hop", msg, len(src), len(dst), *one[0], *one[1]) if single else None
        if key in cluster.memo:
            return cluster.memo[key]
        a, b = self.hop_leaders(cluster, src, dst)
        send = self.message_s(cluster, a, b, msg)
        hop = 2.0 * send + broadcast_s(cluster, b, dst, msg, self.message_s) + \
            broadcast_s(cluster, a, src, msg, self.message_s)
        if key is not None:
            cluster.memo[key] = hop
        return hop

    def message_s(self, cluster: Cluster, a: str, b: str, nbytes: float) -> float:
        """One message from device ``a`` to ``b``: ``alpha + bytes / beta``
        (:func:`hexicore.cost.transfer.send_s`)."""
        return send_s(cluster, a, b, nbytes)

    def stage_memory_parts(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                           n_layers: int, *, first: bool = False, last: bool = False, in_flight: float = 1,
                           dp: int = 1, kept: float | None = None, share_layers: int | None = None,
                           tied_heads: float | None = None) -> dict[str, float]:
        """Peak memory of each device of a stage in GiB, by part (App. A MEM-CUMSUM, extended).

        ``n_layers`` are the blocks the stage keeps, ``first``/``last`` the number of
        embeddings/heads it keeps (True = 1; a schedule's placement may give a rank two model
        copies or the head of a chain that ends on it, :meth:`held`), ``share_layers`` the blocks
        one in-flight micro-batch's activations span (default ``n_layers``), ``tied_heads`` the
        heads keeping their own copy of a tied embedding (:func:`~hexicore.cost.precision.tied_copies`).

        * ``weights``/``gradients``/``optimizer``: bytes per parameter of each
          (:meth:`state_bytes`) x the parameters a device keeps: the blocks' TP-split part
          ``/ tp`` and, whole, what TP replicates — norms, row-parallel biases, the embedding on
          the first stage, the head on the last (:func:`hexicore.cost.precision.device_params`;
          App. A's ``48 H^2 B_type / |d_ij|`` per layer splits everything); under ``train.zero``
          (``dp > 1``) the sharded parts are ``params / tp / dp`` (every element split among all
          ``tp x dp`` holders, :func:`hexicore.cost.precision.sharded`; a tied embedding's stay whole,
          :func:`~hexicore.cost.precision.tied_whole`), or kept for ``kept`` parameters
          (:meth:`kept_params`: uneven shards, hybrid sharding, TP degrees that differ); hybrid
          ZeRO-2 keeps its gradients whole (:func:`hexicore.cost.precision.sharded_parts`); under
          ``train.vocab_parallel`` the ends' ``V x H`` matrices are kept ``ceil(V / tp) x H`` per
          device (:func:`hexicore.cost.precision.end_params`), a tied copy too;
        * ``activations``: ``in_flight`` (the schedule's, :meth:`in_flight`) x per-layer bytes: a
          block's saved tensors (:func:`hexicore.cost.block_memory.block_bytes`: the runtime's
          count; the weights' casts once per stage where the runtime casts once per step,
          :meth:`held_activations`), under recomputation App. A's ``B_mb*S*H*B_type`` in the
          residual stream's (the weights') dtype; on the last stage the head projection's cast
          under autocast (``V*H*B_type``, once, or per in-flight micro-batch where each forward
          casts its own);
        * ``workspace``: one block's saved tensors (the block being recomputed), on the
          last stage the logits (fp32, ``B_mb*S*V*4``, whole on every TP rank: the head is
          replicated; ``ceil(V / tp)`` columns under ``train.vocab_parallel``) and their gradient, where gradients are sharded (ZeRO-2/3, ``dp > 1``) the full gradient of
          the stage's largest unit (summed and freed unit by unit) and under ZeRO-3 also its
          gathered weights (:func:`hexicore.cost.precision.largest_unit_params`: the runtime
          gathers one block, the embedding or the norm + head at a time), and ``reserve_gb``.
        """
        # the memo per (model, train) object, found by identity (hashing both costs more than the
        # parts themselves; the entry holds them, so their ids stay theirs), then per the rest
        entry = self._memory.get((id(model), id(train)))
        if entry is None or entry[0] is not model or entry[1] is not train:
            if len(self._memory) >= MEMORY_KEPT // 1000:  # a memo only: bounded
                self._memory.clear()
            entry = self._memory[id(model), id(train)] = (model, train, {})
        memo = entry[2]
        key = (len(devices), n_layers, first, last, in_flight, dp, kept, share_layers, tied_heads)
        hit = memo.get(key)
        if hit is None:
            if len(memo) >= MEMORY_KEPT:
                memo.clear()
            hit = memo[key] = self._memory_parts(model, train, len(devices), n_layers, first=first, last=last,
                                                 in_flight=in_flight, dp=dp, kept=kept, share_layers=share_layers,
                                                 tied_heads=tied_heads)
        return hit.copy()

    def _memory_parts(self, model: ModelSpec, train: TrainSettings, tp: int, n_layers: int, *, first: bool,
                      last: bool, in_flight: float, dp: int, kept: float | None, share_layers: int | None,
                      tied_heads: float | None) -> dict[str, float]:
        """:meth:`stage_memory_parts` computed (it depends on the stage's devices only through
        their number, the TP degree ``tp``)."""
        rows = vocab_split(train, tp)
        layer_p = model.layer_params()
        params = n_layers * layer_p + first * model.embedding_params() + last * model.head_params() + \
            tied_copies(model, first, last, tied_heads) * model.vocab * model.hidden
        mine = device_params(model, n_layers, tp, first=first, last=last, tied_heads=tied_heads, split=rows)
        full = self.state_bytes(train)
        split = sharded_parts(train.zero_stage, train.zero_scope) if dp > 1 else ()
        whole = tied_whole(model, first, last, tied_heads)  # the tied embedding's copies: never sharded ...
        own = tied_whole(model, first, last, tied_heads, rows)  # ... but split by rows under vocabulary parallelism
        out = {k: v * ((params - whole) / tp / dp + own if k in split else mine) / GIB
               for k, v in full.parts().items()}
        if kept is not None:
            for k in split:
                out[k] = full.parts()[k] * kept / GIB
        share = n_layers if share_layers is None else share_layers
        whole = block_bytes(model, train.micro_batch, train.seq_len, tp, train.dtype_bytes, full.weights)
        kept = model.activation_bytes_per_layer(train.micro_batch, tp=tp, seq_len=train.seq_len,  # block input:
                                                dtype_bytes=max(full.weights, train.dtype_bytes))  # residual stream
        out["activations"] = (kept * in_flight * share if train.recompute else
                              self.held_activations(model, train, tp, dp, whole, n_layers, in_flight * share)) / GIB
        out["activations"] += self.head_casts(model, train, dp, last, in_flight, rows) / GIB
        work = whole if train.recompute and n_layers else 0.0
        if last:
            work += 2 * train.micro_batch * train.seq_len * vocab_matrix(model, rows) / model.hidden * 4
        if "gradients" in split:
            unit = largest_unit_params(model, n_layers, tp, first=first, last=last, tied_heads=tied_heads, split=rows)
            work += (full.weights if train.zero_stage == 3 else 0.0) * unit + full.gradients * unit
        out["workspace"] = work / GIB + self.reserve_gb
        return out

    def held_activations(self, model: ModelSpec, train: TrainSettings, tp: int, dp: int, block: float,
                         n_layers: int, forwards: float) -> float:
        """Bytes a stage of ``n_layers`` blocks keeps for ``forwards`` block forwards (in-flight
        micro-batches x the blocks each spans) of ``block`` bytes each, without recomputation:
        each forward's own saved tensors, and the weights' casts once for the stage's blocks
        where the runtime casts once per step
        (:func:`~hexicore.cost.block_memory.casts_once`), else once per forward (in ``block``)."""
        casts = weight_cast_bytes(model, tp, train.dtype_bytes, self.state_bytes(train).weights)
        if not casts_once(train.recompute, train.zero_stage, dp):
            return forwards * block
        return forwards * (block - casts) + n_layers * casts

    def head_casts(self, model: ModelSpec, train: TrainSettings, dp: int, last: float, in_flight: float,
                   split: int = 1) -> float:
        """Bytes of the head projection's casts under autocast a stage holding ``last`` heads keeps
        (whole on every TP rank, or its rows among ``split`` ranks under vocabulary parallelism,
        :func:`~hexicore.cost.block_memory.head_cast_bytes`): once where
        the runtime casts once per step (:func:`~hexicore.cost.block_memory.casts_once`), else
        once per in-flight micro-batch."""
        if not last:
            return 0.0
        once = casts_once(train.recompute, train.zero_stage, dp)
        return last * (1 if once else in_flight) * head_cast_bytes(model, train.dtype_bytes,
                                                                    self.state_bytes(train).weights, split)

    def stage_memory_gb(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                        n_layers: int, **held: Any) -> float:
        """Peak memory of each device of a stage in GiB: the sum of :meth:`stage_memory_parts`
        (``held``: its keywords, ``first``, ``last``, ``in_flight``, ``dp``, ...)."""
        return sum(self.stage_memory_parts(cluster, model, train, devices, n_layers, **held).values())

    # ----------------------------------------------------------- placement
    def pipeline_placement(self, pipeline: Pipeline, n_mb: int) -> Placement | None:
        """The pipeline's placement under its schedule (the injected ``placement``), or None for
        the plain one: stage j's blocks, the embedding on the first stage, the head on the last."""
        return None if self.placement is None else self.placement(pipeline, n_mb)

    def held(self, pipeline: Pipeline, n_mb: int) -> list[dict[str, Any]]:
        """Per stage the :meth:`stage_memory_parts` keywords of what its devices keep:
        ``n_layers`` (every copy's blocks), ``first``/``last`` (embeddings/heads kept),
        ``share_layers`` (the largest copy: one in-flight micro-batch's blocks), ``tied_heads``
        (heads without their chain's embedding on the rank). A copy of another stage's blocks has
        that stage's layer count, as the runtime cuts its chunks."""
        last = len(pipeline.stages) - 1
        pl = self.pipeline_placement(pipeline, n_mb)
        if pl is None:
            return [{"n_layers": s.n_layers, "first": j == 0, "last": j == last}  # tied_heads: by the rule
                    for j, s in enumerate(pipeline.stages)]
        layers = [s.n_layers for s in pipeline.stages]
        return [{"n_layers": pl.blocks(j, layers), "first": pl.embeddings(j), "last": pl.heads(j),
                 "share_layers": pl.share_layers(j, layers), "tied_heads": pl.lone_heads(j)}
                for j in range(len(layers))]

    def stage_terms(self, pipeline: Pipeline, n_mb: int) -> list[list[tuple[float, int, bool, bool]]]:
        """Per stage the ``(traffic, n_layers, first, last)`` of each copy it runs: one micro-batch
        through the stage costs ``sum traffic x STAGE(n_layers, first, last)`` (a copy's blocks,
        embedding and head, weighted by the fraction of micro-batches it runs). Plain: one term,
        ``(1, n_j, j == 0, j == P-1)``."""
        last = len(pipeline.stages) - 1
        pl = self.pipeline_placement(pipeline, n_mb)
        if pl is None:
            return [[(1.0, s.n_layers, j == 0, j == last)] for j, s in enumerate(pipeline.stages)]
        layers = [s.n_layers for s in pipeline.stages]
        return [[(c.traffic, layers[c.source], c.embedding, c.head) for c in cs] for cs in pl.ranks]

    # ------------------------------------------------------------ pipeline
    def pipeline_s(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """PIPELINE-TIME of App. A (the 1F1B/GPipe shape):
        ``sum_j (STAGE_j + HOP_j) + (n_mb - 1) * max_j (STAGE_j + HOP_j)``; HOP of the last stage is 0
        (:func:`hexicore.cost.base.fill_drain_time`)."""
        return fill_drain_time(stage_times, hop_times, n_mb)

    def in_flight(self, pipeline: Pipeline, stage_index: int, n_mb: int) -> float:
        """Micro-batches whose activations a stage holds at its peak: the injected
        ``activation`` (the pipeline's schedule's peak) if any; else the default rule,
        ``P - j`` at stage j capped by ``n_mb`` (:func:`hexicore.cost.base.default_in_flight`)."""
        if self.activation is not None:
            return self.activation(pipeline, stage_index, n_mb)
        return default_in_flight(len(pipeline.stages), stage_index, n_mb)

    def pipeline_pieces(self, plan: Plan, pipeline: Pipeline) -> tuple[list[float], list[float]]:
        """STAGE and HOP times of one pipeline, one micro-batch each (under ZeRO-3 the stage
        time includes the weight gathers, :meth:`zero3_stage_s`, of the plan's pipeline on its
        stages; under ZeRO-2 a stage lasts at least its gradients' reduce-scatter,
        :meth:`zero2_stage_s`: the link is then what paces it)."""
        priced = BoundCostModel.of_plan(self, plan)
        terms = self.stage_terms(pipeline, pipeline.n_micro_batches(plan.train.micro_batch))
        stages = [sum(w * priced.stage_s(s.devices, n, first=f, last=h) for w, n, f, h in ts)
                  for s, ts in zip(pipeline.stages, terms)]
        if plan.train.zero_stage in (2, 3) and len(plan.pipelines) > 1:
            i = next(k for k, q in enumerate(plan.pipelines) if q.stages == pipeline.stages)  # any schedule priced
            if plan.train.zero_stage == 3:
                z3 = self.zero3_stage_s(plan)
                stages = [x + z3[(i, j)] for j, x in enumerate(stages)]
            else:
                z2 = self.zero2_stage_s(plan)
                stages = [max(x, z2.get((i, j), 0.0)) for j, x in enumerate(stages)]
        hops = [priced.hop_s(a.devices, b.devices) for a, b in zip(pipeline.stages, pipeline.stages[1:])]
        return stages, hops

    # ------------------------------------------------------------------ DP
    def dp_layer_s(self, cluster: Cluster, holders: Sequence[Stage], n_params: float, dtype_bytes: int,
                   links: dict | None = None, weight: Mapping[str, float] | None = None) -> float:
        """COMM-DP-LAYER (App. A) for one layer held by one stage in each of several pipelines.

        Paper: ``2 * max_d sum_{d' != d} (alpha + P*B_type / (|D| * beta))`` over the devices D
        holding the layer, i.e. a ring all-reduce priced per peer. With TP the shards differ;
        HexiScale §3.2 cuts them into chunks of the smallest shard (``P / lcm(tp)``, = ``P / tp_max`` for powers of two), each chunk
        all-reduced among the one device per pipeline that holds it. We price exactly that: each
        device sums the paper's term over the chunks it holds, with ``|D|`` = number of pipelines.
        With every tp = 1 this is the paper's formula; TP peers of one stage never exchange DP
        traffic (the paper's ``|D^k_dp|`` would count them). One pipeline: 0. ``links`` (optional)
        memoises ``(alpha, beta)`` per device pair across calls (a speed-up only).
        ``weight`` (ZeRO with ``zero_split=memory``): uneven shards, a holder's share of a chunk
        proportional to its weight (its device memory), so the piece a device receives from a
        peer is ``chunk x w_peer / sum_holders w`` instead of ``chunk / |D|`` (same ring form).
        """
        n = len(holders)
        link = links if links is not None else {}
        if n <= 1:
            return 0.0
        chunks = math.lcm(*(s.tp for s in holders))
        if weight is None and chunks * n * (n - 1) >= MIN_TERMS:  # the same sums, as arrays
            return ring_layer_s(cluster, holders, n_params, dtype_bytes)
        chunk = n_params * dtype_bytes / chunks
        worst = 0.0
        for i, s in enumerate(holders):
            per = chunks // s.tp
            for k, d in enumerate(s.devices):
                t = 0.0
                for c in range(k * per, (k + 1) * per):
                    for i2, s2 in enumerate(holders):
                        if i2 != i:
                            peer = s2.devices[c * s2.tp // chunks]
                            ab = link.get((d, peer))
                            if ab is None:
                                ab = link[(d, peer)] = (cluster.alpha(d, peer), cluster.beta(d, peer))
                            share = 1.0 / n if weight is None else weight[peer] / sum(
                                weight[h.devices[c * h.tp // chunks]] for h in holders)
                            t += ab[0] + chunk * share / ab[1]
                worst = max(worst, 2.0 * t)
        return worst

    def dp_stage_s(self, plan: Plan) -> dict[tuple[int, int], float]:
        """Per stage ``(pipeline, stage)``: ``sum_{k in stage} COMM-DP-LAYER(D^k_dp)`` (App. A) and
        the embedding's, the head's and a tied embedding group's sync (:func:`~hexicore.cost.sharding.dp_stage_parts`)."""
        return {k: a + b for k, (a, b) in sharding.dp_stage_parts(self, plan).items()}

    def shard_weights(self, plan: Plan) -> dict[str, float] | None:
        """Per device its share weight under uneven shards (:func:`hexicore.cost.sharding.shard_weights`)."""
        return sharding.shard_weights(plan)

    def kept_params(self, plan: Plan) -> dict[str, float] | None:
        """Per device the parameters whose sharded parts it keeps (:func:`hexicore.cost.sharding.kept_params`)."""
        return sharding.kept_params(plan, self)

    def dp_s(self, plan: Plan) -> float:
        """COMM-DP of App. A: ``max_{i,j} sum_{k in stage (i,j)} COMM-DP-LAYER(D^k_dp)``.

        ZeRO-1/2 replace the all-reduce by a reduce-scatter of the gradients and an all-gather
        of the updated weights: the same bytes, so the same time (the formula's factor 2 is
        exactly those two halves). ZeRO-3 pays its sharded traffic per micro-batch inside the
        stage time (:meth:`zero3_stage_s`); at the step only hybrid sharding's cross-machine sum."""
        parts = sharding.dp_stage_parts(self, plan).values()
        if plan.train.zero_stage == 3:
            return max((b for _, b in parts), default=0.0)
        return max((a + b for a, b in parts), default=0.0)

    def zero3_stage_s(self, plan: Plan) -> dict[tuple[int, int], float]:
        """ZeRO-3 traffic of one micro-batch through each stage ``(pipeline, stage)``: all-gather
        of the stage's weights before its forward and again before its backward, and
        reduce-scatter of its gradients, each half of the stage's COMM-DP term among the
        holders sharing shards, i.e. ``1.5 x sum_k COMM-DP-LAYER`` per micro-batch
        (``sharding.ZERO3_PER_MICRO_BATCH``), priced on the same per-link alpha/beta model and not
        overlapped with compute. Weights are re-gathered every micro-batch because a pipeline
        interleaves the micro-batches' forwards and backwards (keeping them gathered for the
        step would undo the sharding)."""
        if plan.train.zero_stage != 3:
            return {}
        return {k: sharding.ZERO3_PER_MICRO_BATCH * a for k, (a, _) in sharding.dp_stage_parts(self, plan).items()}

    def zero2_stage_s(self, plan: Plan) -> dict[tuple[int, int], float]:
        """ZeRO-2's gradient reduce-scatter of one micro-batch through each stage ``(pipeline,
        stage)``: half of the stage's COMM-DP term among the holders sharing shards
        (``sharding.ZERO2_PER_MICRO_BATCH``). ZeRO-2 keeps only its piece of the gradients
        between micro-batches, so every micro-batch's gradients are summed as its backward
        finishes them (as DeepSpeed's stage 2 does, and the runtime), posted asynchronously: a
        stage's link carries ``n_mb`` reduce-scatters a step, behind its compute while one takes
        less than the stage's forward and backward, pacing the stage where it takes more
        (:meth:`pipeline_pieces` takes the larger). The last one and the weights' all-gather
        remain at the step (:meth:`dp_s`). Hybrid sharding's ZeRO-2 sums at the step: none."""
        if plan.train.zero_stage != 2 or plan.train.zero_scope == "machine":
            return {}
        return {k: sharding.ZERO2_PER_MICRO_BATCH * a for k, (a, _) in sharding.dp_stage_parts(self, plan).items()}

    # ------------------------------------------------------------ the plan
    def memory_parts(self, plan: Plan) -> dict[str, dict[str, float]]:
        """Peak memory per device (GiB) by part (:meth:`stage_memory_parts`), every device the
        plan uses."""
        out: dict[str, dict[str, float]] = {}
        cluster, model, train = plan.cluster, plan.model, plan.train
        kept = self.kept_params(plan)
        for p in plan.pipelines:
            n_mb = p.n_micro_batches(train.micro_batch)
            for j, (s, held) in enumerate(zip(p.stages, self.held(p, n_mb))):
                even = None  # even shares: one computation for the whole stage
                for d in s.devices:
                    if even is None or kept is not None:
                        even = self.stage_memory_parts(cluster, model, train, s.devices, **held,
                                                       in_flight=self.in_flight(p, j, n_mb), dp=len(plan.pipelines),
                                                       kept=None if kept is None else kept[d])
                    out[d] = dict(even)
        return out

    def memory_gb(self, plan: Plan) -> dict[str, float]:
        """Peak memory per device (GiB) for every device the plan uses."""
        return {d: sum(parts.values()) for d, parts in self.memory_parts(plan).items()}

    def work_bound_s(self, plan: Plan) -> float:
        """A floor on the iteration time under any schedule: each rank runs its stage's work, every
        micro-batch, before the step-end sync (``dp_s``); with ``train.dp_overlap`` the sync may
        hide behind that work, so only what follows it (:meth:`step_extra_s`) is added."""
        work = max((p.n_micro_batches(plan.train.micro_batch) * max(self.pipeline_pieces(plan, p)[0], default=0.0)
                    for p in plan.pipelines), default=0.0)
        return work + (self.step_extra_s(plan) if plan.train.dp_overlap else self.dp_s(plan))

    def step_s(self, plan: Plan, pipeline_s: Sequence[float], parts: Sequence[Mapping[str, Any]]) -> float:
        """The iteration time of ``plan`` whose pipelines take ``pipeline_s`` (``parts``: each
        one's ``backward_s`` and ``hop_s`` per stage): ``max_i T_i + COMM-DP`` (App. A), or with
        ``train.dp_overlap`` each stage's sync started when its holders' gradients are final
        (:mod:`hexicore.cost.overlap`) plus what follows the sync (:meth:`step_extra_s`)."""
        if not plan.train.dp_overlap:
            return max(pipeline_s) + self.dp_s(plan)
        sync = sharding.dp_stage_parts(self, plan)
        chunks = []
        for ps, q, p in zip(pipeline_s, parts, plan.pipelines):
            chain = self.gradient_chain(p) if self.gradient_chain is not None else overlap.plain_chain(len(p.stages))
            chunks.append(overlap.chunk_ready(ps, q["backward_s"], q["hop_s"], chain, [s.layers for s in p.stages]))
        return overlap.overlapped_step(pipeline_s, chunks, sync, plan.train.zero_stage) + self.step_extra_s(plan)

    def step_extra_s(self, plan: Plan) -> float:
        """What a step pays after its gradient sync besides the sync (0 here; the profiled model's
        measured optimizer step and fixed overhead)."""
        return 0.0

    def estimate(self, plan: Plan) -> Estimate:
        """Iteration time = ``max_i PIPELINE-TIME(i) + COMM-DP`` (App. A) or, with
        ``train.dp_overlap``, the sync overlapped with the schedule (:meth:`step_s`); MFU,
        memory, breakdown.

        MFU = model FLOPs of one iteration (3 x forward: no recomputation counted) divided by
        iteration time x the peak FLOP/s of every device of the cluster (idle ones included).
        """
        t = plan.train
        pipe_s, parts = [], []
        for p in plan.pipelines:
            stages, hops = self.pipeline_pieces(plan, p)
            n_mb = p.n_micro_batches(t.micro_batch)
            if self.pipeline_timer is not None:
                ps = self.pipeline_timer(p, stages, hops, n_mb)
            else:
                ps = self.pipeline_s(stages, hops, n_mb)
            pipe_s.append(ps)
            fwd, bwd = forward_backward(self, plan, p, stages)  # the two passes of each STAGE
            parts.append({"stage_s": stages, "hop_s": hops, "micro_batches": n_mb, "forward_s": fwd, "backward_s": bwd})
        it = self.step_s(plan, pipe_s, parts)
        dp = it - max(pipe_s)
        mem = self.memory_gb(plan)
        oom = tuple(d for d, gb in mem.items() if gb > plan.cluster.device(d).memory_gb)
        tokens = t.global_batch * t.seq_len
        flops = 3.0 * tokens * plan.model.model_flops_per_token(t.seq_len)
        mfu = flops / (it * plan.cluster.total_tflops * 1e12) if it > 0 else 0.0
        return Estimate(it, mfu, tokens / it if it > 0 else 0.0, tuple(pipe_s), dp,
                        {d: round(v, 3) for d, v in mem.items()}, oom, {"pipelines": parts, "reserve_gb": self.reserve_gb})
