"""The stage table and the layout of one pipeline (HexiScale §4.3, App. A): cached stage costs
and the layout of an ordered list of stages (exact layer allocation).

* :class:`StageTable` — the cost model's STAGE/HOP/memory pieces cached per (devices, position)
  so the search asks the cost model once per distinct stage (App. A), also under a schedule's
  placement (:func:`placed_rows`);
* :func:`layout_pipeline` — stage times + hops + memory caps -> :func:`allocate_layers`, a
  :class:`StageLayout`. The TP menus a pipeline's stages come from: :mod:`hexicore.planner.stage_layout.tp_menus`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np

from hexicore.core.cluster import Cluster
from hexicore.core.model import ModelSpec
from hexicore.core.placement import Placement
from hexicore.core.plan import Pipeline, Stage
from hexicore.core.settings import TrainSettings
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost.base import BoundCostModel, CostModel, bind, check_seconds, default_in_flight
from hexicore.planner.stage_layout.layers import allocate_layers, layer_ranges
from hexicore.planner.stage_layout.tp_menus import Group, apply_menu

#: most pipelines whose stage rows :func:`stage_rows` keeps (then it starts afresh)
ROWS_KEPT = 2048
#: most units whose pieces :func:`unit_pieces` keeps (then it starts afresh)
UNITS_KEPT = 16384


@dataclass
class StageTable:
    """Cached cost pieces for one (cluster, model, train, cost model): stage time rows
    ``t(l), l = 0..L``, memory caps and hop times, under one schedule (whose peak activations
    set the caps). Mutable cache, local to one search."""

    cluster: Cluster
    model: ModelSpec
    train: TrainSettings
    cost: CostModel
    schedule: ScheduleRef = field(default_factory=ScheduleRef.default)
    dp: int = 1  # pipelines of the plan being built: the ZeRO shard count of the memory caps
    #: ``(schedule, ranks) -> per rank the fewest layers it may hold`` (its chunks, the pricing
    #: book's ``least``); None: one each
    least_fn: Callable[[ScheduleRef, int], Sequence[int]] | None = None
    _times: dict = field(default_factory=dict)
    _caps: dict = field(default_factory=dict)
    _hops: dict = field(default_factory=dict)
    _flight: dict = field(default_factory=dict)
    _rows: dict = field(default_factory=dict)
    _allocs: dict = field(default_factory=dict)
    _sigs: dict = field(default_factory=dict)
    _sig_ids: dict = field(default_factory=dict)
    _units: dict = field(default_factory=dict)  # (unit, menus) -> unit_pieces' pieces (signature keys only)

    def __post_init__(self) -> None:
        self.schedule = ScheduleRef.from_mapping(self.schedule)

    def variant(self, **changes: Any) -> "StageTable":
        """The table under another ``schedule`` or ``dp``: the stage times, hops and group
        signatures are shared, the memory caps and everything built on them start afresh."""
        return replace(self, **changes, _caps={}, _flight={}, _rows={}, _allocs={})

    @cached_property
    def priced(self) -> BoundCostModel:
        """The table's cost model bound to its cluster, model and train (:func:`hexicore.cost.base.bind`)."""
        return bind(self.cost, self.cluster, self.model, self.train)

    @cached_property
    def machine_class(self) -> dict[str, Any] | None:
        """Per machine its class of interchangeable machines (same GPU type, intra-machine link and
        zone, no per-pair link override: a machine named by one is a class of its own), when
        the cost model declares ``class_priced`` (prices a group of devices only through its
        machine's GPU type and links); else None (every group is its own key)."""
        if not getattr(self.cost, "class_priced", False):
            return None
        linked = {m for link in self.cluster.links for m in link.between}
        return {m.name: ("own", m.name) if m.name in linked else (m.gpu, m.bandwidth_gbs, m.latency_us, m.zone)
                for m in self.cluster.machines}

    def signature(self, devices: Group) -> tuple[int, str | None]:
        """(key, machine) of a group: the key is a small integer equal for groups the cost model
        prices identically — under a ``class_priced`` cost model a group inside one machine is
        known by its machine's class and its size (the same TP group on any machine of the class
        has the same stage time and memory), else by the group itself; ``machine``: the group's
        machine (None when it spans several), which with the keys decides a hop's link."""
        hit = self._sigs.get(devices)
        if hit is None:
            classes, dev = self.machine_class, self.cluster.device
            machines = {dev(d).machine for d in devices}
            one = next(iter(machines)) if len(machines) == 1 else None
            key = ("group", devices) if classes is None or one is None else ("class", classes[one], len(devices))
            hit = self._sigs[devices] = (self._sig_ids.setdefault(key, len(self._sig_ids)), one)
        return hit

    def _hop_key(self, src: Group, dst: Group) -> tuple[int, int, bool]:
        (a, ma), (b, mb) = self.signature(src), self.signature(dst)
        return (a, b, ma is not None and ma == mb)

    def times(self, devices: Group, first: bool, last: bool) -> np.ndarray:
        """STAGE(d_ij) of App. A for 0..L layers (one micro-batch). When the cost model's stage
        time is affine in the layer count (checked at l = 0, 1, 2 and L; the analytic model's is)
        the row is filled from those values, else every l is asked."""
        key = (self.signature(devices)[0], first, last)
        row = self._times.get(key)
        if row is None:
            stage_s, layers = self.priced.stage_s, self.model.layers
            s0 = stage_s(devices, 0, first=first, last=last)
            s1 = stage_s(devices, 1, first=first, last=last)
            s2 = stage_s(devices, 2, first=first, last=last)
            ls = np.arange(layers + 1)
            if abs((s2 - s1) - (s1 - s0)) <= 1e-12 * max(1.0, abs(s2)):  # affine in l: 3 calls suffice
                row = s0 + (s1 - s0) * ls
                row[layers] = stage_s(devices, layers, first=first, last=last)
                if abs(row[layers] - (s0 + (s1 - s0) * layers)) > 1e-9 * max(1.0, row[layers]):
                    row = None
            if row is None:
                row = np.array([stage_s(devices, int(l), first=first, last=last) for l in ls])
            check_seconds(np.ravel(row).tolist(), self.cost, "stage_s")
            self._times[key] = row
        return row

    def hop(self, src: Group, dst: Group) -> float:
        key = self._hop_key(src, dst)
        if key not in self._hops:
            hop = self.priced.hop_s(src, dst)
            check_seconds([hop], self.cost, "hop_s")
            self._hops[key] = hop
        return self._hops[key]

    def in_flight(self, n_stages: int, stage_index: int, n_mb: int) -> int:
        """Micro-batches stage ``stage_index`` holds at its peak under the table's schedule (the cost
        model's ``in_flight``; a cost model without one: :func:`hexicore.cost.base.default_in_flight`)."""
        key = (n_stages, stage_index, n_mb)
        if key not in self._flight:
            probe = getattr(self.cost, "in_flight", None)
            if probe is None:
                self._flight[key] = default_in_flight(n_stages, stage_index, n_mb)
            else:
                dummy = Pipeline(n_mb * self.train.micro_batch,
                                 tuple(Stage(("?",), 1, (0, 1)) for _ in range(n_stages)), self.schedule)
                self._flight[key] = probe(dummy, stage_index, n_mb)
        return self._flight[key]

    def flights(self, n_stages: int, n_mb: int) -> list[int]:
        """:meth:`in_flight` of every stage of an ``n_stages``-stage pipeline (cached)."""
        key = (n_stages, n_mb)
        if key not in self._flight:
            self._flight[key] = [self.in_flight(n_stages, j, n_mb) for j in range(n_stages)]
        return self._flight[key]

    def least(self, n_stages: int) -> tuple[int, ...]:
        """Per stage of an ``n_stages``-stage pipeline under the table's schedule the fewest layers
        it may hold (the runtime cuts a rank's layers among its chunks, one at least each)."""
        return (1,) * n_stages if self.least_fn is None else tuple(self.least_fn(self.schedule, n_stages))

    def placement(self, n_stages: int, n_mb: int) -> Placement | None:
        """The table's schedule's placement of an ``n_stages``-stage pipeline (the cost model's
        ``pipeline_placement``; None: plain, or a cost model without one)."""
        key = ("placement", n_stages, n_mb)
        if key not in self._flight:
            probe = getattr(self.cost, "pipeline_placement", None)
            dummy = Pipeline(n_mb * self.train.micro_batch,
                             tuple(Stage(("?",), 1, (0, 1)) for _ in range(n_stages)), self.schedule)
            self._flight[key] = None if probe is None else probe(dummy, n_mb)
        return self._flight[key]

    def cap(self, devices: Group, first: bool | int, last: bool | int, in_flight: int, copies: int = 1,
            tied: int | None = None) -> int:
        """Most layers l (0..L) the stage holds in memory with ``in_flight`` micro-batches; -1 if
        not even the embedding/head fits. ``first``/``last``: embeddings/heads it keeps; ``copies``:
        model copies of l blocks each, ``tied``: heads with their own copy of a tied embedding (a
        placement's; None or the rule ``heads - embeddings``: the cost model's own rule)."""
        rule = not self.model.tied_embeddings or tied == max(0, int(last) - int(first))
        key = (self.signature(devices)[0], first, last, in_flight) + ((copies,) if copies != 1 else ()) + \
            ((tied,) if tied is not None and not rule else ())
        if key not in self._caps:
            limit = min(self.cluster.device(d).memory_gb for d in devices)

            def memory(l: int) -> float:
                more = {} if copies == 1 else {"share_layers": l}  # one in-flight micro-batch spans one copy
                more.update({} if tied is None or rule else {"tied_heads": tied})
                return self.priced.stage_memory_gb(devices, copies * l, first=first, last=last,
                                                   in_flight=in_flight, dp=self.dp, **more)

            def fits(l: int) -> bool:
                return memory(l) <= limit

            self._caps[key] = largest_fitting(fits, memory, limit, self.model.layers)
        return self._caps[key]


