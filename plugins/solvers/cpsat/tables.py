"""Integer tables for the CP-SAT model, every entry computed by the problem's cost model.

The model never re-derives a cost formula: stage times, hop times, memory and the in-flight
micro-batch counts come from ``problem.cost.stage_s / hop_s / stage_memory_gb / in_flight`` on
representative devices, and the DP peer terms from ``problem.cost.dp_layer_s`` on two-holder
layouts. Times are integers in ``unit`` seconds (a microsecond for real models, see
:func:`time_unit`), rounded **down** (``floor``), so every table entry is
at most the cost model's value: the model's objective of a plan is a lower bound of its
estimate, and CP-SAT's proven bound stays a valid lower bound of the true optimum.

A stage *option* is ``(machine, tp)``: a stage of ``tp`` devices inside one machine (HexiScale
keeps TP inside a machine). Identical devices of a machine are interchangeable for every piece
of the analytic model (their type and links are the machine's), so options, not device ids,
are what the model decides (symmetry breaking); ids are assigned when decoding.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import Sequence

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Stage
from hexicore.cost.precision import sync_bytes
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.planner.search.workers import available_cores, fork_map
from hexicore.planner.problem import Problem
from hexicore.planner.baselines.symmetric import least_layers

from .ends import head_rows
from .tied import tied_pairs


#: Largest integer magnitude the model may meet (objective upper bound). CP-SAT 9.15's presolve
#: returned wrong "OPTIMAL" answers on this model with magnitudes around 1e10 (tiny models in
#: picosecond units); 1e8 keeps every coefficient and bound far below that.
MAX_MAGNITUDE = 1e8


def time_unit(problem: Problem, options: Sequence["Option"], max_pipelines: int) -> float:
    """The model's time unit (seconds, a power of ten): the finest unit in which a crude upper
    bound of every objective term (all micro-batches through the slowest stage option, a hop per
    block, the DP sync of every block over the slowest pair of options) stays under
    ``MAX_MAGNITUDE``. Real models get about 1-10 us, tiny test models picoseconds."""
    c, m, t = problem.cluster, problem.model, problem.train
    n_mb, L = t.micro_batches, m.layers
    priced = problem.bound_cost()
    stage = max(priced.stage_s(o.devices, L, first=True, last=True) for o in options)
    sizes = {name: len(devs) for name, devs in machine_pools(problem).items()}
    hop = max(priced.hop_s(a.devices, b.devices) for a in options for b in options
              if a.machine != b.machine or a.tp + b.tp <= sizes[a.machine]) \
        if len(options) > 1 else 0.0
    params = max(m.layer_params(), m.embedding_params(), m.head_params())
    dp = max(problem.cost.dp_layer_s(c, [Stage(a.devices[:1], 1, (0, 1)), Stage(b.devices[-1:], 1, (0, 1))],
                                     params, sync_bytes(problem.cost, t)) for a in options for b in options)
    extra = 2 if m.tied_embeddings else 0  # a tied embedding's group ring (:mod:`.tied`), n members
    top = (n_mb + L) * (stage + L * hop) + max_pipelines * (L + 2 + extra) * dp * max(o.tp for o in options)
    return 10.0 ** math.ceil(math.log10(max(top, 1e-300) / MAX_MAGNITUDE))


@dataclass(frozen=True)
class Option:
    """A stage kind: ``tp`` devices of machine ``machine`` (``devices`` = representatives)."""

    machine: str
    tp: int
    devices: tuple[str, ...]


def tp_degrees(problem: Problem, available: int) -> list[int]:
    """TP degrees a stage may use: powers of two up to ``available`` that divide the model's
    attention heads, KV heads and FFN width (Megatron's TP rule, :meth:`ModelSpec.tp_divides`;
    HexiScale's menus are powers of two)."""
    m = problem.model
    out, t = [], 1
    while t <= available:
        if m.tp_divides(t):
            out.append(t)
        t *= 2
    return out


def machine_pools(problem: Problem) -> dict[str, list[str]]:
    """Usable device ids per machine, fastest first (:func:`device_speeds`; equal ones in
    cluster order). An option's representatives are its machine's fastest devices, so where a
    cost model prices a machine's devices differently (a per-device profile) every table entry
    is still at most the cost of any group of that size there: the bound stays valid."""
    speed = device_speeds(problem)
    pools: dict[str, list[str]] = {}
    for d in problem.cluster.devices:
        pools.setdefault(d.machine, []).append(d.id)
    return {name: sorted(devs, key=speed.__getitem__) for name, devs in pools.items()}


def device_speeds(problem: Problem) -> dict[str, float]:
    """The cost model's time of one block on each device alone (its own profile entry, where it
    has one; the analytic model prices every device of a GPU type alike)."""
    priced = problem.bound_cost()
    return {d.id: priced.stage_s((d.id,), 1) for d in problem.cluster.devices}


def uneven_machines(problem: Problem) -> list[str]:
    """Machines whose devices the cost model prices differently: the model sees each of them as
    devices like its fastest, so its optimum is a bound, not a proven optimal plan."""
    speed, out = device_speeds(problem), {}
    for d in problem.cluster.devices:
        out.setdefault(d.machine, set()).add(speed[d.id])
    return [name for name, v in out.items() if len(v) > 1]


def stage_options(problem: Problem) -> list[Option]:
    """Every (machine, tp) stage kind of the cluster."""
    return [Option(m, t, tuple(devs[:t])) for m, devs in machine_pools(problem).items()
            for t in tp_degrees(problem, len(devs))]


def _second_group(pools: dict[str, list[str]], a: Option, b: Option) -> tuple[str, ...]:
    """Devices for ``b`` disjoint from ``a`` where the machine has room (else wrap around)."""
    pool = pools[b.machine]
    if a.machine != b.machine:
        return tuple(pool[:b.tp])
    return tuple(pool[(a.tp + k) % len(pool)] for k in range(b.tp))


@dataclass(frozen=True)
class Tables:
    """Everything the formulation reads, in integer time units (``unit`` seconds) / block counts.

    ``stage[o][first][last][l]``  STAGE time of option o holding l blocks (o = 0: unused slot);
    ``hop[o][o2]``                HOP time from a stage of option o to one of o2 (0 if o2 = 0);
    ``cap[o][first][last][f]``    most blocks a stage of o can hold with ``flights[f]`` micro-batches
                                  in flight (``f = len(flights)``: none, 0 blocks);
    ``in_flight[P][j][n]``        the index ``f`` into ``flights`` of the micro-batches stage j of a
                                  P-stage pipeline holds (n per pipeline);
    ``flights``                   every in-flight count the schedule meets, ascending, from 0 (the
                                  cost model's values, fractional ones included: zb_v's 2.5);
    ``least[P][j]``               fewest blocks stage j of a P-stage pipeline may hold: a block per
                                  chunk the schedule runs on that rank (0 past the last stage);
    ``dp_pair[v][o][o2]``         one peer's share of COMM-DP-LAYER (v pipelines), blocks;
    ``dp_pair_emb``/``dp_pair_head`` the same for the embedding and the head (a tied
                                  embedding's ``vocab x hidden``: not here, ``tied_pair``);
    ``ceiling``                   with a known plan: an integer above its estimate; no optimal
                                  plan has a stage, pipeline or DP time above it (None: unknown);
    ``dp_latency[o][o2]``         the latency part ``2 alpha`` of one peer term (each further
                                  chunk a device of o holds, when another replica has a higher
                                  TP degree, adds one more).
    Options are numbered from 1 (index 0 = unused); ``options[o - 1]`` describes option o.
    """

    options: tuple[Option, ...]
    unit: float
    layers: int
    max_pipelines: int
    max_stages: int
    stage: tuple
    hop: tuple
    cap: tuple
    in_flight: tuple
    dp_pair: tuple
    dp_pair_emb: tuple
    dp_pair_head: tuple
    dp_latency: tuple
    ceiling: int | None = None
    tied_pair: tuple | None = None  # ``[n][o][o2]``: a tied embedding group's peer term (:mod:`.tied`)
    head: tuple | None = None  # ``[P][j]``: 1 where stage j keeps the head (:mod:`.ends`; None: the last)
    least: tuple | None = None  # ``[P][j]``, see above (None: one block per stage)
    flights: tuple = ()  # see above (empty: ``in_flight`` holds the counts themselves, ``flights[f] = f``)


def _stage_table(problem: Problem, opt: Option | None, to_us) -> list:
    L = problem.model.layers
    if opt is None:
        return [[[0] * (L + 1) for _ in (0, 1)] for _ in (0, 1)]
    priced = problem.bound_cost()
    return [[[to_us(priced.stage_s(opt.devices, n, first=bool(fi), last=bool(la)), False)
              for n in range(L + 1)] for la in (0, 1)] for fi in (0, 1)]


def _cap_table(problem: Problem, opt: Option | None, flights: Sequence[float], extra: int = 0) -> list:
    """``cap[first][last][f]``: the largest l such that every l' in 1..l fits with ``flights[f]``
    micro-batches in flight, i.e. ``stage_memory_gb(l', in_flight=flights[f]) <= memory_gb``
    (memory grows with l in the analytic model), at the cost model's own in-flight value (never
    rounded: a fractional count prices its fraction of a micro-batch's activations); ``flights[0]
    = 0`` and ``extra`` entries past the last hold 0 (in-flight counts of pipelines the schedule
    does not run)."""
    L = problem.model.layers
    out = [[[0] * (len(flights) + extra) for _ in (0, 1)] for _ in (0, 1)]
    if opt is None:
        return out
    priced = problem.bound_cost()
    mem = problem.cluster.device(opt.devices[0]).memory_gb
    for fi in (0, 1):
        for la in (0, 1):
            for f in range(1, len(flights)):
                n = 0
                while n < L and priced.stage_memory_gb(opt.devices, n + 1, first=bool(fi), last=bool(la),
                                                       in_flight=flights[f]) <= mem:
                    n += 1
                out[fi][la][f] = n
    return out


def _dp_pair(problem: Problem, pools: dict[str, list[str]], a: Option, b: Option, v: int, n_params: float,
             to_us) -> int:
    """One peer's term of COMM-DP-LAYER (HexiScale App. A) seen by a device of ``a`` whose
    layer replica in another pipeline sits on ``b``, with ``v`` pipelines in all:
    ``2 * (alpha + P*B_type / (tp_a * v * beta))``. Computed with the cost model's own
    ``dp_layer_s`` on two single-device holders (which prices ``2 * (alpha + P'*B/(2*beta))``)
    by passing ``P' = 2P / (tp_a * v)``."""
    if v <= 1:
        return 0
    da = pools[a.machine][0]
    db = _second_group(pools, Option(a.machine, 1, (da,)), Option(b.machine, 1, ()))[0]
    holders = [Stage((da,), 1, (0, 1)), Stage((db,), 1, (0, 1))]
    return to_us(problem.cost.dp_layer_s(problem.cluster, holders, 2.0 * n_params / (a.tp * v),
                                         sync_bytes(problem.cost, problem.train)))


def build_tables(problem: Problem, options: Sequence[Option], max_pipelines: int, max_stages: int,
                 upper_s: float | None = None) -> Tables:
    """Evaluate the cost model on every option / pair / count the formulation can meet.

    ``upper_s`` (the estimate of a known fitting plan) sets the unit so that it spans 10^6..10^7
    units, and caps every hop and DP entry at ``upper_s`` (+1 unit): a plan that pays such an
    entry costs more than the known plan, so the cap never changes the optimum, and lowering
    entries keeps the bound valid. Without it the unit comes from :func:`time_unit`."""
    if not hasattr(problem.cost, "dp_layer_s"):
        raise HexicoreError("solver cpsat needs a cost model with dp_layer_s (the analytic model)", field="cost")
    m, t, L = problem.model, problem.train, problem.model.layers
    priced = problem.bound_cost()
    pools = machine_pools(problem)
    opts = [None, *options]
    if upper_s is not None and upper_s > 0:
        unit = 10.0 ** math.ceil(math.log10(upper_s / 1e7))
        ceiling = int(math.ceil(upper_s / unit)) + 1
    else:
        unit, ceiling = time_unit(problem, options, max_pipelines), None

    def to_us(seconds: float, cap: bool = True) -> int:
        """Seconds -> integer units, rounded down (keeps the model a lower approximation)."""
        v = int(math.floor(seconds / unit))
        return min(v, ceiling) if (cap and ceiling is not None) else v

    n_mb = t.micro_batches
    rows = in_flight_rows(problem, max_stages, n_mb)
    flights, in_flight = flight_index(rows, max_stages, n_mb)
    blocked = any(len(flights) in row for rows_p in in_flight for row in rows_p)
    hop = [[0] * len(opts) for _ in opts]
    for a in range(1, len(opts)):
        for b in range(1, len(opts)):
            dst = _second_group(pools, opts[a], opts[b])
            hop[a][b] = to_us(priced.hop_s(opts[a].devices, dst))

    def pair(params: float) -> tuple:
        return tuple(tuple(tuple(0 if (a == 0 or b == 0) else _dp_pair(problem, pools, opts[a], opts[b], v, params, to_us)
                                 for b in range(len(opts))) for a in range(len(opts)))
                     for v in range(max_pipelines + 1))

    least = tuple(tuple(_least_row(problem, p, max_stages)) for p in range(max_stages + 1))
    own = m.embedding_params() - (m.vocab * m.hidden if m.tied_embeddings else 0)  # a tied one: its group's
    return Tables(
        options=tuple(options), unit=unit, layers=L, max_pipelines=max_pipelines, max_stages=max_stages,
        stage=tuple(_stage_table(problem, o, to_us) for o in opts),
        hop=tuple(tuple(r) for r in hop),
        cap=tuple(_cap_table(problem, o, flights, extra=1 if blocked else 0) for o in opts), flights=flights,
        in_flight=tuple(tuple(tuple(r) for r in rows) for rows in in_flight),
        dp_pair=pair(m.layer_params()), dp_pair_head=pair(m.head_params()),
        dp_pair_emb=pair(own) if own else pair(0.0)[:1] * (max_pipelines + 1),  # none left: no ring at all
        dp_latency=pair(0.0)[min(2, max_pipelines)],
        ceiling=ceiling, tied_pair=tied_pairs(problem, options, pools, max_pipelines, to_us), least=least,
        head=head_rows(problem, max_stages, n_mb),
    )


def flight_index(rows: dict[tuple[int, int], tuple[float, ...]], max_stages: int,
                 n_mb: int) -> tuple[tuple[float, ...], list]:
    """``(flights, in_flight)`` of :class:`Tables` from :func:`in_flight_rows`: ``flights`` =
    ``(0, *sorted distinct finite values)`` (with whole counts only, ``1 .. max`` where every one
    occurs, so that ``flights[f] = f`` for 1F1B's closed rule), ``in_flight[P][j][n]`` the index of
    ``rows[P, n][j]`` there; a pair the schedule does not run (an infinite value: too few
    micro-batches, DualPipeV's ``M >= 2P``) gets ``len(flights)``, whose cap is 0 blocks."""
    seen = {f for r in rows.values() for f in r if math.isfinite(f) and f > 0}
    flights = (0.0, *sorted(seen)) if seen else (0.0, 1.0)
    index = {f: k for k, f in enumerate(flights)}
    in_flight = [[[0] * (n_mb + 1) for _ in range(max_stages + 1)] for _ in range(max_stages + 1)]
    for p in range(1, max_stages + 1):
        for j in range(p):
            for n in range(1, n_mb + 1):
                f = rows[p, n][j]
                in_flight[p][j][n] = index[f] if math.isfinite(f) else len(flights)
    return flights, in_flight


#: per cost model (by identity, while it lives): ``{(schedule, micro-batch, P, n): in-flight row}``
_FLIGHT: dict[int, tuple[weakref.ref, dict]] = {}


def in_flight_rows(problem: Problem, max_stages: int, n_mb: int) -> dict[tuple[int, int], tuple[float, ...]]:
    """``problem.cost.in_flight(pipe, j, n)`` of a template ``pipe`` of P empty stages under the
    problem's schedule (the peaks of its schedule pricer, :meth:`hexicore.pipeline.pricer.SchedulePricer.peaks`,
    injected by the planner; the cost model's default rule without one), for every P <=
    ``max_stages`` and n <= ``n_mb``: one row (j = 0..P-1) per pair. A schedule that simulates its peaks makes these most of the tables' cost (synth:
    a synthesis per pair, about a second each), so the pairs not known yet run in forked
    processes, one per core (:func:`~hexicore.planner.search.workers.fork_map`: the plain loop's
    values), and the rows are kept for the cost model's life: the allocation's sub-clusters ask
    for the same ones (the rows depend on the cost model, schedule, micro-batch, P and n only)."""
    t, sched = problem.train, dict(problem.schedule)
    memo = _flight_memo(problem.cost)
    ref = ScheduleRef.from_mapping(sched)

    def row(pn: tuple[int, int]) -> tuple[float, ...]:
        p, n = pn
        dummy = Pipeline(t.micro_batch, tuple(Stage((), 0, (0, 0)) for _ in range(p)), sched)
        return tuple(problem.cost.in_flight(dummy, j, n) for j in range(p))

    pairs = [(p, n) for p in range(1, max_stages + 1) for n in range(1, n_mb + 1)]
    todo = [pn for pn in pairs if (ref, t.micro_batch, *pn) not in memo]
    if todo:  # forked only where the largest pair's row is slow (1F1B's closed rule: microseconds)
        start = time.perf_counter()
        last = row(todo[-1])
        slow = time.perf_counter() - start > 0.01
        got = fork_map(row, todo[:-1], available_cores() if slow else 1) + [last]
        memo.update(((ref, t.micro_batch, *pn), r) for pn, r in zip(todo, got))
    return {pn: memo[(ref, t.micro_batch, *pn)] for pn in pairs}


def _flight_memo(cost: object) -> dict:
    """The rows kept for ``cost`` (a fresh dict where it takes no weak reference)."""
    try:
        alive = weakref.ref(cost)
    except TypeError:
        return {}
    hit = _FLIGHT.get(id(cost))
    if hit is None or hit[0]() is not cost:
        for k in [k for k, (r, _) in _FLIGHT.items() if r() is None]:
            del _FLIGHT[k]
        hit = _FLIGHT[id(cost)] = (alive, {})
    return hit[1]


def _least_row(problem: Problem, p: int, width: int) -> list[int]:
    """``least[p]`` of :class:`Tables`: the layer-per-chunk rule (:func:`least_layers`), 0 past stage p."""
    return [*least_layers(problem, p), *[0] * (width - p)]
