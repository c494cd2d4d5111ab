"""Cost-weighted event simulation of per-rank action lists (DESIGN.md §4, §6; issue 5 item 4).

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
Lists of ``FAST_MIN`` actions or more are first run by :mod:`hexicore.pipeline.simulate_fast` (numpy
sweeps, same results; it defers to this event loop on any defect, so errors read the same).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import Action, ActionList
from hexicore.core.errors import ScheduleError


def shares(al: ActionList) -> tuple[float, ...]:
    """Fraction of its rank's share each stage is: ``1 / (#stages of the same chain on that rank)``."""
    out = [1.0] * al.stages
    for chain in al.chains:
        count: dict[int, int] = {}
        for s in chain:
            count[al.stage_rank[s]] = count.get(al.stage_rank[s], 0) + 1
        for s in chain:
            out[s] = 1.0 / count[al.stage_rank[s]]
    return tuple(out)


@dataclass(frozen=True)
class Timing:
    """Per-stage compute times and per-link transfer times (seconds or any unit).

    ``hops[r]`` is one transfer between ranks ``r`` and ``r+1`` (either direction); a transfer
    between non-adjacent ranks (the loop wrap of interleaved 1F1B) costs ``max(hops)``.
    ``input_grad``/``weight_grad`` (zero-bubble ``I``/``W``) default to half of ``backward``.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    hops: tuple[float, ...] = ()
    input_grad: tuple[float, ...] | None = None
    weight_grad: tuple[float, ...] | None = None
    reduce: float = 0.0

    def link(self, a: int, b: int) -> float:
        if a == b or not self.hops:
            return 0.0
        lo, hi = min(a, b), max(a, b)
        return self.hops[lo] if hi == lo + 1 and lo < len(self.hops) else max(self.hops)

    def durations(self) -> dict[str, tuple[float, ...]]:
        half = tuple(b / 2 for b in self.backward)
        return {"F": self.forward, "B": self.backward, "I": self.input_grad or half, "W": self.weight_grad or half}

    @classmethod
    def from_ranks(cls, al: ActionList, forward: Sequence[float], backward: Sequence[float],
                   hops: Sequence[float] = (), reduce: float = 0.0) -> "Timing":
        """Per-rank times of one micro-batch through the rank's whole share (Hanayo's T_F, T_B):
        a stage takes its share of its rank's time (DESIGN.md §4: TF/(2W) per stage on a wave)."""
        sh = shares(al)
        f = tuple(forward[al.stage_rank[s]] * sh[s] for s in range(al.stages))
        b = tuple(backward[al.stage_rank[s]] * sh[s] for s in range(al.stages))
        return cls(f, b, tuple(hops), reduce=reduce)

    @classmethod
    def uniform(cls, al: ActionList, forward: float = 1.0, backward: float = 2.0, comm: float = 0.0) -> "Timing":
        """Every rank T_F = ``forward``, T_B = ``backward``; every transfer ``comm``."""
        p = al.ranks
        return cls.from_ranks(al, [forward] * p, [backward] * p, [comm] * (p - 1))


