"""Typed results of the library API: :class:`SimulationResult` (what ``hexicore.simulate``
returns; ``to_dict()`` is the ``summary.json`` that ``hexicore simulate`` writes, docs/cli.md).

The plan side needs no type here: ``hexicore.plan`` returns a :class:`hexicore.core.plan.Plan`
whose ``estimate`` is a :class:`hexicore.core.estimate.Estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # only for annotations: keeps ``import hexicore`` light
    from hexicore.pipeline.actions import ActionList
    from hexicore.pipeline.simulate import SimResult

#: summary.json's keys, in the order ``hexicore simulate`` writes them.
SUMMARY_KEYS = ("schedule", "ranks", "stages", "micro_batches", "timing", "makespan", "bubble_ratio",
                "closed_form_bubble", "busy", "peak_activations", "weight_copies", "actions")


@dataclass(frozen=True)
class SimulationResult:
    """One simulated schedule (the discrete-event simulator of :mod:`hexicore.pipeline.simulate`).

    ``forward``/``backward``/``comm`` are the inputs T_F, T_B (one micro-batch through one
    rank's whole share) and T_C (one transfer); ``makespan`` the iteration's length;
    ``bubble_ratio`` = 1 - sum(busy) / (ranks x makespan); ``closed_form_bubble`` the paper's
    closed form for this schedule and these inputs where one exists, else None;
    ``peak_activations`` per rank in micro-batches through the rank's share;
    ``weight_copies`` the number of model copies (chains); ``n_actions`` the number of
    instructions over all ranks. ``action_list`` is the validated list (communication
    inserted) and ``sim`` the simulator's record of it (events for a trace or timeline).
    ``extra`` holds summary keys this class does not name, so :meth:`to_dict` loses nothing.
    """

    schedule: Mapping[str, Any]
    ranks: int
    stages: int
    micro_batches: int
    forward: float
    backward: float
    comm: float
    makespan: float
    bubble_ratio: float
    closed_form_bubble: float | None
    busy: tuple[float, ...]
    peak_activations: tuple[float, ...]
    weight_copies: int
    n_actions: int
    action_list: "ActionList" = field(compare=False, repr=False, default=None)
    sim: "SimResult" = field(compare=False, repr=False, default=None)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def idle(self) -> tuple[float, ...]:
        """Per rank: makespan minus busy time."""
        return tuple(self.makespan - b for b in self.busy)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the ``summary.json`` of ``hexicore simulate`` for the same inputs."""
        out = {"schedule": dict(self.schedule), "ranks": self.ranks, "stages": self.stages,
               "micro_batches": self.micro_batches,
               "timing": {"forward": self.forward, "backward": self.backward, "comm": self.comm},
               "makespan": self.makespan, "bubble_ratio": self.bubble_ratio,
               "closed_form_bubble": self.closed_form_bubble, "busy": list(self.busy),
               "peak_activations": list(self.peak_activations), "weight_copies": self.weight_copies,
               "actions": self.n_actions}
        out.update(self.extra)
        return out

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], action_list: "ActionList | None" = None,
                     sim: "SimResult | None" = None) -> "SimulationResult":
        """Wrap the summary mapping that :func:`hexicore.app.commands.simulate.build` returns."""
        s, timing = dict(summary), dict(summary["timing"])
        return cls(schedule=dict(s["schedule"]), ranks=s["ranks"], stages=s["stages"],
                   micro_batches=s["micro_batches"], forward=timing["forward"], backward=timing["backward"],
                   comm=timing["comm"], makespan=s["makespan"], bubble_ratio=s["bubble_ratio"],
                   closed_form_bubble=s["closed_form_bubble"], busy=tuple(s["busy"]),
                   peak_activations=tuple(s["peak_activations"]), weight_copies=s["weight_copies"],
                   n_actions=s["actions"], action_list=action_list, sim=sim,
                   extra={k: v for k, v in s.items() if k not in SUMMARY_KEYS})
