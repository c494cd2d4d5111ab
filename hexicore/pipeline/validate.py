"""The action-list validator (the action-list contract: docs/formats.md).

:func:`validate_actions` checks, and raises :class:`ScheduleError` naming the rank, the position
and the action on the first defect:

* shape: ``stage_rank`` covers every stage; every stage is on exactly one chain; micro-batches
  name a chain;
* every action's stage lives on the rank that runs it, its micro-batch runs through the stage;
* every (stage, micro-batch) of a micro-batch's chain is computed exactly once (one F and one B,
  or one I and one W), in dependency order: F after the previous stage's F, B/I after its own F
  and the next stage's B/I, W after I;
* the step: at most one ``STEP`` per rank, its last action (none: the runtime steps after the
  list); with several chains of one length (model copies, Chimera), every stage whose part has
  replicas is summed with them by exactly one ``REDUCE`` (:func:`check_sync`), else the copies
  would train apart;
* every SEND is matched by the peer's RECV (FIFO per link), every RECV by a SEND, and the lists
  finish when run with asynchronous sends and blocking receives (no deadlock) — the execution
  of :func:`hexicore.pipeline.simulate.simulate` with unit times (T_F = 1, T_B = 2).

Compute-only lists (what schedules emit) are checked as if the comm pass had run; pass
``comm=True`` to insist that the lists carry their own SEND/RECV (what a runtime executes).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from hexicore.core.errors import ScheduleError
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.timing import SimResult, Timing


def check_layout(al: ActionList) -> None:
    """Stage map, chains and micro-batch chains are consistent."""
    if len(al.stage_rank) != al.stages or any(not 0 <= r < al.ranks for r in al.stage_rank):
        raise ScheduleError(f"stage_rank needs {al.stages} ranks in [0, {al.ranks})", field="stage_rank")
    lists = len(al.actions) if al.has_objects() else al.arrays.ranks
    if lists != al.ranks:
        raise ScheduleError(f"expected {al.ranks} action lists, got {lists}", field="actions")
    where: dict[int, int] = {}
    for c, chain in enumerate(al.chains):
        for s in chain:
            if not 0 <= s < al.stages or s in where:
                raise ScheduleError(f"chain {c}: stage {s} is out of range or on two chains", field="chains")
            where[s] = c
    if len(where) != al.stages:
        raise ScheduleError(f"chains cover {len(where)} of {al.stages} stages", field="chains")
    if len(al.mb_chain) != al.micro_batches or any(not 0 <= c < len(al.chains) for c in al.mb_chain):
        raise ScheduleError(f"mb_chain needs {al.micro_batches} chain indices in [0, {len(al.chains)})",
                            field="mb_chain")


def check_built(al: Any, name: str, ranks: int, micro_batches: int) -> ActionList:
    """What schedule ``name``'s ``order()`` returned for ``ranks`` and ``micro_batches``: an
    :class:`ActionList` for them with one list per rank and a consistent stage map
    (:func:`check_layout`), returned; else a one-line :class:`ScheduleError` naming the schedule."""
    where = f"schedule {name}"
    if not isinstance(al, ActionList):
        raise ScheduleError(f"order() returned {type(al).__name__}, not an ActionList", source=where)
    if (al.ranks, al.micro_batches) != (ranks, micro_batches):
        raise ScheduleError(f"order() built lists for {al.ranks} ranks and {al.micro_batches} micro-batches, "
                            f"asked for {ranks} and {micro_batches}", source=where)
    try:
        check_layout(al)
    except ScheduleError as exc:
        raise ScheduleError(exc.message, source=where, field=exc.field) from None
    return al


@contextmanager
def blamed(name: str) -> Iterator[None]:
    """Inside, a :class:`ScheduleError` without a source (the simulator's deadlock or matching
    defect in lists schedule ``name`` built) is raised again naming the schedule."""
    try:
        yield
    except ScheduleError as exc:
        if exc.source:
            raise
        raise ScheduleError(exc.message, source=f"schedule {name}", field=exc.field) from None


def check_sync(al: ActionList) -> None:
    """The step rules of the module docstring: STEP at most once per rank and last; one REDUCE
    per replicated stage (chains of one length: position k of every chain is one model part)."""
    import numpy as np

    from hexicore.pipeline.arrays import REDUCE, STEP

    a = al.arrays
    rank = a.rank_of()
    steps = np.bincount(rank[a.op == STEP], minlength=al.ranks)
    ends = a.offsets[1:] - 1
    for r in range(al.ranks):
        if steps[r] > 1 or (steps[r] == 1 and a.op[ends[r]] != STEP):
            raise ScheduleError(f"rank {r}: {int(steps[r])} STEP actions; at most one, as the list's last action "
                                "(the optimizer steps once per iteration)", field=f"actions[{r}]")
    lengths = {len(c) for c in al.chains}
    if len(al.chains) < 2 or len(lengths) != 1 or al.stages == 0:
        return
    reduced = np.bincount(a.stage[(a.op == REDUCE) & (a.stage >= 0)], minlength=al.stages)  # bad ones: below
    for s in (s for chain in al.chains for s in chain):
        if reduced[s] != 1:
            raise ScheduleError(f"stage {s} (a model part with {len(al.chains)} copies) has {int(reduced[s])} REDUCE "
                                "actions; exactly one sums its gradients with its replicas'", field="actions")


def validate_actions(al: ActionList, *, comm: bool | None = None, fast: bool | None = None) -> SimResult:
    """Validate ``al`` (module docstring); returns the unit-time simulation on success. Large
    lists are checked on arrays (:mod:`hexicore.pipeline.simulate_fast`; ``fast`` forces the choice)."""
    check_layout(al)
    check_sync(al)
    return simulate(al, Timing.uniform(al), comm=comm, fast=fast)
