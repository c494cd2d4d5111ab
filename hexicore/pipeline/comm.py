"""The shared communication pass: compute-only action lists -> lists with SEND/RECV pairs
(schedules emit compute; this one pass inserts the matching communication, docs/formats.md).

Rules (what a runtime executing the lists may rely on):

1. ``SEND_F(s, mb, peer)`` directly follows ``F(s, mb)`` when the next stage of ``mb``'s chain
   (:mod:`hexicore.pipeline.chains`) lives on another rank; ``SEND_B(s, mb, peer)`` directly
   follows ``B(s, mb)`` (or ``I``) when the previous stage does. Consecutive stages on one rank
   (a wave's turn, a V) exchange nothing.
2. Each link (sender, receiver) is FIFO: a receiver's ``RECV_*`` on a link appear in exactly the
   order of the sender's ``SEND_*`` on it, so untagged point-to-point (NCCL) matches them.
3. A ``RECV`` is placed as late as possible: just before the compute that consumes it — unless
   an earlier message on the same link is still unreceived, in which case that one is received
   first (rule 2) and kept until its consumer runs.

With asynchronous sends (``isend``/``batch_isend_irecv``) and blocking receives this order
cannot deadlock when the compute order itself is feasible: an early receive waits only for a
message that its sender posted before the one the consumer needs. A runtime may prefetch (post
the ``irecv`` of the next ``RECV`` right after the previous compute, as Hanayo's runtime does)
and wait on it at the ``RECV``'s position; it must wait on its ``isend`` handles before
``STEP``.

The pass runs on :class:`~hexicore.pipeline.arrays.ActionArrays` for every list (one
implementation; small lists get their ``Action`` objects back). Where every link's consumers
take its messages in send order (the usual case) each ``RECV`` lands right before its consumer
without ranking the messages; otherwise rule 3's early receives are placed from per-link ranks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from hexicore.core.errors import ScheduleError
from hexicore.pipeline import arrays as aa
from hexicore.pipeline.actions import OPS, Action, ActionList, from_arrays

#: results with at least this many actions stay array-backed (their objects are built on first read)
FAST_MIN = 20_000


def insert_comm(al: ActionList, *, fast: bool | None = None) -> ActionList:
    """Return ``al`` with SEND/RECV inserted per the module rules (existing comm is dropped first).
    ``fast``: keep the result array-backed (default: for ``FAST_MIN`` actions or more); the pass
    is the same either way. A consumer whose input no rank sends raises :class:`ScheduleError`."""
    base = al.compute_only()
    arrays, direct = comm_arrays(base)
    if fast if fast is not None else base.n_actions >= FAST_MIN:
        acts: Any = arrays
    else:
        acts = _objects(base, arrays) if base.has_objects() else from_arrays(arrays)
    out = ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, acts,
                     base.chains, base.mb_chain, dict(base.meta))
    if direct:  # every RECV right before its consumer: same times as ``base`` (hexicore.pipeline.simulate_fast)
        object.__setattr__(out, "_comm_base", base)
    return out


def _objects(base: ActionList, arrays: aa.ActionArrays) -> tuple[tuple[Action, ...], ...]:
    """Per rank the output's ``Action`` objects: ``base``'s own, in order, and new SEND/RECV."""
    own = iter([a for acts in base.actions for a in acts])
    comm = arrays.is_comm().tolist()
    flat = [Action(OPS[o], s, m, p) if c else next(own)
            for c, o, s, m, p in zip(comm, arrays.op.tolist(), arrays.stage.tolist(), arrays.mb.tolist(),
                                     arrays.peer.tolist())]
    o = arrays.offsets.tolist()
    return tuple(tuple(flat[o[r]:o[r + 1]]) for r in range(arrays.ranks))


class _Messages(NamedTuple):
    """Producers and consumers of messages among the compute actions ``k`` (flat indices)."""

    k: np.ndarray      # F/B/I actions with a stage and micro-batch in range
    kind: np.ndarray   # int8; 0: forward output (F), 1: input gradient (B/I)
    stage: np.ndarray
    mb: np.ndarray
    rank: np.ndarray
    send: np.ndarray   # mask over k: sends its result to another rank
    to: np.ndarray     # receiving stage of each send (over k[send])
    s_peer: np.ndarray  # receiving rank of each send
    cons: np.ndarray   # mask over k: its input comes from another rank
    c_peer: np.ndarray  # sending rank of each consumer's input (over k[cons])
    s_link: np.ndarray  # link (sender * P + receiver) of each send
    c_link: np.ndarray  # link of each consumer's input


def _messages(al: ActionList) -> _Messages:
    """Who sends what to whom (rule 1), from the chain tables and the stage map."""
    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    if len(al.stage_rank) != S or any(not 0 <= r < P for r in al.stage_rank):
        raise ScheduleError(f"stage_rank needs {S} ranks in [0, {P})", field="stage_rank")
    op, st, mb = A.op, A.stage, A.mb
    in_range = (np.asarray(mb, np.int32).view(np.uint32) < M) & (np.asarray(st, np.int32).view(np.uint32) < S)  # -1: huge
    k = np.flatnonzero((op <= aa.I) & in_range)
    s, m = st[k], mb[k]
    rank = np.repeat(np.arange(P, dtype=np.int32), np.diff(A.offsets))[k]
    kind = (op[k] != aa.F).view(np.int8)
    prev, nxt = al.links.tables()
    C = len(prev)
    at = kind.astype(np.intp)  # table row: (kind, chain, stage)
    if C > 1:
        at *= C
        at += np.asarray(al.mb_chain, dtype=np.intp)[m]
    at *= S
    at += s
    s2r = np.append(np.asarray(al.stage_rank, dtype=np.int32), -1)  # index -1: no stage
    to = np.concatenate((nxt.ravel(), prev.ravel())).astype(np.int32)[at]
    psrc = s2r[np.concatenate((prev.ravel(), nxt.ravel())).astype(np.int32)[at]]
    del at
    pto = s2r[to]
    send = (pto >= 0) & (pto != rank)
    cons = (psrc >= 0) & (psrc != rank)
    s_link = rank[send] * np.int32(P) + pto[send]  # int32: P * P links
    c_link = psrc[cons] * np.int32(P) + rank[cons]
    return _Messages(k, kind, s, m, rank, send, to[send], pto[send], cons, psrc[cons], s_link, c_link)


def _match(al: ActionList, x: _Messages) -> np.ndarray:
    """Per consumer the ordinal of the send it receives: the last send of that message on the
    consumer's link (rule 2). A consumer without one is a :class:`ScheduleError`."""
    S, M = al.stages, al.micro_batches
    span = 2 * S * M
    skey = (x.kind[x.send].astype(np.int64) * S + x.to) * M + x.mb[x.send]
    ckey = (x.kind[x.cons].astype(np.int64) * S + x.stage[x.cons]) * M + x.mb[x.cons]
    if not (np.bincount(skey, minlength=span) > 1).any():  # each message sent once: a direct table
        table = np.full(span, -1, dtype=np.int64)
        table[skey] = np.arange(len(skey))
        pj = table[ckey]
        del table
        found = (pj >= 0) & (x.s_link[pj] == x.c_link) if len(skey) else pj >= 0
    else:  # a message sent twice (a defect the validator reports): the later one, as in send order
        full = x.s_link.astype(np.int64) * span + skey
        want = x.c_link.astype(np.int64) * span + ckey
        order = np.argsort(full, kind="stable")
        at = np.searchsorted(full[order], want, side="right") - 1  # the last of equal keys
        pj = order[np.maximum(at, 0)]
        found = (at >= 0) & (full[pj] == want)
    if not found.all():
        i = int(np.flatnonzero(~found)[0])
        raise _missing(al, x, i)
    return pj