@dataclass(frozen=True)
class Event:
    """One executed action: compute spans [start, end) on its rank; a send spans until arrival."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    makespan: float
    busy: tuple[float, ...]
    peak_activations: tuple[float, ...]
    events: tuple[Event, ...] = ()

    @property
    def bubble_ratio(self) -> float:
        n = len(self.busy)
        return 1.0 - sum(self.busy) / (n * self.makespan) if self.makespan > 0 else 0.0


def _where(r: int, k: int, a: Action) -> str:
    return f"rank {r}, position {k}, action {a}"


def _links(al: ActionList) -> tuple[list[dict[int, int | None]], list[dict[int, int | None]]]:
    """Per chain: stage -> previous / next stage in data order."""
    prev, nxt = [], []
    for chain in al.chains:
        p = {s: (chain[i - 1] if i else None) for i, s in enumerate(chain)}
        n = {s: (chain[i + 1] if i + 1 < len(chain) else None) for i, s in enumerate(chain)}
        prev.append(p)
        nxt.append(n)
    return prev, nxt


#: lists with at least this many actions are simulated on arrays (:mod:`hexicore.pipeline.simulate_fast`)
FAST_MIN = 20_000


def simulate(al: ActionList, timing: Timing | None = None, *, record: bool = False,
             comm: bool | None = None, fast: bool | None = None) -> SimResult:
    """Run ``al`` under ``timing`` (default :meth:`Timing.uniform`); see the module docstring.

    ``comm``: whether the lists carry their own SEND/RECV (default: whether any rank has one).
    ``record``: keep every event for timelines. Raises :class:`ScheduleError` on any defect.
    ``fast``: try the array simulation first (default: without ``record``, for ``FAST_MIN``
    actions or more); it returns the same result, and defers to this one on any defect.
    """
    timing = timing or Timing.uniform(al)
    if comm is None:
        comm = bool(al.arrays.is_comm().any()) if not al.has_objects() else \
            any(a.is_comm for acts in al.actions for a in acts)
    if not record and (fast if fast is not None else al.n_actions >= FAST_MIN):
        from hexicore.pipeline.simulate_fast import simulate_arrays

        res = simulate_arrays(al, timing, comm)
        if res is not None:
            return res
    dur = timing.durations()
    share = shares(al)
    prev_of, next_of = _links(al)
    s2r, P, M, S = al.stage_rank, al.ranks, al.micro_batches, al.stages
    lists = al.actions
    pos, clock, busy, live, peak = [0] * P, [0.0] * P, [0.0] * P, [0.0] * P, [0.0] * P
    done: dict[tuple[str, int, int], float] = {}  # ("F"|"G"|"W", stage, mb) -> end; G = B or I
    got: dict[tuple[str, int, int], float] = {}  # ("F"|"B", receiving stage, mb) -> arrival
    chans: dict[tuple[int, int], deque] = {}
    events: list[Event] = []

    def fail(r: int, k: int, a: Action, why: str) -> ScheduleError:
        return ScheduleError(f"{_where(r, k, a)}: {why}", field=f"actions[{r}][{k}]")

    def input_ready(r: int, k: int, a: Action, kind: str, src: int | None) -> float | None:
        """When the input of compute ``a`` is available on rank r (None: not yet, wait)."""
        if src is None:
            return 0.0
        dep = ("F" if kind == "F" else "G", src, a.mb)
        what = f"{src}{'F' if kind == 'F' else 'B'}{a.mb}"
        if s2r[src] == r:
            if dep not in done:
                raise fail(r, k, a, f"runs before its input {what} on the same rank")
            return done[dep]
        if comm:
            key = (kind, a.stage, a.mb)
            if key not in got:
                raise fail(r, k, a, f"input {what} from rank {s2r[src]} was not received before it "
                                    f"(no RECV_{kind} earlier on this rank)")
            return got[key]
        return done[dep] + timing.link(s2r[src], r) if dep in done else None

    def step(r: int) -> bool:
        """Execute rank r's next action if it can run now; False if it must wait."""
        k = pos[r]
        a = lists[r][k]
        op, s, mb = a.op, a.stage, a.mb
        if op == "STEP":
            pos[r] += 1
            return True
        if s is None or not 0 <= s < S:
            raise fail(r, k, a, f"stage must be in [0, {S})")
        if s2r[s] != r:
            raise fail(r, k, a, f"stage {s} is held by rank {s2r[s]}, not rank {r}")
        if op == "REDUCE":
            return _reduce(r, k, a)
        if mb is None or not 0 <= mb < M:
            raise fail(r, k, a, f"micro-batch must be in [0, {M})")
        c = al.mb_chain[mb]
        if s not in prev_of[c]:
            raise fail(r, k, a, f"stage {s} is not on chain {c} of micro-batch {mb}")
        if a.is_comm:
            return _comm(r, k, a, c)
        key = ("G" if op in "BI" else op, s, mb)
        if key in done or (op in "BI" and (("B", s, mb) in seen or ("I", s, mb) in seen)):
            raise fail(r, k, a, "computed twice")
        if op == "F":
            t = input_ready(r, k, a, "F", prev_of[c][s])
        elif op == "W":
            if ("I", s, mb) not in seen:
                raise fail(r, k, a, f"weight gradient before its input gradient {s}I{mb}")
            t = done[("G", s, mb)]
        else:
            if ("F", s, mb) not in done:
                raise fail(r, k, a, f"backward before its forward {s}F{mb}")
            t = input_ready(r, k, a, "B", next_of[c][s])
            if t is not None:
                t = max(t, done[("F", s, mb)])
        if t is None:
            return False
        start = max(clock[r], t)
        end = start + dur[op][s]
        clock[r], done[key] = end, end
        seen.add((op, s, mb))
        busy[r] += end - start
        if op == "F":
            live[r] += share[s]
            peak[r] = max(peak[r], live[r])
        elif op in "BI":
            live[r] -= share[s]
        if record:
            events.append(Event(r, a, start, end))
        pos[r] += 1
        return True

    def _comm(r: int, k: int, a: Action, c: int) -> bool:
        op, s, mb, peer = a.op, a.stage, a.mb, a.peer
        fwd = op.endswith("_F")
        other = (next_of if fwd else prev_of)[c][s] if op.startswith("SEND") else (prev_of if fwd else next_of)[c][s]
        if other is None or s2r[other] == r:
            raise fail(r, k, a, "no transfer belongs here (no neighbouring stage on another rank)")
        if peer != s2r[other]:
            raise fail(r, k, a, f"peer must be rank {s2r[other]} (holder of stage {other})")
        if op.startswith("SEND"):
            if (("F", s, mb) if fwd else ("G", s, mb)) not in done:
                raise fail(r, k, a, f"sends {s}{'F' if fwd else 'B'}{mb} before computing it")
            arrive = clock[r] + timing.link(r, peer)
            chans.setdefault((r, peer), deque()).append(("F" if fwd else "B", other, mb, arrive, k))
            if record:
                events.append(Event(r, a, clock[r], arrive))
        else:
            q = chans.get((peer, r))
            if not q:
                return False
            kind, stage, m, arrive, _ = q[0]
            if (kind, stage, m) != (op[-1], s, mb):
                raise fail(r, k, a, f"the next message from rank {peer} is "
                                    f"{'SEND_F' if kind == 'F' else 'SEND_B'} for stage {stage} micro-batch {m} "
                                    f"(messages on a link are received in the order they are sent)")
            q.popleft()
            got[(kind, s, mb)] = arrive
            clock[r] = max(clock[r], arrive)
        pos[r] += 1
        return True

    def _reduce(r: int, k: int, a: Action) -> bool:
        peer = r if a.peer is None else a.peer
        if peer == r:
            clock[r] += timing.reduce
            pos[r] += 1
            return True
        if not 0 <= peer < P:
            raise fail(r, k, a, f"peer must be a rank in [0, {P})")
        j = pos[peer]
        if j >= len(lists[peer]) or lists[peer][j].op != "REDUCE" or lists[peer][j].peer != r:
            return False
        b = lists[peer][j]
        ia = next(i for i, ch in enumerate(al.chains) if a.stage in ch)
        ib = next((i for i, ch in enumerate(al.chains) if b.stage in ch), None)
        if ib is None or al.chains[ia].index(a.stage) != al.chains[ib].index(b.stage):
            raise fail(r, k, a, f"rank {peer} reduces stage {b.stage} at position {j}, "
                                f"not a replica of stage {a.stage}")
        t = max(clock[r], clock[peer]) + timing.reduce
        clock[r] = clock[peer] = t
        pos[r] += 1
        pos[peer] += 1
        return True

    seen: set[tuple[str, int, int]] = set()
    lens = [len(x) for x in lists]
    active = [r for r in range(P) if lens[r]]
    while active:
        moved = False
        for r in active:
            while pos[r] < lens[r] and step(r):
                moved = True
        active = [r for r in active if pos[r] < lens[r]]
        if active and not moved:
            stuck = "; ".join(f"{_where(r, pos[r], lists[r][pos[r]])} waits" for r in active)
            raise ScheduleError(f"deadlock: {stuck}", field="actions")
    for (src, dst), q in chans.items():
        if q:
            kind, stage, m, _, k = q[0]
            raise ScheduleError(f"{_where(src, k, lists[src][k])}: never received by rank {dst}",
                                field=f"actions[{src}][{k}]")
    _check_complete(al, seen)
    makespan = max(clock) if P else 0.0
    return SimResult(makespan, tuple(busy), tuple(peak), tuple(events))


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


