"""Training metrics where training tools read them (``runtime.log``): TensorBoard event files
under ``out/tensorboard/run-N/`` through torch's own ``torch.utils.tensorboard.SummaryWriter``,
or a Weights & Biases run (``wandb``, its files under ``out/wandb/``; ``WANDB_MODE=offline``
works without a network). Rank 0 logs, every step: ``train/loss``, ``train/lr``,
``train/grad_norm``, ``train/tokens_per_s``, ``train/step_s``; at the end the predicted-vs-
measured figures of ``metrics.json`` (``predicted/step_s``, ``measured/step_s``,
``predicted/dp_sync_s``, ..., ``measured/peak_memory_gb/rank_R``). Both packages are optional
extras (``hexicore[tensorboard]``, ``hexicore[wandb]``); a run that asks for one that is not
installed is refused before any worker starts (:func:`check_log`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Mapping

from hexicore.core.errors import HexicoreError

#: ``runtime.log`` values -> the package each needs
LOGS = {"none": None, "tensorboard": "tensorboard", "wandb": "wandb"}
#: the figures of metrics.json's ``predicted``/``measured`` logged at the end (scalars or per-rank lists)
COMPARED = ("step_s", "dp_sync_s", "pipelines_s", "peak_memory_gb")


def check_log(kind: str) -> None:
    """Before launch: the package ``runtime.log`` needs is installed (one line naming the extra)."""
    package = LOGS.get(kind)
    if package and importlib.util.find_spec(package) is None:
        raise HexicoreError(f"runtime.log={kind} needs the {package} package, which is not installed: "
                            f"pip install 'hexicore[{kind}]'", field="runtime.log")


def run_folder(out: Path) -> Path:
    """``out/tensorboard/run-N``: the next N, so a rerun into the same ``out`` is a run of its own."""
    base = out / "tensorboard"
    taken = [int(p.name[4:]) for p in base.glob("run-*") if p.name[4:].isdigit()] if base.is_dir() else []
    return base / f"run-{max(taken, default=0) + 1}"


class MetricLog:
    """Rank 0's writer for ``runtime.log`` (none: every call does nothing)."""

    def __init__(self, kind: str, out: Path | None, config: Mapping[str, Any]):
        self.kind, self.writer, self.wandb = kind, None, None
        if out is None or kind == "none":
            return
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_folder(out)))
        elif kind == "wandb":
            import wandb

            out.mkdir(parents=True, exist_ok=True)
            self.wandb = wandb.init(project="hexicore", dir=str(out), config=dict(config))

    def _scalar(self, name: str, value: Any, step: int) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        if self.writer is not None:
            self.writer.add_scalar(name, float(value), step)
        if self.wandb is not None:
            self.wandb.log({name: float(value)}, step=step)

    def step(self, step: int, **values: Any) -> None:
        """One step's figures, as ``train/<name>``."""
        for name, value in values.items():
            self._scalar(f"train/{name}", value, step)

    def finish(self, metrics: Mapping[str, Any] | None, step: int) -> None:
        """The predicted-vs-measured figures at the run's last step; then close the writer."""
        for side in ("predicted", "measured"):
            found = (metrics or {}).get(side)
            for key in COMPARED if isinstance(found, Mapping) else ():
                value = found.get(key)
                if isinstance(value, list):
                    label = "rank" if key == "peak_memory_gb" else "pipeline"
                    for i, v in enumerate(value):
                        self._scalar(f"{side}/{key}/{label}_{i}", v, step)
                else:
                    self._scalar(f"{side}/{key}", value, step)
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
