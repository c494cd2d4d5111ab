"""The ``measured`` object of ``metrics.json``: what a run took, with the keys of ``predicted``
(:mod:`hexicore.core.prediction`; docs/runtime.md, "What a run measures").

Each rank records, for every step it runs after its first (the first pays one-off costs:
allocator warm-up, lazy imports, communicator setup):

* its schedule part: the step's wall time in :meth:`~..parallel.pipeline.Executor.run_step` minus the
  DP sync (``Executor.sync_s``: replica and tied-embedding gradient sums, the data-parallel
  reduction and the optimizer step, timed around :meth:`~..parallel.pipeline.Executor._step`,
  and the trainer's loss all-reduce that ends the step);
* the forward and backward seconds of each micro-batch through its stage (``Executor.passes``:
  ``F`` is the forward, ``B``, ``I`` and ``W`` the backward, summed over the rank's chunks, so an
  interleaved schedule's chunks count as one stage);
* its peak memory: ``torch.cuda.max_memory_allocated`` on a GPU, the process's peak resident
  set size (``resource.getrusage``) on CPU;
* its messages (``Executor.messages``, a pipeline leader's): when each send was posted, and for
  each receive when the rank began to wait for it and when it arrived, on the host's one clock.

Each rank keeps medians; rank 0 gathers them (``all_gather_object``) and reduces them: a
pipeline's ``pipelines_s`` and a stage's forward/backward are the largest over their ranks (TP
ranks included), ``peak_memory_gb`` one entry per rank, ``step_s`` the median of rank 0's step
times after the first. ``dp_sync_s`` is, per step, the shortest sync over the ranks, then the
median over steps: a rank that finished its schedule early waits inside the sync for the slowest
pipeline, while the rank that arrived last waited for nobody, so its sync time is the sync's own
and ``step_s`` ~ ``max(pipelines_s) + dp_sync_s`` as in the cost model. ``hops`` (per pipeline,
per boundary between pipeline ranks ``j`` and ``j + 1``: one micro-batch's activation or
gradient crossing it, the cost model's ``HOP_j``) is the median over the messages whose receiver
was already waiting when the sender posted them, from the post to the arrival
(:func:`hop_times`): a message that arrived before its receiver asked says only that it took
less than that. On a GPU the host's clock does not see when a CUDA stream moves the bytes, so
``hops`` is null there.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch
import torch.distributed as dist

GIB = 2**30
FORWARD, BACKWARD = frozenset({"F"}), frozenset({"B", "I", "W"})


def peak_memory_gb(device: torch.device) -> float:
    """This process's peak memory in GiB: CUDA allocator peak on a GPU, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux reports KiB


def reset_peak(device: torch.device) -> None:
    """Start the CUDA allocator's peak afresh (a process's RSS peak cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Recorder:
    """One rank's step records (``record`` after each step) and their medians (``summary``)."""

    def __init__(self) -> None:
        self.steps = 0
        self.schedule_s: list[float] = []
        self.sync_s: list[float] = []
        self.forward_s: list[float] = []
        self.backward_s: list[float] = []
        self.messages: list[list[tuple]] = []  # per step kept, the executor's messages

    def record(self, executor: Any) -> None:
        """Keep ``executor``'s last step unless it is this process's first."""
        self.steps += 1
        if executor is None or self.steps == 1:
            return
        self.schedule_s.append(executor.schedule_s)
        self.sync_s.append(executor.sync_s)
        self.messages.append(list(getattr(executor, "messages", [])))
        per_mb: dict[int, list[float]] = {}
        for op, _, mb, seconds in executor.passes:
            kind = getattr(op, "value", str(op))
            pair = per_mb.setdefault(mb, [0.0, 0.0])
            pair[0 if kind in FORWARD else 1] += seconds
        self.forward_s += [f for f, _ in per_mb.values()]
        self.backward_s += [b for _, b in per_mb.values()]

    def summary(self, role: Any, device: torch.device) -> dict[str, Any]:
        """This rank's medians, its place (pipeline, stage) and its peak memory."""
        return {"pipeline": role.pipeline if role is not None else None,
                "stage": role.pipe_rank if role is not None else None,
                "schedule_s": _median(self.schedule_s), "sync_steps": list(self.sync_s),
                "forward_s": _median(self.forward_s), "backward_s": _median(self.backward_s),
                "peak_memory_gb": peak_memory_gb(device), "messages": self.messages}


