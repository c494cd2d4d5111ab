"""The array engine: the fast path of :func:`hexicore.pipeline.simulate.simulate` and the engine
of :func:`hexicore.pipeline.simulate.makespan`.

Same execution model and results as the event simulator (module :mod:`hexicore.pipeline.simulate`), for
lists held as :class:`hexicore.pipeline.arrays.ActionArrays`:

1. checks, vectorised (:mod:`hexicore.pipeline.fast_graph`, timing-free, kept on the list):
   stages on the right rank and on the micro-batch's chain; every (stage, micro-batch) computed once (F, and B or I + W) with same-rank inputs earlier; every
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
   Zero durations skip the sweeps (no certificate) and go straight to that loop, and so do
   small lists priced by :func:`hexicore.pipeline.simulate.makespan`.

Lists carrying the shared comm pass's direct communication (each SEND right after its
producer, each RECV right before its consumer, per link in send order) have the same times as
their compute part: they are checked and timed through it — the compute part the pass recorded
(``insert_comm`` output), or else the list's own compute part after checking that the pass
rebuilds exactly these lists. Other comm placements get their own receive edges.

Anything else — a defect, a REDUCE that is not in a rank's tail, a SEND not directly after its
producer's compute block, a deadlock — returns None and the caller runs the event loop, which
names the defect (rank, position, action).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexicore.pipeline import arrays as aa
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.fast_graph import cached_graph
from hexicore.pipeline.timing import SimResult, Timing

#: sweeps per window (and over everything) before the in-order evaluation takes over
SWEEPS = 16


def simulate_arrays(al: ActionList, timing: Timing, comm: bool) -> SimResult | None:
    """The event simulation of ``al`` (module docstring), or None where the event loop must run."""
    g = cached_graph(al, comm)
    return None if g is None else _solve(al, g, timing)


def compute_graph(al: ActionList) -> tuple[ActionList, dict[str, Any]] | None:
    """The graph of ``al``'s compute actions (F, B, I, W; communication, REDUCE and STEP cost
    nothing) with the list it belongs to, kept on ``al``; None when the engine does not take
    them. For lists of compute and STEP only that is ``al``'s own graph, else the graph of a
    copy with the compute actions only."""
    key = "_fast_graph_compute"
    if key not in al.__dict__:
        g, view = cached_graph(al, False), al  # None with communication or a REDUCE mid-list
        if g is None or any(g["tail"]):
            A = al.arrays
            view = ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank,
                              A.select(A.op <= aa.W), al.chains, al.mb_chain)
            g = cached_graph(view, False)
        object.__setattr__(al, key, None if g is None else (view, g))
    return al.__dict__[key]


def graph_makespan(view: ActionList, g: dict[str, Any], timing: Timing, in_order: bool) -> float | None:
    """Makespan of a :func:`compute_graph` under ``timing``; ``in_order``: evaluate in
    dependency order (the event loop's floating-point steps) without sweeping first."""
    res = _solve(view, g, timing, sweep=not in_order)
    return None if res is None else res.makespan


def _solve(al: ActionList, g: dict[str, Any], timing: Timing, sweep: bool = True) -> SimResult | None:
    """Times by alternating rank and chain sweeps (module docstring), else in dependency order;
    None on a deadlock or a REDUCE tail that does not pair up."""
    P, L, N = g["P"], g["L"], g["N"]
    dur = timing.durations()
    table = np.zeros((4, al.stages))
    for k, o in enumerate("FBIW"):
        table[k] = dur[o]
    op, stn = g["node_op"], g["node_st"]
    real = op >= 0
    d = np.where(real, table[np.maximum(op, 0), stn], 0.0)
    link = np.array([[timing.link(a, b) for b in range(P)] for a in range(P)]) if P else np.zeros((0, 0))
    e_del = link[g["e_from"], g["e_to"]] if len(g.get("e_src", ())) else np.zeros(0)
    T = None
    if sweep and (d[real] > 0).all():
        T = _Sweeps(al, g, d, link, e_del).run()
    if T is None:  # the critical path zigzags (uneven times), or zero times: in dependency order
        T = _in_order(g, d, link, e_del)
        if T is None:
            return None
    Tv = T[:N].reshape(P, L)
    clock = Tv[:, L - 1].tolist() if L else [0.0] * P
    if any(g["tail"]) and not _reduce_tail(al, g["tail"], clock, timing.reduce):
        return None
    busy = tuple(float(v) for v in d.reshape(P, L).sum(axis=1))
    return SimResult(max(clock) if P else 0.0, busy, g["peak"], ())


class _Sweeps:
    """Step 2's sweeps: rank sweeps and chain sweeps from zero until a fixed point (the
    certificate), first per window of P micro-batches, then over everything."""

    def __init__(self, al: ActionList, g: dict[str, Any], d: np.ndarray, link: np.ndarray,
                 e_del: np.ndarray) -> None:
        P, L, N = g["P"], g["L"], g["N"]
        self.g, self.L, self.M = g, L, al.micro_batches
        self.d2 = d.reshape(P, L)
        self.tol = min(1e-12 * max(1.0, float(d.sum())), float(d[g["node_op"] >= 0].min(initial=1.0)) / 4)
        cm, lf, lt = g["chain"], g["lf"], g["lt"]
        DC = np.append(d, 0.0)[cm]
        DC += np.where(lf >= 0, link[np.maximum(lf, 0), np.maximum(lt, 0)], 0.0)[g["mbc"]]
        np.cumsum(DC, axis=1, out=DC)
        self.cm, self.DC = cm, DC
        self.comm = "e_src" in g
        self.e_del = e_del
        self.T = np.append(d, 0.0)  # ends, lower bounds: every node starts at 0 or later
        self.Tv = self.T[:N].reshape(P, L)

    def rank_pass(self, lo: int, hi: int, Ds: np.ndarray, e_sel: Any) -> float:
        T, Tv = self.T, self.Tv
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

    def chain_pass(self, m0: int, m1: int) -> float:
        ids = self.cm[m0:m1]
        Tc = self.T[ids]
        Dc = self.DC[m0:m1]
        t = Dc + np.maximum.accumulate(Tc - Dc, axis=1)
        ch = float((t - Tc).max(initial=0.0))
        if ch > 0:
            self.T[ids] = np.maximum(Tc, t)
        return ch

    def window(self, lo: int, hi: int) -> tuple[np.ndarray, Any]:
        """Prefix sums of the columns [lo, hi) and the receive edges into them (grouped by target)."""
        d2, L, g = self.d2, self.L, self.g
        Ds = np.cumsum(d2[:, lo:hi], axis=1)
        if not self.comm or not len(g["e_tgt"]):
            return Ds, None
        c = g["e_tgt"] % L
        sel = (c >= lo) & (c < hi)
        if not sel.any():
            return Ds, None
        es, et, ed = g["e_src"][sel], g["e_tgt"][sel], self.e_del[sel]
        starts = np.flatnonzero(np.r_[True, et[1:] != et[:-1]])
        tg = et[starts]
        flat = (tg // L) * (hi - lo) + tg % L - lo
        Dprev = (Ds - d2[:, lo:hi]).reshape(-1)[flat]
        return Ds, (es, ed, starts, flat, Dprev)

    def settle(self, m0: int, m1: int, lo: int, hi: int) -> bool:
        """Sweep micro-batches [m0, m1) over columns [lo, hi) until nothing moves (True)."""
        Ds, ew = self.window(lo, hi)
        for _ in range(SWEEPS):
            self.chain_pass(m0, m1)  # exact along chains: a rank sweep that moves nothing ends it
            if self.rank_pass(lo, hi, Ds, ew) <= self.tol:
                return True
        return False

    def run(self) -> np.ndarray | None:
        """Node ends at the fixed point, or None when a window does not settle."""
        g, L, M = self.g, self.L, self.M
        step = max(g["P"], 1)
        for m0 in range(0, M, step):
            m1 = min(M, m0 + step)
            lo, hi = int(g["mb_lo"][m0:m1].min(initial=L)), int(g["mb_hi"][m0:m1].max(initial=0))
            hi = L if m1 == M else hi  # the last window takes the ranks' end nodes too
            if hi > lo and not self.settle(m0, m1, lo, hi):
                return None
        return self.T if self.settle(0, M, 0, L) else None  # everything: the certificate


def _order_plan(g: dict[str, Any]) -> dict[str, Any]:
    """The timing-free part of :func:`_in_order` (kept in ``g``): each node's cross-rank chain
    input and the ranks it travels between, the receive edges into each node, the rank spans."""
    if "order" not in g:
        P, L, N = g["P"], g["L"], g["N"]
        cm = g["chain"]
        pred = np.full(N + 1, -1, dtype=np.int64)
        src, dst = np.full(N + 1, -1, dtype=np.int64), np.full(N + 1, -1, dtype=np.int64)
        pred[cm[:, 1:]] = cm[:, :-1]
        src[cm[:, 1:]], dst[cm[:, 1:]] = g["lf"][g["mbc"]][:, 1:], g["lt"][g["mbc"]][:, 1:]
        same = (pred >= 0) & (pred // L == np.arange(N + 1) // L)
        pred[same | (np.arange(N + 1) >= N)] = -1  # inputs on the node's own rank come earlier anyway
        extra: dict[int, list[tuple[int, int]]] = {}
        if "e_src" in g:
            for e, (a, b) in enumerate(zip(g["e_src"].tolist(), g["e_tgt"].tolist())):
                extra.setdefault(b, []).append((a, e))
        counts = (g["node_op"].reshape(P, L) >= 0).sum(axis=1).tolist()
        g["order"] = {"dep": pred[:N].tolist(), "src": np.maximum(src[:N], 0), "dst": np.maximum(dst[:N], 0),
                      "hop": src[:N] >= 0, "extra": extra, "counts": counts}
    return g["order"]


def _in_order(g: dict[str, Any], d: np.ndarray, link: np.ndarray, e_del: np.ndarray) -> np.ndarray | None:
    """Node ends by running every rank's compute nodes in order, each waiting for its inputs (the
    event simulator's loop on plain lists: same floating-point steps); None on a deadlock."""
    P, L, N = g["P"], g["L"], g["N"]
    plan = _order_plan(g)
    dep, counts = plan["dep"], plan["counts"]
    dly = np.where(plan["hop"], link[plan["src"], plan["dst"]], 0.0).tolist() if P else []
    ew = e_del.tolist()
    extra = {b: [(a, ew[e]) for a, e in edges] for b, edges in plan["extra"].items()}
    dur = d.tolist()
    T: list[Any] = [None] * N
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
    ends = np.arange(P) * L + np.asarray(counts, dtype=np.int64)  # end node: the rank's clock; pads after it
    Tv = out[:N].reshape(P, L)
    for r in range(P):
        Tv[r, counts[r]:] = out[ends[r]]
    return out


def _reduce_tail(al: ActionList, tail: list, clock: list[float], reduce: float) -> bool:
    """REDUCE rendezvous after the last compute (Chimera), as the event loop runs them."""
    position = al.links.position
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
                if position(s) != position(tail[peer][pos[peer]][1]):
                    return False
                clock[r] = clock[peer] = max(clock[r], clock[peer]) + reduce
                pos[r] += 1
                pos[peer] += 1
                moved = True
        if all(p == len(row) for p, row in zip(pos, tail)):
            return True
        if not moved:
            return False
