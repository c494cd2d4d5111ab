"""``hexicore train``: run training with a runtime plugin (docs/cli.md, docs/runtime.md).

``hexicore train [plan_file=PATH | parallel=none | schedule=NAME pipeline.ranks=P] model=tiny
runtime=torch train.steps=N [train.global_batch=N train.micro_batch=N] [seed=S] [out=DIR]
[resume=CKPT | init_from=HF_DIR] [train.checkpoint_every=K]`` builds the run (:func:`hexicore.app.training.build_run_spec`:
a plan is checked by the cost model first), hands it to the runtime with the registry, prints a
summary, and the runtime writes ``metrics.json`` and ``final/`` (a Hugging Face checkpoint
directory) to ``out`` (default: Hydra's
output directory). Bad input is one line and exit 2, before any process starts; a worker that
fails, dies or hangs ends the run with one line on stderr and exit status 1. Under ``torchrun``
this process is one of the workers (see ``docs/runtime.md`` for the multi-node command).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from hexicore.app.compose import on_command_line, output_dir
from hexicore.app.report import console, prediction_table
from hexicore.app.sweep import record
from hexicore.app.training import build_run_spec, create_runtime
from hexicore.core import schema
from hexicore.core.ownership import RUN_CONFIG_MARK, check_run_dir, clear_checkpoints
from hexicore.core.errors import HexicoreError, RunError
from hexicore.registry import Registry


def run(cfg: DictConfig) -> int:
    return train(cfg, Registry.default())


def train(cfg: DictConfig, registry: Registry) -> int:
    """The command with an explicit registry (tests pass one holding their own plugins)."""
    out = str(cfg.out) if cfg.get("out") else str(output_dir(cfg))
    try:
        spec = build_run_spec(cfg, registry, out)
        folders = ("final", *(("checkpoints",) if spec.checkpoint.every else ()),
                   *(("reads",) if spec.checkpoint.init_from else ()))
        prepare_out(out, cfg.get("resume"), cfg.get("overwrite"), folders)
        runtime = create_runtime(spec, registry)
        metrics = runtime.run(spec, registry=registry)
    except RunError as exc:
        print(f"hexicore: error: {exc}", file=sys.stderr)
        return 1
    except HexicoreError as exc:
        raise located(exc, cfg) from None
    if metrics:
        write_run_config(cfg, out)
        record(result_row(metrics, spec, out))
        print(summary_line(metrics, out))
        table = prediction_table(metrics.get("predicted"), metrics.get("measured"))
        if table is not None:
            console().print(table)
        note = other_devices_note(spec, metrics, cfg)
        if note:
            print(note)
    return 0


def other_devices_note(spec: Any, metrics: Mapping[str, Any], cfg: DictConfig) -> str | None:
    """What the predicted-vs-measured errors compare when a plan for catalog GPUs ran on this
    machine's CPU (no device emulated, no profile of this machine): a prediction for other devices."""
    measured = metrics.get("measured") if isinstance(metrics.get("measured"), Mapping) else {}
    if spec.cluster is None or not metrics.get("predicted") or measured.get("memory") != "rss":
        return None
    if str((cfg.get("cost") or {}).get("name")) == "profiled":
        return None
    devices = spec.layout.plan.devices
    if any(spec.cluster.emulation(d).active for d in devices):
        return None
    gpus = sorted({spec.cluster.device(d).gpu.name for d in devices})
    return (f"note: the prediction is for the plan's devices ({', '.join(gpus)}); this run measured this machine's "
            "CPU, so the errors compare different hardware (cost=profiled with a profile of this machine, or "
            "emulate: in the cluster file, predicts what it measures)")


#: a schedule's and the runtime's words for a one-pipeline run's inputs -> the keys that set them
FIELDS = {"ranks": "pipeline.ranks", "micro_batches": "train.global_batch"}


def located(exc: HexicoreError, cfg: DictConfig) -> HexicoreError:
    """An error raised without a source (the run's settings, a schedule plugin, the runtime) as
    one about the command line, its field as the user wrote it. Without ``plan_file`` every
    value is the command line's; with one, only ``runtime.*`` is (the plan's own errors name the
    plan file where they are raised: :func:`hexicore.app.compose.evaluate`, the runtime's layout)."""
    if cfg.get("plan_file") and not str(exc.field or "").startswith("runtime"):
        return exc
    return on_command_line(exc, cfg, FIELDS)


