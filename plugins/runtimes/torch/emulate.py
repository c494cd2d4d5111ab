"""Emulated heterogeneity on one host: stretch compute to ``K`` times its own work.

A cluster file may give a machine ``emulate: {slowdown: K}`` (a test aid, never a default;
:class:`hexicore.core.cluster.Machine`). Every compute action (F, B, I, W) and the optimizer
step of that machine's ranks is timed and then sleeps until it has lasted ``K`` times its work,
as on a device ``K`` times slower than the host, while the process leaves the CPU to the others
(as a slower GPU leaves the host). ``hexicore profile`` measures through the same function, so
a profile sees an emulated device exactly as the runtime runs it.

The work is, on CPU, the calling thread's CPU seconds (``time.thread_time``; torch runs its CPU
ops on the calling thread with one intra-op thread), on CUDA the synchronised wall seconds. On a
CPU host shared by several ranks the wall time of an action also holds the time the rank waited
for a core and the time it waited for a collective inside the action (a TP all-reduce runs on
the communicator's threads). Neither is the device's compute: the action ends at ``start + K x
work`` (or when it is done, if later), so such waits are hidden inside the device time as a
GPU's kernels run on while its host thread waits, and they are never multiplied by ``K``.
"""

from __future__ import annotations

import time

import torch


def settle(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously; CPU work is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock() -> tuple[float, float]:
    """``(time.perf_counter(), time.thread_time())`` now: where a stretched piece of work starts."""
    return time.perf_counter(), time.thread_time()


def stretch(factor: float, started: float, device: torch.device, cpu_started: float | None = None) -> float:
    """Sleep until work begun at ``started`` (``time.perf_counter()``) has lasted ``factor x
    work``: ``work`` = this thread's CPU seconds since ``cpu_started`` (``time.thread_time()``) on
    CPU, else the wall seconds since ``started`` (CUDA, or no ``cpu_started``); return the
    unstretched wall duration in seconds. ``factor <= 1`` returns at once."""
    if factor <= 1.0:
        return time.perf_counter() - started
    settle(device)
    took = time.perf_counter() - started
    work = took if cpu_started is None or device.type == "cuda" else time.thread_time() - cpu_started
    time.sleep(max(factor * max(work, 0.0) - took, 0.0))
    return took
