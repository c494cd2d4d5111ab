"""The optimizer settings of a run beyond AdamW's own: the learning-rate schedule and gradient
clipping by global norm (``runtime.lr_schedule``, ``warmup_steps``, ``min_lr``, ``clip_grad``).

Torch-free: the launching process checks the keys (one line naming ``runtime.KEY``) and every
rank computes the lr of a step from the same pure function, :func:`lr_at`. Clipping itself
(the global norm over every rank) is :mod:`..parallel.data.grad_norm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError

SCHEDULES = ("constant", "linear", "cosine")
#: what a checkpoint's ``meta.json`` records of the optimizer; resuming with another value is refused
RECORDED = ("lr", "min_lr", "lr_schedule", "warmup_steps", "clip_grad", "eps", "weight_decay")


def lr_at(step: int, *, lr: float, schedule: str = "constant", warmup_steps: int = 0, min_lr: float = 0.0,
          steps: int = 1) -> float:
    """The learning rate of step ``step`` (counted from 0) of a run of ``steps`` steps.

    Warmup (Megatron's linear warmup): for ``step < W`` (``W = warmup_steps``) the lr is
    ``lr * (step + 1) / W``. After it, with ``D = steps - W`` decay steps and the decay progress
    ``t = (step - W) / D`` (0 at the first step after warmup; it would reach 1 at step ``steps``):

    * ``constant``: ``lr``;
    * ``linear``: ``min_lr + (lr - min_lr) * (1 - t)``;
    * ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2``.

    So the first step after warmup runs at ``lr`` and the last at one decay step above
    ``min_lr``; ``constant`` without warmup is exactly ``lr`` at every step.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    t = (step - warmup_steps) / max(steps - warmup_steps, 1)
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - t)
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def decays(schedule: str) -> bool:
    """Whether the lr after warmup depends on ``train.steps`` (the decay length)."""
    return schedule != "constant"


@dataclass(frozen=True)
class OptimSchedule:
    """The per-step optimizer settings of one run: :func:`lr_at` over ``steps`` steps, and the
    largest global gradient norm (``clip_grad``; None: no clipping)."""

    lr: float
    steps: int
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    clip_grad: float | None = None

    def lr_at(self, step: int) -> float:
        return lr_at(step, lr=self.lr, schedule=self.schedule, warmup_steps=self.warmup_steps, min_lr=self.min_lr,
                     steps=self.steps)


def parse(p: Mapping[str, Any], lr: float) -> dict[str, Any]:
    """Check ``runtime.lr_schedule``, ``warmup_steps``, ``min_lr`` and ``clip_grad`` (``p``: the
    section with its defaults; ``lr``: the checked ``runtime.lr``): one line naming the key."""
    if p["lr_schedule"] not in SCHEDULES:
        raise HexicoreError(f"unknown lr schedule {p['lr_schedule']!r}; choose one of: {', '.join(SCHEDULES)}",
                            field="runtime.lr_schedule")
    warmup = schema.integer(p["warmup_steps"], None, "runtime.warmup_steps", minimum=0)
    min_lr = schema.number(p["min_lr"], None, "runtime.min_lr", allow_zero=True)
    if min_lr > lr:
        raise HexicoreError(f"min_lr {min_lr:g} is above lr {lr:g}: the schedule decays from lr to min_lr",
                            field="runtime.min_lr")
    clip = None if p["clip_grad"] is None else schema.number(p["clip_grad"], None, "runtime.clip_grad")
    return {"lr_schedule": str(p["lr_schedule"]), "warmup_steps": warmup, "min_lr": min_lr, "clip_grad": clip}


def check_steps(warmup_steps: int, steps: int) -> None:
    """Warmup must fit the run: ``warmup_steps <= train.steps``."""
    if warmup_steps > steps:
        raise HexicoreError(f"warmup_steps={warmup_steps} is more than train.steps={steps}",
                            field="runtime.warmup_steps")


__all__ = ["SCHEDULES", "RECORDED", "lr_at", "decays", "OptimSchedule", "parse", "check_steps"]
