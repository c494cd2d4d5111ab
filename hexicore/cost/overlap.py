"""The data-parallel sync overlapped with the pipeline (``train.dp_overlap``): when each stage's
gradients are final, when its sync can start, and what of it the schedule does not hide.

HexiScale App. A prices an iteration as ``max_i PIPELINE-TIME(i) + COMM-DP``: every stage waits
for the slowest pipeline's last backward before its sync starts. The runtime does better (as
Megatron-LM's overlap-grad-reduce and DDP's buckets do): a stage's gradient buckets are posted as
soon as its last backward is done, while its rank goes on with the rest of its list. So:

* **ready** — stage ``(i, j)``'s gradients are final at ``r_ij = T_i - tail_ij``, ``T_i`` its
  pipeline's time. Where the schedule finishes the stages' gradients in chain order (declared
  ``Pricing.chained_gradients``: GPipe, 1F1B — the last micro-batch's backward runs from the
  last stage to the first and nothing follows it), ``tail_ij = sum_{k<j} (BWD_ik + HOP_ik)``:
  the last micro-batch's gradient still has to cross every stage before ``j``. That is a bound
  (the rank may finish earlier when a stage before it is the bottleneck), exact when the
  cool-down is the chain's. Other schedules (split backward ``W`` deferred to fill bubbles,
  waves and V shapes ending on rank 0, bidirectional copies) are priced ``tail = 0``: no credit,
  whatever the runtime hides;
* **start** — a stage's layers are all-reduced among their holders in every pipeline, so its
  sync starts once every holder is ready: ``s_ij = max r`` over the stages of every pipeline
  that hold one of its layers (the embedding with the first stages, the head with the last);
* **end** — ``e_ij = s_ij + COMM-DP_ij`` (its sync, :func:`hexicore.cost.sharding.dp_stage_parts`,
  intra + cross machine); under ZeRO-1/2 only the gradients' reduce-scatter (half of the
  all-reduce term) and hybrid sharding's cross-machine sum overlap: the updated weights'
  all-gather (the other half) follows the optimizer step, which waits for the global gradient
  norm, hence every stage's sum; under ZeRO-3 the per-micro-batch traffic is in the stage times
  and only the cross-machine sum is left here.

Iteration ``= max(max_i T_i, max_ij e_ij) + max_ij gather_ij``; the estimate's ``dp_s`` is the
part not hidden, ``iteration - max_i T_i``. With one pipeline nothing is synced; with every
``tail = 0`` and equal ``T_i`` it is App. A's formula. What it leaves out: the sync sharing a
link with the pipeline's own hops and TP collectives while they overlap.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def ready_times(pipeline_s: float, backward_s: Sequence[float], hop_s: Sequence[float],
                chained: bool) -> list[float]:
    """``r_j = T - tail_j`` per stage of one pipeline (module docstring): ``tail_j = sum_{k<j}
    (backward_s[k] + hop_s[k])`` where ``chained``, else 0."""
    out, tail = [], 0.0
    for j in range(len(backward_s)):
        out.append(pipeline_s - (tail if chained else 0.0))
        if j < len(hop_s):
            tail += backward_s[j] + hop_s[j]
    return out


def sync_starts(layers: Sequence[Sequence[tuple[int, int]]], ready: Sequence[Sequence[float]]) -> dict[tuple[int, int], float]:
    """``s_ij`` per stage ``(i, j)``: the latest ``ready`` of every stage, in any pipeline, that
    holds one of stage ``(i, j)``'s blocks ``[lo, hi)`` (``layers[i][j]``); the first stages share
    the embedding and the last stages the head. Per position (embedding, each block, head) the
    latest holder first, then per stage the latest of its positions."""
    size = max((hi for ranges in layers for _, hi in ranges), default=0) + 2  # embedding at 0, head at the end
    latest = [float("-inf")] * size
    spans = {}
    for i, ranges in enumerate(layers):
        for j, (lo, hi) in enumerate(ranges):
            a, b = (0 if j == 0 else lo + 1), (size if j == len(ranges) - 1 else hi + 1)
            spans[(i, j)] = (a, b)
            for k in range(a, b):
                latest[k] = max(latest[k], ready[i][j])
    return {key: max(latest[a:b], default=float("-inf")) for key, (a, b) in spans.items()}


def overlapped_step(pipeline_s: Sequence[float], starts: Mapping[tuple[int, int], float],
                    parts: Mapping[tuple[int, int], tuple[float, float]], zero_stage: int) -> float:
    """The iteration time with the sync overlapped (module docstring): ``max(max T_i, max e_ij)
    + max gather_ij`` with ``parts[(i, j)] = (intra, cross)`` of stage ``(i, j)``'s sync."""
    end, gather = max(pipeline_s, default=0.0), 0.0
    for key, (intra, cross) in parts.items():
        if zero_stage == 3:
            own = cross
        elif zero_stage in (1, 2):
            own, gather = intra / 2 + cross, max(gather, intra / 2)
        else:
            own = intra + cross
        end = max(end, starts.get(key, end) + own)
    return end + gather
