"""Starting the workers: PyTorch's own launcher, or the processes ``torchrun`` already started.

``hexicore train`` on one machine calls :func:`launch`, which starts ``world`` workers through
``torch.distributed.launcher.api.elastic_launch`` (the API behind ``torchrun --standalone``:
c10d rendezvous on localhost, no restarts, the agent stops every worker as soon as one fails).
Workers receive resolved :class:`~..train.trainer.WorkerSpec` objects whose layouts hold the action lists
already built by the launching process's registry: a worker reads no config and builds no
schedule, so a schedule plugin registered only in the launching process (not installed as an
entry point) runs as well as a built-in one.

Across machines, start the *same* entry point (``hexicore train``) under torchrun on every
node; docs/runtime.md ("Several machines: torchrun") gives the command.

Inside torchrun (``TORCHELASTIC_RUN_ID`` and ``RANK`` are set) ``hexicore train`` runs as that
worker directly; every rank composes the same config from the same command line (and builds
its registry from the installed entry points, as ``hexicore train`` does), and rank 0's
:class:`~..train.trainer.WorkerSpec` is broadcast so all ranks agree. ``out`` and ``resume`` must be
on a filesystem rank 0 can write (checkpoints are consolidated on rank 0) and every rank can
read (resume).

Stops are clean: a failing, dead or hung rank ends every rank within the run's ``timeout_s``
plus :data:`SHUTDOWN_S` (torch's launcher would wait 30 s before killing a rank that ignores
SIGTERM, e.g. a stopped one); Ctrl-C or SIGTERM on the launcher stops every worker quietly and
ends in one line naming the last complete checkpoint; the launcher's temporary folder is removed
on every exit path (and folders of killed launchers on the next launch).

Start methods (``runtime.start_method``): ``spawn`` starts each worker as a fresh interpreter;
``forkserver`` forks each from a server process that imported torch once (started with the first
launch and kept for the launching process's life): a 2-rank run from the shell started about
1.5 s sooner on a 2-core host, and in a process that launches several runs (a library user, a
sweep) every run after the first about 2 s sooner. A forked worker would otherwise see the server's working directory, module
path and environment as they were when the server started; :class:`Launcher` carries the
launching process's, which every worker takes on first (:meth:`Launcher.apply`), so both methods
run a worker in the same state (the errors folder of *this* launch, an ``OMP_NUM_THREADS`` set
since, a plugin on a path added since).

Threads (:func:`set_threads`): ``OMP_NUM_THREADS`` when set, else the machine's usable cores
less those other processes keep busy (the 1-minute load average), divided among the local
ranks; rank 0 prints the setting.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from hexicore.core.errors import HexicoreError, RunError


def in_torchrun() -> bool:
    """True inside a worker that torchrun (or any torchelastic agent) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


ERROR_DIR = "HEXICORE_ERROR_DIR"
ERRORS_PREFIX = "hexicore-errors-"
#: seconds the launcher gives workers to stop on SIGTERM before it kills them
SHUTDOWN_S = 1
#: exit status of a worker that was told to stop (128 + signal number)
STOPPED = {128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM}


#: what torch's elastic agent sets in each worker's environment (its rank and rendezvous; every
#: other variable is the launching process's, :meth:`Launcher.apply`)
AGENT_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
                             "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "TORCH_NCCL_ASYNC_ERROR_HANDLING"})
#: what a ``forkserver`` imports once, so that no worker imports it again
FORKSERVER_PRELOAD = ("torch", "torch.distributed")


@dataclass(frozen=True)
class Launcher:
    """The launching process's state a worker runs in: working directory, module path and
    environment (with :data:`ERROR_DIR`, this launch's errors folder), taken when the workers
    are started (:func:`_launch`)."""

    cwd: str
    path: tuple[str, ...]
    environment: dict = field(default_factory=dict)

    @classmethod
    def here(cls) -> "Launcher":
        return cls(os.getcwd(), tuple(sys.path), dict(os.environ))

    def apply(self) -> None:
        """Take on the launching process's state in a worker: its environment, with the agent's
        variables (:data:`AGENT_VARIABLES`, ``TORCHELASTIC_*``) as the agent set them; its module
        path; its working directory. Under ``spawn`` this changes nothing."""
        agent = {k: v for k, v in os.environ.items() if k in AGENT_VARIABLES or k.startswith("TORCHELASTIC_")}
        os.environ.clear()
        os.environ.update(self.environment)
        os.environ.update(agent)
        sys.path[:] = list(self.path)
        os.chdir(self.cwd)


class LaunchError(RunError):
    """A worker failed, died or timed out; the message names the rank and the cause."""


