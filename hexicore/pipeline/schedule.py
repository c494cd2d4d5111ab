"""The pipeline-schedule interface and helpers shared by schedule plugins (docs/plugins.md,
"Writing a schedule plugin").

A schedule turns a :class:`ScheduleSpec` (P ranks, M micro-batches, optional per-rank times)
into per-rank action lists. Plugins implement :meth:`ActionSchedule.order` (compute only);
:meth:`ActionSchedule.actions` runs the shared comm pass (:func:`hexicore.pipeline.comm.insert_comm`).

Schedules generate orders and declare how they are priced; the pricer prices them
(:class:`hexicore.pipeline.pricer.SchedulePricer`, its tiers: closed form, steady-state model,
exact simulation). The planner (:mod:`hexicore.planner.pricing`) asks a schedule through the
methods below, whose defaults are the schedule's pricer and which a plugin overrides only where
its lists depend on more than P and M (synth's on the times it was built for):

* :meth:`ActionSchedule.pipeline_time` — exact PIPELINE-TIME (:meth:`SchedulePricer.exact`: the
  closed form, :meth:`ActionSchedule.closed_form`, where it is exact, else the simulated
  default-time order, built once per P and M). Time-driven orders (greedy) built for the
  actual times by :meth:`ActionSchedule.actions` may differ slightly from that;
* :meth:`ActionSchedule.model_time` — the cheap model the search ranks thousands of candidates
  with, shaped by the declared :class:`Pricing` (:meth:`SchedulePricer.anchored`);
* :meth:`ActionSchedule.peaks` / :meth:`ActionSchedule.model_peaks` — peak in-flight activations
  per rank (the declared rule, :meth:`ActionSchedule.peak_rule`, or simulated:
  :meth:`SchedulePricer.peaks`); :meth:`ActionSchedule.placement` — which blocks, embedding and
  head each rank holds;
* :meth:`ActionSchedule.resolve` — its own choice of free parameters for given times;
* :attr:`ActionSchedule.pricing` — growth kind, fewest ranks and what fewer are priced as,
  whether the cost model's own PIPELINE-TIME formula is the schedule's.

``hexicore simulate`` also prints :meth:`ActionSchedule.closed_bubble` next to the simulated bubble
and the schedule's :meth:`ActionSchedule.note` under it.

Time units follow the cost model: ``stage_times[j]`` is forward + backward of one micro-batch
through rank j's whole share (split ``T_F : T_B = 1 : 2``, HexiScale App. A counts backward as
2x forward), ``hop_times[j]`` the round trip between ranks j and j+1 (cost model COMM-PP-HOP),
so one transfer is half of it.
"""

from __future__ import annotations

import math

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.comm import insert_comm
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.placement import Placement
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.action_placement import built_placement, built_template, chunk_counts
from hexicore.pipeline.pricer import BLOCKS, STEADY, SchedulePricer
from hexicore.pipeline.simulate import SimResult, held_peaks, shares, simulate
from hexicore.pipeline.spec import ScheduleSpec
from hexicore.pipeline.validate import blamed, check_built


