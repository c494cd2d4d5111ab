"""The learning-rate schedule of a run and its check against the run's length
(``runtime.lr_schedule``, ``warmup_steps``, ``min_lr``; the settings and their checks are
:class:`~hexicore.core.settings.OptimizerSettings`).

Torch-free: every rank computes the lr of a step from the same pure function, :func:`lr_at`.
Clipping by the global norm (``runtime.clip_grad``, over every rank) is
:mod:`..parallel.data.grad_norm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hexicore.core.errors import HexicoreError
from hexicore.core.settings import OptimizerSettings


def lr_at(step: int, *, lr: float, schedule: str = OptimizerSettings.lr_schedule,
          warmup_steps: int = OptimizerSettings.warmup_steps, min_lr: float = OptimizerSettings.min_lr,
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
    """The per-step optimizer settings of one run of ``steps`` steps: :func:`lr_at` under
    ``optimizer``'s lr, schedule, warmup and ``min_lr``."""

    optimizer: OptimizerSettings
    steps: int

    def lr_at(self, step: int) -> float:
        o = self.optimizer
        return lr_at(step, lr=o.lr, schedule=o.lr_schedule, warmup_steps=o.warmup_steps, min_lr=o.min_lr,
                     steps=self.steps)


def check_steps(warmup_steps: int, steps: int) -> None:
    """Warmup must fit the run: ``warmup_steps <= train.steps``."""
    if warmup_steps > steps:
        raise HexicoreError(f"warmup_steps={warmup_steps} is more than train.steps={steps}",
                            field="runtime.warmup_steps")


__all__ = ["lr_at", "decays", "OptimSchedule", "check_steps"]