def _missing(al: ActionList, x: _Messages, i: int) -> ScheduleError:
    """The error of consumer ``i`` (over ``k[cons]``) whose input is never sent to its rank."""
    j = x.k[x.cons][i]
    A = al.arrays
    a = Action(OPS[int(A.op[j])], int(A.stage[j]), int(A.mb[j]))
    r, kind = int(x.rank[x.cons][i]), int(x.kind[x.cons][i])
    src = al.prev_stage(a.stage, a.mb) if kind == 0 else al.next_stage(a.stage, a.mb)
    return ScheduleError(f"rank {r}, action {a}: rank {int(x.c_peer[i])} never produces its input "
                         f"{src}{'F' if kind == 0 else 'B'}{a.mb}", field=f"actions[{r}]")


def _direct(al: ActionList, x: _Messages, pj: np.ndarray) -> bool:
    """Whether each link's consumers take every message of the link once, in send order (then
    each RECV sits right before its consumer)."""
    nl = al.ranks ** 2
    s_link, c_link = x.s_link, x.c_link
    if (np.bincount(s_link, minlength=nl) != np.bincount(c_link, minlength=nl)).any():
        return False
    o = np.argsort(c_link.astype(np.int16) if nl < 32768 else c_link, kind="stable")
    lo, po = c_link[o], pj[o]
    return not ((lo[1:] == lo[:-1]) & (po[1:] <= po[:-1])).any()


