"""Starting the workers: PyTorch's own launcher, or the processes ``torchrun`` already started.

``hexicore train`` on one machine calls :func:`launch`, which starts ``world`` workers through
``torch.distributed.launcher.api.elastic_launch`` (the API behind ``torchrun --standalone``:
c10d rendezvous on localhost, no restarts, the agent stops every worker as soon as one fails).
Workers receive resolved :class:`~.trainer.WorkerSpec` objects whose layouts hold the action lists
already built by the launching process's registry: a worker reads no config and builds no
schedule, so a schedule plugin registered only in the launching process (not installed as an
entry point) runs as well as a built-in one.

Across machines, start the *same* entry point (``hexicore train``) under torchrun on every
node; docs/runtime.md ("Several machines: torchrun") gives the command.

Inside torchrun (``TORCHELASTIC_RUN_ID`` and ``RANK`` are set) ``hexicore train`` runs as that
worker directly; every rank composes the same config from the same command line (and builds
its registry from the installed entry points, as ``hexicore train`` does), and rank 0's
:class:`~.trainer.WorkerSpec` is broadcast so all ranks agree. ``out`` and ``resume`` must be
on a filesystem rank 0 can write (checkpoints are consolidated on rank 0) and every rank can
read (resume).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from hexicore.core.errors import HexicoreError, RunError


def in_torchrun() -> bool:
    """True inside a worker that torchrun (or any torchelastic agent) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


ERROR_DIR = "HEXICORE_ERROR_DIR"


class LaunchError(RunError):
    """A worker failed, died or timed out; the message names the rank and the cause."""


def worker_main(specs: list) -> list[Any] | None:
    """Entry point of every worker: init the process group, run the specs in order."""
    import torch
    import torch.distributed as dist

    from .trainer import choose_backend, train

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world, 1)))
    backend = choose_backend(specs[0].backend)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group(backend, timeout=timedelta(seconds=max(s.timeout_s for s in specs)))
    try:
        results = []
        for spec in specs:
            if spec.layout.world != world:
                raise HexicoreError(f"the plan needs {spec.layout.world} processes, this job has {world}")
            spec = _agree(spec, rank, world)
            results.append(train(spec, rank, world, device))
        return results if rank == 0 else None
    except Exception as exc:  # noqa: BLE001 - one clear line per failing rank, then a non-zero exit
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"hexicore: rank {rank}: {type(exc).__name__}: {line}", file=sys.stderr, flush=True)
        if os.environ.get(ERROR_DIR):
            with open(os.path.join(os.environ[ERROR_DIR], f"rank{rank}.txt"), "w", encoding="utf-8") as f:
                f.write(line)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _agree(spec, rank: int, world: int):
    """Rank 0's spec for everyone (torchrun: each rank composed its own)."""
    import torch.distributed as dist

    box = [spec if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def launch(specs: list, nproc: int, *, start_method: str = "spawn") -> list[Any]:
    """Run ``specs`` in sequence on ``nproc`` local workers; rank 0's results."""
    if in_torchrun():
        return worker_main(specs) or []
    if nproc == 1:
        import torch

        from .trainer import train

        return [train(spec, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")) for spec in specs]
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, start_method=start_method)
    errors = tempfile.mkdtemp(prefix="hexicore-errors-")
    saved = os.environ.get(ERROR_DIR)
    os.environ[ERROR_DIR] = errors  # spawned workers inherit it and leave their one-line error there
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # workers print their own one-line errors; we print the summary
        lg.setLevel(logging.CRITICAL)
    try:
        out = elastic_launch(config, worker_main)(specs)
    except ChildFailedError as exc:
        raise LaunchError(_failure_line(exc, errors)) from None
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if saved is None:
            os.environ.pop(ERROR_DIR, None)
        else:
            os.environ[ERROR_DIR] = saved
        shutil.rmtree(errors, ignore_errors=True)
    return out[0]


def _failure_line(exc: Any, errors: str) -> str:
    """One line: the first rank that reported an error (a timeout names what it waited for),
    else the first rank that exited abnormally (killed, or died without a word)."""
    reported = sorted(Path(errors).glob("rank*.txt"), key=lambda p: p.stat().st_mtime)
    failures = getattr(exc, "failures", {}) or {}
    dead = sorted((r, getattr(f, "exitcode", "?")) for r, f in failures.items()
                  if getattr(f, "exitcode", 1) not in (1,))
    if dead:
        r, code = dead[0]
        why = f"died (signal {-code})" if isinstance(code, int) and code < 0 else f"exited with code {code}"
        first = f"rank {r} {why}"
        if reported:
            first += f"; rank {reported[0].stem[4:]}: {reported[0].read_text(encoding='utf-8')}"
        return f"training failed: {first}"
    if reported:
        return f"training failed: rank {reported[0].stem[4:]}: {reported[0].read_text(encoding='utf-8')}"
    return f"training failed: {', '.join(f'rank {r} exited with code {c}' for r, c in sorted((r, getattr(f, 'exitcode', '?')) for r, f in failures.items())) or exc}"