@dataclass(frozen=True)
class Pricing:
    """How the planner prices a schedule: declared by each schedule plugin as the class
    attribute ``pricing`` (docs/plugins.md, "Writing a schedule plugin").

    * ``growth`` — how the search's model of PIPELINE-TIME grows with the micro-batch count n
      above P ranks (:meth:`ActionSchedule.model_time`): :data:`STEADY` (affine in n in steady
      state: the bottleneck rank does one F+B per micro-batch; through the exact times at P,
      2P and 3P, beyond them the growth from 2P to 3P or the busiest rank's work per
      micro-batch, whichever is more; exact for n <= P) or :data:`BLOCKS` (the schedule runs
      blocks of P micro-batches: ``ceil(n / P)`` times its time at P, a partial block priced as a whole
      one; its peak activations those at P);
    * ``min_ranks`` — the fewest ranks the schedule runs on; a pipeline with fewer is priced
      as ``fewer_ranks`` (a reference to another schedule; ``None``: refused there);
    * ``cost_model_time`` — the cost model's own closed PIPELINE-TIME (HexiScale App. A:
      ``sum_j (STAGE_j + HOP_j) + (n - 1) max_j (STAGE_j + HOP_j)``) is this schedule's time:
      when it is the configured schedule (not ``auto``) the planner keeps that formula, which
      the CP-SAT solver's proven bound relies on.
    * ``memory_cap`` — its ``memory`` parameter caps peak in-flight micro-batches per rank (a
      number or one per rank): ``schedule=auto``'s final re-pricing passes each pipeline's own
      (:mod:`hexicore.planner.final_schedules`).
    * ``micro_batches_per_rank`` — the schedule needs at least this many micro-batches per rank
      (DualPipeV: 2, ``M >= 2P``; 0: any ``M >= 1``): the search gives each pipeline at least
      :meth:`min_micro_batches` of them or does not use the schedule there, and plan checks
      refuse a pipeline with fewer.
    * ``peaks_grow`` — its per-rank peaks never fall as M grows (an order built greedily per M,
      where more micro-batches only add work: interleaved ZB, DualPipeV): the search reads the
      peaks above the window at the window's end alone, one count instead of one per M of it
      (:meth:`SchedulePricer.anchored_peaks`; tests/pipeline/test_pricer.py checks the
      declaration along the window).
    * ``chained_gradients`` — every rank's last gradient-finishing action is its part of the last
      micro-batch's backward, which runs from the last stage to the first (GPipe, 1F1B): the
      overlapped data-parallel sync of stage j is priced as starting ``sum_{k<j} (BWD_k +
      HOP_k)`` before the pipeline's end (:mod:`hexicore.cost.overlap`); otherwise at its end.
      A chain that visits a rank more than once (interleaved 1F1B, Hanayo's waves, looped BFS)
      is read from the schedule's template (:meth:`ActionSchedule.gradient_chain`), chunk by
      chunk; tests/cost/test_overlap.py checks the declaration against simulated runs.
    * ``simulations`` — about how many simulations of a pipeline building its lists for that
      pipeline costs (1: one build and one simulation; a synthesis that searches orders by
      simulating them: hundreds): under a time budget ``schedule=auto``'s final re-pricing
      begins it only with that many times one simulation of the pipeline left
      (:mod:`hexicore.planner.final_schedules`).

    Exact times: :meth:`ActionSchedule.pipeline_time` (closed form where exact, else simulated);
    peak activations: :meth:`ActionSchedule.peaks` (closed rule if declared, else simulated).
    """

    growth: str = STEADY
    min_ranks: int = 1
    fewer_ranks: ScheduleRef | None = None
    cost_model_time: bool = False
    memory_cap: bool = False
    micro_batches_per_rank: int = 0
    peaks_grow: bool = False
    chained_gradients: bool = False
    simulations: int = 1

    def __post_init__(self) -> None:
        if self.growth not in (STEADY, BLOCKS):
            raise ValueError(f"Pricing.growth must be {STEADY!r} or {BLOCKS!r}, got {self.growth!r}")
        if self.min_ranks < 1:
            raise ValueError(f"Pricing.min_ranks must be >= 1, got {self.min_ranks}")
        if self.simulations < 1:
            raise ValueError(f"Pricing.simulations must be >= 1, got {self.simulations}")
        if self.micro_batches_per_rank < 0:
            raise ValueError(f"Pricing.micro_batches_per_rank must be >= 0, got {self.micro_batches_per_rank}")

    def min_micro_batches(self, ranks: int) -> int:
        """The fewest micro-batches a pipeline of ``ranks`` ranks runs under this schedule."""
        return max(1, self.micro_batches_per_rank * ranks)


