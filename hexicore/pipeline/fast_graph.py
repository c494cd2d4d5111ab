"""The timing-free graph of the array engine (:mod:`hexicore.pipeline.simulate_fast`): step 1
of its module docstring — vectorised checks, then the compute nodes, their rank order and their
chains, the receive edges of hand-placed communication, peak activations and REDUCE tails.

A node is a compute action (F, B, I, W); node ``r * L + j`` is the j-th compute of rank r, and
``r * L + count_r`` is the rank's end node (pads after it). ``None`` wherever the event loop of
:mod:`hexicore.pipeline.simulate` must run instead (a defect it names, or a shape the engine
does not take).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexicore.core.errors import ScheduleError
from hexicore.pipeline import arrays as aa
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.comm import comm_arrays
from hexicore.pipeline.timing import shares


def build_graph(al: ActionList, comm: bool) -> dict[str, Any] | None:
    """Checks and the timing-free structure of the compute graph of ``al`` (module docstring).
    ``comm``: the lists carry their own SEND/RECV."""
    if comm:  # the comm pass's own direct lists: same checks and times as their compute part
        base = al.__dict__.get("_comm_base") or _canonical_base(al)
        if base is not None:
            return cached_graph(base, False)
    A, P, S = al.arrays, al.ranks, al.stages
    try:
        lay = al.links.per_stage()
    except ScheduleError:
        return None
    if lay is None or len(al.stage_rank) != S or len(A.offsets) != P + 1:
        return None
    x = _checked(al, lay, comm)
    if x is None:
        return None
    g = _nodes(al, x)
    g.update(_chains(al, x, g))
    if comm:
        g.update(_recv_edges(al, x, lay, g["L"]))
        if g.get("bad"):
            return None
    g["peak"], g["tail"] = _peaks_and_tails(al, x, g)
    return g


def cached_graph(al: ActionList, comm: bool) -> dict[str, Any] | None:
    """:func:`build_graph`, kept on ``al`` (timing-free; dropped when ``al`` is pickled)."""
    key = f"_fast_graph_{bool(comm)}"
    if key not in al.__dict__:
        object.__setattr__(al, key, build_graph(al, bool(comm)))
    return al.__dict__[key]


def _canonical_base(al: ActionList) -> ActionList | None:
    """``al``'s compute part when the comm pass rebuilds exactly ``al`` with every RECV right
    before its consumer (then the times are the compute part's), else None."""
    base = al.compute_only()
    try:
        canon, direct = comm_arrays(base)
    except ScheduleError:
        return None
    return base if direct and _same(canon, al.arrays) else None


def _same(a: aa.ActionArrays, b: aa.ActionArrays) -> bool:
    return len(a) == len(b) and all(np.array_equal(getattr(a, f), getattr(b, f))
                                    for f in ("offsets", "op", "stage", "mb", "peer"))


def _checked(al: ActionList, lay: tuple, comm: bool) -> dict[str, Any] | None:
    """The per-action checks of step 1; the arrays later steps use, or None."""
    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    chain_of = lay[2]
    op, st, mb = A.op, A.stage, A.mb
    n, rank, idx = len(op), A.rank_of(), np.arange(len(op))
    s2r = np.asarray(al.stage_rank, dtype=np.int64)
    mbc = np.asarray(al.mb_chain, dtype=np.int64)
    step = op == aa.STEP
    s_ok = (st >= 0) & (st < S)
    if not (s_ok | step).all() or (s2r[np.where(s_ok, st, 0)] != rank)[~step].any():
        return None
    main, red = op < aa.REDUCE, op == aa.REDUCE
    if red.any():  # REDUCE only in a rank's tail (after every compute and comm op)
        last_main = np.full(P, -1)
        np.maximum.at(last_main, rank[main], idx[main])
        if (idx[red] < last_main[rank[red]]).any():
            return None
    if (main & (op >= aa.SEND_F)).any() and not comm:
        return None
    if not ((mb >= 0) & (mb < M))[main].all():
        return None
    sm = np.where(main, st, 0), np.where(main, mb, 0)
    if (chain_of[sm[0]] != mbc[sm[1]])[main].any():
        return None
    x = {"rank": rank, "idx": idx, "s2r": s2r, "mbc": mbc, "red": red, "pair": sm[0] * M + sm[1], "n": n,
         "isF": op == aa.F, "isG": (op == aa.B) | (op == aa.I), "isW": op == aa.W, "isC": op <= aa.W}
    return x if _computed_once(al, x, lay) else None


def _computed_once(al: ActionList, x: dict[str, Any], lay: tuple) -> bool:
    """Every (stage, micro-batch) of each chain: one F and one B (or one I and one W), in
    dependency order where producer and consumer share a rank. Adds ``posF``/``posG``."""
    A, S, M = al.arrays, al.stages, al.micro_batches
    op, st, mb = A.op, A.stage, A.mb
    pair, idx, n, rank, s2r = x["pair"], x["idx"], x["n"], x["rank"], x["s2r"]
    isF, isG, isW = x["isF"], x["isG"], x["isW"]
    posF, posG, gop = np.full(S * M, n), np.full(S * M, n), np.full(S * M, -1)
    for mask, pos in ((isF, posF), (isG, posG)):
        if (np.bincount(pair[mask], minlength=S * M) > 1).any():
            return False
        pos[pair[mask]] = idx[mask]
    gop[pair[isG]] = op[isG]
    expected = sum(len(al.chains[c]) for c in al.mb_chain)
    nI = int((op == aa.I).sum())
    if isF.sum() != expected or isG.sum() != expected or isW.sum() != nI \
            or (np.bincount(pair[isW], minlength=S * M) > 1).any() or (gop[pair[isW]] != aa.I).any():
        return False
    # inputs: F needs prev stage's F, G needs own F and next stage's G; W needs its I
    prev, nxt, _ = lay
    pF, nG = prev[st[isF]], nxt[st[isG]]
    mF, mG = mb[isF], mb[isG]
    if (posG[pair[isW]] > idx[isW]).any() or (posF[pair[isG]] > idx[isG]).any():
        return False
    sameF = (pF >= 0) & (s2r[np.maximum(pF, 0)] == rank[isF])
    sameG = (nG >= 0) & (s2r[np.maximum(nG, 0)] == rank[isG])
    if (posF[(np.maximum(pF, 0) * M + mF)[sameF]] > idx[isF][sameF]).any() or \
            (posG[(np.maximum(nG, 0) * M + mG)[sameG]] > idx[isG][sameG]).any():
        return False
    x["posF"], x["posG"] = posF, posG
    return True


def _nodes(al: ActionList, x: dict[str, Any]) -> dict[str, Any]:
    """Node ids of the compute actions (rank-major, an end node per rank), their op and stage."""
    A, P = al.arrays, al.ranks
    isC, rank = x["isC"], x["rank"]
    counts = np.bincount(rank[isC], minlength=P)
    L = int(counts.max(initial=0)) + 1  # one more column: the rank's end node
    col = np.cumsum(isC) - 1 - np.concatenate(([0], np.cumsum(counts)))[rank]  # compute ordinal on rank
    x["nid"] = nid_of = rank * L + col
    N = P * L
    node_op = np.full(N, -1, dtype=np.int64)
    node_st = np.zeros(N, dtype=np.int64)
    node_op[nid_of[isC]], node_st[nid_of[isC]] = A.op[isC], A.stage[isC]
    return {"P": P, "L": L, "N": N, "node_op": node_op, "node_st": node_st}


def _chains(al: ActionList, x: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    """Per micro-batch its chain's nodes in data order (F down the stages, then G back up) and
    per chain the ranks each step goes from and to (the transfer times between them)."""
    S, M, N, L = al.stages, al.micro_batches, g["N"], g["L"]
    pair, nid_of, s2r, mbc = x["pair"], x["nid"], x["s2r"], x["mbc"]
    lens = np.array([len(c) for c in al.chains], dtype=np.int64)
    Lc = 2 * int(lens.max(initial=0))
    nodeF, nodeG = np.full(S * M, N), np.full(S * M, N)
    nodeF[pair[x["isF"]]], nodeG[pair[x["isG"]]] = nid_of[x["isF"]], nid_of[x["isG"]]
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
    return {"chain": cm, "lf": lf, "lt": lt, "mbc": mbc,
            "mb_lo": np.where(cm < N, cm % L, L).min(axis=1), "mb_hi": np.where(cm < N, cm % L, -1).max(axis=1) + 1}


def _peaks_and_tails(al: ActionList, x: dict[str, Any], g: dict[str, Any]) -> tuple[tuple[float, ...], list]:
    """Peak activations (+share at F, -share at B/I, in rank order) and each rank's REDUCE tail."""
    A, P, L, N = al.arrays, al.ranks, g["L"], g["N"]
    st, isF, isG, nid_of = A.stage, x["isF"], x["isG"], x["nid"]
    sh = np.asarray(shares(al))
    delta = np.zeros(N)
    delta[nid_of[isF]] = sh[st[isF]]
    delta[nid_of[isG]] = -sh[st[isG]]
    live = np.cumsum(delta.reshape(P, L), axis=1)
    peak = tuple(float(max(0.0, v)) for v in live.max(axis=1, initial=0.0))
    tail: list[list] = [[] for _ in range(P)]
    rank, peer = x["rank"], A.peer
    for k in np.flatnonzero(x["red"]).tolist():
        tail[int(rank[k])].append((k, int(st[k]), None if peer[k] < 0 else int(peer[k])))
    return peak, tail


def _recv_edges(al: ActionList, x: dict[str, Any], lay: tuple, L: int) -> dict:
    """Comm checks and one edge per RECV: (node before the matching SEND) -> (next compute node)."""
    A, P, S, M = al.arrays, al.ranks, al.stages, al.micro_batches
    op, st, mb, peer = A.op, A.stage, A.mb, A.peer
    rank, idx, s2r, posF, posG, isC, nid_of = x["rank"], x["idx"], x["s2r"], x["posF"], x["posG"], x["isC"], x["nid"]
    prev, nxt, _ = lay
    bad = {"bad": True}
    sF, rF = (op == aa.SEND_F), (op == aa.RECV_F)
    snd, rcv = sF | (op == aa.SEND_B), rF | (op == aa.RECV_B)
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
    if not _received_before_use(al, x, lay, r_msg, idx[rcv]):
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


def _received_before_use(al: ActionList, x: dict[str, Any], lay: tuple, r_msg: np.ndarray,
                         r_idx: np.ndarray) -> bool:
    """Every cross-rank input is received earlier on the consumer's rank (each message once)."""
    A, S, M = al.arrays, al.stages, al.micro_batches
    st, mb = A.stage, A.mb
    rank, s2r, n = x["rank"], x["s2r"], x["n"]
    prev, nxt, _ = lay
    posR = np.full(2 * S * M, n)
    if (np.bincount(r_msg, minlength=2 * S * M) > 1).any():
        return False
    posR[r_msg] = r_idx
    for mask, nb, kind in ((x["isF"], prev, 0), (x["isG"], nxt, 1)):
        o = nb[st[mask]]
        cross = (o >= 0) & (s2r[np.maximum(o, 0)] != rank[mask])
        if (posR[((kind * S + st[mask]) * M + mb[mask])[cross]] > x["idx"][mask][cross]).any():
            return False
    return True