def gather(summary: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Every rank's summary, in rank order (every rank must call this)."""
    if world == 1:
        return [summary]
    every: list = [None] * world
    dist.all_gather_object(every, summary)
    return every


def _largest(xs: Sequence[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def _sync_s(per_rank: Sequence[Sequence[float]]) -> float | None:
    """The median over steps of the step's shortest sync: the rank that reached the sync last
    waited for nobody, so its time is the sync's own (the others' include waiting for it)."""
    steps = min((len(x) for x in per_rank), default=0)
    return _median([min(x[k] for x in per_rank) for k in range(steps)])


def hop_times(summaries: Sequence[dict[str, Any]], stage_counts: Sequence[int]) -> list[list[float | None]]:
    """Per pipeline, per boundary between pipeline ranks ``j`` and ``j + 1``, the median seconds a
    message took to cross it: a send paired with its receive (same kind, receiving stage and
    micro-batch, same step, same pipeline), counted from the post to the arrival where the
    receiver was waiting before the post (else the arrival is when it asked, not when the bytes
    came); activations and gradients alike. None where no such message crossed the boundary."""
    out: list[list[list[float]]] = [[[] for _ in range(max(n - 1, 0))] for n in stage_counts]
    for i in range(len(stage_counts)):
        ranks = [s for s in summaries if s["pipeline"] == i and s.get("messages")]
        for step in range(min((len(s["messages"]) for s in ranks), default=0)):
            posts = {key: (s["stage"], at) for s in ranks for side, key, at, _ in s["messages"][step] if side == "send"}
            for s in ranks:
                for side, key, asked, arrived in s["messages"][step]:
                    sender = posts.get(tuple(key)) if side == "recv" else None
                    if sender is None or abs(sender[0] - s["stage"]) != 1 or asked > sender[1]:
                        continue
                    out[i][min(sender[0], s["stage"])].append(arrived - sender[1])
    return [[_median(h) for h in p] for p in out]


def measured(summaries: Sequence[dict[str, Any]], step_s: Sequence[float], stage_counts: Sequence[int],
             memory: str) -> dict[str, Any]:
    """The ``measured`` object from every rank's summary, rank 0's step times of this process,
    and the number of stages of each pipeline (``memory``: ``cuda`` or ``rss``, how it was read)."""
    steady = list(step_s[1:])  # one step only: nothing steady to measure (null)
    on = [[[s for s in summaries if s["pipeline"] == i and s["stage"] == j] for j in range(n)]
          for i, n in enumerate(stage_counts)]
    return {"step_s": _median(steady),
            "pipelines_s": [_largest([s["schedule_s"] for st in p for s in st]) for p in on],
            "dp_sync_s": _sync_s([s["sync_steps"] for s in summaries if s["sync_steps"]]),
            "peak_memory_gb": [s["peak_memory_gb"] for s in summaries],
            "stages": [[{"forward_s": _largest([s["forward_s"] for s in st]),
                         "backward_s": _largest([s["backward_s"] for s in st])} for st in p] for p in on],
            "hops": None if memory == "cuda" else hop_times(summaries, stage_counts),
            "memory": memory, "steps": len(steady),
            "per_rank": [{"pipeline": s["pipeline"], "stage": s["stage"], "schedule_s": s["schedule_s"],
                          "dp_sync_s": _median(s["sync_steps"]), "forward_s": s["forward_s"],
                          "backward_s": s["backward_s"]} for s in summaries]}
