"""Emulated heterogeneity on one host: the runtime side of a cluster file's ``emulate``
(:mod:`hexicore.core.emulation`, a test aid, never a default).

Every compute action (F, B, I, W) and the optimizer step of an emulated machine's ranks runs
inside :func:`emulated`, which sleeps after the work until it has lasted the emulated device's
time, while the process leaves the CPU to the others (as a slower GPU leaves the host).
``hexicore profile`` measures through the same function, so a profile sees an emulated device
exactly as the runtime runs it.

* ``slowdown: K`` — ``K`` times the work. The work is, on CPU, the calling thread's CPU seconds
  (``time.thread_time``; torch runs its CPU ops on the calling thread with one intra-op thread),
  on CUDA the synchronised wall seconds. On a CPU host shared by several ranks the wall time of
  an action also holds the time the rank waited for a core and the time it waited for a
  collective inside the action (a TP all-reduce runs on the communicator's threads). Neither is
  the device's compute: the action ends at ``start + K x work`` (or when it is done, if later),
  so such waits are hidden inside the device time as a GPU's kernels run on while its host
  thread waits, and they are never multiplied by ``K``.
* ``tflops: X`` — a fixed speed: the action's FLOPs, counted while it runs (:class:`FlopCount`,
  torch's own FLOP formulas), over ``X`` TFLOP/s. The host's speed no longer enters, as long as
  the host needs less than that.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from hexicore.core.emulation import Emulation

_aten = torch.ops.aten


def _sdpa_cpu(q: Any, k: Any, v: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    return flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)


def _sdpa_cpu_backward(g: Any, q: Any, k: Any, v: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    return flop_counter.sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape)


#: torch's FLOP formulas (matrix products, convolutions, the fused attention kernels of CUDA) plus
#: the CPU flash-attention kernel that ``scaled_dot_product_attention`` uses here, counted as
#: torch counts the CUDA ones
FORMULAS = {**flop_counter.flop_registry,
            _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
            _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward}


class FlopCount(TorchDispatchMode):
    """Counts the FLOPs of the operators run inside it (autograd's backward included: the
    engine carries the mode to the ops it runs), in ``flops``."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = FORMULAS.get(func._overloadpacket)
        if count is not None:
            self.flops += int(count(*args, **kwargs, out_val=out))
        return out


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
    cpu = cpu_started is not None and device.type != "cuda"
    work = time.thread_time() - cpu_started if cpu else time.perf_counter() - started
    return hold(factor * max(work, 0.0), started, device)


def hold(seconds: float, started: float, device: torch.device) -> float:
    """Sleep until work begun at ``started`` has lasted ``seconds`` (or return at once if it
    already has); return the unstretched wall duration in seconds."""
    settle(device)
    took = time.perf_counter() - started
    time.sleep(max(seconds - took, 0.0))
    return took


@contextmanager
def emulated(emulation: Emulation, device: torch.device) -> Iterator[None]:
    """Run the body as a piece of device compute of ``emulation``'s speed (module docstring);
    nothing is added when the machine is not emulated."""
    if not emulation.active:
        yield
        return
    wall, cpu = clock()
    if emulation.tflops > 0.0:
        with FlopCount() as count:
            yield
        hold(count.flops / (emulation.tflops * 1e12), wall, device)
    else:
        yield
        stretch(emulation.slowdown, wall, device, cpu)
