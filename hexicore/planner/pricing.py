"""Schedule-aware pricing for the planner: each pipeline's PIPELINE-TIME and peak activations
come from its own schedule's pricer (:class:`hexicore.pipeline.pricer.SchedulePricer`, through
the schedule's ``pipeline_time`` — tier "exact": the declared closed form, else exact
simulation —, ``model_time`` — the search's anchored model —, ``peaks``/``model_peaks``, which
a plugin overrides only where its lists depend on more than P and M; the declared ``Pricing``,
``resolve``), and ``schedule=auto`` picks per pipeline the fastest schedule that fits. A
schedule whose ``Pricing.cost_model_time`` says so, configured alone, keeps the cost model's own
PIPELINE-TIME (:func:`hexicore.cost.base.fill_drain_time`). The steady-state tier
(:meth:`~hexicore.pipeline.pricer.SchedulePricer.steady_state`) is not used here yet: plans
are priced as before, bit for bit.

* :class:`ScheduleBook` builds schedules once per :class:`ScheduleRef` from the registry and asks
  them: ``exact`` times, ``model`` times (what the search calls thousands of times), ``peaks``
  (peak in-flight micro-batches per rank, the memory the schedule needs); a pipeline with fewer
  ranks than a schedule runs on is priced under the schedule the plugin names for that case,
  one with fewer micro-batches than it needs (``Pricing.micro_batches_per_rank``) is infinitely
  slow and never fits, so no search keeps it;
* :func:`timed_cost` injects those into a cost model (``pipeline_timer`` + ``activation``);
* :func:`native_cost` keeps the cost model's own PIPELINE-TIME, with the schedules' peaks;
* :func:`schedule_pricing` is the cost model and book a problem is solved with;
* :func:`plan_cost` is the cost model a made plan is priced with (what evaluate recomputes);
* :func:`options` lists the schedules ``schedule=auto`` chooses from (its ``options``, by default
  those of conf/schedule/auto.yaml).

The search only ranks candidates with the modelled times; the final plan is re-priced and its
schedules re-chosen exactly (:func:`choose_exact`). The core names no schedule: everything
schedule-specific is declared by the schedule plugins.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Mapping, Sequence

import yaml

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost.base import bad_number
from hexicore.planner.stage_layout.pipeline_fit import capped, fits
from hexicore.pipeline.pricer import worth_pricing
from hexicore.pipeline.schedule import PRICED
from hexicore.registry import accepts, require

#: a schedule's free parameters are chosen on at most this many of its periods of micro-batches
#: (:meth:`ScheduleBook.choosing_micro_batches`)
CHOOSE_PERIODS = 4
#: :func:`choose_exact` prices at most this many options besides a pipeline's own exactly, in
#: the order of their modelled times, and none modelled more than ``RANK_MARGIN`` (relative)
#: above the best exact time found (the search's model errs by a few percent on uneven stages)
RANKED = 2
RANK_MARGIN = 0.03
#: the planner's keyword for "choose per pipeline among ``options``" (no schedule plugin)
AUTO = "auto"
#: why a schedule book has no ``auto``: it is the hexiscale search's choice, not a schedule
AUTO_ONLY = ("schedule=auto is chosen by solver=hexiscale only (its search gives each pipeline a schedule); "
             "with other solvers name one schedule, e.g. schedule=1f1b")


def is_auto(schedule: Mapping[str, Any]) -> bool:
    return ScheduleRef.from_mapping(schedule).name == AUTO


def auto_defaults() -> dict[str, Any]:
    """``schedule=auto``'s shipped config, conf/schedule/auto.yaml (its default ``options``)."""
    text = resources.files("hexicore.conf").joinpath("schedule", "auto.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text) or {}


def options(schedule: Mapping[str, Any]) -> tuple[ScheduleRef, ...]:
    """The schedules the planner may give a pipeline: ``schedule=auto``'s ``options`` (each
    ``{name, ...params}``; conf/schedule/auto.yaml's when none are given), else the configured
    schedule alone."""
    ref = ScheduleRef.from_mapping(schedule)
    if ref.name != AUTO:
        return (ref,)
    raw = ref.get("options") or auto_defaults().get("options") or []
    out = []
    for i, o in enumerate(raw):
        if not isinstance(o, Mapping) or not isinstance(o.get("name"), str) or o["name"] == AUTO:
            raise HexicoreError(f"each option must be a mapping with a schedule name, got {o!r}",
                                field=f"schedule.options[{i}]")
        out.append(ScheduleRef.from_mapping(o))
    if not out:
        raise HexicoreError("schedule=auto needs at least one option", field="schedule.options")
    return tuple(out)


@dataclass(frozen=True)
class ScheduleBook:
    """Schedules built once per reference from ``registry``; exact and modelled times, peaks.
    Caches are local to one book (one solve): the schedules keep them."""

    registry: Any
    _built: dict = field(default_factory=dict, compare=False, repr=False)
    _priced: dict = field(default_factory=dict, compare=False, repr=False)

    def schedule(self, ref: Mapping[str, Any]) -> Any:
        """The schedule plugin object for ``ref`` (built on first use)."""
        ref = ScheduleRef.from_mapping(ref)
        hit = self._built.get(ref)
        if hit is None:
            if ref.name == AUTO:
                raise HexicoreError(AUTO_ONLY, field="schedule")
            hit = self.registry.create("schedule", ref.name, **ref.kwargs())
            require("schedule", ref.name, hit, PRICED)  # priced: more than the lists a run needs
            self._built[ref] = hit
        return hit

    def usable(self, ref: Mapping[str, Any], ranks: int) -> bool:
        """Whether the schedule runs on ``ranks`` ranks (its ``Pricing.min_ranks``)."""
        return ranks >= self.schedule(ref).pricing.min_ranks

    def effective(self, ref: Mapping[str, Any], ranks: int) -> ScheduleRef:
        """The reference a pipeline of ``ranks`` is priced under: ``ref``, or where the schedule
        needs more ranks the one its ``Pricing.fewer_ranks`` names."""
        ref = ScheduleRef.from_mapping(ref)
        pricing = self.schedule(ref).pricing
        if ranks >= pricing.min_ranks:
            return ref
        if pricing.fewer_ranks is None:
            raise HexicoreError(f"schedule {ref.name!r} needs at least {pricing.min_ranks} pipeline ranks, got "
                                f"{ranks}", field="schedule")
        return self.effective(pricing.fewer_ranks, ranks)

    def native(self, ref: Mapping[str, Any]) -> bool:
        """Whether the cost model's own PIPELINE-TIME is this schedule's (``Pricing.cost_model_time``)."""
        return not is_auto(ref) and self.schedule(ref).pricing.cost_model_time

    def priced(self, ref: Mapping[str, Any], ranks: int) -> Any:
        """The schedule object a pipeline of ``ranks`` under ``ref`` is priced by (:meth:`effective`; cached)."""
        if not isinstance(ref, ScheduleRef):
            ref = ScheduleRef.from_mapping(ref)
        key = (ref, ranks)
        hit = self._priced.get(key)
        if hit is None:
            hit = self._priced[key] = self.schedule(self.effective(ref, ranks))
        return hit

    def min_micro_batches(self, ref: Mapping[str, Any], ranks: int) -> int:
        """The fewest micro-batches a pipeline of ``ranks`` runs under ``ref`` (the schedule's own
        ``Pricing.min_micro_batches``: the runtime executes ``ref`` itself, whatever prices it; cached:
        the search asks on every modelled time)."""
        if not isinstance(ref, ScheduleRef):
            ref = ScheduleRef.from_mapping(ref)
        key = ("min", ref, ranks)
        hit = self._priced.get(key)
        if hit is None:
            hit = self._priced[key] = self.schedule(ref).pricing.min_micro_batches(ranks)
        return hit

    def least(self, ref: Mapping[str, Any], ranks: int) -> tuple[int, ...]:
        """Per rank the fewest layers a pipeline of ``ranks`` under ``ref`` may give it: the chunks
        the runtime cuts its blocks into (the schedule's ``least_layers``; one each for a schedule
        without it, or where ``ref`` does not run on ``ranks``); cached."""
        ref = ScheduleRef.from_mapping(ref)
        key = ("least", ref, ranks)
        if key not in self._priced:
            probe = getattr(self.schedule(ref), "least_layers", None) if self.usable(ref, ranks) else None
            try:
                self._priced[key] = tuple(int(k) for k in probe(ranks)) if probe is not None else (1,) * ranks
            except HexicoreError:
                self._priced[key] = (1,) * ranks
        return self._priced[key]

    def chunks(self):
        """Per pipeline, per rank the model chunks its schedule runs there (:meth:`least`: the
        chunks the runtime cuts a rank's blocks into), for a cost model that prices each
        action's fixed cost (``schedule_chunks``)."""
        return lambda pipe: self.least(pipe.schedule, len(pipe.stages))

    def runs(self, ref: Mapping[str, Any], ranks: int, n: int) -> bool:
        """Whether a pipeline of ``ranks`` with ``n`` micro-batches runs under ``ref``."""
        return self.usable(ref, ranks) and n >= self.min_micro_batches(ref, ranks)

    def exact(self, ref: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float], n: int,
              rank_layers: Sequence[int] = ()) -> float:
        """The schedule's exact ``pipeline_time`` (its pricer's tier "exact"); with ``rank_layers``
        (each rank's blocks) for a schedule whose ``pipeline_time`` takes them, so it prices the lists the runtime builds
        for those blocks (synth leaves out layouts a rank's blocks cannot hold)."""
        if n < self.min_micro_batches(ref, len(stage_s)):
            return math.inf
        timed = self.priced(ref, len(stage_s)).pipeline_time
        return _time(timed(stage_s, hop_s, int(n), **layers_for(timed, rank_layers)), ref, "pipeline_time")

    def model(self, ref: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
        """The search's PIPELINE-TIME (the schedule's ``model_time``: its pricer's anchored model)."""
        if n < self.min_micro_batches(ref, len(stage_s)):
            return math.inf
        return _time(self.priced(ref, len(stage_s)).model_time(stage_s, hop_s, int(n)), ref, "model_time")

    def bound(self, ref: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
        """A lower bound on :meth:`exact` under these stage times — those of the schedule's own
        placement (the schedule's ``time_bound``; inf where it does not run)."""
        if not self.runs(ref, len(stage_s), n):
            return math.inf
        return _time(self.priced(ref, len(stage_s)).time_bound(stage_s, hop_s, int(n)), ref, "time_bound")

    def peaks(self, ref: Mapping[str, Any], ranks: int, n: int, rank_layers: Sequence[int] = ()) -> tuple[float, ...]:
        """Peak in-flight micro-batches per rank (units of a rank's whole share), of the lists
        built for the ranks' blocks where the schedule takes them (as :meth:`exact`)."""
        if n < self.min_micro_batches(ref, ranks):
            return (math.inf,) * ranks
        peaks = self.priced(ref, ranks).peaks
        return _peaks(peaks(ranks, n, **layers_for(peaks, rank_layers)), ref, ranks, "peaks")

    def model_peaks(self, ref: Mapping[str, Any], ranks: int, n: int) -> tuple[float, ...]:
        """The search's peaks (the schedule's ``model_peaks``); the final plan is checked with
        :meth:`peaks`."""
        if n < self.min_micro_batches(ref, ranks):
            return (math.inf,) * ranks
        return _peaks(self.priced(ref, ranks).model_peaks(ranks, n), ref, ranks, "model_peaks")

    def resolve(self, ref: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float],
                n: int, rank_layers: Sequence[int] = ()) -> tuple[ScheduleRef, float]:
        """The reference a plan records for ``ref`` under these times, with its exact time (the
        schedule's own choice of its free parameters, ``resolve``, within ``rank_layers``, the
        blocks of each rank, for a schedule whose ``resolve`` takes them); a pipeline with
        fewer ranks than the schedule runs on keeps ``ref``, priced as :meth:`effective` says.
        Cached per input (a schedule's choice is a pure function of them: the search's exact
        pricing and the final re-pricing of the same pipeline resolve once)."""
        ref = ScheduleRef.from_mapping(ref)
        key = ("resolve", ref, tuple(map(float, stage_s)), tuple(map(float, hop_s)), int(n), tuple(rank_layers))
        hit = self._priced.get(key)
        if hit is None:
            hit = self._priced[key] = self._resolved(ref, stage_s, hop_s, n, rank_layers)
        return hit

    def _resolved(self, ref: ScheduleRef, stage_s: Sequence[float], hop_s: Sequence[float],
                  n: int, rank_layers: Sequence[int]) -> tuple[ScheduleRef, float]:
        """:meth:`resolve` computed."""
        if not self.runs(ref, len(stage_s), n):
            return ref, self.exact(ref, stage_s, hop_s, n)
        sched = self.schedule(ref)
        rep = self.choosing_micro_batches(ref, len(stage_s), n)
        chosen, secs = sched.resolve(ref, stage_s, hop_s, rep, **layers_for(sched.resolve, rank_layers))
        _time(secs, ref, "resolve")
        if rep != n:  # chosen on fewer micro-batches: priced exactly at n
            secs = self.exact(chosen, stage_s, hop_s, n, rank_layers)
        if chosen != ref and chosen not in self._built:  # its work is reused (ActionSchedule.share)
            share = getattr(sched, "share", None)
            if share is not None:
                share(self.schedule(chosen))
        return chosen, secs

    def choosing_micro_batches(self, ref: Mapping[str, Any], ranks: int, n: int) -> int:
        """The micro-batches a schedule's free parameters are chosen on (:meth:`resolve`): ``n`` up
        to :data:`CHOOSE_PERIODS` times the schedule's period (``ranks``, or the fewest
        micro-batches it runs with), else ``n`` reduced by whole periods to that range — the same
        steady state and remainder, so a choice between orders that differ in their steady state
        is made where it shows, for a cost that does not grow with ``n``."""
        period = max(ranks, self.min_micro_batches(ref, ranks))
        span = CHOOSE_PERIODS * period
        if n <= span:
            return int(n)
        first = span - period + 1  # the last whole period below the span: n's remainder kept
        return int(first + (n - first) % period)

    def timer(self, modelled: bool = False):
        """A ``hexicore.cost.PipelineTimer`` pricing each pipeline under its own schedule."""
        def timer(pipe: Pipeline, stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
            if modelled:
                return self.model(pipe.schedule, stage_s, hop_s, n)
            return self.exact(pipe.schedule, stage_s, hop_s, n, pipe.stage_layers)

        return timer

    def activation(self, modelled: bool = False):
        """A ``hexicore.cost.ActivationFn``: stage j's peak under the pipeline's schedule."""
        if modelled:
            return lambda pipe, j, n: self.model_peaks(pipe.schedule, len(pipe.stages), n)[j]
        return lambda pipe, j, n: self.peaks(pipe.schedule, len(pipe.stages), n, pipe.stage_layers)[j]

    def gradient_chain(self, pipe: Pipeline) -> tuple[tuple[int, float], ...] | None:
        """Where ``pipe``'s schedule (the one it runs on its ranks) runs the last micro-batch's
        backward, chunk by chunk (``ActionSchedule.gradient_chain``), or None; kept per schedule
        and rank count (the search asks for every pipeline it prices)."""
        key = ("gradient_chain", ScheduleRef.from_mapping(pipe.schedule), len(pipe.stages))
        if key not in self._priced:
            try:
                ref = self.effective(pipe.schedule, len(pipe.stages))
            except HexicoreError:  # a schedule this pipeline cannot run: priced as never fitting anyway
                self._priced[key] = None
                return None
            chain = getattr(self.schedule(ref), "gradient_chain", None)
            self._priced[key] = chain(len(pipe.stages)) if chain is not None else None
        return self._priced[key]

    def placement(self):
        """A ``hexicore.cost.PlacementFn``: which blocks, embeddings and heads each rank holds
        under the pipeline's schedule (its ``placement``, given the ranks' blocks where it takes
        ``rank_layers``, as :meth:`exact`), None where that is the plain one."""

        def placed(pipe: Pipeline, n: int) -> Any:
            ranks, blocks = len(pipe.stages), pipe.stage_layers
            key = ("placement", ScheduleRef.from_mapping(pipe.schedule), ranks, int(n), blocks)
            if key not in self._priced:
                sched = self.priced(key[1], ranks)
                runs = n >= self.min_micro_batches(key[1], ranks)  # else priced as never fitting
                how = getattr(sched, "placement", None) if runs else None
                pl = how(ranks, int(n), **layers_for(how, blocks)) if how is not None else None
                self._priced[key] = None if pl is None or pl.is_plain else pl
            return self._priced[key]

        return placed


def layers_for(method: Any, rank_layers: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """``{"rank_layers": ...}`` for a schedule method that takes the keyword, where known (every
    rank holds a block: a template pipeline of empty stages, as a solver's tables price one,
    says nothing of the layout); else nothing (a plugin written without it is called as before)."""
    known = bool(rank_layers) and min(rank_layers) >= 1
    return {"rank_layers": tuple(int(k) for k in rank_layers)} if known and accepts(method, "rank_layers") else {}


def _time(value: Any, ref: Mapping[str, Any], what: str) -> float:
    """A schedule plugin's time (``what``: its method), a number >= 0 (inf: never runs), else one line."""
    if (bad := bad_number([value])) is not None:
        raise HexicoreError(f"{what}() returned {bad!r}; times are numbers >= 0", source=f"schedule {ref['name']}")
    return value


def _peaks(values: Any, ref: Mapping[str, Any], ranks: int, what: str) -> tuple[float, ...]:
    """A schedule plugin's peak activations: one number >= 0 per rank, else a one-line error."""
    values = tuple(values) if hasattr(values, "__iter__") and not isinstance(values, str) else (values,)
    got = f"{len(values)} values for {ranks} ranks" if len(values) != ranks else bad_number(values)
    if got is not None:
        raise HexicoreError(f"{what}() returned {got!s}; one number >= 0 per rank", source=f"schedule {ref['name']}")
    return values


def timed_cost(cost: Any, book: ScheduleBook, modelled: bool = False) -> Any:
    """``cost`` whose pipeline term and activation memory follow each pipeline's schedule
    (a frozen dataclass with ``pipeline_timer``/``activation`` fields, e.g. AnalyticCostModel)."""
    return with_placement(replace(cost, pipeline_timer=book.timer(modelled), activation=book.activation(modelled)),
                          book)


def with_placement(cost: Any, book: ScheduleBook) -> Any:
    """``cost`` whose memory and stage times follow each pipeline's schedule's placement (a
    cost model with a ``placement`` field, e.g. AnalyticCostModel; others unchanged), and whose
    chunks per rank are the schedule's (a cost model with ``schedule_chunks``, the profiled one)."""
    if hasattr(cost, "schedule_chunks"):
        cost = replace(cost, schedule_chunks=book.chunks())
    if hasattr(cost, "gradient_chain"):
        cost = replace(cost, gradient_chain=book.gradient_chain)
    return replace(cost, placement=book.placement()) if hasattr(cost, "placement") else cost


def native_cost(cost: Any, book: ScheduleBook) -> Any:
    """``cost`` (a frozen dataclass with an ``activation`` field) pricing each pipeline by its
    own PIPELINE-TIME (App. A; any injected ``pipeline_timer`` removed), with the peak
    activations and placement of each pipeline's schedule (:func:`with_placement`)."""
    if hasattr(cost, "pipeline_timer"):
        cost = replace(cost, pipeline_timer=None)
    return with_placement(replace(cost, activation=book.activation()), book)


def schedule_pricing(cost: Any, schedule: Mapping[str, Any], registry: Any) -> tuple[Any, ScheduleBook | None]:
    """The cost model a problem configured with ``schedule`` is solved with, and the book that
    prices its pipelines (``Problem.pricing``). A schedule whose time is the cost model's own
    formula (``Pricing.cost_model_time``) keeps it — the book then only supplies the schedule's
    peak activations, and ``None`` is returned as the book; any other schedule, and
    ``schedule=auto``, is priced by the schedules. A cost model without an ``activation``
    field is returned unchanged (``schedule=auto`` then builds its book in the search)."""
    if not hasattr(cost, "activation"):
        return cost, None
    book = ScheduleBook(registry)
    if book.native(schedule):
        return native_cost(cost, book), None
    return timed_cost(cost, book), book


def plan_cost(cost: Any, plan: Any, book: ScheduleBook | None) -> Any:
    """The cost model a made ``plan`` is priced with, by ``hexicore evaluate`` and in the
    estimate ``hexicore plan`` writes (so the two agree however the plan was searched): where
    every pipeline runs a schedule whose time is the cost model's own formula
    (``Pricing.cost_model_time``: 1F1B, App. A's PIPELINE-TIME) that formula, as a plan searched
    under that schedule alone is priced (:func:`schedule_pricing`); otherwise each pipeline
    priced by its schedule (:func:`timed_cost`). ``cost`` may be either already (a problem's);
    without a book, or for a cost model without ``pipeline_timer`` and ``activation`` fields, it
    is returned unchanged."""
    if book is None or not hasattr(cost, "activation") or not hasattr(cost, "pipeline_timer"):
        return cost
    if all(book.native(p.schedule) for p in plan.pipelines):
        return native_cost(cost, book)
    return timed_cost(cost, book)


def choose_exact(book: ScheduleBook, cost: Any, plan: Any, refs: Sequence[ScheduleRef],
                 deadline: float = math.inf) -> tuple[Any, list]:
    """Per pipeline of ``plan`` (layers and batches fixed), the exactly fastest schedule among
    ``refs`` whose peak activations fit every stage's devices; the pipeline's own schedule
    stays a candidate, so no pipeline gets slower. The others are priced exactly in the order of
    the search's modelled times (:meth:`ScheduleBook.model`), bounds first: at most
    :data:`RANKED` of them, none whose modelled time is more than :data:`RANK_MARGIN` above the
    best fitting exact time so far, none whose lower bound (:meth:`ScheduleBook.bound`) leaves
    no room for a gain of :data:`~hexicore.pipeline.pricer.LEAST_GAIN`, and none that would end
    past ``deadline`` (``time.monotonic()``; the pipeline's own is priced still): an option is
    modelled, or priced, only while the slowest modelling, or pricing, seen so far in this call
    still ends within it (on 80 stages of 512 micro-batches one option's model, three
    simulations, takes 0.3-0.8 s: modelling every option of a 320-GPU plan's pipelines took a
    search 2.7 s past its budget). Returns the new plan and, per pipeline,
    ``{schedule name: seconds}`` of the options priced."""
    pipes, tried = [], []
    slowest = {"model": 0.0, "price": 0.0}  # seconds: one option's modelling, one exact pricing
    for p in plan.pipelines:
        best, seen = None, {}
        n = p.n_micro_batches(plan.train.micro_batch)
        pieces = cost.pipeline_pieces(plan, p)
        others = [r for r in refs if r != p.schedule and book.runs(r, len(p.stages), n)]
        modelled = {}
        for r in others:
            if time.monotonic() + slowest["model"] > deadline:
                break
            began = time.monotonic()
            modelled[r] = book.model(r, *pieces, n)
            slowest["model"] = max(slowest["model"], time.monotonic() - began)
        ranked = sorted(modelled, key=lambda r: modelled[r])
        for i, ref in enumerate([p.schedule] + ranked):
            if not book.runs(ref, len(p.stages), n):
                continue
            if best is not None and time.monotonic() + slowest["price"] > deadline:
                break
            if best is not None and best[0] and (i > RANKED or modelled[ref] > best[1] * (1 + RANK_MARGIN)
                                                 or not worth_pricing(placed_bound(book, cost, plan, p, ref), best[1])):
                continue
            began = time.monotonic()
            ref, secs = resolve_placed(book, cost, plan, Pipeline(p.batch, p.stages, ref))
            slowest["price"] = max(slowest["price"], time.monotonic() - began)
            seen[ref.name] = round(secs, 6)
            ok = fits(book, cost, plan, Pipeline(p.batch, p.stages, ref))
            if best is None or (ok, -secs) > (best[0], -best[1] + 1e-12):
                best = (ok, secs, ref)
        pipes.append(Pipeline(p.batch, p.stages, best[2] if best else p.schedule))
        tried.append(seen)
    return replace(plan, pipelines=tuple(pipes)), tried


def placed_bound(book: ScheduleBook, cost: Any, plan: Any, pipe: Pipeline, ref: ScheduleRef) -> float:
    """:meth:`ScheduleBook.bound` of ``pipe`` under ``ref``, read on the stage and hop times of
    ``ref``'s own placement (``cost.pipeline_pieces``): what the bound speaks of, where ``ref``
    puts the embedding, the head or copies elsewhere than ``pipe``'s schedule does."""
    pieces = cost.pipeline_pieces(plan, Pipeline(pipe.batch, pipe.stages, ref))
    return book.bound(ref, *pieces, pipe.n_micro_batches(plan.train.micro_batch))


def resolve_placed(book: ScheduleBook, cost: Any, plan: Any, pipe: Pipeline) -> tuple[ScheduleRef, float]:
    """:meth:`ScheduleBook.resolve` of ``pipe``'s schedule under the stage times of its own
    placement (``cost.pipeline_pieces`` of ``pipe``: a schedule that puts the head on rank 0, or
    two copies on a rank, is priced with that rank's real work). Where the resolved schedule
    places its pieces otherwise than priced (a synthesised V layout moves the head to rank 0),
    it is priced exactly under its own placement's times, and resolved once more for those
    times; the faster of the two, exactly priced, is returned."""
    n = pipe.n_micro_batches(plan.train.micro_batch)
    pieces = cost.pipeline_pieces(plan, pipe)
    blocks = pipe.stage_layers
    chosen, secs = book.resolve(pipe.schedule, *pieces, n, blocks)
    own = cost.pipeline_pieces(plan, Pipeline(pipe.batch, pipe.stages, chosen)) if chosen != pipe.schedule else pieces
    if own == pieces:
        return chosen, secs
    best = (book.exact(chosen, *own, n, blocks), chosen)
    again, _ = book.resolve(pipe.schedule, *own, n, blocks)
    if again != chosen:
        t = book.exact(again, *cost.pipeline_pieces(plan, Pipeline(pipe.batch, pipe.stages, again)), n, blocks)
        best = min(best, (t, again), key=lambda x: x[0])
    return best[1], best[0]


def resolve_plan(book: ScheduleBook, cost: Any, plan: Any) -> Any:
    """``plan`` with each pipeline's schedule as it records itself under the pipeline's own
    stage and hop times (:meth:`ScheduleBook.resolve`: free parameters chosen, a synthesised
    schedule's times recorded; a schedule built within a memory cap gets the pipeline's own,
    :func:`capped`; priced under its own placement, :func:`resolve_placed`), so evaluate and the
    runtime rebuild the very lists priced."""
    pipes = []
    for p in plan.pipelines:
        ref = capped(book, cost, plan, p, ScheduleRef.from_mapping(p.schedule))
        ref, _ = resolve_placed(book, cost, plan, Pipeline(p.batch, p.stages, ref))
        pipes.append(Pipeline(p.batch, p.stages, ref))
    return replace(plan, pipelines=tuple(pipes))
