"""Batch allocation across pipelines (HexiScale §3.3, §4; docs/background.md, the worked case: "pipeline batch
sizes differ by 40% while their run times differ by 7%").

The global batch is ``M`` micro-batches; pipeline i runs ``n_i >= 1`` of them with gradient
accumulation (one optimizer step per iteration, so ``n_i`` only changes its PIPELINE-TIME).
Minimise ``max_i T_i(n_i)`` subject to ``sum_i n_i = M``, each ``T_i`` nondecreasing.

Greedy water-filling is exact here: start every pipeline at one micro-batch (or the fewest its
schedule runs with, ``n_i >= lo_i``: DualPipeV needs two per rank) and hand out the rest one at
a time to the pipeline whose time after receiving it is smallest. Proof: if greedy ever chose a
value above the optimum ``T*``, every pipeline would already hold at least its optimal count
(``T_i(n_i + 1) > T* >= T_i(n_i*)`` implies ``n_i* <= n_i``), so all ``M`` would already be
handed out — a contradiction.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence


def allocate_batch(times: Sequence[Callable[[int], float]], micro_batches: int,
                   least: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """Micro-batch counts per pipeline minimising the slowest pipeline, pipeline i getting at
    least ``least[i]`` (default 1); ``None`` when those minimums exceed the micro-batches."""
    k = len(times)
    counts = [max(1, int(x)) for x in least] if least is not None else [1] * k
    if k == 0 or len(counts) != k or micro_batches < sum(counts):
        return None
    heap = [(times[i](counts[i] + 1), i) for i in range(k)]
    heapq.heapify(heap)
    for _ in range(micro_batches - sum(counts)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (times[i](counts[i] + 1), i))
    return tuple(counts)


def affine_time(fill: float, step: float) -> Callable[[int], float]:
    """PIPELINE-TIME of App. A as a function of ``n_mb``: ``fill + (n_mb - 1) * step``."""
    return lambda n: fill + (n - 1) * step
