"""pluggy hook specifications of the ``hexicore`` plugin system (docs/plugins.md).

One hook per kind; each returns (or yields) typed :class:`PluginSpec` records, as conda's
``conda_solvers()`` does. A plugin module implements any subset::

    from hexicore.hookspecs import hookimpl, PluginSpec

    @hookimpl
    def hexicore_solvers():
        yield PluginSpec(kind="solver", name="annealing", factory=AnnealingSolver,
                         description="simulated annealing over device partitions",
                         config={"name": "annealing", "steps": 2000})

and is found through the ``hexicore`` entry-point group (the built-ins use the same group).
``config`` (a mapping or a dataclass) is stored in Hydra's ConfigStore under the kind's config
group, so ``solver=annealing`` works with no YAML file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

PROJECT = "hexicore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: kind -> (hook name, Hydra config group or None)
KINDS: dict[str, tuple[str, str | None]] = {
    "solver": ("hexicore_solvers", "solver"),
    "partitioner": ("hexicore_partitioners", None),
    "refiner": ("hexicore_refiners", None),
    "orderer": ("hexicore_orderers", None),
    "cost_model": ("hexicore_cost_models", "cost"),
    "schedule": ("hexicore_schedules", "schedule"),
    "runtime": ("hexicore_runtimes", "runtime"),
}

#: kind -> what hexicore uses of the object a factory builds (methods; ``pricing`` is an attribute)
INTERFACE: dict[str, tuple[str, ...]] = {
    "solver": ("solve",),
    "partitioner": ("partition",),
    "refiner": ("refine",),
    "orderer": ("order",),
    "cost_model": ("estimate", "stage_s", "hop_s", "stage_memory_gb"),
    "schedule": ("actions",),  # what a run uses; planning and simulate need more (their callers check)
    "runtime": ("run",),
}
ATTRIBUTES = frozenset({"pricing"})
#: how a kind's plugin gets its interface, where a list of methods would not say it
HINTS = {"schedule": "subclass hexicore.pipeline.schedule.ActionSchedule and write order()"}


def missing_members(kind: str, obj: Any, members: Iterable[str] | None = None) -> list[str]:
    """The ``members`` (default: ``kind``'s interface, :data:`INTERFACE`) that ``obj`` lacks, as
    an error names them (a method that is not callable counts as missing)."""
    out = []
    for m in INTERFACE[kind] if members is None else members:
        value = getattr(obj, m, None)
        if value is None or (m not in ATTRIBUTES and not callable(value)):
            out.append(m if m in ATTRIBUTES else f"{m}()")
    return out


@dataclass(frozen=True)
class PluginSpec:
    """One implementation: ``factory(**params)`` builds it from its config section."""

    kind: str
    name: str
    factory: Callable[..., Any]
    description: str = ""
    config: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown plugin kind {self.kind!r}; choose one of: {', '.join(KINDS)}")
        if not self.name or self.name != self.name.lower() or " " in self.name:
            raise ValueError(f"plugin names are lower-case words, got {self.name!r}")


class HexicoreSpecs:
    """Hook specifications; every hook returns an iterable of :class:`PluginSpec`."""

    @hookspec
    def hexicore_solvers(self) -> Iterable[PluginSpec]:
        """Solvers: ``factory(**params).solve(problem, *, time_limit, seed, progress) -> Plan``."""

    @hookspec
    def hexicore_partitioners(self) -> Iterable[PluginSpec]:
        """Partitioners: ``partition(graph, parts, *, objective, balance, seed) -> list[list[id]]``."""

    @hookspec
    def hexicore_refiners(self) -> Iterable[PluginSpec]:
        """Refiners: ``refine(graph, parts, *, objective, balance) -> list[list[id]]``."""

    @hookspec
    def hexicore_orderers(self) -> Iterable[PluginSpec]:
        """Stage orderers: ``order(groups, graph) -> list[group]``."""

    @hookspec
    def hexicore_cost_models(self) -> Iterable[PluginSpec]:
        """Cost models: ``factory(**params)`` returns a :class:`hexicore.cost.CostModel`."""

    @hookspec
    def hexicore_schedules(self) -> Iterable[PluginSpec]:
        """Pipeline schedules: ``factory(**params)`` (the ``schedule.*`` keys but ``name``) returns a
        :class:`hexicore.pipeline.schedule.Schedule`, in practice a subclass of
        :class:`hexicore.pipeline.schedule.ActionSchedule` that writes ``order(spec)`` (compute-only
        per-rank action lists; ``actions(spec)`` adds the shared comm pass) and declares how it is
        priced, so that the planner, ``hexicore simulate`` and the runtimes need no schedule name:

        * ``pricing = Pricing(growth=STEADY | BLOCKS, min_ranks=1, fewer_ranks=None,
          cost_model_time=False, micro_batches_per_rank=0)``: how the search models its
          PIPELINE-TIME above P micro-batches (steady state, or blocks of P micro-batches like
          Hanayo), the fewest ranks it runs on and the
          :class:`hexicore.core.schedule_ref.ScheduleRef` a pipeline with fewer is priced as,
          whether the cost model's own closed PIPELINE-TIME is its time, the fewest micro-batches
          per rank it needs (DualPipeV: 2);
        * ``closed_form(stage_times, hop_times, n_mb)``: its exact makespan where a closed form
          holds, else None (then ``pipeline_time`` simulates its default-time order);
        * ``peak_rule(ranks, n_mb)``: its peak activations per rank by a closed rule (1F1B's
          ``min(P - j, n)``, GPipe's ``n``), else None (``peaks`` simulates);
        * ``closed_bubble(spec, chosen)``: its paper's bubble ratio where one applies (printed by
          ``hexicore simulate`` next to the simulated one), and ``note(chosen)``;
        * ``resolve(ref, stage_times, hop_times, n_mb) -> (ScheduleRef, seconds)``: its own choice
          of free parameters for one pipeline (Hanayo's ``waves=auto``), as the plan records it.

        docs/plugins.md, "Writing a schedule plugin", walks through one."""

    @hookspec
    def hexicore_runtimes(self) -> Iterable[PluginSpec]:
        """Runtimes: ``factory()`` (no parameters) builds an object with

        * ``run(spec, *, registry) -> Mapping | None``: check and execute one training run.
          ``spec`` is a :class:`hexicore.core.run_spec.RunSpec` built by the app layer: the
          layout (a plan already checked by the cost model, one pipeline of equal stages, or the
          single-process reference), the model and cluster, one schedule section per pipeline,
          the train settings, and the runtime's own config section (``spec.runtime.params``,
          which the runtime validates). ``registry`` is the caller's
          :class:`hexicore.registry.Registry`: the runtime builds schedules from it (never from
          a registry of its own), so plugins registered only by the caller work. Returns the
          metrics (``metrics.json``'s content) on the process that reports them, else None.
          Bad input raises :class:`~hexicore.core.errors.HexicoreError` before anything starts;
          a run that started and failed raises :class:`~hexicore.core.errors.RunError`.
        * optionally ``check_plan(spec, *, registry)``: raise ``HexicoreError`` if the layout
          cannot run (structure only, no framework or devices needed); ``hexicore evaluate``
          reports it as a warning.

        A runtime never imports :mod:`hexicore.app` or reads the Hydra config."""
