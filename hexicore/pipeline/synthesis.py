"""Schedules synthesised for given (uneven) stage times under a per-rank activation cap:
list scheduling over a few layouts and rules, then local search by double justification.

For a :class:`hexicore.pipeline.schedule.ScheduleSpec` (per-rank T_F, T_I, T_W, hop times) and
a cap (peak in-flight micro-batches per rank, units of the rank's whole share; one number for
every rank, or one per rank, e.g. what each rank's device memory holds):

1. candidates: every layout of :data:`LAYOUTS` (linear: stage r on rank r; ``v``: two chunks
   per rank in a V; ``loop2``: two chunks on the loop map) x backward-first / forward-first x
   unbounded / P deferred W's, each the greedy list schedule of
   :mod:`hexicore.pipeline.greedy` with split backward;
2. local search: per layout the ``keep`` fastest (simulated makespan) whose peak fits get
   a coordinate descent on per-rank admission limits (``cap_r`` .. ``cap_r + 3``: a chunked
   layout's admitted micro-batches hold half a share each for a while, so a looser admission
   can still peak within the cap; kept while the makespan falls and the peak fits;
   ``admit_rounds`` rounds, 0 skips it), then
   double justification
   (:func:`hexicore.pipeline.improve.justify`);
3. the fastest whose simulated peak activations stay within the cap wins (if none fits, the
   lowest peak), then ``swaps`` random adjacent swaps on one rank each (seeded) are tried by
   hill climbing (:func:`climb`).

:func:`lower_bound` is what it is measured against: for every layout of :data:`LAYOUTS`, rank
r cannot start before micro-batch 0's forward reaches its first stage (the forwards of the
stages before it plus the transfers) and then has ``M (T_F + T_I + T_W)`` of its own work; the
bound is the smallest over the layouts of the largest over the ranks (memory caps ignored, so it
bounds every cap; for a pipeline's plain times, under ``v``, which moves the head from the last
rank to rank 0, the last rank's work is left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.arrays import ActionArrays
from hexicore.pipeline.greedy import greedy_order
from hexicore.pipeline.improve import justify
from hexicore.core.errors import ScheduleError
from hexicore.pipeline.simulate import makespan, simulate

#: stage -> rank maps synth considers (name -> (ranks -> map))
LAYOUTS = ("linear", "v", "loop2")


def layout_map(name: str, ranks: int) -> tuple[int, ...]:
    if name == "linear":
        return tuple(range(ranks))
    if name == "v":
        return tuple(range(ranks)) + tuple(reversed(range(ranks)))
    if name == "loop2":
        return tuple(range(ranks)) * 2
    raise ValueError(f"unknown layout {name!r}; choose one of {LAYOUTS}")


@dataclass(frozen=True)
class Synthesis:
    """The chosen lists (compute only, no ``STEP``), their layout, makespan, peak and every
    candidate's ``(layout, rule, makespan, peak)``."""

    stage_rank: tuple[int, ...]
    lists: tuple[tuple[Any, ...], ...]
    layout: str
    makespan: float
    peak: float
    tried: tuple[tuple[str, str, float, float], ...]


def _probe(spec: Any, s2r: Sequence[int]) -> ActionList:
    return ActionList({}, spec.ranks, len(s2r), spec.micro_batches, tuple(s2r), ((),) * spec.ranks)


def caps_of(cap: float | Sequence[float], ranks: int) -> tuple[float, ...]:
    """The per-rank cap: ``cap`` for every rank, or the given one per rank."""
    if isinstance(cap, (int, float)):
        return (float(cap),) * ranks
    caps = tuple(float(c) for c in cap)
    if len(caps) != ranks:
        raise ValueError(f"{len(caps)} memory caps for {ranks} ranks")
    return caps


def excess(peaks: Sequence[float], caps: Sequence[float]) -> float:
    """How far the peaks exceed the caps (the largest overshoot of any rank; <= 0: they fit)."""
    return max(p - c for p, c in zip(peaks, caps))


def fits(peaks: Sequence[float], caps: Sequence[float]) -> bool:
    return excess(peaks, caps) <= 1e-9


def candidate(spec: Any, name: str, ff: bool, wl: int | None,
              caps: Sequence[float]) -> tuple[float, tuple[float, ...], ActionList]:
    """One greedy candidate: (makespan, per-rank peaks, compute-only lists)."""
    P, M = spec.ranks, spec.micro_batches
    s2r = layout_map(name, P)
    timing = spec.timing(_probe(spec, s2r))
    lists = greedy_order(P, s2r, [tuple(range(len(s2r)))], (0,) * M, timing, cap=list(caps), split_backward=True,
                         forward_first=ff, w_limit=None if wl is None else [wl] * P)
    al = ActionList({}, P, len(s2r), M, s2r, tuple(tuple(x) for x in lists))
    r = simulate(al, timing, comm=False)
    return r.makespan, tuple(r.peak_activations), al


def _descend(spec: Any, name: str, ff: bool, wl: int | None, cap: Sequence[float],
             start: tuple[float, tuple[float, ...], ActionList],
             rounds: int = 2) -> tuple[tuple[float, ...], tuple[float, tuple[float, ...], ActionList]]:
    """Coordinate descent on per-rank admission limits (cap_r .. cap_r + 3): a change is kept
    when the makespan falls and the peaks stay within ``cap``."""
    P = spec.ranks
    caps, best = list(cap), start
    for _ in range(rounds):
        moved = False
        for r in range(P):
            for v in (cap[r], cap[r] + 1, cap[r] + 2, cap[r] + 3):
                if v == caps[r]:
                    continue
                trial = caps[:r] + [v] + caps[r + 1:]
                got = candidate(spec, name, ff, wl, trial)
                if fits(got[1], cap) and got[0] < best[0] - 1e-12:
                    caps, best, moved = trial, got, True
        if not moved:
            break
    return tuple(caps), best