class _Stop(BaseException):
    """SIGINT/SIGTERM reached the launching process."""

    def __init__(self, sig: int):
        super().__init__(sig)
        self.sig = sig


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_threads(local_world: int, *, announce: bool = False) -> int:
    """torch's intra-op threads for one of ``local_world`` processes on this machine:
    ``OMP_NUM_THREADS`` if set, else the usable cores not kept busy by other processes (1-minute
    load average), divided among the local ranks, at least one. Oversubscribed OpenMP threads
    spin against each other (a busy 2-core machine: 7.5 s a step with 2 threads, 0.4 s with 1)."""
    import torch

    cores = usable_cores()
    if os.environ.get("OMP_NUM_THREADS"):
        try:  # (torch read it when imported: in a forkserver, perhaps before it was set)
            torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
        except ValueError:
            pass  # not a number: torch's own reading of it stands
        n, why = torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
        try:
            busy = int(os.getloadavg()[0])
        except OSError:
            busy = 0
        n = max(1, max(1, cores - busy) // max(local_world, 1))
        torch.set_num_threads(n)
        why = f"{cores} cores, load {busy}, {local_world} local rank{'s' if local_world > 1 else ''}"
    if announce:
        print(f"hexicore: torch threads per rank: {n} ({why})", flush=True)  # a note: stdout, stderr is for errors
    return n


def _quiet_stop(sig: int, frame: Any) -> None:
    """A worker told to stop (Ctrl-C on its terminal, the launcher's SIGTERM) leaves at once and
    silently: the launcher says what happened; a checkpoint being written is left as a
    temporary file, removed on the next run."""
    os._exit(128 + sig)


@contextmanager
def _stoppable() -> Iterator[None]:
    """SIGINT/SIGTERM raise :class:`_Stop` in the launching process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(sig: int, frame: Any) -> None:
        raise _Stop(sig)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def stop_line(sig: int, specs: list) -> str:
    """One line for a stopped run: the signal and the last complete checkpoint to resume from."""
    from ..checkpoint import native as checkpoint

    last = None
    for spec in specs:
        if spec.output.out:
            try:
                last = checkpoint.resolve(spec.output.out)
            except HexicoreError:
                pass
    name = signal.Signals(sig).name
    return (f"stopped by {name}; last complete checkpoint: {last} (continue with resume={last})" if last
            else f"stopped by {name}; no checkpoint was written")


def worker_main(specs: list, launcher: Launcher | None = None) -> list[Any] | None:
    """Entry point of every worker: take on the ``launcher``'s state (None: torchrun started this
    process), init the process group, run the specs in order."""
    if launcher is not None:
        launcher.apply()
    import torch
    import torch.distributed as dist

    from ..train.trainer import choose_backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _quiet_stop)
    set_threads(local_world, announce=rank == 0)
    if os.environ.get(ERROR_DIR):  # the launcher's watchdog kills what does not stop (docs above)
        with open(os.path.join(os.environ[ERROR_DIR], f"pid{rank}.txt"), "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    backend = choose_backend(specs[0].launch.backend)
    device = torch.device("cpu")
    if specs[0].links is not None:  # every transfer held to the cluster's declared links
        from .emulated_links import install

        backend = install(specs[0].links)
    elif backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group(backend, timeout=timedelta(seconds=max(s.launch.timeout_s for s in specs)))
    try:
        results = []
        for spec in specs:
            need = spec.world if hasattr(spec, "execute") else spec.layout.world
            if need != world:
                raise HexicoreError(f"the plan needs {need} processes, this job has {world}")
            spec = _agree(spec, rank, world)
            results.append(run_one(spec, rank, world, device))
        return results if rank == 0 else None
    except Exception as exc:  # noqa: BLE001 - one clear line per failing rank, then a non-zero exit
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"hexicore: rank {rank}: {type(exc).__name__}: {line}", file=sys.stderr, flush=True)
        if os.environ.get(ERROR_DIR):
            with open(os.path.join(os.environ[ERROR_DIR], f"rank{rank}.txt"), "w", encoding="utf-8") as f:
                f.write(line)
            if isinstance(exc, HexicoreError) and not isinstance(exc, RunError):  # bad input: exit 2
                with open(os.path.join(os.environ[ERROR_DIR], f"input{rank}.txt"), "w", encoding="utf-8") as f:
                    f.write(line)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_one(spec, rank: int, world: int, device) -> Any:
    """One job on this rank: a :class:`~..train.trainer.WorkerSpec` trains; any other job object
    (e.g. :class:`~..profile.profiler.ProfileJob`) runs its own ``execute(rank, world, device)``."""
    if hasattr(spec, "execute"):
        return spec.execute(rank, world, device)
    from ..train.trainer import train

    return train(spec, rank, world, device)


def _agree(spec, rank: int, world: int):
    """Rank 0's spec for everyone (torchrun: each rank composed its own)."""
    import torch.distributed as dist

    box = [spec if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def launch(specs: list, nproc: int) -> list[Any]:
    """Run ``specs`` in sequence on ``nproc`` local workers, started as the first spec's
    :class:`~.settings.LaunchSettings` say; rank 0's results. A stop (SIGINT/SIGTERM) is a
    :class:`LaunchError` naming the last complete checkpoint."""
    if in_torchrun():
        return worker_main(specs) or []
    try:
        with _stoppable():
            return _launch(specs, nproc, specs[0].launch.start_method)
    except (_Stop, KeyboardInterrupt) as exc:
        raise LaunchError(stop_line(getattr(exc, "sig", signal.SIGINT), specs)) from None


def _launch(specs: list, nproc: int, start_method: str) -> list[Any]:
    if nproc == 1:
        import torch

        set_threads(1, announce=True)
        return [run_one(spec, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")) for spec in specs]
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, start_method=start_method, shutdown_timeout=SHUTDOWN_S)
    _remove_orphans()
    errors = tempfile.mkdtemp(prefix=f"{ERRORS_PREFIX}{os.getpid()}-")
    saved = os.environ.get(ERROR_DIR)
    os.environ[ERROR_DIR] = errors  # the workers take it on (Launcher) and leave their one-line error there
    if start_method == "forkserver":
        import multiprocessing

        package = __name__.rsplit(".launch.", 1)[0]  # this runtime's trainer and profiler, with what they import
        multiprocessing.set_forkserver_preload([*FORKSERVER_PRELOAD, __name__, f"{package}.train.trainer",
                                                f"{package}.profile.profiler"])
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)  # each sets its own level
               if n.startswith(("torch.distributed.elastic", "torch.multiprocessing"))]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # workers print their own one-line errors; we print the summary
        lg.setLevel(logging.CRITICAL)
    done, killed = threading.Event(), set()
    watchdog = threading.Thread(target=_watch, args=(errors, done, killed), daemon=True)
    watchdog.start()
    try:
        out = elastic_launch(config, worker_main)(specs, Launcher.here())
    except SignalException as exc:
        raise _Stop(int(exc.sigval)) from None
    except ChildFailedError as exc:
        codes = [getattr(f, "exitcode", 1) for f in (getattr(exc, "failures", {}) or {}).values()]
        if codes and all(c in STOPPED for c in codes):  # the workers were told to stop (Ctrl-C)
            raise _Stop(abs(codes[0]) - 128 if codes[0] > 0 else -codes[0]) from None
        bad = sorted(Path(errors).glob("input*.txt"))
        if bad:  # a worker found the input bad (a tensor's values): one line, exit 2 as before launch
            raise HexicoreError(bad[0].read_text(encoding="utf-8")) from None
        raise LaunchError(_failure_line(exc, errors, killed)) from None
    finally:
        done.set()
        watchdog.join()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if saved is None:
            os.environ.pop(ERROR_DIR, None)
        else:
            os.environ[ERROR_DIR] = saved
        shutil.rmtree(errors, ignore_errors=True)
    return out[0]


