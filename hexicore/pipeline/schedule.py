"""The pipeline-schedule interface (DESIGN.md §2) and helpers shared by schedule plugins.

A schedule turns a :class:`ScheduleSpec` (P ranks, M micro-batches, optional per-rank times)
into per-rank action lists. Plugins implement :meth:`ActionSchedule.order` (compute only);
:meth:`ActionSchedule.actions` runs the shared comm pass (:func:`hexicore.pipeline.comm.insert_comm`).
The planner calls :meth:`ActionSchedule.pipeline_time` — a closed form where it is exact, else
the simulator (:mod:`hexicore.pipeline.simulate`) run on the schedule's default-time order (built once per
P and M) under the given stage and link times; cached per input. Time-driven orders (greedy)
built for the actual times by :meth:`ActionSchedule.actions` may differ slightly from that.

Time units follow the cost model: ``stage_times[j]`` is forward + backward of one micro-batch
through rank j's whole share (split ``T_F : T_B = 1 : 2``, HexiScale App. A counts backward as
2x forward), ``hop_times[j]`` the round trip between ranks j and j+1 (cost model COMM-PP-HOP),
so one transfer is half of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.comm import insert_comm
from hexicore.core.errors import HexicoreError
from hexicore.pipeline.simulate import SimResult, Timing, compile_lists, makespan, simulate


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule is built for. ``forward``/``backward`` are per-rank T_F/T_B (one
    micro-batch through the rank's whole share; default 1 and 2), ``hops`` one transfer between
    ranks r and r+1 (default 0). Time-driven orders (greedy) use them; fixed orders ignore them."""

    ranks: int
    micro_batches: int
    forward: tuple[float, ...] = ()
    backward: tuple[float, ...] = ()
    hops: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        p = self.ranks
        if not self.forward:
            object.__setattr__(self, "forward", (1.0,) * p)
        if not self.backward:
            object.__setattr__(self, "backward", tuple(2.0 * f for f in self.forward))
        if not self.hops:
            object.__setattr__(self, "hops", (0.0,) * max(p - 1, 0))

    @classmethod
    def from_pieces(cls, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> "ScheduleSpec":
        """The planner's pieces (cost-model units, see the module docstring) as a spec."""
        return cls(len(stage_times), int(n_mb), tuple(t / 3.0 for t in stage_times),
                   tuple(2.0 * t / 3.0 for t in stage_times), tuple(h / 2.0 for h in hop_times))

    def timing(self, al: ActionList) -> Timing:
        return Timing.from_ranks(al, self.forward, self.backward, self.hops)


@runtime_checkable
class Schedule(Protocol):
    """DESIGN.md §2: ``actions(spec)`` and ``pipeline_time(stage_times, hop_times, n_mb)``."""

    name: str

    def actions(self, spec: ScheduleSpec) -> ActionList: ...

    def pipeline_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float: ...

    def peak_activations(self, spec: ScheduleSpec) -> tuple[float, ...]: ...


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
    """``value`` as an int >= 1, else a one-line error naming ``schedule.<key>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        try:
            ok = not isinstance(value, bool) and float(value) == int(value) and int(value) >= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            also = f" {alternative}" if alternative else ""
            raise HexicoreError(f"schedule {name!r}: {key} must be a positive integer{also}, got {value!r}",
                                field=f"schedule.{key}")
    return int(value)


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
    return ActionList({"name": name, **dict(params)}, spec.ranks, len(stage_rank), spec.micro_batches,
                      tuple(stage_rank), acts, tuple(tuple(c) for c in chains), tuple(mb_chain), dict(meta or {}))


@dataclass(frozen=True)
class ActionSchedule(ABC):
    """Base of the built-in schedules: ``order`` is the plugin's; the rest is shared."""

    _cache: dict = field(default_factory=dict, compare=False, repr=False, init=False)

    name = "abstract"

    @abstractmethod
    def order(self, spec: ScheduleSpec) -> ActionList:
        """Compute-only per-rank lists (F/B/I/W, REDUCE, STEP) for ``spec``."""

    def params(self) -> dict[str, Any]:
        return {}

    def actions(self, spec: ScheduleSpec) -> ActionList:
        """The lists a runtime executes: :meth:`order` + the shared comm pass."""
        return insert_comm(self.order(spec))

    def closed_form(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
        """Exact makespan where a closed form exists for these inputs, else None."""
        return None

    def simulate(self, spec: ScheduleSpec, *, record: bool = False) -> tuple[ActionList, SimResult]:
        al = self.order(spec)
        return al, simulate(al, spec.timing(al), record=record, comm=False)

    def template(self, ranks: int, n_mb: int) -> ActionList:
        """The order for default times, ``order(ScheduleSpec(ranks, n_mb))`` (cached): the lists a
        runtime gets when it asks for P and M only, and what :meth:`pipeline_time` prices."""
        key = ("template", ranks, n_mb)
        if key not in self._cache:
            self._cache[key] = self.order(ScheduleSpec(ranks, n_mb))
        return self._cache[key]

    def price(self, spec: ScheduleSpec) -> float:
        """Makespan of :meth:`template` under ``spec``'s times (:func:`hexicore.pipeline.simulate.makespan`)."""
        al = self.template(spec.ranks, spec.micro_batches)
        key = ("compiled", spec.ranks, spec.micro_batches)
        if key not in self._cache:
            self._cache[key] = compile_lists(al)
        return makespan(al, spec.timing(al), self._cache[key])

    def pipeline_time(self, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        """Makespan of one pipeline iteration (planner units; module docstring): the closed form
        where exact, else :meth:`price`; cached per input."""
        key = ("time", tuple(map(float, stage_times)), tuple(map(float, hop_times)), int(n_mb))
        if key not in self._cache:
            t = self.closed_form(key[1], key[2], key[3])
            if t is None:
                t = self.price(ScheduleSpec.from_pieces(key[1], key[2], key[3]))
            self._cache[key] = t
        return self._cache[key]

    def peak_activations(self, spec: ScheduleSpec) -> tuple[float, ...]:
        """Peak in-flight activations per rank (units of DESIGN.md §4) under ``spec``."""
        return self.simulate(spec)[1].peak_activations


def uniform_closed_form(stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float | None:
    """GPipe/1F1B with equal stages and free transfers: ``(M + P - 1)(T_F + T_B)`` (exact)."""
    if stage_times and len(set(stage_times)) == 1 and not any(hop_times):
        return (n_mb + len(stage_times) - 1) * stage_times[0]
    return None


def pipeline_timer(registry: Any) -> Any:
    """The cost model's ``pipeline_timer`` hook (hexicore.cost.PipelineTimer) from the registry:
    ``timer(pipeline, stage_times, hop_times, n_mb)`` prices each pipeline under its own
    ``schedule`` section through :meth:`ActionSchedule.pipeline_time` (schedules built once)."""
    built: dict[tuple, Any] = {}

    def timer(pipeline: Any, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int) -> float:
        params = dict(pipeline.schedule)
        name = str(params.pop("name", "1f1b"))
        key = (name, tuple(sorted((k, str(v)) for k, v in params.items())))
        if key not in built:
            built[key] = registry.create("schedule", name, **params)
        return built[key].pipeline_time(stage_times, hop_times, n_mb)

    return timer