@runtime_checkable
class Schedule(Protocol):
    """What the planner, the simulator and the runtimes use of a schedule plugin (docs/plugins.md):
    the action lists, exact and modelled pipeline times, peak activations, the pricing
    declaration, a closed-form bubble and its choice of free parameters. :class:`ActionSchedule`
    implements everything but ``order``."""

    name: str
    pricing: Pricing

    def actions(self, spec: ScheduleSpec) -> ActionList: ...

    def pipeline_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float: ...

    def model_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float: ...

    def peak_activations(self, spec: ScheduleSpec) -> tuple[float, ...]: ...

    def peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]: ...

    def model_peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]: ...

    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None: ...

    def note(self, chosen: ScheduleRef) -> str | None: ...

    def resolve(self, ref: ScheduleRef, stage_times: Sequence[float], hop_times: Sequence[float],
                n_mb: int, rank_layers: Sequence[int] = ()) -> tuple[ScheduleRef, float]: ...


#: what the planner uses of a schedule (``Schedule`` but the action lists); ``pricing`` an attribute
PRICED = ("pricing", "pipeline_time", "model_time", "peak_activations", "peaks", "model_peaks", "resolve")
#: what ``hexicore simulate`` uses of one
SIMULATED = ("actions", "closed_bubble", "note")


# ------------------------------------------------------------------ stage -> rank maps
def loop_map(ranks: int, chunks: int = 1) -> tuple[int, ...]:
    """Megatron's interleaved layout: stage ``s`` on rank ``s mod P`` (``chunks`` loops)."""
    return tuple(s % ranks for s in range(ranks * chunks))


def wave_map(ranks: int, waves: int) -> tuple[int, ...]:
    """Hanayo's wave layout of ``2PW`` stages: 0..P-1, P-1..0, repeated W times (torch's "v")."""
    down = list(range(ranks))
    return tuple((down + down[::-1]) * waves)


def need(ok: bool, name: str, message: str, field_name: str = "schedule") -> None:
    """Refuse a spec the schedule cannot serve: one-line :class:`HexicoreError`."""
    if not ok:
        raise HexicoreError(f"schedule {name!r}: {message}", field=field_name)