def largest_fitting(fits: Callable[[int], bool], memory: Callable[[int], float], limit: float, layers: int) -> int:
    """The largest l in 0..``layers`` with ``fits(l)`` (memory grows with l), -1 if none: where
    the memory is affine in l from one block on (MEM-CUMSUM is: per-block state and activations
    times l, plus what the stage keeps whatever its blocks), the line through l = 1 and 2 names
    the answer and two checks confirm it (l fits, l + 1 does not); else, or where they do not,
    a binary search (about log2 L checks)."""
    if layers >= 3:
        m1, m2 = memory(1), memory(2)
        slope = m2 - m1
        if slope > 0 and m1 <= limit:
            guess = min(layers, 1 + int((limit - m1) / slope + 1e-9))
            if fits(guess) and (guess == layers or not fits(guess + 1)):
                return guess
    lo, hi = -1, layers
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class StageLayout:
    """An ordered pipeline with its layer counts; ``stage_s``/``hop_s`` per micro-batch."""

    stages: tuple[Group, ...]
    layers: tuple[int, ...]
    stage_s: tuple[float, ...]
    hop_s: tuple[float, ...]

    def fill_step(self) -> tuple[float, float]:
        """(sum_j (STAGE_j + HOP_j), max_j (STAGE_j + HOP_j)) of App. A PIPELINE-TIME."""
        per = [s + h for s, h in zip(self.stage_s, list(self.hop_s) + [0.0])]
        return sum(per), max(per)

    def pipeline(self, batch: int, schedule: ScheduleRef) -> Pipeline:
        return Pipeline(batch, tuple(Stage(g, len(g), r) for g, r in zip(self.stages, layer_ranges(self.layers))),
                        schedule)


