"""Cost-weighted simulation of per-rank action lists: one execution model, one entry point.

Execution model (the one a runtime of :mod:`hexicore.pipeline.actions` lists implements):

* each rank runs its list in order; a compute op (F, B, I, W) occupies the rank for its
  stage's time (:class:`Timing`, may differ per stage);
* ``SEND_*`` is asynchronous (an ``isend``): it costs the rank nothing and the message arrives
  one link time later; ``RECV_*`` blocks until the next message on that link (FIFO per
  (sender, receiver) pair) has arrived and must be that message;
* ``REDUCE`` is a rendezvous of the two ranks holding replicas of a stage (Chimera): both
  finish at the later arrival plus ``Timing.reduce``; ``STEP`` is free;
* lists without any communication (what schedules emit) are run as if the shared comm pass had
  inserted it: an input from another rank is waited for, one link time after it was produced.

Outputs: makespan, per-rank busy time, bubble ratio ``1 - sum busy / (ranks * makespan)``,
peak in-flight activations per rank in units of one micro-batch through the rank's whole share
(a stage holds ``1 / (stages of its chain on the rank)`` of that; released by ``B`` or ``I``),
and a timeline. Any defect (order, matching, deadlock) raises :class:`ScheduleError` naming the
rank, the position and the action; :func:`hexicore.pipeline.validate.validate_actions` builds on it.

:func:`simulate` runs lists of ``FAST_MIN`` actions or more on the array engine of
:mod:`hexicore.pipeline.simulate_fast` (numpy sweeps, same results; it defers to the event loop
here on any defect, so errors read the same); timelines (``record``), small lists and defects run
the event loop. :func:`makespan` is the planner's view of the same engine: the makespan of a
list's compute actions, its timing-free graph built once per list, re-priced for each timing.
:class:`Timing`, :class:`SimResult`, :class:`Event` and :func:`shares` live in
:mod:`hexicore.pipeline.timing` (importable from here too).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from hexicore.core.errors import ScheduleError
from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.arrays import B as B_CODE, F as F_CODE, I as I_CODE
from hexicore.pipeline.simulate_fast import compute_graph, graph_makespan, simulate_arrays
from hexicore.pipeline.timing import Event, SimResult, Timing, shares

__all__ = ["FAST_MIN", "Event", "SimResult", "Timing", "compile_lists", "held_peaks", "makespan", "shares", "simulate"]

#: lists with at least this many actions are simulated on arrays (:mod:`hexicore.pipeline.simulate_fast`)
FAST_MIN = 20_000


def simulate(al: ActionList, timing: Timing | None = None, *, record: bool = False,
             comm: bool | None = None, fast: bool | None = None) -> SimResult:
    """Run ``al`` under ``timing`` (default :meth:`Timing.uniform`); see the module docstring.

    ``comm``: whether the lists carry their own SEND/RECV (default: whether any rank has one).
    ``record``: keep every event for timelines. Raises :class:`ScheduleError` on any defect.
    ``fast``: try the array engine first (default: without ``record``, for ``FAST_MIN``
    actions or more); it returns the same result, and defers to the event loop on any defect.
    """
    timing = timing or Timing.uniform(al)
    if comm is None:
        comm = bool(al.arrays.is_comm().any()) if not al.has_objects() else \
            any(a.is_comm for acts in al.actions for a in acts)
    if not record and (fast if fast is not None else al.n_actions >= FAST_MIN):
        res = simulate_arrays(al, timing, comm)
        if res is not None:
            return res
    return _EventLoop(al, timing, comm, record).run()


def held_peaks(al: ActionList) -> tuple[float, ...]:
    """The simulator's peak in-flight activations per rank without simulating: a rank holds
    ``share(s)`` more after each ``F`` of stage ``s`` and releases it at its ``B`` or ``I``, in
    the order of its own list, so the peak is the largest prefix sum of those steps (at least 0)
    and does not depend on any time. Equal to :func:`simulate`'s ``peak_activations`` on every
    list that runs to the end (tests/pipeline/test_simulate.py)."""
    arrays, share = al.arrays, np.asarray(shares(al), dtype=float)
    step = np.zeros(len(arrays), dtype=float)
    held = arrays.op == F_CODE
    step[held] = share[arrays.stage[held]]
    freed = (arrays.op == B_CODE) | (arrays.op == I_CODE)
    step[freed] = -share[arrays.stage[freed]]
    out = []
    for r in range(arrays.ranks):
        part = step[arrays.offsets[r]:arrays.offsets[r + 1]]
        out.append(max(0.0, float(np.cumsum(part).max())) if len(part) else 0.0)
    return tuple(out)


def compile_lists(al: ActionList) -> Any:
    """The timing-free form :func:`makespan` prices: ``al``'s compute actions and the array
    engine's graph of them (built once, kept on ``al``; None where the engine does not take
    them). Passing it to :func:`makespan` is optional."""
    return compute_graph(al)


def makespan(al: ActionList, timing: Timing, compiled: Any = None) -> float:
    """Makespan only, for the planner's hot path: the array engine on ``al``'s compute actions
    (:func:`compile_lists`) — communication, ``STEP`` and ``REDUCE`` free (use :func:`simulate`
    when ``timing.reduce`` or the lists' own communication matter). Lists under ``FAST_MIN``
    actions are evaluated in dependency order with the event loop's floating-point steps,
    larger ones by the engine's sweeps: the same times as :func:`simulate` with ``comm=False``
    on a valid list. A list that cannot finish raises the event loop's located ScheduleError."""
    c = compiled if compiled is not None else compile_lists(al)
    t = None if c is None else graph_makespan(c[0], c[1], timing, in_order=al.n_actions < FAST_MIN)
    if t is None:  # not the engine's (or a defect): the event loop names it, or prices it
        return simulate(al, replace(timing, reduce=0.0), comm=False, fast=False).makespan
    return t


def _where(r: int, k: int, a: Action) -> str:
    return f"rank {r}, position {k}, action {a}"


class _EventLoop:
    """The event loop of :func:`simulate`: ranks run their lists in order (module docstring);
    ``step`` executes one action or says it must wait; a round where nobody moves is a deadlock."""

    def __init__(self, al: ActionList, timing: Timing, comm: bool, record: bool) -> None:
        self.al, self.timing, self.comm, self.record = al, timing, comm, record
        self.dur, self.share = timing.durations(), shares(al)
        self.links = al.links
        self.prev, self.next = self.links.lists()
        self.on = self.links.pos  # on[c][s] >= 0: stage s lies on chain c
        self.lists = al.actions
        self.S, self.M, self.s2r, self.mbc = al.stages, al.micro_batches, al.stage_rank, al.mb_chain
        P = al.ranks
        self.pos, self.clock, self.busy, self.live, self.peak = [0] * P, [0.0] * P, [0.0] * P, [0.0] * P, [0.0] * P
        self.done: dict[tuple[str, int, int], float] = {}  # ("F"|"G"|"W", stage, mb) -> end; G = B or I
        self.got: dict[tuple[str, int, int], float] = {}  # ("F"|"B", receiving stage, mb) -> arrival
        self.chans: dict[tuple[int, int], deque] = {}
        self.events: list[Event] = []
        self.seen: set[tuple[str, int, int]] = set()

    def run(self) -> SimResult:
        lists, pos, step = self.lists, self.pos, self.step
        lens = [len(x) for x in lists]
        active = [r for r in range(self.al.ranks) if lens[r]]
        while active:
            moved = False
            for r in active:
                while pos[r] < lens[r] and step(r):
                    moved = True
            active = [r for r in active if pos[r] < lens[r]]
            if active and not moved:
                stuck = "; ".join(f"{_where(r, pos[r], lists[r][pos[r]])} waits" for r in active)
                raise ScheduleError(f"deadlock: {stuck}", field="actions")
        for (src, dst), q in self.chans.items():
            if q:
                k = q[0][4]
                raise ScheduleError(f"{_where(src, k, lists[src][k])}: never received by rank {dst}",
                                    field=f"actions[{src}][{k}]")
        _check_complete(self.al, self.seen)
        makespan = max(self.clock) if self.al.ranks else 0.0
        return SimResult(makespan, tuple(self.busy), tuple(self.peak), tuple(self.events))

    def fail(self, r: int, k: int, a: Action, why: str) -> ScheduleError:
        return ScheduleError(f"{_where(r, k, a)}: {why}", field=f"actions[{r}][{k}]")

    def input_ready(self, r: int, k: int, a: Action, kind: str, src: int | None) -> float | None:
        """When the input of compute ``a`` is available on rank r (None: not yet, wait)."""
        if src is None:
            return 0.0
        s2r, done = self.al.stage_rank, self.done
        dep = ("F" if kind == "F" else "G", src, a.mb)
        what = f"{src}{'F' if kind == 'F' else 'B'}{a.mb}"
        if s2r[src] == r:
            if dep not in done:
                raise self.fail(r, k, a, f"runs before its input {what} on the same rank")
            return done[dep]
        if self.comm:
            key = (kind, a.stage, a.mb)
            if key not in self.got:
                raise self.fail(r, k, a, f"input {what} from rank {s2r[src]} was not received before it "
                                         f"(no RECV_{kind} earlier on this rank)")
            return self.got[key]
        return done[dep] + self.timing.link(s2r[src], r) if dep in done else None

    def step(self, r: int) -> bool:
        """Execute rank r's next action if it can run now; False if it must wait. A compute op
        (F, B, I, W) starts when the rank is free and its inputs are there."""
        k = self.pos[r]
        a = self.lists[r][k]
        op, s, mb = a.op, a.stage, a.mb
        if op == "STEP":
            self.pos[r] += 1
            return True
        if s is None or not 0 <= s < self.S:
            raise self.fail(r, k, a, f"stage must be in [0, {self.S})")
        if self.s2r[s] != r:
            raise self.fail(r, k, a, f"stage {s} is held by rank {self.s2r[s]}, not rank {r}")
        if op == "REDUCE":
            return self.reduce(r, k, a)
        if mb is None or not 0 <= mb < self.M:
            raise self.fail(r, k, a, f"micro-batch must be in [0, {self.M})")
        c = self.mbc[mb]
        if self.on[c][s] < 0:
            raise self.fail(r, k, a, f"stage {s} is not on chain {c} of micro-batch {mb}")
        if a.is_comm:
            return self.transfer(r, k, a, c)
        done, seen = self.done, self.seen
        key = ("G" if op in "BI" else op, s, mb)
        if key in done or (op in "BI" and (("B", s, mb) in seen or ("I", s, mb) in seen)):
            raise self.fail(r, k, a, "computed twice")
        if op == "F":
            t = self.input_ready(r, k, a, "F", self.prev[c][s])
        elif op == "W":
            if ("I", s, mb) not in seen:
                raise self.fail(r, k, a, f"weight gradient before its input gradient {s}I{mb}")
            t = done[("G", s, mb)]
        else:
            if ("F", s, mb) not in done:
                raise self.fail(r, k, a, f"backward before its forward {s}F{mb}")
            t = self.input_ready(r, k, a, "B", self.next[c][s])
            if t is not None:
                t = max(t, done[("F", s, mb)])
        if t is None:
            return False
        clock = self.clock
        start = max(clock[r], t)
        end = start + self.dur[op][s]
        clock[r], done[key] = end, end
        seen.add((op, s, mb))
        self.busy[r] += end - start
        if op == "F":
            self.live[r] += self.share[s]
            self.peak[r] = max(self.peak[r], self.live[r])
        elif op in "BI":
            self.live[r] -= self.share[s]
        if self.record:
            self.events.append(Event(r, a, start, end))
        self.pos[r] += 1
        return True

    def transfer(self, r: int, k: int, a: Action, c: int) -> bool:
        """SEND (asynchronous, arrives one link time later) or RECV (blocks, FIFO per link)."""
        op, s, mb, peer = a.op, a.stage, a.mb, a.peer
        s2r, clock = self.al.stage_rank, self.clock
        fwd = op.endswith("_F")
        send = op.startswith("SEND")
        other = (self.next if fwd == send else self.prev)[c][s]
        if other is None or s2r[other] == r:
            raise self.fail(r, k, a, "no transfer belongs here (no neighbouring stage on another rank)")
        if peer != s2r[other]:
            raise self.fail(r, k, a, f"peer must be rank {s2r[other]} (holder of stage {other})")
        if send:
            if (("F", s, mb) if fwd else ("G", s, mb)) not in self.done:
                raise self.fail(r, k, a, f"sends {s}{'F' if fwd else 'B'}{mb} before computing it")
            arrive = clock[r] + self.timing.link(r, peer)
            self.chans.setdefault((r, peer), deque()).append(("F" if fwd else "B", other, mb, arrive, k))
            if self.record:
                self.events.append(Event(r, a, clock[r], arrive))
        else:
            q = self.chans.get((peer, r))
            if not q:
                return False
            kind, stage, m, arrive, _ = q[0]
            if (kind, stage, m) != (op[-1], s, mb):
                raise self.fail(r, k, a, f"the next message from rank {peer} is "
                                         f"{'SEND_F' if kind == 'F' else 'SEND_B'} for stage {stage} micro-batch {m} "
                                         f"(messages on a link are received in the order they are sent)")
            q.popleft()
            self.got[(kind, s, mb)] = arrive
            clock[r] = max(clock[r], arrive)
        self.pos[r] += 1
        return True

    def reduce(self, r: int, k: int, a: Action) -> bool:
        """REDUCE: a rendezvous with the rank holding the replica (at the same chain position)."""
        pos, clock, lists = self.pos, self.clock, self.lists
        peer = r if a.peer is None else a.peer
        if peer == r:
            clock[r] += self.timing.reduce
            pos[r] += 1
            return True
        if not 0 <= peer < self.al.ranks:
            raise self.fail(r, k, a, f"peer must be a rank in [0, {self.al.ranks})")
        j = pos[peer]
        if j >= len(lists[peer]) or lists[peer][j].op != "REDUCE" or lists[peer][j].peer != r:
            return False
        b = lists[peer][j]
        mine = self.links.position(a.stage)
        if mine is None or mine != self.links.position(b.stage):
            raise self.fail(r, k, a, f"rank {peer} reduces stage {b.stage} at position {j}, "
                                     f"not a replica of stage {a.stage}")
        t = max(clock[r], clock[peer]) + self.timing.reduce
        clock[r] = clock[peer] = t
        pos[r] += 1
        pos[peer] += 1
        return True


def _check_complete(al: ActionList, seen: set[tuple[str, int, int]]) -> None:
    """Every (stage, micro-batch) of each micro-batch's chain: one F and one B (or one I and one W)."""
    for mb in range(al.micro_batches):
        for s in al.chain_of(mb):
            r = al.stage_rank[s]
            missing = [f"{s}F{mb}"] if ("F", s, mb) not in seen else []
            if ("B", s, mb) not in seen:
                if ("I", s, mb) in seen or ("W", s, mb) in seen:
                    missing += [f"{s}{op}{mb}" for op in "IW" if (op, s, mb) not in seen]
                else:
                    missing.append(f"{s}B{mb}")
            if missing:
                raise ScheduleError(f"rank {r}: missing {', '.join(missing)} (stage {s}, micro-batch {mb})",
                                    field=f"actions[{r}]")
