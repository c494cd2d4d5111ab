"""The optimizer step's time from a profile: AdamW's update and ``zero_grad`` on every rank.

Every rank runs the optimizer over the parameters it keeps after the DP sync and before the
step ends (the torch runtime: ``Executor._step``), so the step pays

    OPT = max_d  P(d) x r(gpu(d), tp(d))

where ``P(d)`` is the parameters device ``d`` keeps (:func:`hexicore.cost.precision.device_params`:
its blocks' TP share plus the embedding/head it holds, where its schedule places them; under ZeRO its shard,
:func:`hexicore.cost.sharding.kept_params`, or ``P / dp`` for even shards) and ``r`` the measured
seconds per parameter of its GPU type: a profiled block's ``optimizer_s`` over that block's
parameters on one TP rank (:func:`block_rank_params`), the median over the profiled micro-batch
sizes at the nearest profiled TP degree. The update is element-wise (it reads and writes the
weights, gradients and two moments), so its time is linear in the parameters. A device whose
type has no measured step adds nothing (the analytic model has no optimizer term).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

from hexicore.core.profile import BlockTiming
from hexicore.cost.precision import device_params, tp_replicated_layer_params, vocab_split


def block_rank_params(b: BlockTiming, model: Any) -> float:
    """Parameters of the measured block on one of its ``tp`` ranks: the attention and MLP
    matrices ``2 h q + 2 h kv + 3 h f`` split ``tp`` ways plus what TP replicates (the model's
    :func:`tp_replicated_layer_params` when the block has the model's shape, else two norms
    ``2 h``)."""
    same = not b.hidden or (b.hidden, b.ffn, b.heads, b.kv_heads) == (model.hidden, model.ffn, model.heads,
                                                                      model.kv_heads)
    if same:
        rep = tp_replicated_layer_params(model)
        return (model.layer_params() - rep) / b.tp + rep
    h = b.hidden
    kv = b.kv_heads * h // b.heads
    return (2 * h * h + 2 * h * kv + 3 * h * b.ffn) / b.tp + 2 * h


def seconds_per_param(blocks: Sequence[BlockTiming], model: Any, tp: int) -> float | None:
    """``r``: seconds of the optimizer step per kept parameter, from the blocks of the nearest
    profiled TP degree that carry ``optimizer_s`` (None: none measured)."""
    timed = [b for b in blocks if b.optimizer_s > 0]
    if not timed:
        return None
    near = min({b.tp for b in timed}, key=lambda t: (abs(t - tp), t))
    return statistics.median(b.optimizer_s / block_rank_params(b, model) for b in timed if b.tp == near)


def optimizer_step_s(plan: Any, blocks_of: Callable[[str], Sequence[BlockTiming]],
                     kept: dict[str, float] | None, held: Callable[[Any, int], list] | None = None) -> float:
    """``OPT`` of the module docstring for ``plan``; ``blocks_of(device id)`` gives the profiled
    blocks of the device (its own entry or its GPU type's), ``kept`` the ZeRO shards per device (None: whole, or even ``/ dp`` under ZeRO),
    ``held(pipeline, n_mb)`` per stage the blocks, embeddings and heads it keeps under its
    schedule's placement (the cost model's ``held``; None: stage j's blocks, the embedding
    first, the head last)."""
    m, t = plan.model, plan.train
    dp = len(plan.pipelines)
    worst = 0.0
    for p in plan.pipelines:
        last = len(p.stages) - 1
        keeps = held(p, p.n_micro_batches(t.micro_batch)) if held is not None else \
            [{"n_layers": s.n_layers, "first": j == 0, "last": j == last} for j, s in enumerate(p.stages)]
        for j, s in enumerate(p.stages):
            for d in s.devices:
                rate = seconds_per_param(blocks_of(d), m, s.tp)
                if rate is None:
                    continue
                if kept is not None:
                    n = kept[d]
                else:
                    n = device_params(m, keeps[j]["n_layers"], s.tp, first=keeps[j]["first"],
                                      last=keeps[j]["last"], tied_heads=keeps[j].get("tied_heads"),
                                      split=vocab_split(t, s.tp))
                    n = n / dp if t.zero_stage else n
                worst = max(worst, n * rate)
    return worst
