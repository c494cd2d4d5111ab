"""Schedule ``synth``: per-rank action lists synthesised for a pipeline's own stage times
(:mod:`hexicore.pipeline.synthesis`: greedy list scheduling over three layouts and two rules, then
double justification), under a per-rank activation cap.

Inputs: the spec's per-rank T_F, T_I, T_W and hop times (from the plan and the cost model, or a
profile) and ``memory``, the cap on peak in-flight micro-batches per rank (units of the rank's
whole share; one number, or a list with one per rank; default P, 1F1B's rank-0 peak).
``effort``: ``full`` (default) or ``quick`` (one candidate per layout refined, no admission
descent, 200 swap trials: what ``schedule=auto``'s final re-pricing uses, a few times faster).
A plan records the stage and hop times it was synthesised for (``stage_times``, ``hop_times``
in the ``schedule`` section, planner units: T_F + T_B per micro-batch, one round trip per hop):
a synth with recorded times always builds the lists for those times (:meth:`Synth.order`), so
a runtime that asks for P and M only, and ``hexicore evaluate`` under any cost model, get the
very lists the plan was priced with (evaluate prices them under its own times).
Layouts: only those whose chunks every rank can hold, one block each at least
(:func:`fitting_layouts`, where the spec gives ``rank_layers``, as the runtime and the planner's
``resolve`` do): a rank of one block never gets the ``v`` or ``loop2`` layout's two chunks.
Phases: those of the layout and rule chosen (warm-up forwards, steady F / I with W's filling
gaps, cool-down), reshaped by justification around the slow ranks.
Memory: at most ``memory`` per rank (the simulated peak is checked; if no candidate fits, the
one with the lowest peak is kept and ``peaks`` reports it).
Bubble: no closed form (it is built for uneven times); with equal times it matches the best
zero-bubble order's ``(3M + (P-1)/2) T`` or better. ``hexicore.pipeline.synthesis.lower_bound``
gives the bound docs/results.md measures it against.
Pricing: exact time simulated on the lists built for the given times (a synthesis, cached per
input); the search's model (thousands of calls) prices two of its first candidates, built once
per P and M for equal times, under the given times (:meth:`Synth.model_time`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from hexicore.core.errors import shown
from hexicore.core.limits import SCHEDULE_S
from hexicore.core.placement import Placement
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.action_placement import placement
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, need, positive_memory
from hexicore.pipeline.simulate import compile_lists, makespan
from hexicore.pipeline.synthesis import LAYOUTS, candidate, caps_of, layout_map, lower_bound, synthesize

#: ``effort`` -> :func:`hexicore.pipeline.synthesis.synthesize` settings
EFFORT = {"full": {}, "quick": {"keep": 1, "admit_rounds": 0, "swaps": 200}}
#: ``effort`` -> about how many simulations of a pipeline one synthesis costs (``Pricing.simulations``),
#: measured as a synthesis's seconds over one simulation of the pipeline's schedule on pipelines of
#: 4-9 ranks and 8-256 micro-batches: quick 140-190, full 450-900
SIMULATIONS = {"full": 900, "quick": 200}


def times(value: Any, name: str, key: str, zero_ok: bool = False) -> tuple[float, ...]:
    """Recorded ``stage_times`` / ``hop_times``: a list of numbers of seconds within
    :data:`hexicore.core.limits.SCHEDULE_S` (or 0 with ``zero_ok``), as a tuple; else a one-line
    error naming ``schedule.<key>``."""
    low, high = SCHEDULE_S
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        and (x == 0 and zero_ok or low <= x <= high) for x in value)
    sign = "non-negative" if zero_ok else "positive"
    need(ok, name, f"{key} must be a list of {sign} numbers of seconds from {low:g} to {high:g}, got {shown(value)}",
         f"schedule.{key}")
    return tuple(float(x) for x in value)


@dataclass(frozen=True)
class Synth(ActionSchedule):
    memory: Any = None
    stage_times: Any = None
    hop_times: Any = None
    effort: str = "full"
    name = "synth"

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", positive_memory(self.memory, self.name, per_rank=True))
        if self.stage_times is not None:
            object.__setattr__(self, "stage_times", times(self.stage_times, self.name, "stage_times"))
            need(len(self.stage_times) > 0, self.name, "stage_times needs one entry per rank", "schedule.stage_times")
        if self.hop_times is not None:
            object.__setattr__(self, "hop_times", times(self.hop_times, self.name, "hop_times", zero_ok=True))
            P = len(self.stage_times or ())
            need(self.stage_times is not None and len(self.hop_times) == P - 1, self.name,
                 f"hop_times needs one entry per hop between the {P} ranks of stage_times, got "
                 f"{len(self.hop_times)}", "schedule.hop_times")
        need(self.effort in EFFORT, self.name, f"effort must be one of {sorted(EFFORT)}, got {shown(self.effort)}",
             "schedule.effort")

    @property
    def pricing(self) -> Pricing:  # type: ignore[override]
        """A synthesis simulates hundreds of orders: as many as its effort makes (:data:`SIMULATIONS`)."""
        return Pricing(memory_cap=True, simulations=SIMULATIONS[self.effort])

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.memory is not None:
            out["memory"] = [float(c) for c in self.memory] if isinstance(self.memory, tuple) else self.memory
        if self.effort != "full":
            out["effort"] = self.effort
        if self.stage_times is not None:
            out["stage_times"] = [float(x) for x in self.stage_times]
            out["hop_times"] = [float(x) for x in (self.hop_times or [0.0] * (len(self.stage_times) - 1))]
        return out

    def unrecorded(self) -> str | None:
        """A plan's synth section records the times its lists were synthesised for."""
        return None if self.stage_times is not None else "stage_times and hop_times (the times its lists were built for)"

    def cap(self, ranks: int) -> float | tuple[float, ...]:
        """The cap on peak in-flight micro-batches: one number, or one per rank."""
        if self.memory is None:
            return float(ranks)
        if isinstance(self.memory, tuple):
            need(len(self.memory) == ranks, self.name, f"memory has {len(self.memory)} entries for {ranks} ranks",
                 "schedule.memory")
            return self.memory
        return float(self.memory)

    def _spec(self, spec: ScheduleSpec) -> ScheduleSpec:
        """What the lists are built for: the recorded times when there are some (a plan's
        schedule: the runtime and evaluate get the lists the plan was priced with), else
        ``spec``."""
        if self.stage_times is None:
            return spec
        need(len(self.stage_times) == spec.ranks, self.name,
             f"stage_times has {len(self.stage_times)} entries for {spec.ranks} ranks", "schedule.stage_times")
        return ScheduleSpec.from_pieces(self.stage_times, self.hop_times or [0.0] * (spec.ranks - 1),
                                        spec.micro_batches, spec.rank_layers)

    def order(self, spec: ScheduleSpec) -> ActionList:
        need(spec.ranks >= 1 and spec.micro_batches >= 1, self.name, "needs ranks >= 1 and micro_batches >= 1")
        spec = self._spec(spec)
        key = ("synth", spec)
        if key not in self._cache:
            s = synthesize(spec, self.cap(spec.ranks), layouts=fitting_layouts(spec), **EFFORT[self.effort])
            self._cache[key] = build(self.name, self.params(), spec, s.stage_rank, s.lists,
                                     meta={"layout": s.layout, "synth_makespan": s.makespan})
        return self._cache[key]

    def placement(self, ranks: int, n_mb: int, rank_layers: Sequence[int] = ()) -> Placement:
        """The layout synthesised for the recorded times (the ``v`` layout puts the head on rank
        0), among those ranks holding ``rank_layers`` blocks can run where given; without
        recorded times (the search, before :meth:`resolve`) the layout is not chosen yet and the
        plain one (linear) is assumed."""
        if self.stage_times is None:
            return Placement.plain(int(ranks))
        return placement(self.order(ScheduleSpec(int(ranks), int(n_mb), rank_layers=tuple(rank_layers))))

    def least_layers(self, ranks: int) -> tuple[int, ...]:
        """One block a rank: given the ranks' blocks, synth builds only layouts they hold
        (:func:`fitting_layouts`; ``linear``, one chunk a rank, always does)."""
        return (1,) * int(ranks)

    def peaks(self, ranks: int, n_mb: int, rank_layers: Sequence[int] = ()) -> tuple[float, ...]:
        """Peak in-flight micro-batches per rank of the lists :meth:`order` builds, for ranks
        holding ``rank_layers`` blocks where given (as the runtime asks for them)."""
        if not rank_layers:
            return super().peaks(ranks, n_mb)
        key = ("peaks", int(ranks), int(n_mb), tuple(int(k) for k in rank_layers))
        if key not in self._cache:
            spec = ScheduleSpec(int(ranks), int(n_mb), rank_layers=key[3])
            self._cache[key] = tuple(float(x) for x in self.peak_activations(spec))
        return self._cache[key]

    def pipeline_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int,
                      rank_layers: Sequence[int] = ()) -> float:
        """The makespan of the lists :meth:`order` builds, for ranks holding ``rank_layers``
        blocks where given (as the runtime asks for them: :func:`fitting_layouts`)."""
        spec = ScheduleSpec.from_pieces(stage_times, hop_times, n_mb, rank_layers)
        return self.simulate(spec)[1].makespan

    def model_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """The search's cheap model (thousands of calls): two of synth's own first candidates
        (linear and V layouts, backward first, under the cap) built once per P and M for equal
        times, the faster under these times; the final plan is re-priced exactly
        (:meth:`pipeline_time`)."""
        P, n = len(stage_times), int(n_mb)
        key = ("seeds", P, n)
        if key not in self._cache:
            base, caps = ScheduleSpec(P, n), caps_of(self.cap(P), P)
            self._cache[key] = [(al, compile_lists(al)) for al in
                                (candidate(base, name, False, None, caps)[2] for name in ("linear", "v"))]
        spec = ScheduleSpec.from_pieces(stage_times, hop_times, n)
        return min(makespan(al, spec.timing(al), c) for al, c in self._cache[key])

    def time_bound(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """:func:`hexicore.pipeline.synthesis.lower_bound` of its layouts: no synthesis beats it
        (the planner synthesises only where it leaves room for a gain). The times are those of
        the plain placement (synth's before it is resolved); the bound also holds for the V
        layout, which moves the head to rank 0."""
        return lower_bound(ScheduleSpec.from_pieces(stage_times, hop_times, n_mb), head_moves=True)

    def resolve(self, ref: ScheduleRef, stage_times: Sequence[float], hop_times: Sequence[float],
                n_mb: int, rank_layers: Sequence[int] = ()) -> tuple[ScheduleRef, float]:
        """Records the times synthesised for (module docstring); with ``rank_layers`` (the blocks
        of each rank) the lists are those :meth:`order` builds for them (:func:`fitting_layouts`)."""
        mine = Synth(self.memory, tuple(map(float, stage_times)), tuple(map(float, hop_times)), self.effort)
        spec = ScheduleSpec.from_pieces(stage_times, hop_times, n_mb, rank_layers)
        return ScheduleRef(self.name, mine.params()), self.simulate(spec)[1].makespan

    def share(self, resolved: ActionSchedule) -> None:
        """The lists synthesised here for the times ``resolved`` records (same cap and effort)."""
        if not isinstance(resolved, Synth) or resolved.stage_times is None or \
                (resolved.memory, resolved.effort) != (self.memory, self.effort):
            return
        for key, al in list(self._cache.items()):
            if key[0] == "synth" and key[1].ranks == len(resolved.stage_times) and resolved._spec(key[1]) == key[1]:
                resolved._cache.setdefault(key, replace(al, schedule=ScheduleRef(self.name, resolved.params())))

    def note(self, chosen: ScheduleRef) -> str | None:
        return None


def fitting_layouts(spec: ScheduleSpec) -> tuple[str, ...]:
    """The layouts of :data:`~hexicore.pipeline.synthesis.LAYOUTS` whose chunks every rank can hold,
    one block each at least (``spec.rank_layers``, where known): a rank holding one block gets
    one chunk, so ``v`` and ``loop2`` (two chunks a rank) are left out there; ``linear`` always fits."""
    if not spec.rank_layers:
        return LAYOUTS
    return tuple(n for n in LAYOUTS if all(layout_map(n, spec.ranks).count(r) <= k
                                           for r, k in enumerate(spec.rank_layers)))


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="synth", factory=Synth,
                     description="synthesised for the pipeline's own stage times under an activation cap")
