"""The data-parallel sync overlapped with the pipeline (``train.dp_overlap``): when each stage's
gradients are final, when its sync can start, and what of it the schedule does not hide.

HexiScale App. A prices an iteration as ``max_i PIPELINE-TIME(i) + COMM-DP``: every stage waits
for the slowest pipeline's last backward before its sync starts. The runtime does better (as
Megatron-LM's overlap-grad-reduce and DDP's buckets do): a stage's gradient buckets are posted as
soon as its last backward is done, while its rank goes on with the rest of its list. So:

* **ready** — where the schedule runs the last micro-batch's backward chunk by chunk and each
  rank's last gradient-finishing action of a chunk is that micro-batch's (its *gradient chain*:
  GPipe and 1F1B stage by stage, interleaved 1F1B chunk ``v - 1`` of every rank down to chunk
  0; ``ActionSchedule.gradient_chain``), chain position q is final at ``r_q = T_i - sum_{q'<q}
  (share_q' BWD_q' + HOP_q',q'+1)``, ``T_i`` the pipeline's time, ``BWD`` a stage's backward of
  one micro-batch, ``share`` the chunk's part of the stage's blocks: the last micro-batch's
  gradient still has to cross every chunk before it. That is a bound (a rank may finish
  earlier when a chunk before it is the bottleneck), exact when the cool-down is the chain's.
  Other schedules (split backward ``W`` deferred to fill bubbles, waves and V shapes ending on
  rank 0, bidirectional copies) are priced ``r = T_i``: no credit, whatever the runtime hides.
  A chunk holds its part of the stage's plan blocks, in order (the runtime's cut of a rank's
  blocks into chunks may differ by a block);
* **start** — a block is all-reduced among its holders in every pipeline, so a chunk's sync
  starts once every holder of its blocks is ready (the embedding with the chain's first
  chunks, the head with its last);
* **end** — a stage's sync (``COMM-DP_ij``, :func:`hexicore.cost.sharding.dp_stage_parts`, intra
  + cross machine) runs chunk by chunk, the highest blocks first, as the runtime posts its
  per-layer buckets one after another: each chunk's part (its share) starts at the later of
  its own start and the previous part's end; ``e_ij`` the last end. Under ZeRO-1/2 the runtime
  sums a group's whole bucket at once (one part, from its latest chunk's start) and only the
  gradients' reduce-scatter (half of the all-reduce term) and hybrid sharding's cross-machine
  sum overlap: the updated weights' all-gather (the other half, ``gather_ij``) follows the
  optimizer step, which waits for the global gradient norm, hence every stage's sum; under
  ZeRO-3 the per-micro-batch traffic is in the stage times and only the cross-machine sum is
  left here.

Iteration ``= max(max_i T_i, max_ij e_ij) + max_ij gather_ij``; the estimate's ``dp_s`` is the
part not hidden, ``iteration - max_i T_i``. With one pipeline nothing is synced; with every
``r = T_i`` and equal ``T_i`` it is App. A's formula. What it leaves out: the sync sharing a
link with the pipeline's own hops and TP collectives while they overlap.
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: a chunk of a stage: plan blocks ``[lo, hi)``, its share of the stage's blocks, when it is final,
#: whether the chain starts (embedding) or ends (head) there
Chunk = tuple[int, int, float, float, bool, bool]


def plain_chain(ranks: int) -> tuple[tuple[int, float], ...]:
    """The gradient chain of App. A's pipeline (1F1B): every stage once, in order."""
    return tuple((r, 1.0) for r in range(ranks))


def _link(hop_s: Sequence[float], a: int, b: int) -> float:
    """One hop between stages ``a`` and ``b`` (a non-adjacent pair, a chain's wrap: the slowest)."""
    if a == b or not hop_s:
        return 0.0
    lo, hi = min(a, b), max(a, b)
    return hop_s[lo] if hi == lo + 1 else max(hop_s)


def chunk_ready(pipeline_s: float, backward_s: Sequence[float], hop_s: Sequence[float],
                chain: Sequence[tuple[int, float]] | None, layers: Sequence[tuple[int, int]]) -> list[list[Chunk]]:
    """Per stage its chunks (:data:`Chunk`) with ``r_q = T - sum_{q'<q} (share BWD + HOP)``
    along ``chain`` (module docstring); ``chain`` None: each stage one chunk, final at ``T``."""
    last = len(layers) - 1
    if chain is None:
        return [[(lo, hi, 1.0, pipeline_s, j == 0, j == last)] for j, (lo, hi) in enumerate(layers)]
    out: list[list[Chunk]] = [[] for _ in layers]
    taken, tail = [0.0] * len(layers), 0.0
    for q, (r, share) in enumerate(chain):
        lo, hi = layers[r]
        a, b = lo + round(taken[r] * (hi - lo)), lo + round(min(1.0, taken[r] + share) * (hi - lo))
        taken[r] += share
        out[r].append((a, b, share, pipeline_s - tail, q == 0, q == len(chain) - 1))
        if q + 1 < len(chain):
            tail += backward_s[r] * share + _link(hop_s, r, chain[q + 1][0])
    return out


def _span(chunk: Chunk, size: int) -> tuple[int, int]:
    """The positions a chunk's sync covers: 0 the embedding, block k at k + 1, the head last."""
    lo, hi, _, _, first, last = chunk
    return (0 if first else lo + 1), (size if last else hi + 1)


def overlapped_step(pipeline_s: Sequence[float], chunks: Sequence[Sequence[Sequence[Chunk]]],
                    parts: Mapping[tuple[int, int], tuple[float, float]], zero_stage: int) -> float:
    """The iteration time with the sync overlapped (module docstring): ``max(max T_i, max e_ij)
    + max gather_ij``; ``chunks[i][j]`` stage ``(i, j)``'s chunks (:func:`chunk_ready`),
    ``parts[(i, j)] = (intra, cross)`` its sync."""
    size = max((c[1] for stages in chunks for cs in stages for c in cs), default=0) + 2
    latest = [float("-inf")] * size
    for stages in chunks:
        for cs in stages:
            for c in cs:
                a, b = _span(c, size)
                for k in range(a, b):
                    latest[k] = max(latest[k], c[3])
    end, gather = max(pipeline_s, default=0.0), 0.0
    for (i, j), (intra, cross) in parts.items():
        mine = chunks[i][j]
        starts = [max(latest[slice(*_span(c, size))], default=end) for c in mine]
        if zero_stage == 0:  # per-layer buckets, the highest blocks first
            done = float("-inf")
            for c, start in sorted(zip(mine, starts), key=lambda x: -x[0][0]):
                done = max(done, start) + (intra + cross) * c[2]
        else:  # one bucket per group: from its latest chunk
            own = cross if zero_stage == 3 else intra / 2 + cross
            gather = gather if zero_stage == 3 else max(gather, intra / 2)
            done = max(starts) + own
        end = max(end, done)
    return end + gather