def compile_lists(al: ActionList) -> list[list[tuple]] | None:
    """Per rank ``(key, op, stage, dependency key or None, dependency rank)`` for :func:`makespan`.
    A compute op has at most one input not already ordered before it on its own rank. None for
    lists of ``FAST_MIN`` actions or more: :func:`makespan` runs them on arrays."""
    return None if al.n_actions >= FAST_MIN else _compile(al)


def _compile(al: ActionList) -> list[list[tuple]]:
    prev_of, next_of = _links(al)
    out = []
    for r, acts in enumerate(al.actions):
        row = []
        for a in acts:
            if not a.is_compute:
                continue
            c = al.mb_chain[a.mb]
            if a.op == "F":
                src, dep = prev_of[c][a.stage], "F"
            elif a.op in "BI":
                src, dep = next_of[c][a.stage], "G"
            else:
                src = None
            key = ("G" if a.op in "BI" else a.op, a.stage, a.mb)
            row.append((key, a.op, a.stage, None if src is None else (dep, src, a.mb),
                        r if src is None else al.stage_rank[src]))
        out.append(row)
    return out


def makespan(al: ActionList, timing: Timing, compiled: list[list[tuple]] | None = None) -> float:
    """Makespan only, for the planner's hot path: no checks, no events, communication and
    ``STEP`` free, ``REDUCE`` free (use :func:`simulate` when ``timing.reduce`` matters). Same
    times as :func:`simulate` on a valid list; a list that cannot finish raises ScheduleError."""
    if compiled is None and al.n_actions >= FAST_MIN:
        from dataclasses import replace

        from hexicore.pipeline.simulate_fast import simulate_arrays

        res = simulate_arrays(al, replace(timing, reduce=0.0), False)
        if res is not None:
            return res.makespan
    comp = compiled if compiled is not None else _compile(al)
    dur = timing.durations()
    P = al.ranks
    link = [[timing.link(a, b) for b in range(P)] for a in range(P)]
    pos, clock = [0] * P, [0.0] * P
    done: dict[tuple, float] = {}
    active = [r for r in range(P) if comp[r]]
    while active:
        moved = False
        for r in active:
            row, i, c, lr = comp[r], pos[r], clock[r], link[r]
            n = len(row)
            while i < n:
                key, op, s, dep, src = row[i]
                if dep is not None:
                    t = done.get(dep)
                    if t is None:
                        break
                    t += lr[src]
                    if t > c:
                        c = t
                c += dur[op][s]
                done[key] = c
                i += 1
            if i != pos[r]:
                moved = True
                pos[r], clock[r] = i, c
        active = [r for r in active if pos[r] < len(comp[r])]
        if active and not moved:
            simulate(al, timing, comm=False)  # raises the located error
            raise ScheduleError("deadlock", field="actions")
    return max(clock) if P else 0.0
