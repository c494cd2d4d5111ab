"""The schedule pricer: what a pipeline costs under a schedule, in named tiers.

Schedule plugins *generate* orders (:meth:`hexicore.pipeline.schedule.ActionSchedule.order`) and
*declare* how they are priced (``pricing``, ``closed_form``, ``peak_rule``); one
:class:`SchedulePricer` per schedule object prices a (stage times, hop times, micro-batches,
memory cap) through these tiers:

1. **closed form** (:meth:`SchedulePricer.closed_form`): the formula the schedule plugin declares
   (the helpers below: fill-drain :func:`uniform_closed_form`, looped :func:`looped_closed_form`,
   split backward :func:`split_closed_form`). Exact where the plugin returns a number (it returns None where
   its formula does not hold: uneven stages, non-free links, too few micro-batches).
2. **steady-state model** (:meth:`SchedulePricer.steady_state`): warm-up + cool-down +
   ``(M - k) / c x`` a steady-state period of ``c`` micro-batches, derived from short exact
   simulations of the same order under the same times (method docstring); exact from ``k``
   micro-batches on where the order's makespan has become periodic-affine by then
   (tests/pipeline/test_pricer.py measures where, schedule by schedule).
3. **exact simulation** (:meth:`SchedulePricer.simulated`): the makespan of the schedule's
   default-time order for P and M (``template``) under the given stage and link times, run
   by the simulator (:func:`hexicore.pipeline.simulate.makespan`). Exact for that order, always.

:meth:`SchedulePricer.exact` is tier 1 where it holds, else tier 3 (the schedule's ``price``,
which a schedule choosing its own free parameters overrides): the PIPELINE-TIME the planner's
final plans are priced with. :meth:`SchedulePricer.anchored` is the search's cheap model
(thousands of calls per plan): exact up to the anchor, then affine (``STEADY``) or in blocks
(``BLOCKS``) through the exact times at the anchors, as the schedule's ``Pricing.growth``
declares; exact where the schedule's growth is what it declares from the anchor on (the final
plan is re-priced with :meth:`SchedulePricer.exact`).

Memory, one path: :meth:`SchedulePricer.peaks` is the schedule's declared ``peak_rule`` where it
gives one, else the peak in-flight activations the simulator counts on the default-time order;
:meth:`SchedulePricer.anchored_peaks` the search's (at the saturating micro-batch count).

The cost model's own closed PIPELINE-TIME (HexiScale App. A,
:func:`hexicore.cost.base.fill_drain_time`) and its default in-flight rule
(:func:`hexicore.cost.base.default_in_flight`) are 1F1B's; a plan configured with a schedule
whose ``Pricing.cost_model_time`` says so keeps them (the CP-SAT solver's proven bound relies on
that formula). Units: ``stage_times[j]`` is forward + backward of one micro-batch through rank j's
whole share (``T_F : T_B = 1 : 2``), ``hop_times[j]`` the round trip between ranks j and j+1
(:mod:`hexicore.pipeline.spec`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from hexicore.pipeline.action_placement import built_template
from hexicore.pipeline.simulate import compile_lists, makespan
from hexicore.pipeline.spec import ScheduleSpec
from hexicore.pipeline.validate import blamed

#: ``Pricing.growth`` kinds: the search's model grows in steady state, or in blocks of P
STEADY, BLOCKS = "steady", "blocks"


# ------------------------------------------------------------------ tier 1: closed forms
def uniform_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
    """Makespan of a fill-drain-shaped schedule (every stage one F+B per micro-batch, no overlap
    gain) with equal stages and free transfers: ``(M + P - 1)(T_F + T_B)`` (exact)."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + len(stage_times) - 1) * stage_times[0]
    return None


def uniform_bubble(spec: Any) -> float | None:
    """The bubble ratio of :func:`uniform_closed_form`, ``(P-1)/(M+P-1)``, when ``spec`` has
    equal stages and free transfers; else None."""
    P, M = spec.ranks, spec.micro_batches
    if len(set(spec.forward)) == 1 and len(set(spec.backward)) == 1 and not any(spec.hops):
        return (P - 1) / (M + P - 1)
    return None


