"""Schedule-aware pricing for the planner (issue 8): each pipeline's PIPELINE-TIME and peak
activations come from its own schedule (DESIGN.md §2 ``Schedule.pipeline_time`` and
``peak_activations``), and ``schedule=auto`` picks per pipeline the fastest schedule that fits.

* :class:`ScheduleBook` builds schedules once by name from the registry and prices them:
  ``exact`` (the schedule's own ``pipeline_time``), ``model`` (the same at a few anchor
  micro-batch counts, interpolated: what the search calls thousands of times) and ``peaks``
  (peak in-flight micro-batches per rank, the memory the schedule needs);
* :func:`timed_cost` injects those into a cost model (``pipeline_timer`` + ``activation``);
* :func:`options` lists the schedules ``schedule=auto`` chooses from (conf/schedule/auto.yaml).

The model: for ``n <= P`` (P ranks) the exact time; above, 1F1B-like schedules are affine in
``n`` in steady state (the bottleneck rank does one F+B per micro-batch), fitted through the
exact times at ``P`` and ``2P`` (within 3% of the simulation in our checks); Hanayo runs blocks
of P micro-batches for ``n > P`` (:mod:`hexicore_plugins.schedules.hanayo`), priced as
``ceil(n / P)`` blocks of its time at ``P`` (an upper bound: consecutive blocks overlap; a
partial block, ``n < P``, as a whole one), its peak activations as those at ``P``. The
search only ranks candidates with the model; the final plan is re-priced and its schedules
re-chosen exactly (:func:`choose_exact`), where Hanayo above P micro-batches gets its due.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline
from hexicore.pipeline.schedule import ScheduleSpec

AUTO = "auto"
#: what ``schedule=auto`` chooses from when its config names no ``options``
DEFAULT_OPTIONS: tuple[dict, ...] = ({"name": "1f1b"}, {"name": "interleaved_1f1b", "chunks": 2},
                                     {"name": "hanayo", "waves": "auto", "max_waves": 4})
#: schedules whose time grows in blocks of P micro-batches (module docstring)
BLOCK_SCHEDULES = frozenset({"hanayo"})
#: schedules whose peak is the closed rule of the cost model (GPipe n, 1F1B min(P - j, n))
RULE_PEAKS = frozenset({"1f1b", "gpipe"})


def is_auto(schedule: Mapping[str, Any]) -> bool:
    return str(schedule.get("name", "1f1b")) == AUTO


def options(schedule: Mapping[str, Any]) -> tuple[dict, ...]:
    """The schedule sections the planner may give a pipeline: ``schedule=auto``'s ``options``
    (each ``{name, ...params}``), else the configured schedule alone."""
    if not is_auto(schedule):
        return (dict(schedule),)
    raw = schedule.get("options") or DEFAULT_OPTIONS
    out = []
    for i, o in enumerate(raw):
        if not isinstance(o, Mapping) or not isinstance(o.get("name"), str) or o["name"] == AUTO:
            raise HexicoreError(f"each option must be a mapping with a schedule name, got {o!r}",
                                field=f"schedule.options[{i}]")
        out.append(dict(o))
    return tuple(out)


def section_key(section: Mapping[str, Any]) -> tuple:
    params = {k: v for k, v in section.items() if k != "name"}
    return (str(section.get("name", "1f1b")), tuple(sorted((k, str(v)) for k, v in params.items())))


@dataclass(frozen=True)
class ScheduleBook:
    """Schedules built once per section from ``registry``; exact and modelled times, peaks.
    Caches are local to one book (one solve)."""

    registry: Any
    _built: dict = field(default_factory=dict, compare=False, repr=False)
    _peaks: dict = field(default_factory=dict, compare=False, repr=False)
    _model: dict = field(default_factory=dict, compare=False, repr=False)

    def schedule(self, section: Mapping[str, Any]) -> Any:
        key = section_key(section)
        if key not in self._built:
            params = {k: v for k, v in section.items() if k != "name"}
            self._built[key] = self.registry.create("schedule", key[0], **params)
        return self._built[key]

    def usable(self, section: Mapping[str, Any], ranks: int) -> bool:
        """Hanayo's wave turns on the last rank: it needs two ranks."""
        return ranks >= 2 or str(section.get("name")) not in BLOCK_SCHEDULES

    def effective(self, section: Mapping[str, Any], ranks: int) -> Mapping[str, Any]:
        """The section a pipeline of ``ranks`` is priced under: one rank has no bubble under any
        schedule, so a schedule that needs two ranks is priced as 1F1B there."""
        return section if self.usable(section, ranks) else {"name": "1f1b"}

    def exact(self, section: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
        section = self.effective(section, len(stage_s))
        return self.schedule(section).pipeline_time(stage_s, hop_s, int(n))

    def model(self, section: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
        """PIPELINE-TIME from the anchors (module docstring); exact for ``n <= P`` but Hanayo's."""
        p = len(stage_s)
        section = self.effective(section, p)
        key = (section_key(section), tuple(stage_s), tuple(hop_s))
        block = key[0][0] in BLOCK_SCHEDULES
        if n <= p and not block:
            return self.exact(section, stage_s, hop_s, n)
        hit = self._model.get(key)
        if hit is None:
            a = self.exact(section, stage_s, hop_s, p)
            b = 2 * a if block else self.exact(section, stage_s, hop_s, 2 * p)
            hit = self._model[key] = (a, max(b - a, 0.0))
        a, step = hit
        return a + (max(math.ceil(n / p), 1) - 1 if block else (n - p) / p) * step

    def peaks(self, section: Mapping[str, Any], ranks: int, n: int) -> tuple[float, ...]:
        """Peak in-flight micro-batches per rank (units of a rank's whole share)."""
        section = self.effective(section, ranks)
        name = str(section.get("name", "1f1b"))
        if name in RULE_PEAKS:
            return tuple(float(n if name == "gpipe" else max(1, min(n, ranks - j))) for j in range(ranks))
        key = (section_key(section), ranks, n)
        if key not in self._peaks:
            self._peaks[key] = tuple(self.schedule(section).peak_activations(ScheduleSpec(ranks, n)))
        return self._peaks[key]

    def model_peaks(self, section: Mapping[str, Any], ranks: int, n: int) -> tuple[float, ...]:
        """``peaks`` at ``min(n, 2P - 1)`` (Hanayo: at ``P``, the block it repeats): exact
        below, the saturated value above (1F1B saturates at P, interleaved groups hold at most
        2P - 1 micro-batches). The final plan is checked with the exact peaks."""
        if str(self.effective(section, ranks).get("name")) in BLOCK_SCHEDULES:
            return self.peaks(section, ranks, ranks)
        return self.peaks(section, ranks, min(n, 2 * ranks - 1))

    def timer(self, modelled: bool = False):
        """A ``hexicore.cost.PipelineTimer`` pricing each pipeline under its own section."""
        price = self.model if modelled else self.exact

        def timer(pipe: Pipeline, stage_s: Sequence[float], hop_s: Sequence[float], n: int) -> float:
            return price(pipe.schedule, stage_s, hop_s, n)

        timer.schedule_book = self  # type: ignore[attr-defined]  # lets the search find the book
        return timer

    def activation(self, modelled: bool = False):
        """A ``hexicore.cost.ActivationFn``: stage j's peak under the pipeline's section."""
        peaks = self.model_peaks if modelled else self.peaks
        return lambda pipe, j, n: peaks(pipe.schedule, len(pipe.stages), n)[j]


def timed_cost(cost: Any, book: ScheduleBook, modelled: bool = False) -> Any:
    """``cost`` whose pipeline term and activation memory follow each pipeline's schedule
    (a frozen dataclass with ``pipeline_timer``/``activation`` fields, e.g. AnalyticCostModel)."""
    return replace(cost, pipeline_timer=book.timer(modelled), activation=book.activation(modelled))


def resolve(book: ScheduleBook, section: Mapping[str, Any], stage_s: Sequence[float], hop_s: Sequence[float],
            n: int) -> tuple[dict, float]:
    """An option as the section a plan records, with its exact time: ``waves=auto`` becomes the
    W Hanayo chooses for these stage and hop times (``choose_waves``)."""
    sched = book.schedule(section)
    if section.get("waves") == "auto" and hasattr(sched, "choose_waves"):
        w, seen = sched.choose_waves(ScheduleSpec.from_pieces(stage_s, hop_s, n))
        return {"name": section["name"], "waves": w}, seen[w]
    return dict(section), book.exact(section, stage_s, hop_s, n)


def choose_exact(book: ScheduleBook, cost: Any, plan: Any, sections: Sequence[Mapping[str, Any]]) -> tuple[Any, list]:
    """Per pipeline of ``plan`` (layers and batches fixed), the exactly fastest section among
    ``sections`` whose peak activations fit every stage's devices; the pipeline's own section
    stays a candidate, so no pipeline gets slower. Returns the new plan and, per pipeline,
    ``{section name: seconds}`` of the options tried."""
    pipes, tried = [], []
    for p in plan.pipelines:
        stage_s, hop_s = cost.pipeline_pieces(plan, p)
        n = p.n_micro_batches(plan.train.micro_batch)
        best, seen = None, {}
        for sec in [p.schedule] + [s for s in sections if section_key(s) != section_key(p.schedule)]:
            if not book.usable(sec, len(p.stages)):
                continue
            sec, secs = resolve(book, sec, stage_s, hop_s, n)
            seen[str(sec["name"])] = round(secs, 6)
            ok = fits(book, cost, plan, Pipeline(p.batch, p.stages, sec))
            if best is None or (ok, -secs) > (best[0], -best[1] + 1e-12):
                best = (ok, secs, sec)
        pipes.append(Pipeline(p.batch, p.stages, best[2] if best else dict(p.schedule)))
        tried.append(seen)
    return replace(plan, pipelines=tuple(pipes)), tried


def fits(book: ScheduleBook, cost: Any, plan: Any, pipe: Pipeline) -> bool:
    """Every stage of ``pipe`` fits its devices with the section's exact peak activations."""
    c, m, t = plan.cluster, plan.model, plan.train
    n = pipe.n_micro_batches(t.micro_batch)
    peaks = book.peaks(pipe.schedule, len(pipe.stages), n)
    last = len(pipe.stages) - 1
    for j, s in enumerate(pipe.stages):
        gb = cost.stage_memory_gb(c, m, t, s.devices, s.n_layers, first=j == 0, last=j == last,
                                  in_flight=peaks[j], dp=len(plan.pipelines))
        if gb > min(c.device(d).memory_gb for d in s.devices):
            return False
    return True
