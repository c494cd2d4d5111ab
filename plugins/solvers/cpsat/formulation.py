"""The CP-SAT model of HexiScale's plan search (cost model: HexiScale App. A, docs/cost-model.md).

Indices: pipeline ``i`` (up to ``P_max``), stage slot ``j`` of a pipeline (slots are used as a
prefix, in pipeline order), stage option ``o = (machine, tp)`` (see :mod:`.tables`), block ``k``.

Decisions
  ``x[i,j,o]``  slot j of pipeline i is a stage of option o (at most one o; none = slot unused);
  ``z[i,j,k]``  block k runs on slot j of pipeline i (contiguous, in slot order, every slot used
                holds >= 1 block); ``l[i,j] = sum_k z[i,j,k]``;
  ``n[i]``      micro-batches of pipeline i (``sum_i n[i] = global_batch / micro_batch``).
Constraints
  devices:  ``sum_{i,j,o: machine(o)=m} tp(o) x[i,j,o] <= |m|`` (counts, not ids: symmetry breaking);
  memory:   ``l[i,j] <= cap[o][first][last][in_flight(P_i, j, n_i)]`` (element constraint;
            ``in_flight`` indexes the schedule's in-flight counts ``flights``, fractional ones
            priced as they are; where the schedule's rows are the cost model's default rule,
            1F1B's ``min(n_i, P_i - j)`` (:func:`hexicore.cost.base.default_in_flight`), by
            AddMinEquality, else an element table);
  chunks:   ``l[i,j] >= least[P_i][j]``, a block per chunk the schedule runs on that rank (Hanayo's
            2W, the V schedules' 2; element constraint, only where some entry exceeds 1);
  symmetry: pipelines ordered by (stages, micro-batches) non-increasing.
Objective (integer time units, :mod:`.tables`), App. A ``max_i PIPELINE-TIME(i) + COMM-DP``:
  ``U[i,j] = STAGE + HOP``: STAGE as the linear form ``per_o * l + fixed_o (+ head_o if last)``
  read off the stage-time table (:func:`stage_slopes`), HOP an element constraint over the
  hop table indexed by the options of slots j and j + 1;
  ``PIPE[i] = sum_j U[i,j] + (n[i] - 1) * max_j U[i,j]`` (AddMaxEquality + a product): the
  cost model's PIPELINE-TIME :func:`hexicore.cost.base.fill_drain_time` written as constraints,
  ``T = max(max_i PIPE[i], throughput cut)`` (AddMaxEquality; the cut, :func:`throughput_bound`,
  is a lower bound of every plan's true time, so it only lifts the LP bound);
  ``D[k] >= 2 sum_{o'} N[k,o'] g_v[o,o'] - g_v[o,o]`` for every option o present at block k when
  v pipelines exist (``N[k,o]`` = pipelines whose replica of block k runs on option o), i.e.
  COMM-DP-LAYER written per peer; ``DP >= sum_{k in stage} D[k]`` (+ embedding / head terms on
  first / last stages, and a tied embedding's group ring on both, :mod:`.tied`); minimise ``T + DP``.
  "Last" is where the schedule keeps the head: the first stage of a V-shaped one (:mod:`.ends`).

Simplifications (each makes the model a *lower* approximation, so bounds stay valid):
  * times are floored to whole time units, and STAGE is the table's largest affine minorant in
    the block count (the analytic STAGE is affine: this loses < 1 unit per block);
  * with a known fitting plan (warm start or greedy, :mod:`.hint`), hop and DP entries and the
    domains of stage, pipeline and DP times are capped just above its estimate: a plan paying
    more costs more than the known one, so the optimum is never cut off;
  * the DP chunk count ``lcm(tp)`` of the cost model's chunked all-reduce is taken as the
    largest TP degree present (exact for power-of-two degrees; with others, e.g. a fix_groups
    warm start with TP 3, a lower bound: the model then misses a few latencies ``alpha``);
  * the 1F1B closed form is the pipeline time (the analytic model's default; a cost model with
    another ``pipeline_timer`` gets no proven bound, see :mod:`hexicore_plugins.solvers.cpsat`).
The plan space itself is restricted to stages inside one machine with power-of-two TP degrees
dividing the heads, KV heads and FFN width (:func:`.tables.tp_degrees`); bounds are bounds over
that space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ortools.sat.python import cp_model

from hexicore.cost.base import default_in_flight

from .ends import head_flags
from .tables import Tables
from .tied import tied_bound, tied_term


@dataclass
class Formulation:
    """The CP-SAT model and the handles :mod:`.decode` reads."""

    model: cp_model.CpModel
    x: dict = field(default_factory=dict)       # (i, j, o) -> bool
    layers: dict = field(default_factory=dict)  # (i, j) -> int expr
    n: dict = field(default_factory=dict)       # i -> int var (micro-batches)
    z: dict = field(default_factory=dict)       # (i, j, k) -> bool: block k on slot j of pipeline i
    slots: list = field(default_factory=list)   # slots per pipeline
    n_blocks: int = 0
    T: object = None
    DP: object = None
    parts: dict = field(default_factory=dict)  # named sub-terms, for inspection and tests


def stage_slopes(tab: Tables, o: int, fi: int) -> tuple[int, int, int]:
    """``(per block, fixed, fixed if last)`` of option o's stage-time table, chosen so that
    ``fixed + per * l <= STAGE[o][first][last][l]`` for every l: the analytic STAGE is affine in
    the block count (compute and TP traffic per block, the head on the last stage), so this
    loses only the table's rounding (< 1 unit per block)."""
    rows = tab.stage[o][fi]
    per = min(min((rows[la][n] - rows[la][0]) // n for n in range(1, tab.layers + 1)) for la in (0, 1))
    return per, rows[0][0], rows[1][0]


def _stage_time(m, tab: Tables, x, layers, last, i: int, j: int, fi: int, ub: int):
    """STAGE of slot (i, j): ``sum_o per_o * l_o + fixed_o * x_o (+ head_o * [x_o and last])``
    with ``l_o`` = the slot's blocks when it runs option o (else 0), a linear form of the table."""
    K = len(tab.options)
    terms, split = [], []
    for o in range(1, K + 1):
        per, fixed, fixed_last = stage_slopes(tab, o, fi)
        l_o = m.new_int_var(0, tab.layers, f"l{i}_{j}_{o}")
        m.add(l_o <= tab.layers * x[i, j, o])
        split.append(l_o)
        both = m.new_bool_var(f"lx{i}_{j}_{o}")
        m.add_bool_and([last, x[i, j, o]]).only_enforce_if(both)
        m.add_bool_or([~last, ~x[i, j, o]]).only_enforce_if(~both)
        terms.append(per * l_o + fixed * x[i, j, o] + (fixed_last - fixed) * both)
    m.add(sum(split) == layers)
    s = m.new_int_var(0, ub, f"S{i}_{j}")
    m.add(s == sum(terms))
    return s


def _element(m, index, table: list[int], target, name: str) -> None:
    """``target == table[index]`` (the index as its own variable)."""
    idx = m.new_int_var(0, len(table) - 1, name)
    m.add(idx == index)
    m.add_element(idx, table, target)


def _flat(table) -> list[int]:
    if isinstance(table, (list, tuple)):
        return [v for row in table for v in _flat(row)]
    return [int(table)]


def slot_counts(n_devices: int, max_pipelines: int, layers: int) -> list[int]:
    """Pipelines ordered by stage count: pipeline i has at most ``n_devices // (i + 1)`` stages."""
    return [max(1, min(layers, n_devices // (i + 1))) for i in range(max_pipelines)]


def build(tab: Tables, machines: dict[str, int], n_mb: int, slots: Sequence[int],
          fixed: Sequence[Sequence[int]] | None = None) -> Formulation:
    """Build the model. ``fixed`` (fix_groups): per pipeline, the option of each stage, kept as is.
    Variables and constraints are created in a fixed order (the solver's search depends on it)."""
    m = cp_model.CpModel()
    P = len(slots)
    f = Formulation(m, slots=list(slots), n_blocks=tab.layers)
    max_u = max(_flat(tab.stage)) + max(_flat(tab.hop))
    if tab.ceiling is not None:  # a known plan costs less: no optimum has a larger term (valid cut)
        max_u = min(max_u, tab.ceiling)
    top_t = min(max(slots) * max_u + n_mb * max_u, tab.ceiling if tab.ceiling is not None else math.inf)
    used, oid, last = _slot_variables(m, tab, f, n_mb)
    n_stages = {i: sum(used[i, j] for j in range(slots[i])) for i in range(P)}
    _devices_and_order(m, tab, f, machines, n_stages, fixed)
    head = head_flags(m, tab, f.slots, last, n_stages)  # the last stage, or where the schedule keeps the head
    one_f_one_b = all(tab.in_flight[p][j][n] == default_in_flight(p, j, n) for p in range(1, len(tab.in_flight))
                      for j in range(p) for n in range(1, n_mb + 1))
    pipe = [_pipeline_time(m, tab, f, i, (used, oid, head, n_stages), n_mb, (max_u, top_t), one_f_one_b)
            for i in range(P)]
    slowest = m.new_int_var(0, top_t, "maxPIPE")
    m.add_max_equality(slowest, pipe)
    f.T = m.new_int_var(0, top_t, "T")  # T = max(slowest, cut)
    m.add(f.T >= slowest)
    m.add(f.T >= throughput_bound(tab, machines, n_mb))

    f.DP = _dp_term(m, tab, f, used, head, z=f.z, slots=slots)
    m.minimize(f.T + f.DP)
    return f


def _slot_variables(m, tab: Tables, f: Formulation, n_mb: int) -> tuple[dict, dict, dict]:
    """Per pipeline: its slots' options ``x``, blocks ``z`` (contiguous), ``used`` and ``last``
    flags, and its micro-batches ``n``. Returns (used, option id, last) per slot."""
    K, L = len(tab.options), tab.layers
    opts = range(1, K + 1)
    slots, z = f.slots, f.z
    used, oid, last = {}, {}, {}
    for i in range(len(slots)):
        for j in range(slots[i]):
            for o in opts:
                f.x[i, j, o] = m.new_bool_var(f"x{i}_{j}_{o}")
            used[i, j] = m.new_bool_var(f"u{i}_{j}")
            m.add(sum(f.x[i, j, o] for o in opts) == used[i, j])
            oid[i, j] = sum(o * f.x[i, j, o] for o in opts)
            if j:
                m.add_implication(used[i, j], used[i, j - 1])
            for k in range(L):
                z[i, j, k] = m.new_bool_var(f"z{i}_{j}_{k}")
            f.layers[i, j] = sum(z[i, j, k] for k in range(L))
            m.add(f.layers[i, j] >= used[i, j])
            m.add(f.layers[i, j] <= L * used[i, j])
        for k in range(L):
            m.add(sum(z[i, j, k] for j in range(slots[i])) == used[i, 0])
            for j in range(slots[i]):  # contiguity: "block k on slot <= j" is non-increasing in k
                if k + 1 < L:
                    m.add(sum(z[i, jj, k + 1] for jj in range(j + 1)) <= sum(z[i, jj, k] for jj in range(j + 1)))
        for j in range(1, slots[i]):
            m.add(z[i, j, 0] == 0)
        for j in range(slots[i]):
            last[i, j] = m.new_bool_var(f"last{i}_{j}")
            nxt = used[i, j + 1] if j + 1 < slots[i] else 0
            m.add(last[i, j] == used[i, j] - nxt)
        f.n[i] = m.new_int_var(0, n_mb, f"n{i}")
        m.add(f.n[i] >= used[i, 0])
        m.add(f.n[i] <= n_mb * used[i, 0])
    m.add(sum(f.n.values()) == n_mb)
    return used, oid, last


def _devices_and_order(m, tab: Tables, f: Formulation, machines: dict[str, int], n_stages: dict,
                       fixed: Sequence[Sequence[int]] | None) -> None:
    """Device counts per machine; the fixed options, else symmetry breaking between pipelines."""
    for name, count in machines.items():
        m.add(sum(tab.options[o - 1].tp * f.x[i, j, o] for (i, j, o) in f.x
                  if tab.options[o - 1].machine == name) <= count)
    if fixed is not None:
        for i, row in enumerate(fixed):
            for j, o in enumerate(row):
                m.add(f.x[i, j, o] == 1)
        return
    for i in range(len(f.slots) - 1):  # symmetry: pipelines by (stages, micro-batches) non-increasing
        m.add(n_stages[i] >= n_stages[i + 1])
        tie = m.new_bool_var(f"tie{i}")
        m.add(n_stages[i] == n_stages[i + 1]).only_enforce_if(tie)
        m.add(n_stages[i] != n_stages[i + 1]).only_enforce_if(~tie)
        m.add(f.n[i] >= f.n[i + 1]).only_enforce_if(tie)


def _pipeline_time(m, tab: Tables, f: Formulation, i: int, slot_vars: tuple, n_mb: int, bounds: tuple[int, int],
                   one_f_one_b: bool):
    """PIPE[i] (module docstring: :func:`hexicore.cost.base.fill_drain_time` as constraints) and
    the memory constraint of each of pipeline i's slots."""
    used, oid, head, n_stages = slot_vars
    max_u, top_t = bounds
    K, L, slots = len(tab.options), tab.layers, f.slots
    max_flight = len(tab.cap[0][0][0]) - 1
    U = {}
    for j in range(slots[i]):
        fi = 1 if j == 0 else 0
        stage = _stage_time(m, tab, f.x, f.layers[i, j], head[i, j], i, j, fi, max_u)
        hop = 0
        if j + 1 < slots[i]:
            hops = _flat(tab.hop)
            hop = m.new_int_var(0, max(hops), f"H{i}_{j}")
            _element(m, oid[i, j] * (K + 1) + oid[i, j + 1], hops, hop, f"iH{i}_{j}")
        U[j] = m.new_int_var(0, max_u, f"U{i}_{j}")
        m.add(U[j] == stage + hop)
        # memory: blocks <= cap[o][first][last][in_flight(P_i, j, n_i)]
        flight = m.new_int_var(0, max_flight, f"fl{i}_{j}")
        if one_f_one_b:  # in_flight = min(n_i, P_i - j), 0 on unused slots
            m.add_min_equality(flight, [f.n[i], sum(used[i, jj] for jj in range(j, slots[i]))])
        else:
            fl_tab = [tab.in_flight[p][j][n] if j < len(tab.in_flight[p]) else 0
                      for p in range(len(tab.in_flight)) for n in range(n_mb + 1)]
            _element(m, n_stages[i] * (n_mb + 1) + f.n[i], fl_tab, flight, f"iF{i}_{j}")
        if tab.least is not None and any(row[j] > 1 for row in tab.least if j < len(row)):
            low = m.new_int_var(0, L, f"low{i}_{j}")  # a block per chunk the schedule runs here
            _element(m, n_stages[i], [row[j] for row in tab.least], low, f"iL{i}_{j}")
            m.add(f.layers[i, j] >= low)
        cap = m.new_int_var(0, L, f"cap{i}_{j}")
        cap_tab = _flat([tab.cap[o][fi] for o in range(K + 1)])  # [o][last][f]
        _element(m, (oid[i, j] * 2 + head[i, j]) * (max_flight + 1) + flight, cap_tab, cap, f"iC{i}_{j}")
        m.add(f.layers[i, j] <= cap)
    top = m.new_int_var(0, max_u, f"M{i}")
    m.add_max_equality(top, [U[j] for j in range(slots[i])])
    rest = m.new_int_var(0, n_mb, f"nm1_{i}")
    m.add(rest == f.n[i] - used[i, 0])
    prod = m.new_int_var(0, min(n_mb * max_u, top_t), f"prod{i}")
    m.add_multiplication_equality(prod, [rest, top])
    p_i = m.new_int_var(0, top_t, f"PIPE{i}")
    m.add(p_i == sum(U[j] for j in range(slots[i])) + prod)
    return p_i


def _best_split(tab: Tables, name: str, count: int, value) -> float:
    """Most total ``value(option)`` from splitting a machine's devices into TP groups."""
    best = [0.0] * (count + 1)
    for d in range(1, count + 1):
        best[d] = best[d - 1]
        for o, opt in enumerate(tab.options, start=1):
            if opt.machine == name and opt.tp <= d:
                best[d] = max(best[d], best[d - opt.tp] + value(o))
    return best[count]


def throughput_bound(tab: Tables, machines: dict[str, int], n_mb: int) -> int:
    """A lower bound of every plan's slowest pipeline time (a cut: it only lifts the LP bound).

    Let ``c_o`` be option o's least time per block (``STAGE >= c_o * l``, :func:`stage_slopes`),
    ``R`` the largest total block rate ``sum 1/c_o`` of any split of the machines into TP groups,
    ``c*`` the least ``c_o``, and ``D`` the most pipelines that fit (each holds all ``L`` blocks,
    each TP group at most ``cap`` of them with one micro-batch in flight). Pipeline i has
    ``M_i >= L / R_i`` (its stages' rates ``R_i``) and ``sum_j U_ij >= L c*``, and
    ``T >= sum_j U_ij + (n_i - 1) M_i``; hence ``n_i - 1 <= (T - L c*) R_i / L`` and, summed,
    ``T >= L c* + (n_mb - D) L / R``. Summing ``n_i l_ij c_o <= T`` alone gives ``T >= n_mb L / R``.
    The larger of the two (rounded down) is returned."""
    per = {o: min(stage_slopes(tab, o, fi)[0] for fi in (0, 1)) for o in range(1, len(tab.options) + 1)}
    rate = sum(_best_split(tab, name, count, lambda o: 1.0 / per[o] if per[o] > 0 else 0.0)
               for name, count in machines.items())
    if rate <= 0 or min(per.values()) <= 0:
        return 0
    L = tab.layers
    holds = sum(_best_split(tab, name, count, lambda o: float(max(tab.cap[o][0][0][1:], default=0)))
                for name, count in machines.items())
    copies = min(n_mb, sum(machines.values()), int(holds // L))
    plain = n_mb * L / rate
    bubble = L * min(per.values()) + max(0, n_mb - copies) * L / rate
    return max(0, math.floor(max(plain, bubble) * (1 - 1e-12)) - 1)


def _peer_sum(m, tab: Tables, tab_v, counts, pres, present_lits, ub, name):
    """``D >= 2 sum_o' N[o'] g[o][o'] - g[o][o]`` for each option o present (``pres[o]``) under
    each pipeline count v (``present_lits[v]``); ``tab_v[v][o][o2]`` already includes the 2.

    The cost model cuts a block's gradients into ``lcm(tp)`` chunks (HexiScale §3.2): a device of
    a TP-``t`` stage sends ``lcm/t`` chunks to each peer, each paying the latency. With
    power-of-two degrees ``lcm`` is the largest degree present, so for every degree ``tau > t``
    present the constraint also holds with ``(tau/t - 1)`` extra latencies per peer (exact for the
    largest ``tau``; with other degrees ``lcm >= tau`` keeps it a lower bound)."""
    d = m.new_int_var(0, ub, name)
    tps = sorted({o.tp for o in tab.options})
    tp_present = {}
    for tau in tps[1:]:
        tp_present[tau] = m.new_bool_var(f"{name}_tp{tau}")
        m.add(sum(counts[o] for o in counts if tab.options[o - 1].tp == tau) <= tab.max_pipelines * tp_present[tau])
    lat = tab.dp_latency
    for v, lit in present_lits.items():
        g = tab_v[v]
        for o, p in pres.items():
            t = tab.options[o - 1].tp
            m.add(d >= sum(g[o][o2] * counts[o2] for o2 in counts) - g[o][o]).only_enforce_if([lit, p])
            for tau, has in tp_present.items():
                if tau > t:
                    extra = tau // t - 1
                    m.add(d >= sum((g[o][o2] + extra * lat[o][o2]) * counts[o2] for o2 in counts)
                          - g[o][o] - extra * lat[o][o]).only_enforce_if([lit, p, has])
    return d


def _presence(m, counts, cap, name):
    pres = {}
    for o, expr in counts.items():
        pres[o] = m.new_bool_var(f"{name}{o}")
        m.add(expr <= cap * pres[o])
    return pres


def _dp_term(m, tab: Tables, f: Formulation, used, last, z, slots):
    """COMM-DP of App. A, per peer (see the module docstring); ``last``: the stages keeping the head."""
    P, K, L = len(slots), len(tab.options), tab.layers
    opts = range(1, K + 1)
    tied = tied_term(m, tab, f, used, last)  # a tied embedding's group: first and last stages
    if tied is not None:
        f.parts["TIED"] = tied
    if P <= 1:
        return 0 if tied is None else tied
    count = {}
    for v in range(1, P + 1):
        count[v] = m.new_bool_var(f"npipe{v}")
    m.add_exactly_one(count.values())
    m.add(sum(v * b for v, b in count.items()) == sum(used[i, 0] for i in range(P)))
    multi = {v: b for v, b in count.items() if v >= 2}

    max_tp = max(o.tp for o in tab.options)

    lat = max(_flat(tab.dp_latency))
    ub_dp, ub_emb, ub_head = (max(1, P * (max(_flat(t)) + (max_tp - 1) * lat))  # each table flattened once
                              for t in (tab.dp_pair, tab.dp_pair_emb, tab.dp_pair_head))

    # blocks: y[i,k,o] = replica of block k in pipeline i runs on option o
    D = {}
    for k in range(L):
        y = {}
        for i in range(P):
            for o in opts:
                y[i, o] = m.new_bool_var(f"y{i}_{k}_{o}")
                for j in range(slots[i]):
                    m.add(y[i, o] >= z[i, j, k] + f.x[i, j, o] - 1)
            m.add(sum(y[i, o] for o in opts) == used[i, 0])
        counts = {o: sum(y[i, o] for i in range(P)) for o in opts}
        D[k] = _peer_sum(m, tab, tab.dp_pair, counts, _presence(m, counts, P, f"pk{k}_"), multi, ub_dp, f"D{k}")
    # embedding on first stages, head on last stages
    emb_counts = {o: sum(f.x[i, 0, o] for i in range(P)) for o in opts}
    E = _peer_sum(m, tab, tab.dp_pair_emb, emb_counts, _presence(m, emb_counts, P, "pe"), multi,
                  ub_emb, "E")
    hy = {}
    for i in range(P):
        for o in opts:
            hy[i, o] = m.new_bool_var(f"hy{i}_{o}")
            for j in range(slots[i]):
                m.add(hy[i, o] >= last[i, j] + f.x[i, j, o] - 1)
        m.add(sum(hy[i, o] for o in opts) == used[i, 0])
    head_counts = {o: sum(hy[i, o] for i in range(P)) for o in opts}
    H = _peer_sum(m, tab, tab.dp_pair_head, head_counts, _presence(m, head_counts, P, "ph"), multi,
                  ub_head, "Hd")
    f.parts.update({"E": E, "H": H, **{f"D{k}": D[k] for k in D}})
    d_ub = L * ub_dp + ub_emb + ub_head + tied_bound(tab)
    if tab.ceiling is not None:
        d_ub = min(d_ub, tab.ceiling)
    DP = m.new_int_var(0, d_ub, "DP")
    for i in range(P):
        for j in range(slots[i]):
            share = []
            for k in range(L):
                v = m.new_int_var(0, ub_dp, f"v{i}_{j}_{k}")
                m.add(v >= D[k]).only_enforce_if(z[i, j, k])  # lower bounds suffice: DP is minimised
                share.append(v)
            base = sum(share) + ((E + (tied if tied is not None else 0)) if j == 0 else 0)
            m.add(DP >= base)
            m.add(DP >= base + H + (tied if tied is not None and j > 0 else 0)).only_enforce_if(last[i, j])
    return DP