#: fixed temporary names a killed checkpoint save may leave behind
LEFTOVERS = ("step_*.pt.tmp", "final.pt.tmp", "meta.json.tmp", "*.safetensors.tmp", "metrics.json.tmp")


def prepare_out(out: str, resume: Any, overwrite: bool | None, folders: tuple[str, ...] = ("final",)) -> None:
    """Before any process starts: refuse an ``out`` that is not ours, holds a file where the run
    writes one of ``folders`` or a foreign file in ``final/``, or holds another run's
    checkpoints (:func:`hexicore.core.ownership.check_run_dir`), clear them under
    ``overwrite=true``, and remove what killed writers left (temporary files). Under torchrun
    rank 0 alone does this (it alone writes)."""
    if os.environ.get("RANK", "0") != "0":
        return
    steps = check_run_dir(out, resume=str(resume) if resume else None, overwrite=overwrite, folders=folders)
    clear_checkpoints(steps)
    for folder in (Path(out), Path(out) / "final", Path(out) / "checkpoints", *Path(out).glob("checkpoints/step_*/")):
        if folder.is_dir():
            schema.clean_stale_temps(folder)
            for pattern in LEFTOVERS:  # a killed save under a fixed temporary name
                for f in folder.glob(pattern):
                    f.unlink(missing_ok=True)


def result_row(m: Mapping[str, Any], spec: Any, out: str) -> dict[str, Any]:
    """This run's row of a sweep summary (docs/cli.md): the losses, steps and speeds of ``metrics.json``,
    its peak learning rate (the largest of ``lr``) and the cost model's ``predicted.step_s`` beside the measured one.
    ``step_s`` is ``measured.step_s`` (the median after the run's first step, null with one step),
    the same statistic as ``tokens_per_s``; without a ``measured`` object, the same median of ``step_s``."""
    losses, lrs = list(m.get("losses") or []), [x for x in m.get("lr") or [] if isinstance(x, (int, float))]
    predicted = m.get("predicted") if isinstance(m.get("predicted"), Mapping) else {}
    t = spec.train
    return {"command": "train", "model": spec.model.name, "schedule": m.get("schedule"), "ranks": m.get("ranks"),
            "steps": len(losses), "global_batch": t.global_batch, "micro_batch": t.micro_batch,
            "lr": max(lrs) if lrs else None,
            "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
            "step_s": steady_step_s(m), "predicted_step_s": predicted.get("step_s"), "tokens_per_s": m.get("tokens_per_s"),
            "out": out}


def steady_step_s(m: Mapping[str, Any]) -> float | None:
    """The run's median step time after its first (warm-up) step: ``measured.step_s`` as the
    runtime wrote it, else (a runtime without ``measured``) the median of ``step_s[1:]``; None
    with one step."""
    measured = m.get("measured")
    if isinstance(measured, Mapping) and "step_s" in measured:
        return measured["step_s"]
    steady = list(m.get("step_s") or [])[1:]
    return statistics.median(steady) if steady else None


def write_run_config(cfg: DictConfig, out: str) -> Path:
    """``out/config.yaml``: the run's resolved configuration, every key (the optimizer's, the
    data's, the model and cluster sections in full), which Hydra reads back to repeat the run:
    ``hexicore train --config-path "$(realpath OUT)" --config-name config``."""
    body = OmegaConf.to_yaml(OmegaConf.to_container(cfg, resolve=True))
    head = (f"{RUN_CONFIG_MARK} (written by hexicore train: this run's resolved configuration)\n"
            "# repeat it: hexicore train --config-path \"$(realpath THIS_FOLDER)\" --config-name config\n")
    return schema.write_text_atomic(Path(out) / "config.yaml", head + body)


def summary_line(m: Mapping[str, Any], out: str) -> str:
    return (f"trained {len(m['losses'])} steps ({m['schedule']}, {m['ranks']} rank{'s' if m['ranks'] != 1 else ''}): loss {m['losses'][0]:.4f} -> "
            f"{m['losses'][-1]:.4f}, {m['tokens_per_s']:,.0f} tokens/s; wrote {out}/metrics.json, {out}/final/")