def positive_int(value: Any, name: str, key: str, alternative: str = "") -> int:
    """``value`` as an int >= 1 (a whole float or numeric string counts by its value: 2.0, "2",
    "2.0"), else a one-line error naming ``schedule.<key>``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    count = None
    if not isinstance(value, bool):
        try:
            f = float(value)
            if f == int(f) and f >= 1:  # int(inf) overflows, int(nan) is a ValueError
                count = int(value) if isinstance(value, str) and value.strip().isdigit() else int(f)
        except (TypeError, ValueError, OverflowError):
            count = None
    if count is None:
        also = f" {alternative}" if alternative else ""
        raise HexicoreError(f"schedule {name!r}: {key} must be a positive integer{also}, got {shown(value)}",
                            field=f"schedule.{key}")
    return count


def positive_memory(value: Any, name: str, per_rank: bool = False) -> Any:
    """A ``memory`` parameter (cap on in-flight micro-batches per rank) checked: None, a
    positive number (kept as given) or, with ``per_rank``, a list of them (a tuple of floats);
    else a one-line error naming ``schedule.memory``."""
    if value is None:
        return None
    listed = per_rank and isinstance(value, (list, tuple))
    caps = value if listed else [value]
    ok = bool(caps) and all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0
                            for c in caps)
    what = "a positive number or a list of them (each finite)" if per_rank else "a positive number (finite)"
    need(ok, name, f"memory must be {what}, got {shown(value)}", "schedule.memory")
    return tuple(float(c) for c in value) if listed else value


def build(name: str, params: Mapping[str, Any], spec: ScheduleSpec, stage_rank: Sequence[int],
          per_rank: Any, chains: Sequence[Sequence[int]] = (),
          mb_chain: Sequence[int] = (), meta: Mapping[str, Any] | None = None) -> ActionList:
    """Assemble a compute-only :class:`ActionList`, appending ``STEP`` to every rank; ``per_rank``
    may be :class:`hexicore.pipeline.arrays.ActionArrays` (kept as arrays)."""
    from hexicore.pipeline.arrays import STEP, ActionArrays

    if isinstance(per_rank, ActionArrays):
        acts: Any = per_rank.append_per_rank(STEP)
    else:
        acts = tuple(tuple(a) + (Action("STEP"),) for a in per_rank)
    return ActionList(ScheduleRef(name, params), spec.ranks, len(stage_rank), spec.micro_batches,
                      tuple(stage_rank), acts, tuple(tuple(c) for c in chains), tuple(mb_chain), dict(meta or {}))


@dataclass(frozen=True)
class ActionSchedule(ABC):
    """Base of the schedule plugins: ``order`` is the plugin's; the rest is shared, and a plugin
    overrides what it knows better: ``closed_form`` (exact time), ``peak_rule`` (closed
    peak activations), ``closed_bubble``, ``resolve`` (its free parameters) and the class
    attribute ``pricing`` (:class:`Pricing`). Caches live in the instance: the planner builds
    each schedule once per solve (:class:`hexicore.planner.pricing.ScheduleBook`)."""

    _cache: dict = field(default_factory=dict, compare=False, repr=False, init=False)
    _pricer: Any = field(default=None, compare=False, repr=False, init=False)

    name = "abstract"
    pricing = Pricing()

    @abstractmethod
    def order(self, spec: ScheduleSpec) -> ActionList:
        """Compute-only per-rank lists (F/B/I/W, REDUCE, STEP) for ``spec``."""

    def params(self) -> dict[str, Any]:
        return {}

    def unrecorded(self) -> str | None:
        """What a plan's reference to this schedule lacks to rebuild the lists it was priced with
        (a schedule the planner resolves per pipeline records the result; None: nothing)."""
        return None

    def ordered(self, spec: ScheduleSpec) -> ActionList:  # checked before anything reads it
        return check_built(self.order(spec), self.name, spec.ranks, spec.micro_batches)

    def actions(self, spec: ScheduleSpec) -> ActionList:
        """The lists a runtime executes: :meth:`ordered` + the shared comm pass."""
        return insert_comm(self.ordered(spec))

    # --------------------------------------------------------------- time
    @property
    def pricer(self) -> SchedulePricer:
        """This schedule's :class:`~hexicore.pipeline.pricer.SchedulePricer` (sharing its caches)."""
        if self._pricer is None:
            object.__setattr__(self, "_pricer", SchedulePricer(self, self._cache))
        return self._pricer

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        """Exact makespan where a closed form exists for these inputs, else None (simulated): the
        pricer's tier 1, declared by the plugin (helpers in :mod:`hexicore.pipeline.pricer`)."""
        return None

    def simulate(self, spec: ScheduleSpec, *, record: bool = False) -> tuple[ActionList, SimResult]:
        al = self.ordered(spec)
        with blamed(self.name):  # lists that deadlock are the schedule's defect
            return al, simulate(al, spec.timing(al), record=record, comm=False)

    def template(self, ranks: int, n_mb: int) -> ActionList:
        """The order for default times, ``order(ScheduleSpec(ranks, n_mb))`` (cached): the lists a
        runtime gets when it asks for P and M only, and what :meth:`pipeline_time` prices."""
        key = ("template", ranks, n_mb)
        if key not in self._cache:
            self._cache[key] = self.ordered(ScheduleSpec(ranks, n_mb))
        return self._cache[key]

    def price(self, spec: ScheduleSpec) -> float:
        """Makespan of :meth:`template` under ``spec``'s times (:meth:`SchedulePricer.simulated`);
        a schedule choosing its free parameters per input overrides it (Hanayo's ``waves=auto``)."""
        return self.pricer.simulated(spec)

    def pipeline_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """Makespan of one pipeline iteration (planner units; module docstring):
        :meth:`SchedulePricer.exact`."""
        return self.pricer.exact(stage_times, hop_times, n_mb)

    def model_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """The search's PIPELINE-TIME model (:class:`Pricing`, ``growth``): :meth:`SchedulePricer.anchored`."""
        return self.pricer.anchored(stage_times, hop_times, n_mb)

    def time_bound(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """A lower bound on :meth:`pipeline_time` (:meth:`SchedulePricer.lower_bound`, the busiest
        rank's work); a plugin with a tighter one overrides it."""
        return self.pricer.lower_bound(stage_times, hop_times, n_mb)

    # ------------------------------------------------------------ memory
    def peak_activations(self, spec: ScheduleSpec) -> tuple[float, ...]:
        """Peak in-flight activations per rank (units of a rank's whole share) of the order for
        ``spec``: counted along each rank's list (:func:`~hexicore.pipeline.simulate.held_peaks`,
        the simulator's count without its times)."""
        return held_peaks(self.ordered(spec))

    def peak_rule(self, ranks: int, n_mb: int) -> tuple[float, ...] | None:
        """Peak activations per rank by a closed rule (e.g. ``n`` on every rank for fill-drain),
        or None: :meth:`peaks` simulates."""
        return None

    def peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """Peak in-flight micro-batches per rank for default times: :meth:`SchedulePricer.peaks`
        (:meth:`peak_rule`, else simulated)."""
        return self.pricer.peaks(ranks, n_mb)

    def model_peaks(self, ranks: int, n_mb: int) -> tuple[float, ...]:
        """The search's peaks (:meth:`SchedulePricer.anchored_peaks`); the final plan is checked
        with :meth:`peaks`."""
        return self.pricer.anchored_peaks(ranks, n_mb)

    def placement(self, ranks: int, n_mb: int) -> Placement:
        """Blocks, embeddings and heads per rank of a :meth:`template` for P (any n: stage maps and
        chains do not depend on it; a layout that does overrides this), :func:`built_placement`."""
        return built_placement(self._cache, self.template, int(ranks))

    def gradient_chain(self, ranks: int) -> tuple[tuple[int, float], ...] | None:
        """Where the last micro-batch's backward runs, from the chain's first chunk to its last,
        as ``(rank, share of the rank's blocks)`` per chunk, when every rank's last
        gradient-finishing action of each chunk is that micro-batch's (the overlapped DP sync is
        then priced chunk by chunk, :mod:`hexicore.cost.overlap`); None: not so (the sync priced
        from the pipeline's end). Where ``Pricing.chained_gradients``: chain 0 of the
        :meth:`template` for P ranks, each stage at its rank and share."""
        if not self.pricing.chained_gradients:
            return None
        key = ("gradient_chain", int(ranks))
        if key not in self._cache:
            al = built_template(self._cache, self.template, int(ranks))
            share = shares(al)
            self._cache[key] = tuple((al.stage_rank[s], share[s]) for s in al.chains[0])
        return self._cache[key]

    def least_layers(self, ranks: int) -> tuple[int, ...]:  # its chunks of a chain: a layer each
        return chunk_counts(built_template(self._cache, self.template, int(ranks)))

    # ------------------------------------------------------ the schedule's own
    def closed_bubble(self, spec: ScheduleSpec, chosen: ScheduleRef) -> float | None:
        """The bubble ratio the schedule's paper predicts for ``spec`` (``hexicore simulate``
        prints it next to the simulated one), or None where no closed form applies. ``chosen``
        is the section of the lists actually built (free parameters resolved)."""
        return None

    def note(self, chosen: ScheduleRef) -> str | None:
        """A line ``hexicore simulate`` prints under its summary about the lists built as
        ``chosen`` (e.g. the free parameters the schedule chose), or None."""
        return None

    def resolve(self, ref: ScheduleRef, stage_times: Sequence[float], hop_times: Sequence[float],
                n_mb: int, rank_layers: Sequence[int] = ()) -> tuple[ScheduleRef, float]:
        """The reference a plan records for ``ref`` under these times, with its exact time: the
        schedule's own choice of its free parameters (Hanayo's ``waves=auto``, within the ranks'
        blocks ``rank_layers`` where known); by default ``ref`` itself."""
        return ref, self.pipeline_time(stage_times, hop_times, n_mb)

    def share(self, resolved: "ActionSchedule") -> None:
        """Hand ``resolved`` (built from the reference :meth:`resolve` returned) what it can
        reuse of this one's cached work (e.g. synthesised lists); nothing by default."""