def rows_key(table: StageTable, stages: Sequence[Group], n_mb_max: int) -> tuple:
    """The key of :func:`stage_rows`' cache: the stages' signatures and the links between them
    (:meth:`StageTable.signature`), so pipelines of interchangeable machines share one entry."""
    sigs, sig = table._sigs, table.signature
    out, prev = [], None
    for g in stages:  # per stage: its key and whether it shares the machine of the stage before
        k, m = sigs.get(g) or sig(g)
        out.append(2 * k + (m is not None and m == prev))
        prev = m
    return tuple(out), n_mb_max


def stage_rows(table: StageTable, stages: Sequence[Group], n_mb_max: int,
               key: tuple | None = None) -> tuple[np.ndarray, list[int], list[float]]:
    """Per stage: its time row ``STAGE_j(l) + HOP_j`` (l = 0..L, one matrix row per stage), its
    memory cap with the schedule's in-flight micro-batches at ``n_mb_max`` (an upper bound, so
    any smaller batch also fits), and the hops (cached per :func:`rows_key`)."""
    key = rows_key(table, stages, n_mb_max) if key is None else key
    hit = table._rows.get(key)
    if hit is None:
        if len(table._rows) >= ROWS_KEPT:  # a memo only: bounded, the rows of long pipelines weigh p x L floats
            table._rows.clear()
        hit = table._rows[key] = _new_rows(table, stages, n_mb_max, key[0])
    return hit


