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

Greedy hands out the ``R = M - sum lo_i`` smallest of the keys ``(T_i(lo_i + c), i, c)``,
``c >= 1`` (its heap pops ``(time, pipeline)`` pairs in that order; each pipeline's keys
increase with ``c``). :func:`allocate_batch` finds that same selection without walking it one
micro-batch at a time, so its cost does not grow with ``M``: each ``T_i`` is estimated by the
line through ``T_i(lo_i + 1)`` and ``T_i(lo_i + R)`` (exact for App. A's affine PIPELINE-TIME and
for a steady-state model past its warm-up), the counts where those lines cross a common time are
taken, and single micro-batches are then moved from the pipeline with the largest last key to
the one with the smallest next key until every kept key is below every key left out — the
greedy selection exactly, after a few moves where the estimate was close.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence


def allocate_batch(times: Sequence[Callable[[int], float]], micro_batches: int,
                   least: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """Micro-batch counts per pipeline minimising the slowest pipeline, pipeline i getting at
    least ``least[i]`` (default 1); ``None`` when those minimums exceed the micro-batches. The
    result is the greedy water-filling's of the module docstring, found in about
    ``len(times) * log`` evaluations plus a few per micro-batch the line estimate misplaced."""
    k = len(times)
    lo = [max(1, int(x)) for x in least] if least is not None else [1] * k
    if k == 0 or len(lo) != k or micro_batches < sum(lo):
        return None
    rest = micro_batches - sum(lo)
    if rest == 0:
        return tuple(lo)
    seen: dict[tuple[int, int], float] = {}

    def key(i: int, c: int) -> tuple[float, int, int]:
        """Greedy's order of pipeline i's c-th extra micro-batch (c in 1..rest)."""
        if (i, c) not in seen:
            t = times[i](lo[i] + c)
            seen[i, c] = math.inf if t != t else t  # a NaN (inf - inf of a cost model's inf) never wins
        return seen[i, c], i, c

    extra = _estimate([key(i, 1)[0] for i in range(k)], [key(i, rest)[0] for i in range(k)], rest)
    _settle(extra, key, rest)
    return tuple(a + b for a, b in zip(lo, extra))


def _estimate(first: list[float], last: list[float], rest: int) -> list[int]:
    """Extra micro-batches per pipeline where the lines through (1, ``first[i]``) and (``rest``,
    ``last[i]``) cross a common time, found by bisection on that time (no evaluations); their
    sum may differ from ``rest`` by a few (:func:`_settle` fixes it)."""
    slopes = [(b - a) / (rest - 1) if rest > 1 and math.isfinite(a) and math.isfinite(b) else 0.0
              for a, b in zip(first, last)]

    def counts(t: float) -> list[int]:
        out = []
        for a, s in zip(first, slopes):
            if not math.isfinite(a) or t < a:
                out.append(0)
            elif s <= 0:
                out.append(rest)
            else:  # (a slope so small that the quotient overflows: every one fits)
                q = (t - a) / s
                out.append(min(rest, int(q) + 1) if q < rest else rest)
        return out

    finite = [x for x in first + last if math.isfinite(x)]
    if not finite:
        return [0] * len(first)
    low, high = min(finite), max(finite)
    for _ in range(60):
        mid = (low + high) / 2
        if sum(counts(mid)) >= rest:
            high = mid
        else:
            low = mid
    return counts(high)


def _settle(extra: list[int], key: Callable[[int, int], tuple], rest: int) -> None:
    """Move single micro-batches until ``extra`` sums to ``rest`` and every kept key (each
    pipeline's last, ``key(i, extra[i])``) is below every next one (``key(i, extra[i] + 1)``):
    then ``extra`` is the ``rest`` smallest keys, greedy's selection. Each move swaps a kept key
    for a smaller one, so the loop ends."""
    k = len(extra)
    none = (math.inf, k, 0)  # below any key left out: nothing to take back / beyond any key: nothing to add

    def kept(i: int) -> tuple:
        return key(i, extra[i]) if extra[i] > 0 else (-math.inf, -1, 0)

    def nxt(i: int) -> tuple:
        return key(i, extra[i] + 1) if extra[i] < rest else none

    tops = [(_neg(kept(i)), i) for i in range(k)]  # max-heap of kept keys (negated)
    nexts = [(nxt(i), i) for i in range(k)]  # min-heap of next keys
    heapq.heapify(tops)
    heapq.heapify(nexts)

    def top() -> tuple[tuple, int]:
        while _neg(tops[0][0]) != kept(tops[0][1]):
            heapq.heappop(tops)
        return _neg(tops[0][0]), tops[0][1]

    def low() -> tuple[tuple, int]:
        while nexts[0][0] != nxt(nexts[0][1]):
            heapq.heappop(nexts)
        return nexts[0]

    def move(i: int, by: int) -> None:
        extra[i] += by
        heapq.heappush(tops, (_neg(kept(i)), i))
        heapq.heappush(nexts, (nxt(i), i))

    total = sum(extra)
    while total > rest:
        move(top()[1], -1)
        total -= 1
    while total < rest:
        move(low()[1], +1)
        total += 1
    while True:
        (big, i), (small, j) = top(), low()
        if big < small:
            return
        move(i, -1)
        move(j, +1)


def _neg(key: tuple) -> tuple:
    """A key negated component-wise (a max-heap through :mod:`heapq`'s min-heap)."""
    return tuple(-x for x in key)


def affine_time(fill: float, step: float) -> Callable[[int], float]:
    """PIPELINE-TIME of App. A as a function of ``n_mb``: ``fill + (n_mb - 1) * step``."""
    return lambda n: fill + (n - 1) * step
