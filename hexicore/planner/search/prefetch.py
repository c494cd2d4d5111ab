"""Phase 2 of the search loop's first candidates computed ahead, on several cores.

The loop of :func:`hexicore.planner.search.loop.search_loop` starts with a sweep over ``D_dp`` whose
cuts are fixed (both cuts for every ``D_dp`` when the iterations allow it) and whose seeds are
the loop's random draws in order: those candidates do not depend on one another except through
the caches. :func:`prefetch` partitions them (phase 1, cached in ``context.parts_cache``), lays out
every part not laid out yet (phase 2, :func:`hexicore.planner.stage_layout.phase2.phase2`) in forked
processes (:func:`hexicore.planner.search.workers.fork_map`), then replays the loop's phase-2 calls in
order and stores exactly the layouts the loop would compute itself, with the seed it would use
(``phase2_cache`` keeps the first layout computed per part). The loop then finds them cached:
the plan is the one-process plan.

:func:`walk_ahead` does the same for the walk that follows the sweep, by speculation: the
loop's next candidates as they would be drawn if the best ``D_dp`` stays the same and the cut's
moving averages do not flip (:func:`hexicore.planner.search.loop.speculate`). Their phase 1 runs
in parallel into ``context.parts_cache`` (keyed by every input, so it is what the loop computes),
their phase 2 into ``context.ahead`` keyed by part *and seed*: the loop takes a layout from there
only when it would lay out that part with that seed itself, so a wrong guess costs time, never
a different plan.
"""

from __future__ import annotations

from typing import Sequence

from hexicore.planner.partition.phase1 import split
from hexicore.planner.search.context import SearchContext
from hexicore.planner.search.workers import fork_map
from hexicore.planner.stage_layout.phase2 import lay_out_part, phase2


def _phase2_task(context: SearchContext, task: tuple) -> object:
    d_dp, part, k, n_mb_max, seed = task
    context.at_pipelines(d_dp)
    return phase2(context, list(part), k, n_mb_max, seed)


def prefetch(context: SearchContext, items: Sequence[tuple[int, str, int]], workers: int) -> int:
    """``items``: the loop's first candidates in order as ``(D_dp, cut, seed)`` (shift 0).
    Returns how many layouts were stored."""
    if workers <= 1 or len(items) < 2:
        return 0
    tasks: list[tuple] = []
    first: dict = {}  # phase-2 cache key -> index of its task
    plan = []
    for d_dp, objective, seed in items:
        context.at_pipelines(d_dp)
        parts, ks = split(context, d_dp, objective, (0,), seed)
        n_mb_max = context.micro_batches - (len(parts) - 1)
        entries = []
        for i, (p, k) in enumerate(zip(parts, ks)):
            ck, task = (frozenset(p), k, n_mb_max), (d_dp, tuple(p), k, n_mb_max, seed + i)
            if ck not in context.phase2_cache and ck not in first:
                first[ck] = len(tasks)
                tasks.append(task)
            entries.append((ck, task))
        plan.append(((tuple(tuple(p) for p in parts), tuple(ks)), entries))
    results = fork_map(lambda t: _phase2_task(context, t), tasks, workers)
    seen, stored = set(context.seen), 0
    for key, entries in plan:  # the loop's own order of phase-2 calls
        if key in seen:
            continue
        seen.add(key)
        for ck, task in entries:
            if ck not in context.phase2_cache:
                j = first.get(ck)
                if j is None or tasks[j] != task:  # the loop would lay it out with another seed: stop here
                    return stored
                context.phase2_cache[ck] = results[j]
                stored += 1
            if context.phase2_cache[ck] is None:  # the loop's candidate stops at a part that fits no way
                break
    return stored


def walk_ahead(context: SearchContext, items: Sequence[tuple[int, str, tuple[int, ...], int]], workers: int) -> int:
    """``items``: the loop's guessed next candidates ``(D_dp, cut, k shifts, seed)``; their
    phase 1 and the phase 2 of every part not laid out yet, in parallel (module docstring).
    Returns how many layouts were computed ahead."""
    if workers <= 1 or not items:
        return 0
    todo = list(dict.fromkeys((d, o, tuple(s), seed) for d, o, s, seed in items
                              if (d, o, tuple(s), seed) not in context.parts_cache))
    for key, hit in zip(todo, fork_map(lambda key: split(context, *key), todo, workers)):
        context.parts_cache.setdefault(key, hit)
    tasks: dict = {}
    for d_dp, objective, shifts, seed in items:
        parts, ks = context.parts_cache[(d_dp, objective, tuple(shifts), seed)]
        n_mb_max = context.micro_batches - (len(parts) - 1)
        for i, (p, k) in enumerate(zip(parts, ks)):
            ck = (frozenset(p), k, n_mb_max)
            if ck not in context.phase2_cache and (ck, seed + i) not in context.ahead:
                tasks.setdefault((ck, seed + i), (d_dp, tuple(p), k, n_mb_max, seed + i))

    def lay_out(task: tuple) -> object:  # never through phase2: its cache keeps no seed
        context.at_pipelines(task[0])
        return lay_out_part(context, list(task[1]), *task[2:])

    for key, lay in zip(tasks, fork_map(lay_out, list(tasks.values()), workers)):
        context.ahead[key] = lay
    return len(tasks)