def _new_rows(table: StageTable, stages: Sequence[Group], n_mb_max: int, codes: Sequence[int]) -> tuple:
    """:func:`stage_rows` computed: the table's pieces looked up by the stages' signature codes
    (:func:`rows_key`: ``2 x key + shares the previous stage's machine``), asked by group on a miss;
    under a schedule's placement by :func:`placed_rows`."""
    p = len(stages)
    placement = table.placement(p, n_mb_max)
    if placement is not None:
        return placed_rows(table, stages, table.flights(p, n_mb_max), placement)
    flights = table.flights(p, n_mb_max)
    times, caps_, hops_ = table._times, table._caps, table._hops
    rows, caps, hops = [], [], []
    for j, g in enumerate(stages):
        k, first, last = codes[j] >> 1, j == 0, j == p - 1
        row = times.get((k, first, last))
        rows.append(row if row is not None else table.times(g, first, last))
        cap = caps_.get((k, first, last, flights[j]))
        caps.append(cap if cap is not None else table.cap(g, first, last, flights[j]))
        if not last:
            hop = hops_.get((k, codes[j + 1] >> 1, codes[j + 1] & 1))
            hops.append(hop if hop is not None else table.hop(g, stages[j + 1]))
    out = np.array(rows)
    out[:-1] += np.array(hops)[:, None]
    return out, caps, hops


def placed_rows(table: StageTable, stages: Sequence[Group], flights: Sequence[float], placement: Placement) -> tuple:
    """:func:`stage_rows` under a schedule's placement:
    stage j's row ``sum_c traffic_c x STAGE(l, embedding_c, head_c)`` over the copies it runs,
    each priced at its own l (the search's approximation: a copy of another stage's blocks as
    many as its own; the final plan is priced exactly, :meth:`AnalyticCostModel.stage_terms`);
    its cap the most l such that every stage keeping a copy of its blocks fits with each of
    its copies at l (a bound the exact placement always meets: a stage's copies are each at
    most l, so its memory is at most the one checked). Stages whose blocks would be kept at two
    TP degrees (:meth:`Placement.split_tp`) get cap -1: no layout of them exists."""
    rows, own, hops = [], [], []
    for j, g in enumerate(stages):
        rows.append(sum(c.traffic * table.times(g, c.embedding, c.head) for c in placement.ranks[j]))
        own.append(table.cap(g, placement.embeddings(j), placement.heads(j), flights[j], placement.copies(j), placement.lone_heads(j)))
        if j + 1 < len(stages):
            hops.append(table.hop(g, stages[j + 1]))
    caps = [min(own[r] for r in placement.holders(j)) for j in range(len(stages))]
    if placement.split_tp([len(g) for g in stages]) is not None:
        caps = [-1] * len(stages)
    out = np.array(rows)
    out[:-1] += np.array(hops)[:, None]
    return out, caps, hops


