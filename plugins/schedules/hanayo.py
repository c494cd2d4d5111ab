"""Schedule ``hanayo``: wave-like pipeline (Liu et al., "Hanayo: Harnessing Wave-like Pipeline
Parallelism for Enhanced Large Model Training Efficiency", SC'23).

One model copy cut into ``S = 2PW`` stages on the wave map 0..P-1, P-1..0 (W times): each
micro-batch runs down the ranks and back up W times; the turns need no transfer. The order is
the greedy list schedule of :mod:`hexicore.pipeline.greedy` (earliest start, backward first, then lowest
micro-batch) under the spec's stage and link times, with each rank admitting at most
``memory`` micro-batches (default P, 1F1B's rank-0 peak), then improved by double
justification (:mod:`hexicore.pipeline.improve`: tasks shifted late, then early, through the
gaps of the wave layout; kept when its peak stays within ``memory``; orders of up to
``JUSTIFY_TASKS`` tasks). With it the bubble at M = P is at most the paper's closed form for
P in {2, 4, 8, 16}, W in {1, 2, 4, 8} (the greedy order alone lies above it at W >= 4). For M > P the faster (by simulation)
of the plain greedy order and blocks of P micro-batches (the M = P order repeated on every rank,
the setting of the closed form; a last smaller block for M mod P) is kept: under the cap the
plain order can stall. Above ``PLAIN_GREEDY_TASKS`` compute tasks only the block order is built.

Phases (they emerge from the greedy rule): 1. fill: micro-batch 0 rides the first wave while
rank 0 keeps injecting; 2. steady: backward waves return and interleave with forwards;
3. drain: the last backward waves climb back to rank 0.
Closed form with ``T_B = 2 T_F``, ``T_C = 0``, M = P: ``(2P-2)/(3PW+P-1)``.

``waves=auto`` picks W in 1..``max_waves`` (and ``2W`` at most the blocks of a rank, where the
spec knows them) by simulating each under the spec's times and keeping
the fastest whose peak activations stay within ``memory`` (the paper: more waves over fast
links, fewer over slow ones); the choice and every candidate's makespan are recorded in the
action list's ``schedule`` section, and a plan records the chosen W (:meth:`Hanayo.resolve`).

Pricing (:class:`hexicore.pipeline.schedule.Pricing`): simulated; for M > P the planner's search
models it in blocks of P micro-batches (``ceil(M / P)`` times its time at P, an upper bound:
consecutive blocks overlap), its peak activations as those at P; a wave turns on the last rank,
so it needs two ranks and a one-rank pipeline (no bubble under any schedule) is priced as 1F1B.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Sequence

from hexicore.pipeline.arrays import CODE, ActionArrays, tile_blocks
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.greedy import greedy_tuples
from hexicore.pipeline.improve import justify
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core import limits
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import (BLOCKS, ActionSchedule, Pricing, ScheduleSpec, build, need, positive_int,
                                        positive_memory, wave_map)
from hexicore.pipeline.simulate import compile_lists, makespan, simulate


#: above this many compute tasks (2 S M) only the block order is built for M > P (speed)
PLAIN_GREEDY_TASKS = 1 << 17
#: up to this many compute tasks per order the greedy order is double-justified (speed)
JUSTIFY_TASKS = 1 << 14
#: about how many simulations of a pipeline one W's order costs (``Pricing.simulations`` is this
#: times the waves built), measured as the order's seconds over one ZB-H1 simulation of the
#: pipeline on pipelines of 3-9 ranks and 8-256 micro-batches: W = 1 3-18 (median 9), W = 4
#: 5-79 (median 30), ``waves=auto`` up to 4: 9-76 (median 48)
SIMULATIONS_PER_WAVE = 12


def _arrays(rows: list[list[tuple[str, int, int]]]) -> ActionArrays:
    """Greedy ``(op, stage, mb)`` rows as compute-only arrays."""
    flat = [t for row in rows for t in row]
    ops, stages, mbs = zip(*flat) if flat else ((), (), ())
    return ActionArrays.build([CODE[o] for o in ops], stages, mbs, [-1] * len(flat), [len(r) for r in rows])


def _greedy_arrays(*args: Any, **kw: Any) -> ActionArrays:
    """:func:`greedy_tuples` as arrays; the cyclic GC paused meanwhile (~10^5 short-lived tuples)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _arrays(greedy_tuples(*args, **kw))
    finally:
        if enabled:
            gc.enable()