def looped_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int,
                       chunks: int) -> float | None:
    """Makespan ``(M + (P-1)/v)(T_F + T_B)`` of a looped schedule of ``v`` chunks per rank
    (Megatron's interleaved 1F1B, looped BFS: a bubble of ``(P-1)/v`` stage-rounds) with equal
    stages and free transfers, else None; each plugin states from which M on it holds."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + (len(stage_times) - 1) / chunks) * stage_times[0]
    return None


def split_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int,
                      lag: float) -> float | None:
    """Makespan ``(3M + lag) T`` of a split-backward schedule (ZB-H2, ZB-V, interleaved ZB,
    DualPipeV) whose ranks stay busy after the last rank's first forward arrives ``lag``
    forward-times late, with equal stages and free transfers (a stage time is ``T_F + T_B =
    3T``, T_I = T_W = T); else None. It holds only from enough micro-batches on
    (:func:`split_holds`); below that the schedules are simulated."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + lag / 3.0) * stage_times[0]
    return None


def split_bubble(spec: Any, lag: float) -> float | None:
    """The bubble ratio of :func:`split_closed_form`, ``lag / (3M + lag)``, when ``spec`` has
    T_F = T_I = T_W on every rank and free transfers; else None."""
    if spec.equal_split() is None:
        return None
    return lag / (3 * spec.micro_batches + lag)


def split_holds(ranks: int, n_mb: int, chunked: bool = False) -> bool:
    """Whether the split-backward greedy orders meet :func:`split_closed_form`: with one chunk
    per rank (ZB-H2) from M >= P on; with chunks (ZB-V, interleaved ZB) at M = P and from
    M >= 2P on. With fewer micro-batches the ranks idle after the last rank's first forward
    (ZB-H2 at P = 4, M = 3: 13 T, not 12 T), and between P and 2P the chunked warm-up leaves
    gaps (ZB-V at P = 5, M = 6); checked against the simulator."""
    if n_mb < ranks:
        return False
    return not chunked or n_mb == ranks or n_mb >= 2 * ranks


#: the least relative gain worth an exact pricing: a schedule whose lower bound is within this of
#: the time already in hand is not priced (:func:`worth_pricing`)
LEAST_GAIN = 1e-3

#: the fewest counts in a row without growth that end :meth:`SchedulePricer.anchored_peaks`'s window
SETTLED = 4


def worth_pricing(bound: float, best: float) -> bool:
    """Whether a schedule with lower bound ``bound`` may beat ``best`` seconds by more than
    :data:`LEAST_GAIN` (relative): bounds first, so a schedule whose exact price grows with the
    micro-batches (a synthesis, a justification over all of them) is not built where it cannot
    pay. With many micro-batches every schedule's bubble shrinks towards the bound."""
    return bound < best * (1.0 - LEAST_GAIN)