def unit_pieces(table: StageTable, order: Sequence[Group], menus: Sequence[Sequence[Sequence[int]]]) -> list:
    """Per unit of ``order`` and per menu of its ``menus``: its stages (:func:`apply_menu`), the
    signature key and machine of the first stage, the :func:`rows_key` codes of the others
    and the last stage's machine, so a pipeline's stages and key are joined from pieces."""
    out = []
    for u, ms in zip(order, menus):
        per = table._units.get((u, ms))
        if per is None:  # a unit recurs in every order (and its reverse) of a part: cached
            per = []
            for m in ms:
                groups = tuple(apply_menu(u, m))
                sigs = [table.signature(g) for g in groups]
                rest = tuple(2 * k + (mk is not None and mk == prev) for (k, mk), (_, prev) in zip(sigs[1:], sigs))
                per.append((groups, sigs[0][0], sigs[0][1], rest, sigs[-1][1]))
            if len(table._units) >= UNITS_KEPT:
                table._units.clear()
            table._units[(u, ms)] = per
        out.append(per)
    return out


def joined(pieces: list, choice: Sequence[int], n_mb_max: int) -> tuple[list[Group], tuple]:
    """The stages of ``choice`` (a menu per unit of :func:`unit_pieces`) and their :func:`rows_key`."""
    stages: list[Group] = []
    codes: list[int] = []
    prev = None
    for per, c in zip(pieces, choice):
        groups, k, m, rest, prev_next = per[c]
        codes.append(2 * k + (m is not None and m == prev))
        codes.extend(rest)
        stages.extend(groups)
        prev = prev_next
    return stages, (tuple(codes), n_mb_max)


def layout_pipeline(table: StageTable, stages: Sequence[Group], n_mb_max: int,
                    layers: Sequence[int] | None = None, key: tuple | None = None) -> StageLayout | None:
    """Lay out ordered ``stages``: the exact min-max layer allocation under the memory caps of
    :func:`stage_rows` (or the given ``layers``, checked against the caps). ``None``: OOM.
    ``key``: the stages' :func:`rows_key` when the caller has it."""
    p, L = len(stages), table.model.layers
    if p == 0 or p > L:
        return None
    key = rows_key(table, stages, n_mb_max) if key is None else key
    rows, caps, hops = stage_rows(table, stages, n_mb_max, key)
    if layers is None:
        hit = table._allocs.get(key)
        if hit is None:  # (allocation, stage times) per rows key
            alloc = allocate_layers(rows, caps, L, table.least(p))
            hit = table._allocs[key] = (alloc, None if alloc is None else _stage_s(rows, hops, alloc))
        alloc, stage_s = hit
        if alloc is None:
            return None
    else:
        alloc = tuple(int(x) for x in layers)
        if sum(alloc) != L or any(not k <= a <= c for a, c, k in zip(alloc, caps, table.least(p))):
            return None
        stage_s = _stage_s(rows, hops, alloc)
    return StageLayout(tuple(stages), alloc, stage_s, tuple(hops))


def _stage_s(rows: np.ndarray, hops: Sequence[float], alloc: Sequence[int]) -> tuple[float, ...]:
    """Per stage ``STAGE_j(l_j)``: its row at its layers less its hop (the last has none)."""
    return tuple((rows[np.arange(len(alloc)), alloc] - np.append(hops, 0.0)).tolist())
