"""TP menus (HexiScale §4.3, phase 2 (ii)): the local strategies of a group of GPUs inside one
machine — the ways to cut its GPUs into TP groups (TP degree and number of stages), e.g. 8 GPUs
-> [8], [4, 4], [4, 2, 2], ... — and the helpers that cut a group per machine and per menu."""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate, combinations
from typing import Sequence

from hexicore.core.cluster import Cluster

Group = tuple[str, ...]


@lru_cache(maxsize=4096)
def tp_menus(n: int, degrees: tuple[int, ...], limit: int = 16) -> tuple[tuple[int, ...], ...]:
    """Non-increasing splits of ``n`` GPUs into TP degrees from ``degrees`` (HexiScale's menu:
    8 -> [8], [4,4], [4,2,2], ...). Splits with fewer distinct degrees come first, then those
    with the larger top degree, then in tuple order; at most ``limit`` of them. ``degrees`` must
    contain 1 so that a split always exists.

    The splits are enumerated as counts per degree, one number of distinct degrees at a time,
    and only the ``limit`` kept are spelt out: a machine of thousands of GPUs has a number of
    splits that grows with the cube of its GPUs, each thousands of degrees long."""
    ds = sorted(set(degrees), reverse=True)
    out: list[tuple[int, ...]] = []
    for k in range(1, len(ds) + 1):
        level = [runs for combo in combinations(ds, k) for runs in _counts(n, combo)]
        # a non-increasing split compares as its runs (degree, count): fewer of a degree is smaller
        level.sort(key=lambda runs: (-runs[0][0], runs))
        out.extend(tuple(d for d, c in runs for _ in range(c)) for runs in level[:limit - len(out)])
        if len(out) >= limit:
            break
    return tuple(out)


def _counts(n: int, combo: tuple[int, ...]) -> list[tuple[tuple[int, int], ...]]:
    """Every way to write ``n`` as a sum using each degree of ``combo`` (descending) at least
    once, as runs ``((degree, count), ...)``."""
    found: list[tuple[tuple[int, int], ...]] = []
    last, head = combo[-1], combo[:-1]
    stack: list[tuple[int, tuple[tuple[int, int], ...]]] = [(n - sum(combo), ())]
    while stack:  # (GPUs left beyond one of each degree, counts of the degrees placed so far)
        left, runs = stack.pop()
        i = len(runs)
        if i == len(head):
            if left % last == 0:
                found.append(runs + ((last, 1 + left // last),))
            continue
        d = head[i]
        stack.extend((left - extra * d, runs + ((d, 1 + extra),)) for extra in range(left // d + 1))
    return found


def split_by_machine(cluster: Cluster, devices: Sequence[str]) -> list[Group]:
    """A group's devices per machine (TP stays inside a machine, §3.2), in cluster order."""
    order = {d.id: i for i, d in enumerate(cluster.devices)}
    by: dict[str, list[str]] = {}
    for d in sorted(devices, key=order.__getitem__):
        by.setdefault(cluster.device(d).machine, []).append(d)
    return [tuple(v) for v in by.values()]


def apply_menu(unit: Group, menu: Sequence[int]) -> list[Group]:
    """Cut a machine's devices into consecutive TP groups of the menu's sizes."""
    return [unit[end - t:end] for t, end in zip(menu, accumulate(menu))]


@lru_cache(maxsize=4096)
def uniform_choice(menus: tuple[tuple[int, ...], ...], degree: int) -> int:
    """The menu closest to "every group at TP degree ``degree``" (first of the closest)."""
    return min(range(len(menus)), key=lambda i: (sum(abs(t - degree) for t in menus[i]), i))