# ------------------------------------------------------------------ the pricer
@dataclass(frozen=True)
class SchedulePricer:
    """The tiers of the module docstring for one schedule object (an
    :class:`~hexicore.pipeline.schedule.ActionSchedule`: what it reads of it is ``name``,
    ``pricing``, ``template``, ``closed_form``, ``price``, ``pipeline_time``, ``peak_rule``,
    ``peaks`` and ``peak_activations``). Caches are the schedule's (one solve builds each schedule
    once)."""

    schedule: Any
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    # --------------------------------------------------------------- time
    def lower_bound(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """Tier 0, a bound no order beats: the busiest rank's own work, ``M * max_j stage_times[j]``
        (every rank runs its share of every micro-batch, one task at a time). The planner skips a
        schedule whose bound leaves no room to beat the one it has (:func:`worth_pricing`)."""
        return int(n_mb) * max(stage_times, default=0.0)

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        """Tier 1: the schedule's declared closed form where it is exact for these inputs, else None."""
        return self.schedule.closed_form(stage_times, hop_times, n_mb)

    def simulated(self, spec: ScheduleSpec) -> float:
        """Tier 3: makespan of the schedule's ``template`` for ``spec``'s P and M under ``spec``'s
        times (:func:`hexicore.pipeline.simulate.makespan`; the timing-free graph compiled once
        per P and M)."""
        al = self.schedule.template(spec.ranks, spec.micro_batches)
        key = ("compiled", spec.ranks, spec.micro_batches)
        with blamed(self.schedule.name):
            if key not in self.cache:
                self.cache[key] = compile_lists(al)
            return makespan(al, spec.timing(al), self.cache[key])

    def exact(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """PIPELINE-TIME: tier 1 where the closed form holds, else the schedule's ``price`` (tier 3,
        or the schedule's own simulation where it chooses free parameters); cached per input."""
        key = ("time", tuple(map(float, stage_times)), tuple(map(float, hop_times)), int(n_mb))
        if key not in self.cache:
            t = self.closed_form(key[1], key[2], key[3])
            if t is None:
                t = self.schedule.price(ScheduleSpec.from_pieces(key[1], key[2], key[3]))
            self.cache[key] = t
        return self.cache[key]

    def anchored(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """The search's PIPELINE-TIME model (``Pricing.growth``), from the schedule's exact times at
        P, 2P and 3P (STEADY: exact for n <= P, then piecewise affine through them, and past 3P
        growing as from 2P to 3P, never slower than the busiest rank's work) or at P (BLOCKS: ``ceil(n / P)`` times the time at P); anchors
        cached, 3P's taken only once a count past 2P is asked. A schedule that needs more than P
        micro-batches (``Pricing.min_micro_batches``, DualPipeV's 2P) is anchored there and at
        twice and three times that.

        Why 3P: from P to 2P an order is often still in its warm-up. With uneven stages (13 ranks,
        two of them 1.4x slower) interleaved 1F1B grew 0.255 s a micro-batch there and 0.305 from
        2P on, and interleaved ZB 0.325 against 0.365, so a slope taken from P to 2P put them 8-11%
        below their exact time at 64-130 micro-batches and the search chose by that; from 2P to 3P
        the order has settled (``bench/pricing_error.py`` measures the model on its grid). Past 3P
        the growth is at least the busiest rank's work per micro-batch (:meth:`lower_bound`'s
        ``max_j stage_times[j]``): an order still in its transient at 3P may grow slower there
        (interleaved 1F1B on three uneven ranks: 0.48 s a micro-batch from 2P to 3P against the
        slowest rank's 0.50), and extrapolated over 300 micro-batches that put the model 3.8% below
        the exact time, under the bound no order beats."""
        timed = self.schedule.pipeline_time
        pricing = self.schedule.pricing
        p, n = len(stage_times), int(n_mb)
        p = max(p, pricing.min_micro_batches(p))  # the anchors: P, 2P and 3P, or the fewest it runs with
        block = pricing.growth == BLOCKS
        if n <= p and not block:
            return timed(stage_times, hop_times, n)
        key = ("model", tuple(stage_times), tuple(hop_times))
        hit = self.cache.get(key)
        if hit is None:
            a = timed(stage_times, hop_times, p)
            hit = self.cache[key] = [a, 2 * a if block else timed(stage_times, hop_times, 2 * p), None]
        a, b = hit[0], hit[1]
        bad = next((x for x in hit if x is not None and not x >= 0), None)  # (a plugin's NaN or negative time:
        if bad is not None:  # returned as it is, for the caller's check to name)
            return bad
        if block:
            return a + (max(math.ceil(n / p), 1) - 1) * (b - a)
        if n <= 2 * p:
            return a + (n - p) / p * max(b - a, 0.0)
        if hit[2] is None:
            hit[2] = timed(stage_times, hop_times, 3 * p)
        if not hit[2] >= 0:
            return hit[2]
        if n <= 3 * p:
            return b + (n - 2 * p) / p * max(hit[2] - b, 0.0)
        slope = max((hit[2] - b) / p, max(stage_times, default=0.0))  # (no order grows slower: lower_bound)
        return hit[2] + (n - 3 * p) * slope

    def steady_state(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """Tier 2: ``T(M) = T(k + r) + q (T(k + c) - T(k))`` — warm-up and cool-down ``T(k + r)``,
        then ``q = (M - k - r) / c`` steady periods of ``c`` micro-batches each — with ``k`` the
        warm-up anchor and ``c`` the period (:meth:`steady_fit`: found from short exact
        simulations, tier 3, of the same order under the same stage and link times, a memory cap
        among the schedule's parameters applied alike), ``r = (M - k) mod c``. Below ``k + c``
        micro-batches, or where no period shows (:meth:`steady_fit` is None), it is tier 3.

        Exact (to rounding) when the order's makespan is periodic-affine from ``k`` on:
        ``T(m + c) = T(m) + c * lambda`` for every ``m >= k`` with ``c <= 2P``. A fixed order is a
        max-plus linear system in its stage and link times, so its makespan becomes so
        after a transient; :meth:`steady_fit` confirms the period on three of them before using
        it, and refuses a period below the busiest rank's work. tests/pipeline/test_pricer.py measures the
        tier against exact simulation on a grid (P 2-8, M up to 400, uneven stage and hop times)
        for the built-ins: exact for the fixed orders (1F1B, GPipe, interleaved 1F1B, looped BFS,
        ZB-H1, Hanayo; Chimera's show no period in the window and are simulated); for the
        greedy orders built per M (ZB-H2, ZB-V, interleaved ZB, DualPipeV) an order for M may
        leave the period the window showed: within 1% there, exact in most cases. Not used by
        the planner yet (its search keeps :meth:`anchored`, its final plans :meth:`exact`)."""
        n = int(n_mb)
        fit = self.steady_fit(stage_times, hop_times)
        if fit is None or n < fit[0] + fit[1]:
            return self.simulated(ScheduleSpec.from_pieces(stage_times, hop_times, n))
        k, c, times = fit
        r = (n - k) % c
        return times[r] + (n - k - r) // c * (times[c] - times[0])

    def steady_fit(self, stage_times: Sequence[float], hop_times: Sequence[float]) -> tuple | None:
        """``(k, c, times)`` of :meth:`steady_state`: ``k`` = 3P micro-batches (at least twice the
        fewest the schedule runs with), ``times[i]`` the exact makespan at ``k + i`` for i up to
        ``6P``, and ``c`` the least period in 1..2P with ``T(m + c) - T(m)`` the same (relative
        1e-9) for every ``m`` of the window; None where no such period shows, or where it is
        below ``c`` times the busiest rank's work per micro-batch (``max(stage_times)``: every
        rank runs its share of each micro-batch, so no order grows slower in the end; a window
        that shows a slower growth has not left its transient). Cached per input."""
        P = len(stage_times)
        key = ("steady", tuple(map(float, stage_times)), tuple(map(float, hop_times)))
        if key not in self.cache:
            k = max(3 * P, 2 * self.schedule.pricing.min_micro_batches(P))
            times = [self.simulated(ScheduleSpec.from_pieces(key[1], key[2], k + i)) for i in range(6 * P + 1)]
            tol = 1e-9 * max(times[-1], 1.0)
            fit = None
            for c in range(1, 2 * P + 1):
                steps = [times[i + c] - times[i] for i in range(len(times) - c)]
                if max(steps) - min(steps) <= tol:
                    # no period below the busiest rank's work per micro-batch: a path that only
                    # leads for a while (it loses to that rank's from some M on)
                    fit = (k, c, tuple(times)) if steps[0] >= c * max(stage_times) - tol else None
                    break
            self.cache[key] = fit
        return self.cache[key]

    # ------------------------------------------------------------ memory
    def peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Peak in-flight micro-batches per rank for default times (units of a rank's whole
        share): the schedule's ``peak_rule`` where it declares one, else its count along the
        lists of ``ScheduleSpec(ranks, n_mb)`` (``peak_activations``); cached. The first time for
        a number of ranks its lists are also run (:func:`~hexicore.pipeline.simulate.makespan` of
        the template its placement reads, :func:`~hexicore.pipeline.action_placement.built_template`:
        P micro-batches, or the fewest it runs with), so lists that deadlock are refused here
        (a count along them would not see it; the exact price of every final plan simulates it)."""
        key = ("peaks", int(ranks), int(n_mb))
        if key not in self.cache:
            if ("runs", int(ranks)) not in self.cache:  # its lists for P ranks run to the end (once per P, the
                al = built_template(self.cache, self.schedule.template, int(ranks))  # template its placement
                with blamed(self.schedule.name):  # reads: the counts below do not check it)
                    makespan(al, ScheduleSpec(int(ranks), al.micro_batches).timing(al))
                self.cache[("runs", int(ranks))] = True
            rule = self.schedule.peak_rule(int(ranks), int(n_mb))
            self.cache[key] = tuple(float(x) for x in (
                rule if rule is not None else self.schedule.peak_activations(ScheduleSpec(int(ranks), int(n_mb)))))
        return self.cache[key]

    def anchored_peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """The search's peaks, never below :meth:`peaks` at ``n_mb``: the schedule's ``peak_rule``
        at ``n_mb`` where it declares one (exact: GPipe and looped BFS hold all M); BLOCKS: the
        peaks at P (the block it repeats, within the schedule's cap); else the simulated peaks at
        ``n_mb`` up to the window's end ``w = max(4P, 2 x Pricing.min_micro_batches)`` and, above
        it, per rank the most held at any count of the window ``max(2P - 1, fewest it runs with)
        .. w`` (:meth:`peak_window`; exact-or-above where the order's in-flight counts have
        settled by ``w``: measured against :meth:`peaks` for every built-in in
        tests/pipeline/test_pricer.py; a schedule whose peaks grow with M, ``Pricing.peaks_grow``,
        counted at ``w`` alone). The final plan is checked with :meth:`peaks`."""
        n = int(n_mb)
        if self.schedule.pricing.growth == BLOCKS:
            return self.schedule.peaks(ranks, ranks)
        if self.schedule.peak_rule(int(ranks), n) is not None:
            return self.schedule.peaks(ranks, n)
        lo, hi = self.peak_window(ranks)
        if n <= hi:
            return self.schedule.peaks(ranks, n)
        key = ("peak_window", int(ranks))
        if key not in self.cache and self.schedule.pricing.peaks_grow:  # the most of the window is at its end
            self.cache[key] = self.schedule.peaks(ranks, hi)
        if key not in self.cache:
            most, still = None, 0
            for m in range(lo, hi + 1):
                got = self.schedule.peaks(ranks, m)
                grown = got if most is None else tuple(max(a, b) for a, b in zip(most, got))
                still = still + 1 if grown == most else 0
                most = grown
                if still >= max(SETTLED, int(ranks)):
                    break  # settled (see peak_window)
            self.cache[key] = most
        return self.cache[key]

    def peak_window(self, ranks: int) -> tuple[int, int]:
        """The micro-batch counts ``(first, last)`` :meth:`anchored_peaks` simulates for ``ranks``:
        from ``max(2P - 1, fewest it runs with)`` (1F1B saturates at P, interleaved groups hold
        most at 2P - 1) to ``max(4P, 2 x fewest it runs with)`` (Chimera's two directions settle
        by about 3P). It stops earlier once the per-rank most has not grown for
        ``max(SETTLED, P)`` counts in a row: on the built-ins (P 2-16) no run without growth
        before a later growth is longer than P / 2 (Chimera, interleaved ZB with 3 chunks)."""
        least = self.schedule.pricing.min_micro_batches(int(ranks))
        return max(2 * int(ranks) - 1, least), max(4 * int(ranks), 2 * least)
