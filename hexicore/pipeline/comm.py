"""The shared communication pass: compute-only action lists -> lists with SEND/RECV pairs
(DESIGN.md §6 "schedules emit compute; one shared pass inserts the matching communication").

Rules (what a runtime executing the lists may rely on):

1. ``SEND_F(s, mb, peer)`` directly follows ``F(s, mb)`` when the next stage of ``mb``'s chain
   lives on another rank; ``SEND_B(s, mb, peer)`` directly follows ``B(s, mb)`` (or ``I``) when
   the previous stage does. Consecutive stages on one rank (a wave's turn, a V) exchange nothing.
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

Large lists (``FAST_MIN`` actions or more) take an array pass with the same output
(:mod:`hexicore.pipeline.arrays`; tests/test_fast_paths.py checks the equality on a grid).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from hexicore.pipeline.actions import Action, ActionList
from hexicore.core.errors import ScheduleError


#: lists with at least this many actions go through the array pass (same result, numpy speed)
FAST_MIN = 20_000


def insert_comm(al: ActionList, *, fast: bool | None = None) -> ActionList:
    """Return ``al`` with SEND/RECV inserted per the module rules (existing comm is dropped first).
    ``fast``: use the array pass (default: for lists of ``FAST_MIN`` actions or more); it falls
    back to the object pass, which names the defect, on anything unusual."""
    base = al.compute_only()
    if fast if fast is not None else base.n_actions >= FAST_MIN:
        arr = _insert_comm_arrays(base, general=False)
        if arr is not None:  # the common case: remember the source (hexicore.pipeline.simulate_fast uses it)
            out = ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, arr,
                             base.chains, base.mb_chain, dict(base.meta))
            object.__setattr__(out, "_comm_base", base)
            return out
        arr = _insert_comm_general(base)
        if arr is not None:
            return ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, arr,
                              base.chains, base.mb_chain, dict(base.meta))
    s2r = base.stage_rank
    prev_of, next_of = {}, {}
    for c, chain in enumerate(base.chains):
        for i, s in enumerate(chain):
            prev_of[c, s] = chain[i - 1] if i else None
            next_of[c, s] = chain[i + 1] if i + 1 < len(chain) else None
    # pass 1: sends right after producers; remember each link's message order
    with_sends: list[list[Action]] = []
    sent: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    for r, acts in enumerate(base.actions):
        out = []
        for a in acts:
            out.append(a)
            if a.op not in ("F", "B", "I") or a.mb is None:
                continue
            c = base.mb_chain[a.mb]
            if a.op == "F":
                to = next_of.get((c, a.stage))
                if to is not None and s2r[to] != r:
                    out.append(Action("SEND_F", a.stage, a.mb, s2r[to]))
                    sent[r, s2r[to]].append(("F", to, a.mb))
            else:
                to = prev_of.get((c, a.stage))
                if to is not None and s2r[to] != r:
                    out.append(Action("SEND_B", a.stage, a.mb, s2r[to]))
                    sent[r, s2r[to]].append(("B", to, a.mb))
        with_sends.append(out)
    # pass 2: receives just before consumers, in each link's send order
    index = {link: {m: i for i, m in enumerate(msgs)} for link, msgs in sent.items()}
    cursor: dict[tuple[int, int], int] = defaultdict(int)
    result = []
    for r, acts in enumerate(with_sends):
        out = []
        for k, a in enumerate(acts):
            if a.op in ("F", "B", "I") and a.mb is not None:
                c = base.mb_chain[a.mb]
                src = prev_of.get((c, a.stage)) if a.op == "F" else next_of.get((c, a.stage))
                if src is not None and s2r[src] != r:
                    link, msg = (s2r[src], r), ("F" if a.op == "F" else "B", a.stage, a.mb)
                    i = index.get(link, {}).get(msg)
                    if i is None:
                        raise ScheduleError(f"rank {r}, action {a}: rank {s2r[src]} never produces its input "
                                            f"{src}{'F' if a.op == 'F' else 'B'}{a.mb}", field=f"actions[{r}]")
                    while cursor[link] <= i:
                        kind, st, mb = sent[link][cursor[link]]
                        out.append(Action("RECV_" + kind, st, mb, link[0]))
                        cursor[link] += 1
            out.append(a)
        result.append(tuple(out))
    return ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, tuple(result),
                      base.chains, base.mb_chain, dict(base.meta))


def _insert_comm_arrays(al: ActionList, general: bool = True) -> Any:
    """The same pass on :class:`~hexicore.pipeline.arrays.ActionArrays` (compute-only input), or
    None when the input needs the object pass (a stage off its micro-batch's chain, a missing or
    repeated message: the object pass raises or keeps its own behaviour). Common case first:
    every link's consumers come in send order, so each RECV sits right before its consumer
    (``general=False``: None for any other pattern)."""
    from hexicore.pipeline import arrays as aa

    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    op, st, mb = A.op, A.stage, A.mb
    i32 = np.int32  # values stay 32-bit: the pass touches ~10^6-10^7 entries, memory is the cost
    s2r = np.append(np.asarray(al.stage_rank, dtype=i32), -1)  # index -1: no stage
    links = aa.chain_links(al)
    if links is None:
        return None
    prev, nxt, chain_of = links
    k = np.flatnonzero((op <= aa.I) & (mb >= 0))
    s, m = st[k], mb[k]
    r = np.repeat(np.arange(P, dtype=i32), np.diff(A.offsets))[k]
    if len(k) and (s.min() < 0 or s.max() >= S or m.max() >= M
                   or (chain_of[s] != np.asarray(al.mb_chain, dtype=np.int64)[m]).any()):
        return None
    g = (op[k] != aa.F).view(np.int8)  # kind: 0 F, 1 B/I
    gs = g.astype(np.intp)
    gs *= S
    gs += s
    to = np.concatenate((nxt, prev)).astype(i32)[gs]
    pto = s2r[to]
    send = (pto >= 0) & (pto != r)
    psrc = s2r[np.concatenate((prev, nxt)).astype(i32)[gs]]
    cons = (psrc >= 0) & (psrc != r)
    del gs
    # message key (kind, receiving stage, mb); producer of each consumer's message by key
    key = lambda kind, stage, mask: (kind[mask].astype(np.int64) * S + stage[mask]) * M + m[mask]  # noqa: E731
    skey = key(g, to, send)
    del to
    table = np.full(2 * S * M, -1, dtype=np.int64)
    table[skey] = np.flatnonzero(send)
    pp = table[key(g, s, cons)]
    del table
    c_link = psrc[cons] * P + r[cons]
    nl = P * P
    if (np.bincount(skey, minlength=2 * S * M) > 1).any() or (pp < 0).any() or \
            (np.bincount(r[send] * P + pto[send], minlength=nl) != np.bincount(c_link, minlength=nl)).any():
        return _insert_comm_general(al) if general else None
    del skey
    o = np.argsort(c_link.astype(np.int16) if nl < 32768 else c_link, kind="stable")
    lo, po = c_link[o], pp[o]
    del o, pp, c_link
    if ((lo[1:] == lo[:-1]) & (po[1:] <= po[:-1])).any():
        return _insert_comm_general(al) if general else None
    del lo, po
    n = len(op)
    ks, kc = k[send], k[cons]
    grow = np.zeros(n, dtype=np.int64)
    grow[ks] = 1
    grow[kc] += 1
    newk = np.cumsum(grow)  # action i moves to i + (inserted up to i) - (its own SEND)
    counts = np.diff(A.offsets) + np.bincount(r[send], minlength=P) + np.bincount(r[cons], minlength=P)
    del grow
    newk += np.arange(n)
    newk[ks] -= 1
    sd, rd = newk[ks] + 1, newk[kc] - 1
    fg, bg = g[cons], g[send]
    out = []
    for field, recv_v, send_v in ((op, np.where(fg, aa.RECV_B, aa.RECV_F), np.where(bg, aa.SEND_B, aa.SEND_F)),
                                  (st, s[cons], s[send]), (mb, m[cons], m[send]), (A.peer, psrc[cons], pto[send])):
        o = np.empty(n + len(ks) + len(kc), dtype=field.dtype)
        o[newk], o[rd], o[sd] = field, recv_v, send_v
        out.append(o)
    return aa.ActionArrays.build(*out, counts)


def _insert_comm_general(al: ActionList) -> Any:
    """:func:`_insert_comm_arrays` for any FIFO pattern (early receives)."""
    from hexicore.pipeline import arrays as aa

    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    op, st, mb = A.op, A.stage, A.mb
    rank = A.rank_of()
    s2r = np.asarray(al.stage_rank, dtype=np.int64)
    links = aa.chain_links(al)
    if links is None:
        return None
    prev, nxt, chain_of = links
    prod = ((op == aa.F) | (op == aa.B) | (op == aa.I)) & (mb >= 0)
    k = np.flatnonzero(prod)
    s, m, r, fwd = st[k], mb[k], rank[k], op[k] == aa.F
    if len(k) and (s.min() < 0 or s.max() >= S or m.max() >= M
                   or (chain_of[s] != np.asarray(al.mb_chain, dtype=np.int64)[m]).any()):
        return None
    kind = np.where(fwd, 0, 1)
    to = np.where(fwd, nxt[s], prev[s])
    send = (to >= 0) & (s2r[np.maximum(to, 0)] != r)
    src = np.where(fwd, prev[s], nxt[s])
    cons = (src >= 0) & (s2r[np.maximum(src, 0)] != r)
    # messages: one per send, keyed (link, kind, receiving stage, mb), numbered per link in send order
    msg = (kind * S + np.maximum(to, 0)) * M + m
    sk, s_link, s_msg = k[send], (r * P + s2r[np.maximum(to, 0)])[send], msg[send]
    order = np.argsort(s_link, kind="stable")
    s_link, s_msg, sk = s_link[order], s_msg[order], sk[order]
    first = np.searchsorted(s_link, s_link, side="left")
    idx = np.arange(len(sk)) - first  # index of the message on its link
    key = s_link * (2 * S * M) + s_msg
    korder = np.argsort(key, kind="stable")
    skey = key[korder]
    if len(skey) > 1 and (skey[1:] == skey[:-1]).any():
        return None
    # consumers: compute that needs a message; its index on the link
    ck, c_link = k[cons], (s2r[np.maximum(src, 0)] * P + r)[cons]
    c_key = c_link * (2 * S * M) + (kind * S + s) [cons] * M + m[cons]
    at = np.searchsorted(skey, c_key)
    if len(ck) and ((at >= len(skey)).any() or (skey[np.minimum(at, len(skey) - 1)] != c_key).any()):
        return None
    c_idx = idx[korder[at]] if len(ck) else np.zeros(0, np.int64)
    corder = np.argsort(c_link, kind="stable")
    ck, c_link, c_idx = ck[corder], c_link[corder], c_idx[corder]
    big = len(sk) + 1
    cm = np.maximum.accumulate(c_idx + c_link * big) if len(ck) else c_idx  # running max per link
    # message j on link L is received just before the first consumer on L with running max >= j
    where = np.searchsorted(cm, s_link * big + idx, side="left")
    got = where < len(cm)
    got[got] = c_link[where[got]] == s_link[got]
    rk, rj, rmsg, rlink = ck[where[got]], idx[got], s_msg[got], s_link[got]
    rorder = np.lexsort((rj, rk))
    rk, rmsg, rlink = rk[rorder], rmsg[rorder], rlink[rorder]
    n = len(op)
    before = np.bincount(rk, minlength=n)
    after = np.zeros(n, dtype=np.int64)
    after[sk] = 1
    grow = before + after
    shift = np.cumsum(grow) - grow
    newk = np.arange(n) + shift + before
    total = n + int(grow.sum())
    out_op = np.empty(total, dtype=np.int8)
    out_st, out_mb, out_peer = (np.empty(total, dtype=np.int64) for _ in range(3))
    out_op[newk], out_st[newk], out_mb[newk], out_peer[newk] = op, st, mb, A.peer
    # sends right after their producer
    sp = newk[sk] + 1
    out_op[sp] = np.where(op[sk] == aa.F, aa.SEND_F, aa.SEND_B)
    out_st[sp], out_mb[sp], out_peer[sp] = st[sk], mb[sk], s_link % P
    # receives before their consumer, in message order
    gstart = np.searchsorted(rk, rk, side="left")
    rp = newk[rk] - before[rk] + (np.arange(len(rk)) - gstart)
    rkind = rmsg // M // S
    out_op[rp] = np.where(rkind == 0, aa.RECV_F, aa.RECV_B)
    out_st[rp], out_mb[rp], out_peer[rp] = (rmsg // M) % S, rmsg % M, rlink // P
    counts = np.diff(A.offsets) + np.bincount(rank, weights=grow, minlength=P).astype(np.int64)
    return aa.ActionArrays.build(out_op, out_st, out_mb, out_peer, counts)
