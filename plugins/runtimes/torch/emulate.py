"""Emulated heterogeneity on one host: stretch compute to ``K`` times its measured duration.

A cluster file may give a machine ``emulate: {slowdown: K}`` (a test aid, never a default;
:class:`hexicore.core.cluster.Machine`). Every compute action (F, B, I, W) of that machine's
ranks is timed and followed by a sleep of ``(K - 1)`` times its duration, so the action takes
``K`` times as long as on the real device while the process leaves the CPU to the others (as a
slower GPU leaves the host). ``hexicore profile`` measures through the same function, so a
profile sees an emulated device exactly as the runtime runs it.
"""

from __future__ import annotations

import time

import torch


def settle(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously; CPU work is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stretch(factor: float, started: float, device: torch.device) -> float:
    """Sleep so work begun at ``started`` (``time.perf_counter()``) lasts ``factor`` times as long;
    return the unstretched duration in seconds. ``factor <= 1`` returns at once."""
    if factor <= 1.0:
        return time.perf_counter() - started
    settle(device)
    took = time.perf_counter() - started
    time.sleep((factor - 1.0) * took)
    return took