def _early_receives(al: ActionList, x: _Messages, pj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rule 3 in general: message j of a link is received just before the first consumer on the
    link that needs message j or a later one. Returns (consumer ordinal, send ordinal) per RECV,
    in output order (by consumer, then by message)."""
    s_link, c_link = x.s_link.astype(np.int64), x.c_link.astype(np.int64)
    order = np.argsort(s_link, kind="stable")
    sl = s_link[order]
    idx = np.empty(len(sl), dtype=np.int64)  # each send's index on its link
    idx[order] = np.arange(len(sl)) - np.searchsorted(sl, sl, side="left")
    corder = np.argsort(c_link, kind="stable")
    cl, cidx = c_link[corder], idx[pj[corder]]
    big = len(sl) + 1
    run = np.maximum.accumulate(cidx + cl * big) if len(cl) else cidx  # running max per link
    where = np.searchsorted(run, s_link * big + idx, side="left")
    got = where < len(run)
    got[got] = cl[where[got]] == s_link[got]
    cons_of, sends = corder[where[got]], np.flatnonzero(got)
    o = np.lexsort((idx[sends], cons_of))
    return cons_of[o], sends[o]


def comm_arrays(al: ActionList) -> tuple[aa.ActionArrays, bool]:
    """The pass on ``al``'s arrays (compute only): the new arrays, and whether every RECV sits
    right before its consumer (``direct``)."""
    x = _messages(al)
    pj = _match(al, x)
    kc = x.k[x.cons]
    direct = _direct(al, x, pj)
    if direct:  # RECV i right before consumer i, of the consumer's own message
        rk, nth, r_rank = kc, 0, x.rank[x.cons]
        r_kind, r_stage, r_mb, r_peer = x.kind[x.cons], x.stage[x.cons], x.mb[x.cons], x.c_peer
    else:
        r_cons, r_send = _early_receives(al, x, pj)
        rk, r_rank = kc[r_cons], x.rank[x.cons][r_cons]
        nth = np.arange(len(r_cons)) - np.searchsorted(r_cons, r_cons, side="left")  # message order
        r_kind, r_stage, r_mb, r_peer = x.kind[x.send][r_send], x.to[r_send], x.mb[x.send][r_send], \
            x.rank[x.send][r_send]
    A = al.arrays
    n, ks = len(A), x.k[x.send]
    grow = np.zeros(n, dtype=np.int64)  # actions inserted around each action
    if direct:
        grow[rk] = 1  # its RECV just before
    else:
        before = np.bincount(rk, minlength=n)
        grow += before
    grow[ks] += 1  # a SEND just after
    newk = np.cumsum(grow)
    del grow
    newk += np.arange(n)
    newk[ks] -= 1
    rp = newk[rk] - 1 if direct else newk[rk] - before[rk] + nth
    sp = newk[ks] + 1
    two = np.int8(2)  # SEND_B = SEND_F + 2, RECV_B = RECV_F + 2
    out = []
    for field, send_v, recv_v in ((A.op, x.kind[x.send] * two + np.int8(aa.SEND_F), r_kind * two + np.int8(aa.RECV_F)),
                                  (A.stage, x.stage[x.send], r_stage), (A.mb, x.mb[x.send], r_mb),
                                  (A.peer, x.s_peer, r_peer)):
        o = np.empty(n + len(ks) + len(rk), dtype=field.dtype)
        o[newk], o[sp], o[rp] = field, send_v, recv_v
        out.append(o)
    counts = np.diff(A.offsets) + np.bincount(x.rank[x.send], minlength=al.ranks) \
        + np.bincount(r_rank, minlength=al.ranks)
    return aa.ActionArrays.build(*out, counts), direct