def _watch(errors: str, done: threading.Event, killed: set[int]) -> None:
    """Once a rank has reported its error, give the others :data:`SHUTDOWN_S` to stop, then
    SIGKILL those still there (torch's process context waits 30 s after SIGTERM, which a
    stopped or wedged rank never acts on); the ranks killed go into ``killed``."""
    folder = Path(errors)
    while not done.wait(0.1):
        if any(folder.glob("rank*.txt")):
            if done.wait(SHUTDOWN_S):
                return
            for f in folder.glob("pid*.txt"):
                try:
                    os.kill(int(f.read_text(encoding="utf-8")), signal.SIGKILL)
                    killed.add(int(f.stem[3:]))
                except (ValueError, OSError):
                    pass
            return


def _remove_orphans() -> None:
    """Temporary folders of launchers that were killed (SIGKILL gives no chance to clean up)."""
    for d in Path(tempfile.gettempdir()).glob(f"{ERRORS_PREFIX}*-*"):
        pid = d.name[len(ERRORS_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _failure_line(exc: Any, errors: str, killed: set[int] = frozenset()) -> str:
    """One line: the first rank that exited abnormally by itself (killed from outside, or died
    without a word) with the first reported error, else the first rank that reported an error
    (a timeout names what it waited for). Ranks the launcher stopped afterwards are not causes."""
    reported = sorted(Path(errors).glob("rank*.txt"), key=lambda p: p.stat().st_mtime)
    failures = getattr(exc, "failures", {}) or {}
    dead = sorted((r, getattr(f, "exitcode", "?")) for r, f in failures.items()
                  if getattr(f, "exitcode", 1) != 1 and r not in killed
                  and not (reported and getattr(f, "exitcode", 1) in STOPPED))
    if dead:
        r, code = dead[0]
        why = f"died (signal {-code})" if isinstance(code, int) and code < 0 else f"exited with code {code}"
        first = f"rank {r} {why}"
        if reported:
            first += f"; rank {reported[0].stem[4:]}: {reported[0].read_text(encoding='utf-8')}"
        return f"training failed: {first}"
    if reported:
        return f"training failed: rank {reported[0].stem[4:]}: {reported[0].read_text(encoding='utf-8')}"
    codes = sorted((r, getattr(f, "exitcode", "?")) for r, f in failures.items())
    return f"training failed: {', '.join(f'rank {r} exited with code {c}' for r, c in codes) or exc}"