def synthesize(spec: Any, cap: float | Sequence[float], *, layouts: Sequence[str] = LAYOUTS, keep: int = 2,
               rounds: int = 20, swaps: int = 400, seed: int = 0, admit_rounds: int = 2) -> Synthesis:
    """The module docstring's search for ``spec`` under ``cap`` (one number, or one per rank).
    Pure and deterministic."""
    P = spec.ranks
    caps = caps_of(cap, P)
    tried, best = [], None

    def offer(name: str, rule: str, got: tuple[float, tuple[float, ...], ActionList]) -> None:
        nonlocal best
        t, pks, al = got
        over = excess(pks, caps)
        tried.append((name, rule, t, max(pks)))
        key = (over > 1e-9, over if over > 1e-9 else 0.0, t)
        if best is None or key < best[0]:
            best = (key, name, al, t, pks)

    for name in layouts:
        fitting = []
        for ff in (False, True):
            for wl in (None, P):
                rule = f"{'forward' if ff else 'backward'}-first, W deferral {'unbounded' if wl is None else wl}"
                got = candidate(spec, name, ff, wl, caps)
                offer(name, rule, got)
                if fits(got[1], caps):
                    fitting.append((got[0], ff, wl, rule, got))
        for t, ff, wl, rule, got in sorted(fitting, key=lambda x: x[0])[:keep]:
            admitted, got = _descend(spec, name, ff, wl, caps, got, admit_rounds)
            if got[0] < t:
                offer(name, f"{rule}, admit {list(admitted)}", got)
            al = got[2]
            timing = spec.timing(al)
            better = justify(al, timing, rounds)
            if better is not al:
                r = simulate(better, timing, comm=False)
                offer(name, f"{rule} + justified", (r.makespan, tuple(r.peak_activations), better))
    _, name, al, t, peaks = best
    if fits(peaks, caps) and swaps:
        al, t2, peaks = climb(al, spec.timing(al), caps, swaps, seed)
        if t2 < t - 1e-12:
            tried.append((name, f"+ {swaps} swap trials", t2, max(peaks)))
            t = t2
    return Synthesis(al.stage_rank, al.actions, name, t, max(peaks), tuple(tried))


def climb(al: ActionList, timing: Any, cap: float | Sequence[float], trials: int,
          seed: int) -> tuple[ActionList, float, tuple[float, ...]]:
    """Hill climbing by swaps of two adjacent compute actions on one rank (``trials`` random
    ones, ``seed``), each kept when the simulated makespan falls, the lists still run and the
    peaks stay within ``cap`` (one number or one per rank)."""
    import random

    caps = caps_of(cap, al.ranks)
    rng = random.Random(seed)
    rows = [list(a) for a in al.actions]
    res = simulate(al, timing, comm=False)
    best, peaks = res.makespan, tuple(res.peak_activations)
    for _ in range(trials):
        r = rng.randrange(al.ranks)
        if len(rows[r]) < 2:
            continue
        k = rng.randrange(len(rows[r]) - 1)
        rows[r][k], rows[r][k + 1] = rows[r][k + 1], rows[r][k]
        trial = ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank,
                           tuple(tuple(x) for x in rows), al.chains, al.mb_chain, al.meta)
        try:  # the makespan alone first (cheap); the peak only for an improvement
            ok = makespan(trial, timing) < best - 1e-12
            if ok:
                got = simulate(trial, timing, comm=False)
                ok = got.makespan < best - 1e-12 and fits(got.peak_activations, caps)
        except ScheduleError:
            ok = False
        if ok:
            al, best, peaks = trial, got.makespan, tuple(got.peak_activations)
        else:
            rows[r][k], rows[r][k + 1] = rows[r][k + 1], rows[r][k]
    return al, best, peaks


def lower_bound(spec: Any, layouts: Sequence[str] = LAYOUTS, head_moves: bool = False) -> float:
    """The module docstring's bound: min over layouts of max over ranks of (earliest start +
    own work). ``head_moves``: ``spec``'s times are those of a pipeline's plain placement (the
    head's work on the last rank) and the ``v`` layout would move the head to rank 0, so there
    the last rank's own work is left out of the max (rank 0's only grows: its plain work still
    bounds it) — the bound then holds for whichever placement synth chooses."""
    P, M = spec.ranks, spec.micro_batches
    ig, wg = spec.split_times()
    work = [M * (spec.forward[r] + ig[r] + wg[r]) for r in range(P)]
    out = []
    for name in layouts:
        chunks = 1 if name == "linear" else 2
        head, arrive = [0.0] * P, 0.0
        for r in range(P):
            head[r] = arrive
            arrive += spec.forward[r] / chunks + (spec.hops[r] if r < P - 1 else 0.0)
        kept = range(P - 1) if head_moves and name == "v" and P > 1 else range(P)
        out.append(max(head[r] + work[r] for r in kept))
    return min(out)


def as_arrays(lists: Sequence[Sequence[Any]]) -> ActionArrays:
    return ActionArrays.from_lists(lists)