def wave_bubble(ranks: int, waves: int, tf: float, tb: float, tc: float) -> float:
    """The paper's closed-form bubble ratio for M = P micro-batches, equal stages (T_F, T_B) and
    equal transfers T_C: ``(T_B/W + (1 + 2W + 2/P + (P-2)/3) T_C) /
    (P/(P-1) T_F + (1/(2W) + P/(P-1)) T_B + ((P-2)/2 + 4W) T_C)``."""
    P, W = ranks, waves
    num = tb / W + (1 + 2 * W + 2 / P + (P - 2) / 3) * tc
    return num / (P / (P - 1) * tf + (1 / (2 * W) + P / (P - 1)) * tb + ((P - 2) / 2 + 4 * W) * tc)


def hanayo_bubble(ranks: int, waves: int) -> float:
    """:func:`wave_bubble` with T_B = 2 T_F, T_C = 0: ``(2P-2)/(3PW+P-1)``."""
    return (2 * ranks - 2) / (3 * ranks * waves + ranks - 1)


@dataclass(frozen=True)
class Hanayo(ActionSchedule):
    waves: Any = 2
    memory: float | None = None
    max_waves: int = 8
    name = "hanayo"

    @property
    def pricing(self) -> Pricing:  # type: ignore[override]
        """Blocks of P micro-batches (module docstring); each W's order is a greedy list schedule
        improved by double justification, which simulates as it goes: about
        :data:`SIMULATIONS_PER_WAVE` simulations a wave, every W up to ``max_waves`` under
        ``waves=auto``."""
        waves = self.max_waves if self.waves == "auto" else self.waves
        return Pricing(growth=BLOCKS, min_ranks=2, fewer_ranks=ScheduleRef("1f1b"), chained_gradients=True,
                       simulations=SIMULATIONS_PER_WAVE * waves)

    def __post_init__(self) -> None:
        if self.waves != "auto":
            object.__setattr__(self, "waves", positive_int(self.waves, self.name, "waves", "or 'auto'"))
        object.__setattr__(self, "max_waves", positive_int(self.max_waves, self.name, "max_waves"))
        limits.check(self.max_waves, limits.MAX_WAVES, "waves", field="schedule.max_waves")  # waves=auto tries each
        object.__setattr__(self, "memory", positive_memory(self.memory, self.name))

    def params(self) -> dict[str, Any]:
        return {"waves": self.waves}

    def _cap(self, spec: ScheduleSpec) -> float:
        return float(self.memory) if self.memory is not None else float(spec.ranks)

    def _justified(self, arrays: ActionArrays, spec: ScheduleSpec, s2r: tuple, n_mb: int, timing: Any,
                   waves: int) -> ActionArrays:
        """``arrays`` (an order for ``n_mb`` micro-batches) improved by double justification
        (:func:`hexicore.pipeline.improve.justify`) when small enough and its peak activations
        stay within the cap; else unchanged."""
        if 2 * len(s2r) * n_mb > JUSTIFY_TASKS:
            return arrays
        sub = ScheduleSpec(spec.ranks, n_mb, spec.forward, spec.backward, spec.hops)
        al = build(self.name, {"waves": waves}, sub, s2r, arrays)
        better = justify(al, timing)
        if better is al or max(simulate(better, timing, comm=False, fast=True).peak_activations) > self._cap(spec) + 1e-9:
            return arrays
        return ActionArrays.from_lists([[a for a in acts if a.op != "STEP"] for acts in better.actions])

    def with_waves(self, spec: ScheduleSpec, waves: int) -> ActionList:
        """The wave order for a fixed W: greedy, then double-justified (module docstring)."""
        P, M = spec.ranks, spec.micro_batches
        s2r = wave_map(P, waves)
        chain = [tuple(range(len(s2r)))]
        probe = ActionList({}, P, len(s2r), M, s2r, ((),) * P)
        timing = spec.timing(probe)
        cap = [self._cap(spec)] * P
        candidates = []
        if M <= P or 2 * len(s2r) * M <= PLAIN_GREEDY_TASKS:
            candidates.append(self._justified(_greedy_arrays(P, s2r, chain, (0,) * M, timing, cap=cap),
                                              spec, s2r, M, timing, waves))
        if M > P:  # blocks of P micro-batches, one after another on every rank
            block = self._justified(_greedy_arrays(P, s2r, chain, (0,) * P, timing, cap=cap), spec, s2r, P, timing,
                                    waves)
            rest = self._justified(_greedy_arrays(P, s2r, chain, (0,) * (M % P), timing, cap=cap), spec, s2r,
                                   M % P, timing, waves) if M % P else None
            candidates.append(tile_blocks(block, P, M // P, rest))
        best = None
        for arrays in candidates:
            al = build(self.name, {"waves": waves}, spec, s2r, arrays)
            t = makespan(al, timing) if len(candidates) > 1 else 0.0
            if best is None or t < best[0] - 1e-12:
                best = (t, al)
        return best[1]

    def wave_template(self, ranks: int, n_mb: int, waves: int) -> tuple[ActionList, list, float]:
        """The default-time order for W waves, its compiled form and its peak activations (cached;
        the peak depends on the order only)."""
        key = ("wave_template", ranks, n_mb, waves)
        if key not in self._cache:
            al = self.with_waves(ScheduleSpec(ranks, n_mb), waves)
            self._cache[key] = (al, compile_lists(al), max(simulate(al, comm=False, fast=True).peak_activations))
        return self._cache[key]

    def choose_waves(self, spec: ScheduleSpec) -> tuple[int, dict[int, float]]:
        """``waves=auto``: (best W, {W: makespan}) among W whose peak fits ``memory`` and whose
        ``2W`` chunks a rank fit the fewest blocks a rank holds (``spec.rank_layers``, where
        known); each W's default-time order simulated under ``spec``'s stage and link times."""
        seen: dict[int, float] = {}
        best = None
        top = self.max_waves if not spec.rank_layers else max(1, min(self.max_waves, min(spec.rank_layers) // 2))
        for w in range(1, top + 1):  # 2W chunks a rank: at most its blocks
            al, compiled, peak = self.wave_template(spec.ranks, spec.micro_batches, w)
            seen[w] = makespan(al, spec.timing(al), compiled)
            if peak <= self._cap(spec) + 1e-9 and (best is None or seen[w] < seen[best] - 1e-12):
                best = w
        return (best or 1), seen

    def resolve(self, ref: ScheduleRef, stage_times: Sequence[float], hop_times: Sequence[float],
                n_mb: int, rank_layers: Sequence[int] = ()) -> tuple[ScheduleRef, float]:
        """``waves=auto``: the W :meth:`choose_waves` picks for these times, recorded as
        ``{"name": "hanayo", "waves": W}``; a fixed W is kept."""
        if self.waves != "auto":
            return super().resolve(ref, stage_times, hop_times, n_mb)
        w, seen = self.choose_waves(ScheduleSpec.from_pieces(stage_times, hop_times, n_mb, rank_layers))
        return ScheduleRef(ref.name, {"waves": w}), seen[w]

    def least_layers(self, ranks: int) -> tuple[int, ...]:
        """``2W`` chunks on every rank, a layer at least each; ``waves=auto`` fits W to the ranks'
        blocks (``ScheduleSpec.rank_layers``), so it needs W = 1's two."""
        return (2 * (1 if self.waves == "auto" else int(self.waves)),) * int(ranks)

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        """:func:`wave_bubble` for M = P with equal stages and transfers (W as built)."""
        uniform = all(len(set(x)) <= 1 for x in (spec.forward, spec.backward, spec.hops))
        if spec.micro_batches != spec.ranks or spec.ranks < 2 or not uniform:
            return None
        tc = spec.hops[0] if spec.hops else 0.0
        return wave_bubble(spec.ranks, int(chosen.get("waves", self.waves)), spec.forward[0], spec.backward[0], tc)

    def note(self, chosen: ScheduleRef) -> str | None:
        """``waves=auto``: the W chosen and every candidate's makespan (recorded as ``auto``)."""
        if "auto" not in chosen:
            return None
        cands = ", ".join(f"W={w}: {t:.4g}" for w, t in chosen["auto"].items())
        return f"waves=auto chose W={chosen['waves']} (makespan by W: {cands})"

    def price(self, spec: ScheduleSpec) -> float:
        if self.waves != "auto":
            return super().price(spec)
        need(spec.ranks >= 2, self.name, f"needs pipeline.ranks >= 2 (a wave turns on the last rank), got {spec.ranks}")
        w, seen = self.choose_waves(spec)
        return seen[w]

    def order(self, spec: ScheduleSpec) -> ActionList:
        need(spec.ranks >= 2, self.name, f"needs pipeline.ranks >= 2 (a wave turns on the last rank), got {spec.ranks}")
        need(spec.micro_batches >= 1, self.name, "needs micro_batches >= 1")
        if self.waves != "auto":
            return self.with_waves(spec, self.waves)
        w, seen = self.choose_waves(spec)
        al = self.wave_template(spec.ranks, spec.micro_batches, w)[0]
        sched = {**al.schedule, "auto": {str(k): round(v, 9) for k, v in seen.items()}}
        return ActionList(sched, al.ranks, al.stages, al.micro_batches, al.stage_rank, al.actions,
                          al.chains, al.mb_chain, {"waves_chosen": w, "waves_makespan": seen})


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="hanayo", factory=Hanayo,
                     description="Hanayo waves: 2PW stages on a wave map, one model copy (`waves`, or auto)")
