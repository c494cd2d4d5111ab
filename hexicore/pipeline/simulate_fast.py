"""Array simulation of large action lists: the fast path of :func:`hexicore.pipeline.simulate.simulate`.

Same execution model and results as the event simulator (module :mod:`hexicore.pipeline.simulate`), for
lists held as :class:`hexicore.pipeline.arrays.ActionArrays`:

1. checks, vectorised: stages on the right rank and on the micro-batch's chain; every
   (stage, micro-batch) computed once (F, and B or I + W) with same-rank inputs earlier; every
   SEND after its producer, with the right peer; per link the receives equal the sends in order;
   with ``comm`` every cross-rank input received earlier on the rank;
2. times: a compute node ends at ``max(previous end on its rank, arrivals received since) + d``.
   Over a rank, with D the prefix sum of durations, that is ``D_k + max_{j<=k}(x_j - D_{j-1})``
   (one ``maximum.accumulate``); along a micro-batch's chain (F down the stages, B back up, plus
   transfer times) the same form holds. The two sweeps alternate from zero (lower bounds only
   rise) until nothing moves: first on windows of P micro-batches in turn, then on everything.
   A fixed point with every compute duration positive cannot contain a cycle, so it proves the
   lists finish (no deadlock) and equals the event simulation's times. Even times (the default
   T_F = 1, T_B = 2 of validation) settle in a few sweeps per window; uneven ones can make the
   critical path switch between rank and chain at every step, so after ``SWEEPS`` sweeps on a
   window the nodes are instead evaluated in dependency order by a plain loop over int lists
   (the event loop without objects or checks: the same floating-point steps, ~10x faster).

Lists carrying the shared comm pass's common-case communication (each SEND right after its
producer, each RECV right before its consumer, per link in send order) have the same times as
their compute part: they are checked and timed through it — the compute part the pass recorded
(``insert_comm`` output), or else the list's own compute part after checking that the pass
rebuilds exactly these lists. Other comm placements get their own receive edges.

Anything else — a defect, a REDUCE that is not in a rank's tail, a SEND not directly after its
producer's compute block, zero durations, no convergence — returns None and the caller runs the
object simulator, which names the defect (rank, position, action).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexicore.pipeline import arrays as aa
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.simulate import SimResult, Timing, shares

#: sweeps per window (and over everything) before the in-order evaluation takes over
SWEEPS = 16


def simulate_arrays(al: ActionList, timing: Timing, comm: bool) -> SimResult | None:
    """The event simulation of ``al`` (module docstring), or None where the object path must run."""
    key = f"_fast_graph_{bool(comm)}"
    if key not in al.__dict__:
        object.__setattr__(al, key, _graph(al, bool(comm)))  # type: ignore[misc]  # cached, timing-free
    g = al.__dict__[key]
    return None if g is None else _solve(al, g, timing)


def _graph(al: ActionList, comm: bool) -> dict[str, Any] | None:
    """Checks and the timing-free structure of the compute graph (module docstring)."""
    if comm:  # the comm pass's own common-case lists: same checks and times as their compute part
        from hexicore.pipeline.comm import _insert_comm_arrays

        base = al.__dict__.get("_comm_base")
        if base is None:
            base = al.compute_only()
            canon = _insert_comm_arrays(base, general=False)
            base = base if canon is not None and _same(canon, al.arrays) else None
        if base is not None:
            key = "_fast_graph_False"
            if key not in base.__dict__:
                object.__setattr__(base, key, _graph(base, False))
            return base.__dict__[key]
    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    lay = aa.chain_links(al)
    if lay is None or len(al.stage_rank) != S or len(A.offsets) != P + 1:
        return None
    prev, nxt, chain_of = lay
    op, st, mb, peer = A.op, A.stage, A.mb, A.peer
    n, rank, idx = len(op), A.rank_of(), np.arange(len(op))
    s2r = np.asarray(al.stage_rank, dtype=np.int64)
    mbc = np.asarray(al.mb_chain, dtype=np.int64)
    step = op == aa.STEP
    s_ok = (st >= 0) & (st < S)
    if not (s_ok | step).all() or (s2r[np.where(s_ok, st, 0)] != rank)[~step].any():
        return None
    main = op < aa.REDUCE
    red = op == aa.REDUCE
    if red.any():  # REDUCE only in a rank's tail (after every compute and comm op)
        last_main = np.full(P, -1)
        np.maximum.at(last_main, rank[main], idx[main])
        if (idx[red] < last_main[rank[red]]).any():
            return None
    is_comm = main & (op >= aa.SEND_F)
    if is_comm.any() and not comm:
        return None
    m_ok = (mb >= 0) & (mb < M)
    if not m_ok[main].all():
        return None
    sm = np.where(main, st, 0), np.where(main, mb, 0)
    if (chain_of[sm[0]] != mbc[sm[1]])[main].any():
        return None
    pair = sm[0] * M + sm[1]  # (stage, mb) id
    isF, isW = op == aa.F, op == aa.W
    isG = (op == aa.B) | (op == aa.I)
    posF, posG, gop = np.full(S * M, n), np.full(S * M, n), np.full(S * M, -1)
    for mask, pos in ((isF, posF), (isG, posG)):
        if (np.bincount(pair[mask], minlength=S * M) > 1).any():
            return None
        pos[pair[mask]] = idx[mask]
    gop[pair[isG]] = op[isG]
    expected = sum(len(al.chains[c]) for c in al.mb_chain)
    nI = int((op == aa.I).sum())
    if isF.sum() != expected or isG.sum() != expected or isW.sum() != nI \
            or (np.bincount(pair[isW], minlength=S * M) > 1).any() or (gop[pair[isW]] != aa.I).any():
        return None
    # inputs: F needs prev stage's F, G needs own F and next stage's G; W needs its I
    pF, nG = prev[st[isF]], nxt[st[isG]]
    mF, mG = mb[isF], mb[isG]
    if (posG[pair[isW]] > idx[isW]).any() or (posF[pair[isG]] > idx[isG]).any():
        return None
    sameF = (pF >= 0) & (s2r[np.maximum(pF, 0)] == rank[isF])
    sameG = (nG >= 0) & (s2r[np.maximum(nG, 0)] == rank[isG])
    if (posF[(np.maximum(pF, 0) * M + mF)[sameF]] > idx[isF][sameF]).any() or \
            (posG[(np.maximum(nG, 0) * M + mG)[sameG]] > idx[isG][sameG]).any():
        return None
    isC = op <= aa.W
    counts = np.bincount(rank[isC], minlength=P)
    L = int(counts.max(initial=0)) + 1  # one more column: the rank's end node
    col = np.cumsum(isC) - 1 - np.concatenate(([0], np.cumsum(counts)))[rank]  # compute ordinal on rank
    nid_of = rank * L + col  # node id of each compute action
    N = P * L
    g: dict[str, Any] = {"P": P, "L": L, "N": N}
    node_op = np.full(N, -1, dtype=np.int64)
    node_st = np.zeros(N, dtype=np.int64)
    node_op[nid_of[isC]], node_st[nid_of[isC]] = op[isC], st[isC]
    g["node_op"], g["node_st"] = node_op, node_st
    # chains: F over the chain's stages, then F->G turn, then G back up; links between ranks
    lens = np.array([len(c) for c in al.chains], dtype=np.int64)
    Lc = 2 * int(lens.max(initial=0))
    nodeF, nodeG = np.full(S * M, N), np.full(S * M, N)
    nodeF[pair[isF]], nodeG[pair[isG]] = nid_of[isF], nid_of[isG]
    cm = np.full((M, Lc), N, dtype=np.int64)
    nch = len(al.chains)
    lf, lt = np.full((nch, Lc), -1, dtype=np.int64), np.full((nch, Lc), -1, dtype=np.int64)  # per chain
    for c, chain in enumerate(al.chains):
        rows = np.flatnonzero(mbc == c)
        if not len(rows) or not len(chain):
            continue
        ch = np.asarray(chain, dtype=np.int64)
        k = len(ch)
        stages = np.concatenate((ch, ch[::-1]))
        ids = np.concatenate((nodeF.reshape(S, M)[ch][:, rows], nodeG.reshape(S, M)[ch[::-1]][:, rows])).T
        cm[rows, :2 * k] = ids
        rk = s2r[stages]
        lf[c, 1:2 * k] = rk[:-1]
        lt[c, 1:2 * k] = rk[1:]
    g["chain"], g["lf"], g["lt"], g["mbc"] = cm, lf, lt, mbc
    g["mb_lo"] = np.where(cm < N, cm % L, L).min(axis=1)
    g["mb_hi"] = np.where(cm < N, cm % L, -1).max(axis=1) + 1
    if comm:
        g.update(_recv_edges(op, st, mb, peer, rank, idx, isC, nid_of, posF, posG, prev, nxt, s2r, P, S, M, L))
        if g.get("bad"):
            return None
    # peak activations: +share at F, -share at B/I, in rank order
    sh = np.asarray(shares(al))
    delta = np.zeros(N)
    delta[nid_of[isF]] = sh[st[isF]]
    delta[nid_of[isG]] = -sh[st[isG]]
    live = np.cumsum(delta.reshape(P, L), axis=1)
    g["peak"] = tuple(float(max(0.0, v)) for v in live.max(axis=1, initial=0.0))
    tail = [[] for _ in range(P)]
    for k in np.flatnonzero(red).tolist():
        tail[int(rank[k])].append((k, int(st[k]), None if peer[k] < 0 else int(peer[k])))
    g["tail"] = tail
    return g


def _same(a: aa.ActionArrays, b: aa.ActionArrays) -> bool:
    return len(a) == len(b) and all(np.array_equal(getattr(a, f), getattr(b, f))
                                    for f in ("offsets", "op", "stage", "mb", "peer"))


def _recv_edges(op, st, mb, peer, rank, idx, isC, nid_of, posF, posG, prev, nxt, s2r, P, S, M, L) -> dict:
    """Comm checks and one edge per RECV: (node before the matching SEND) -> (next compute node)."""
    bad = {"bad": True}
    sF, sB, rF, rB = (op == aa.SEND_F), (op == aa.SEND_B), (op == aa.RECV_F), (op == aa.RECV_B)
    snd, rcv = sF | sB, rF | rB
    s, m, r = st[snd], mb[snd], rank[snd]
    fwd = sF[snd]
    other = np.where(fwd, nxt[s], prev[s])
    if (other < 0).any() or (s2r[np.maximum(other, 0)] == r).any() or (peer[snd] != s2r[np.maximum(other, 0)]).any():
        return bad
    if (np.where(fwd, posF[s * M + m], posG[s * M + m]) > idx[snd]).any():
        return bad
    s_msg = ((~fwd).astype(np.int64) * S + other) * M + m
    s_link = r * P + peer[snd]
    rs, rm, rr = st[rcv], mb[rcv], rank[rcv]
    rfwd = rF[rcv]
    src = np.where(rfwd, prev[rs], nxt[rs])
    if (src < 0).any() or (s2r[np.maximum(src, 0)] == rr).any() or (peer[rcv] != s2r[np.maximum(src, 0)]).any():
        return bad
    r_msg = ((~rfwd).astype(np.int64) * S + rs) * M + rm
    r_link = peer[rcv] * P + rr
    so, ro = np.argsort(s_link, kind="stable"), np.argsort(r_link, kind="stable")
    if len(so) != len(ro) or (s_link[so] != r_link[ro]).any() or (s_msg[so] != r_msg[ro]).any():
        return bad
    # every cross-rank input received earlier on the consumer's rank
    posR = np.full(2 * S * M, len(op))
    if (np.bincount(r_msg, minlength=2 * S * M) > 1).any():
        return bad
    posR[r_msg] = idx[rcv]
    isF, isG = op == aa.F, (op == aa.B) | (op == aa.I)
    for mask, nb, kind in ((isF, prev, 0), (isG, nxt, 1)):
        o = nb[st[mask]]
        cross = (o >= 0) & (s2r[np.maximum(o, 0)] != rank[mask])
        if (posR[((kind * S + st[mask]) * M + mb[mask])[cross]] > idx[mask][cross]).any():
            return bad
    # send time = end of the last compute before the SEND, with no RECV in between
    cc, cr, cidx = np.cumsum(isC), np.cumsum(rcv), np.flatnonzero(isC)
    sidx = idx[snd]
    lastC = cidx[cc[sidx] - 1]  # a producer precedes every SEND (checked above)
    if (cr[sidx] != cr[lastC]).any():
        return bad
    src_node = nid_of[lastC][so]  # per RECV (in link order): the sender's node
    # target: next compute on the receiver's rank, else its end node
    ridx = idx[rcv][ro]
    rrank = rr[ro]
    nc = cidx[np.minimum(cc[ridx], len(cidx) - 1)] if len(cidx) else ridx
    ok = (nc > ridx) & (rank[nc] == rrank)
    ends = np.bincount(rank[isC], minlength=P)
    tgt = np.where(ok, nid_of[nc], rrank * L + ends[rrank])
    # a RECV right before its consumer, of a SEND right after its producer, is the chain edge
    # producer -> consumer, which the chain sweep already applies: keep only the other edges
    prod = np.where(fwd, posF[s * M + m], posG[s * M + m])[so]
    cons = np.where(rfwd, posF[rs * M + rm], posG[rs * M + rm])[ro]
    keep = ~((lastC[so] == prod) & ok & (nc == cons))
    order = np.argsort(tgt[keep], kind="stable")
    return {"e_src": src_node[keep][order], "e_tgt": tgt[keep][order], "e_from": (s_link[so] // P)[keep][order],
            "e_to": (s_link[so] % P)[keep][order]}


def _solve(al: ActionList, g: dict[str, Any], timing: Timing) -> SimResult | None:
    """Times by alternating rank and chain sweeps (module docstring); None if not certified."""
    P, L, N = g["P"], g["L"], g["N"]
    dur = timing.durations()
    table = np.zeros((4, al.stages))
    for k, o in enumerate("FBIW"):
        table[k] = dur[o]
    op, stn = g["node_op"], g["node_st"]
    real = op >= 0
    d = np.where(real, table[np.maximum(op, 0), stn], 0.0)
    if real.any() and not (d[real] > 0).all():
        return None
    link = np.array([[timing.link(a, b) for b in range(P)] for a in range(P)]) if P else np.zeros((0, 0))
    tol = min(1e-12 * max(1.0, float(d.sum())), float(d[real].min(initial=1.0)) / 4)
    d2 = d.reshape(P, L)
    cm, lf, lt = g["chain"], g["lf"], g["lt"]
    dext = np.append(d, 0.0)
    DC = dext[cm]
    DC += np.where(lf >= 0, link[np.maximum(lf, 0), np.maximum(lt, 0)], 0.0)[g["mbc"]]
    np.cumsum(DC, axis=1, out=DC)
    comm = "e_src" in g
    if comm:
        e_src, e_tgt = g["e_src"], g["e_tgt"]
        e_del = link[g["e_from"], g["e_to"]] if len(e_src) else np.zeros(0)
    T = np.append(d, 0.0)  # ends, lower bounds: every node starts at 0 or later
    Tv = T[:N].reshape(P, L)

    def rank_pass(lo: int, hi: int, Ds: np.ndarray, e_sel: Any) -> float:
        sub = Tv[:, lo:hi]
        y = sub - Ds
        if e_sel is not None:  # arrivals of early receives: start >= arrival
            es, ed, starts, flat, Dprev = e_sel
            emax = np.maximum.reduceat(T[es] + ed, starts) - Dprev
            yf = y.reshape(-1)
            yf[flat] = np.maximum(yf[flat], emax)
        if lo > 0:
            y[:, 0] = np.maximum(y[:, 0], Tv[:, lo - 1])
        t = Ds + np.maximum.accumulate(y, axis=1)
        ch = float((t - sub).max(initial=0.0))
        if ch > 0:
            np.maximum(sub, t, out=sub)
        return ch

    def chain_pass(m0: int, m1: int) -> float:
        ids = cm[m0:m1]
        Tc = T[ids]
        Dc = DC[m0:m1]
        t = Dc + np.maximum.accumulate(Tc - Dc, axis=1)
        ch = float((t - Tc).max(initial=0.0))
        if ch > 0:
            T[ids] = np.maximum(Tc, t)
        return ch

    def window(lo: int, hi: int) -> tuple[np.ndarray, Any]:
        """Prefix sums of the columns [lo, hi) and the receive edges into them (grouped by target)."""
        Ds = np.cumsum(d2[:, lo:hi], axis=1)
        if not comm or not len(e_tgt):
            return Ds, None
        c = e_tgt % L
        sel = (c >= lo) & (c < hi)
        if not sel.any():
            return Ds, None
        es, et, ed = e_src[sel], e_tgt[sel], e_del[sel]
        starts = np.flatnonzero(np.r_[True, et[1:] != et[:-1]])
        tg = et[starts]
        flat = (tg // L) * (hi - lo) + tg % L - lo
        Dprev = (Ds - d2[:, lo:hi]).reshape(-1)[flat]
        return Ds, (es, ed, starts, flat, Dprev)

    M = al.micro_batches
    step, settled = max(P, 1), False
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        lo, hi = int(g["mb_lo"][m0:m1].min(initial=L)), int(g["mb_hi"][m0:m1].max(initial=0))
        hi = L if m1 == M else hi  # the last window takes the ranks' end nodes too
        if hi <= lo:
            continue
        Ds, ew = window(lo, hi)
        for _ in range(SWEEPS):
            chain_pass(m0, m1)  # exact along chains: a rank sweep that moves nothing ends the window
            if rank_pass(lo, hi, Ds, ew) <= tol:
                break
        else:
            break  # the window does not settle: leave it to the in-order evaluation
    else:
        Ds, ew = window(0, L)
        for _ in range(SWEEPS):  # everything: a fixed point of both sweeps (the certificate)
            chain_pass(0, M)
            if rank_pass(0, L, Ds, ew) <= tol:
                settled = True
                break
    if not settled:  # the critical path zigzags (uneven times): evaluate in dependency order
        T = _in_order(g, d, link, e_del if comm else None)
        if T is None:
            return None
        Tv = T[:N].reshape(P, L)
    clock = Tv[:, L - 1].tolist() if L else [0.0] * P
    if any(g["tail"]) and not _reduce_tail(al, g["tail"], clock, timing.reduce):
        return None
    busy = tuple(float(v) for v in d2.sum(axis=1))
    return SimResult(max(clock) if P else 0.0, busy, g["peak"], ())


def _in_order(g: dict[str, Any], d: np.ndarray, link: np.ndarray, e_del: Any) -> np.ndarray | None:
    """Node ends by running every rank's compute nodes in order, each waiting for its inputs (the
    event simulator's loop on plain lists: same floating-point steps); None on a deadlock."""
    P, L, N = g["P"], g["L"], g["N"]
    cm, lf, lt = g["chain"], g["lf"], g["lt"]
    pred = np.full(N + 1, -1, dtype=np.int64)
    delay = np.zeros(N + 1)
    pred[cm[:, 1:]] = cm[:, :-1]
    delay[cm[:, 1:]] = np.where(lf >= 0, link[np.maximum(lf, 0), np.maximum(lt, 0)], 0.0)[g["mbc"]][:, 1:]
    same = (pred >= 0) & (pred // L == np.arange(N + 1) // L)
    pred[same | (np.arange(N + 1) >= N)] = -1  # inputs on the node's own rank come earlier anyway
    extra: dict[int, list[tuple[int, float]]] = {}
    if e_del is not None:
        for a, b, w in zip(g["e_src"].tolist(), g["e_tgt"].tolist(), e_del.tolist()):
            extra.setdefault(b, []).append((a, w))
    dep, dly, dur = pred[:N].tolist(), delay[:N].tolist(), d.tolist()
    T: list[Any] = [None] * N
    counts = (g["node_op"].reshape(P, L) >= 0).sum(axis=1).tolist()
    pos = [r * L for r in range(P)]
    end = [r * L + counts[r] + 1 for r in range(P)]  # compute nodes and the end node
    clock = [0.0] * P
    active = [r for r in range(P) if pos[r] < end[r]]
    while active:
        moved = False
        for r in active:
            i, e, c = pos[r], end[r], clock[r]
            while i < e:
                j = dep[i]
                if j >= 0:
                    tj = T[j]
                    if tj is None:
                        break
                    tj += dly[i]
                    if tj > c:
                        c = tj
                if i in extra:
                    ts = [T[a] for a, _ in extra[i]]
                    if None in ts:
                        break
                    c = max([c] + [t + w for t, (_, w) in zip(ts, extra[i])])
                c += dur[i]
                T[i] = c
                i += 1
            if i != pos[r]:
                moved = True
                pos[r], clock[r] = i, c
        active = [r for r in active if pos[r] < end[r]]
        if active and not moved:
            return None
    out = np.zeros(N + 1)
    out[:N] = [0.0 if t is None else t for t in T]
    ends = np.arange(P) * L + np.asarray(counts)  # end node: the rank's clock; pads after it
    Tv = out[:N].reshape(P, L)
    for r in range(P):
        Tv[r, counts[r]:] = out[ends[r]]
    return out


def _reduce_tail(al: ActionList, tail: list, clock: list[float], reduce: float) -> bool:
    """REDUCE rendezvous after the last compute (Chimera), as the object simulator runs them."""
    where = {s: i for i, ch in enumerate(al.chains) for s in ch}
    pos = [0] * len(tail)
    while True:
        moved = False
        for r, row in enumerate(tail):
            while pos[r] < len(row):
                _, s, peer = row[pos[r]]
                if peer is None or peer == r:
                    clock[r] += reduce
                    pos[r] += 1
                    moved = True
                    continue
                if not 0 <= peer < len(tail) or pos[peer] >= len(tail[peer]) or tail[peer][pos[peer]][2] != r:
                    break
                b = tail[peer][pos[peer]][1]
                if al.chains[where[s]].index(s) != al.chains[where[b]].index(b):
                    return False
                clock[r] = clock[peer] = max(clock[r], clock[peer]) + reduce
                pos[r] += 1
                pos[peer] += 1
                moved = True
        if all(p == len(row) for p, row in zip(pos, tail)):
            return True
        if not moved:
            return False
