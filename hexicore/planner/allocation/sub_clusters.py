"""Allocation: which devices a plan uses (the solver decides, not the user).

A solver that always uses every device of its cluster can be slowed down by adding hardware
(a slow machine behind a slow link joins a pipeline or the DP sync). :func:`allocate` runs the
same solver on sub-clusters made of whole machines and keeps the best plan under the problem's
:class:`~hexicore.planner.allocation.objective.Objective`:

* machines are grouped into classes of interchangeable machines (same GPU type, usable device
  count, intra-machine link, no per-pair link override); a sub-cluster is a count per class (the
  first machines of each class in cluster order), so isomorphic sub-clusters are solved once;
* when there are at most ``exhaustive`` such sub-clusters, all are solved (the returned plan is
  then the best the solver finds on *any* sub-cluster of whole machines, and adding a machine
  never makes it worse: the smaller cluster's sub-clusters are among the larger one's);
* otherwise a greedy descent from the whole cluster: each step solves every neighbour (one
  machine fewer of one class, one GPU type or one zone removed entirely) and moves to the best if it
  improves — the whole cluster and every all-but-one-machine / all-but-one-type sub-cluster are
  always candidates, so the plan is never worse than today's (``use_all_devices``) plan nor
  than the solver's own plan on every device of a cluster with one machine less — though it may be
  worse than the plan this allocation finds on that smaller cluster, which can come from a
  sub-cluster the descent stops short of (a local optimum); the first step also jumps to the
  sub-clusters of the fastest GPU types alone (:func:`fastest_types`: the 1, 2, ... types of
  highest per-device FLOPS, or FLOPS times memory), which a step of one machine or one type
  reaches only after many; while no plan meets ``budget_per_hour``
  (every neighbour still costs more), it steps on to the neighbour over the budget that keeps the
  most peak FLOPS per dollar, until sub-clusters within the budget are reached and solved;
* where no sub-cluster of whole machines meets ``budget_per_hour``, each class's first machine is
  also solved on as many of its first devices as the budget pays for;
* sub-clusters are skipped without solving when their memory cannot hold the model's state,
  their price exceeds ``budget_per_hour``, or a lower bound (the model's FLOPs over their peak
  FLOP rate; every plan's MFU is at most 1) cannot beat the best plan found.

A solver's proven ``bound`` (cpsat) speaks of the sub-cluster it solved; the returned plan's
``bound`` is the least over every sub-cluster (the FLOPs bound for those not solved or not
visited), and an ``OPTIMAL`` status stays only when no other sub-cluster's bound lies below it.

The returned plan lives on the problem's whole cluster (its JSON lists every device); devices
no pipeline uses are idle, reported per left-out GPU type or machine by :func:`idle_groups`
with the best plan found that uses them (the plan's ``solver.idle``, docs/formats.md).

:class:`TimeShares`: a whole solve's search time divided among the sub-clusters :func:`allocate`
solves, for a solver whose own runs take a time limit (cpsat, where the limit is CP-SAT's search
time, as OR-Tools' ``max_time_in_seconds``; building each model is not counted). hexiscale's
search instead runs each sub-cluster in the wall-clock time left before its deadline.

:func:`on_devices_for_objective`: the baselines under an objective. A baseline solver (Megatron,
Metis, Galvatron, FSDP) lays its plan out on every device it is given, as those systems do. Under
the default objective (least iteration time, no budget, no throughput floor) that is what it
returns; under ``objective=cost``, ``budget_per_hour`` or ``min_tokens_per_s`` it is given the
sub-clusters of whole machines that :func:`allocate` tries, and the plan that best meets the
objective is returned, so a sweep over solvers compares like with like and no baseline plan
breaks a budget it was given.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.planner.allocation.objective import Objective, plan_price, rate
from hexicore.planner.problem import Problem, Progress, no_progress
from hexicore.planner.search.workers import Forked, fork_map, fork_start

__all__ = ["TimeShares", "Trial", "allocate", "idle_groups", "machine_classes", "on_devices_for_objective",
           "sub_cluster"]

INF = math.inf
Solve = Callable[[Problem, Progress], Plan]  # (sub-problem, progress) -> plan
Screen = Callable[[Problem, Plan], "Plan | None"]  # (sub-problem, best plan so far) -> a quick plan there


@dataclass
class TimeShares:
    """``limit`` seconds of search shared among the sub-clusters ``allocate`` solves, in
    proportion to their devices (a larger model takes longer to solve and to bound): before each
    solve ``allocate`` sets ``part``, that sub-cluster's devices over the devices of those it
    still means to solve, itself included (exhaustive mode: every one left that has memory for
    the state; a greedy step: its neighbours left and the largest again for the next step);
    :meth:`seconds` is that part of the seconds left, and the solver reports what its run took
    (:meth:`spend`), so time a sub-cluster did not use (proven early, or skipped) passes on to
    the others and a run that overran its share (presolve) leaves less. Once :attr:`spent`, no
    further sub-cluster is solved."""

    limit: float
    used: float = 0.0
    part: float = 1.0

    def seconds(self) -> float:
        return max(1e-3, self.limit - self.used) * self.part

    def spend(self, seconds: float) -> None:
        self.used += max(0.0, seconds)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


@dataclass(frozen=True)
class Trial:
    """One solved sub-cluster: its machines, the plan (None: nothing fits), its score."""

    machines: tuple[str, ...]
    plan: Plan | None
    score: tuple[float, float]
    part: bool = False  # only some devices of ``machines`` (a budget's, :meth:`_Search.trimmed`)


def machine_classes(cluster: Cluster) -> list[tuple[str, ...]]:
    """Interchangeable machines, in cluster order: same GPU type, usable device count,
    intra-machine link and zone; a machine named by a per-pair link override is a class of its own."""
    used = {d.machine: 0 for d in cluster.devices}
    for d in cluster.devices:
        used[d.machine] += 1
    linked = {m for l in cluster.links for m in l.between}
    classes: dict[tuple, list[str]] = {}
    for m in cluster.machines:
        if m.name not in used:
            continue
        key = ("own", m.name) if m.name in linked else (m.gpu, used[m.name], m.bandwidth_gbs, m.latency_us, m.zone)
        classes.setdefault(key, []).append(m.name)
    return [tuple(v) for v in classes.values()]


def sub_cluster(cluster: Cluster, machines: tuple[str, ...]) -> Cluster:
    """``cluster`` restricted to the usable devices of ``machines`` (the rest excluded)."""
    keep = set(machines)
    gone = [d.id for d in cluster.devices if d.machine not in keep]
    return cluster.exclude(gone) if gone else cluster


def _lower_bound(flops: float | None, cluster: Cluster, machines: tuple[str, ...]) -> float:
    """Iteration time no plan on ``machines`` beats: the model's FLOPs at their peak rate."""
    if not flops:
        return 0.0
    keep = set(machines)
    return flops / (sum(d.tflops for d in cluster.devices if d.machine in keep) * 1e12)


@dataclass
class _Search:
    """The memo of solved sub-clusters and the best so far (internal to :func:`allocate`)."""

    problem: Problem
    solve: Solve
    objective: Objective
    classes: list[tuple[str, ...]]
    trials: dict
    flops: float | None = None
    best: Trial | None = None
    deadline: float | None = None
    began: float = field(default_factory=time.monotonic)  # (the allocation's start: its span ends at ``deadline``)
    progress: Progress = no_progress
    screen: Screen | None = None
    screened: int = 0
    quick: dict = field(default_factory=dict)  # counts -> the screen's score, computed ahead (prescreen)
    whole_error: HexicoreError | None = None  # why nothing fits the whole cluster (raised if nothing fits anywhere)
    vacant: set = field(default_factory=set)  # sub-clusters without a plan: no memory for the state, or proven
    shares: TimeShares | None = None

    def machines(self, counts: tuple[int, ...]) -> tuple[str, ...]:
        keep = {m for cls, n in zip(self.classes, counts) for m in cls[:n]}
        return tuple(m.name for m in self.problem.cluster.machines if m.name in keep)

    def skip(self, machines: tuple[str, ...]) -> bool:
        """Pruned without solving: no memory for the state, over budget, or bounded out."""
        cl, keep = self.problem.cluster, set(machines)
        devs = [d for d in cl.devices if d.machine in keep]
        if not self.holds_state(machines):
            self.vacant.add(machines)
            return True
        price = sum(d.gpu.price_per_hour or 0.0 for d in devs)
        if self.objective.budget_per_hour is not None and price > self.objective.budget_per_hour + 1e-9:
            return True
        if self.best is None or self.best.plan is None or self.best.score[0] == INF:
            return False
        lb = _lower_bound(self.flops, cl, machines)
        bound = price * lb if self.objective.kind == "cost" else lb  # $ per iteration or seconds
        best = self.best.plan.estimate
        best_v = plan_price(self.best.plan) * best.iteration_s if self.objective.kind == "cost" else best.iteration_s
        return self.objective.min_tokens_per_s is None and bound >= best_v * (1 + 1e-9)

    def roomy(self) -> bool:
        """Under a deadline, whether at least :data:`ROOMY_SHARE` of the allocation's time is
        left: then a step searches its best-screened neighbours in full even where their screens
        promise nothing (a screen's short search misranks them: hetero3, Llama 30B at batch 128,
        1F1B, the whole cluster's plan 22.81 s in 0.5 s of a 5 s budget, and without one of its
        RTX 3090 machines 22.76 s, a neighbour whose screen had lost)."""
        if self.deadline is None:
            return False
        return self.deadline - time.monotonic() >= ROOMY_SHARE * (self.deadline - self.began)

    def holds_state(self, machines: tuple[str, ...]) -> bool:
        """Does the memory of ``machines`` hold the model's state (weights, gradients, optimizer)?"""
        keep, cost = set(machines), self.problem.cost
        reserve, per = getattr(cost, "reserve_gb", 0.0), getattr(cost, "state_bytes_per_param", None)
        memory = sum(d.memory_gb - reserve for d in self.problem.cluster.devices if d.machine in keep)
        return memory * 2**30 >= self.problem.model.total_params() * (per or 4 * self.problem.train.dtype_bytes)

    def devices(self, machines: tuple[str, ...]) -> int:
        keep = set(machines)
        return sum(1 for d in self.problem.cluster.devices if d.machine in keep)

    def ahead(self, vectors: list[tuple[int, ...]]) -> int:
        """Devices of the sub-clusters of ``vectors`` still to solve (not solved, and with memory
        for the state), each sub-cluster counted once: the weight :class:`TimeShares` divides by."""
        todo = {self.machines(v) for v in vectors}
        return sum(self.devices(m) for m in todo if m and m not in self.trials and self.holds_state(m))

    def largest(self, vectors: list[tuple[int, ...]]) -> int:
        """Devices of the largest of ``vectors``: the weight a greedy step keeps for the next step."""
        return max((self.devices(self.machines(v)) for v in vectors), default=0)

    def toward_budget(self, vectors: list[tuple[int, ...]]) -> tuple[int, ...] | None:
        """While no plan meets ``budget_per_hour``: the next step of the greedy descent among the
        neighbours ``vectors`` still over the budget (skipped unsolved, so no neighbour improved
        on the best), the one keeping the most peak FLOPS per dollar, then the most FLOPS; None
        once a plan meets the objective, without a budget, or when no neighbour is over it."""
        budget = self.objective.budget_per_hour
        if budget is None or (self.best is not None and self.best.score[0] < INF):
            return None
        over = []
        for v in vectors:
            keep = set(self.machines(v))
            devs = [d for d in self.problem.cluster.devices if d.machine in keep]
            price = sum(d.gpu.price_per_hour or 0.0 for d in devs)
            if devs and price > budget + 1e-9:
                flops = sum(d.tflops for d in devs)
                over.append(((flops / price, flops), v))
        return max(over, key=lambda o: o[0])[1] if over else None

    def promising(self, counts: tuple[int, ...], here: tuple[int, ...] | None = None) -> bool:
        """The screen: does a quick plan on this sub-cluster already beat the best so far, or the
        quick plan on ``here`` (the sub-cluster the step starts from: a quick plan is compared with
        its like, as a short search's plan is slower than the full search's best)?"""
        machines = self.machines(counts)
        if not machines or machines in self.trials or self.best is None or self.best.plan is None:
            return bool(machines)
        score = self.quick_score(counts)
        self.screened += 1
        if score is None:
            return False
        mark = self.quick_score(here) if here is not None and self.machines(here) else None
        if mark is None and here is not None and self.machines(here):  # the screen found nothing there:
            mark = (INF, INF)  # one that finds a plan here does better than its like
        return score < self.best.score or (mark is not None and score < mark)

    def quick_score(self, counts: tuple[int, ...]) -> tuple[float, float] | None:
        """The screen's score on a sub-cluster, computed once (or ahead, :meth:`prescreen`)."""
        if counts not in self.quick:
            self.quick[counts] = self.screen_score(counts, None)
        return self.quick[counts]

    def screen_score(self, counts: tuple[int, ...], best: Plan | None) -> tuple[float, float] | None:
        """The objective's score of the screen's quick plan on a sub-cluster (None: none fits)."""
        sub = replace(self.problem, cluster=sub_cluster(self.problem.cluster, self.machines(counts)))
        try:
            quick = self.screen(sub, best)
        except HexicoreError:
            return None
        return None if quick is None else self.objective.score(quick)

    def prescreen(self, vectors: list[tuple[int, ...]], workers: int) -> None:
        """Screen the neighbours ``vectors`` ahead, ``workers`` at a time in forked processes
        (:mod:`hexicore.planner.search.workers`); :meth:`promising` then uses these scores. Only
        for screens that do not look at the best plan (they get None): the scores are then the
        ones :meth:`promising` would compute itself, so the descent is the same."""
        todo = [v for v in vectors if self.machines(v) and self.machines(v) not in self.trials and v not in self.quick]
        if workers > 1 and len(todo) > 1:
            self.quick.update(zip(todo, fork_map(lambda v: self.screen_score(v, None), todo, workers)))

    def prescreen_start(self, vectors: list[tuple[int, ...]], workers: int) -> Forked | None:
        """Start screening the neighbours ``vectors`` in ``workers`` forked children right away
        (before anything is solved: the caller solves the whole cluster meanwhile); the
        children's scores are those :meth:`prescreen` computes (the screen ignores the best plan)."""
        todo = [v for v in vectors if self.machines(v)]
        if workers < 1 or len(todo) < 1:
            return None
        return fork_start(lambda v: (v, self.screen_score(v, None)), todo, workers)

    def trial(self, counts: tuple[int, ...], first: bool = False, ahead: int = 0) -> Trial | None:
        """Solve the sub-cluster of ``counts`` (memoised; skipped past the deadline or when
        :meth:`skip` prunes it); ``ahead``: the devices still to solve, :class:`TimeShares`."""
        machines = self.machines(counts)
        if not machines:
            return None
        if machines in self.trials:
            return self.trials[machines]
        if not first and ((self.deadline is not None and time.monotonic() > self.deadline)
                          or (self.shares is not None and self.shares.spent)):
            return None
        if not first and self.skip(machines):
            self.trials[machines] = None
            return None
        sub = replace(self.problem, cluster=sub_cluster(self.problem.cluster, machines))
        if self.shares is not None:
            self.shares.part = min(1.0, self.devices(machines) / max(1, ahead))
        return self.solved(machines, machines, sub, first)

    def descend(self, full: tuple[int, ...], types: list[tuple[int, ...]], screened: bool, workers: int) -> None:
        """The greedy descent from ``full`` (module docstring): each step solves the neighbours
        (screened: at most :data:`SCREENED_SOLVES` of those whose screens promise most) and moves
        to the best if it improves, or, over ``budget_per_hour``, toward it."""
        cur = full
        while True:
            here, near = self.best, list(_neighbours(cur, self.classes, types))
            regular = set(near)  # (the steps toward a budget: neighbours only, no jump)
            if cur == full:  # the first step also jumps to the fastest types alone
                near += [v for v in fastest_types(self.problem.cluster, self.classes, full) if v not in regular]
            if screened:
                self.prescreen([cur, *near], workers)
            more = self.largest(near)  # kept for a step after this one
            if screened:  # the most promising few neighbours and jump, by their screens
                score = lambda v: self.quick_score(v) or (INF, INF)  # noqa: E731
                ranked = sorted((v for v in near if self.promising(v, cur)), key=score)
                chosen = set([v for v in ranked if v in regular][:SCREENED_SOLVES]
                             + [v for v in ranked if v not in regular][:SCREENED_JUMPS])
                if self.roomy():  # time to spare: the best screens are searched even where they promise nothing
                    spare = sorted((v for v in near if v in regular and v not in chosen and self.quick.get(v)
                                    and self.machines(v) not in self.trials), key=score)
                    chosen.update(spare[:SCREENED_SOLVES - sum(1 for v in chosen if v in regular)])
                near = sorted(chosen, key=score)  # (best screens first: the time may run out)
            steps = [(v, self.trial(v, ahead=self.ahead(near[k:]) + more)) for k, v in enumerate(near)]
            self.progress(f"allocation: {len(self.trials)} sub-clusters solved", 0.75)
            if self.best is here:
                cur = self.toward_budget([v for v in near if v in regular])
                if cur is None:
                    return
                continue
            cur = next(v for v, t in steps if t is self.best)

    def trimmed(self) -> None:
        """No whole-machine sub-cluster meets ``budget_per_hour``: solve the first devices of each
        class's first machine, as many as the budget pays for (keyed ``(machine, count)``)."""
        cl, budget = self.problem.cluster, self.objective.budget_per_hour
        for cls in self.classes:
            devs = [d for d in cl.devices if d.machine == cls[0]]
            price = devs[0].gpu.price_per_hour or 0.0
            k = len(devs) if price <= 0 else int(budget / price + 1e-9)
            if 1 <= k < len(devs) and (cls[0], k) not in self.trials:
                keep = {d.id for d in devs[:k]}
                sub = replace(self.problem, cluster=cl.exclude([d.id for d in cl.devices if d.id not in keep]))
                self.solved((cls[0], k), (cls[0],), sub, part=True)

    def finished(self, finish: Callable[[Plan], Plan]) -> None:
        """The :data:`FINISHED` best trials' plans priced exactly by ``finish``; the best of them
        becomes :attr:`best`."""
        top = sorted(((k, t) for k, t in self.trials.items() if t is not None and t.plan is not None
                      and t.score[0] < INF), key=lambda kt: kt[1].score)[:FINISHED]
        self.best = None
        for key, t in top:
            plan = finish(t.plan)
            est = plan.estimate or self.problem.cost.estimate(plan)
            plan = Plan(plan.model, self.problem.cluster, plan.train, plan.pipelines, est, plan.solver)
            done = replace(t, plan=plan, score=self.objective.score(plan))
            self.trials[key] = done
            if self.best is None or done.score < self.best.score:
                self.best = done

    def solved(self, key: tuple, machines: tuple, sub: Problem, first: bool = False, part: bool = False) -> Trial:
        """Solve ``sub`` (the devices of ``machines``, or some: ``part``), record it under ``key``."""
        try:
            gpus = len(sub.cluster.devices)
            plan = self.solve(sub, (lambda m, f: self.progress(m, 0.5 * f)) if first else
                              (lambda m, f: self.progress(f"allocation: {len(self.trials) + 1} sub-clusters, "
                                                          f"now {gpus} GPUs: {m}", 0.75)))
        except HexicoreError as exc:
            if first:  # a smaller sub-cluster may still hold a plan (fewer stages, a schedule's limits)
                self.whole_error = exc
            if exc.field != "solver.time_limit":  # out of time: a plan may still be there
                self.vacant.add(key)
            plan = None  # nothing fits (or the solver's settings do not suit) this sub-cluster
        if plan is not None:
            est = plan.estimate or sub.cost.estimate(plan)
            plan = Plan(plan.model, self.problem.cluster, plan.train, plan.pipelines, est, plan.solver)
            if self.flops is None and est.mfu > 0 and est.mfu <= 1:  # the first plan solved
                self.flops = est.mfu * est.iteration_s * sub.cluster.total_tflops * 1e12
        t = Trial(machines, plan, self.objective.score(plan) if plan is not None else (INF, INF), part)
        self.trials[key] = t
        if self.best is None or t.score < self.best.score:
            self.best = t
        return t


def _neighbours(counts: tuple[int, ...], classes: list[tuple[str, ...]], types: list[tuple[int, ...]]):
    for i, n in enumerate(counts):
        if n > 0:
            yield counts[:i] + (n - 1,) + counts[i + 1:]
    for members in types:
        if any(counts[i] for i in members):
            yield tuple(0 if i in members else n for i, n in enumerate(counts))


def fastest_types(cluster: Cluster, classes: list[tuple[str, ...]], counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The sub-clusters of ``counts`` that keep only the ``k`` fastest GPU types, for ``k`` from 1
    to one type fewer than ``counts`` holds, "fastest" read two ways: by per-device peak FLOPS,
    and by peak FLOPS times memory (a GPU with little memory holds few layers and few
    micro-batches in flight, so its FLOPS serve a pipeline less); each sub-cluster once. The
    greedy descent's first step jumps to them beside its neighbours (a small batch or a 1F1B
    bubble can make the fast GPUs alone best: on 320 GPUs of six types, Llama-2 70B at batch 24
    plans best on H100s, A100s and A800s, which a descent of one machine or one type a step
    reaches only after many steps, and which the L40S's higher peak keeps out of the first order)."""
    gpus = {}
    for cls, n in zip(classes, counts):
        if n:
            gpu = cluster.machine(cls[0]).gpu
            gpus[gpu.name] = gpu
    out: list[tuple[int, ...]] = []
    for key in (lambda g: g.tflops, lambda g: g.tflops * g.memory_gb):
        order = sorted(gpus, key=lambda name: -key(gpus[name]))
        for k in range(1, len(order)):
            keep = set(order[:k])
            jump = tuple(n if cluster.machine(cls[0]).gpu.name in keep else 0 for cls, n in zip(classes, counts))
            if jump not in out:
                out.append(jump)
    return out


def _group_moves(cluster: Cluster, classes: list[tuple[str, ...]]) -> list[tuple[int, ...]]:
    """The classes of each GPU type and of each zone (when there are several): the greedy
    descent's moves that leave a whole type or zone out."""
    out = []
    for key in (lambda m: m.gpu.name, lambda m: m.zone):
        by: dict = {}
        for i, cls in enumerate(classes):
            by.setdefault(key(cluster.machine(cls[0])), []).append(i)
        out += [tuple(v) for v in by.values()] if len(by) > 1 else []
    return out


#: a screened greedy step searches in full at most this many neighbours (the best screens that
#: pass), and at most SCREENED_JUMPS of the first step's jumps to the fastest types besides
#: (apart, so a jump never takes a neighbour's place: the descent's own path stays as it was).
#: Two jumps: a screen's short search can rank two jumps unlike the full search (320 GPUs of six
#: types, Llama-2 70B at batch 24, 1F1B: H100s + A100s screened 3.27 s, with the A800s 3.32 s;
#: searched in full, 3.27 and 3.24 s), and a descent from the one searched only removes machines
SCREENED_SOLVES = 2
SCREENED_JUMPS = 2

#: a screened step with at least this share of the allocation's time left (under a deadline)
#: searches its best-screened neighbours in full even where they promise nothing (:meth:`_Search.roomy`)
ROOMY_SHARE = 0.5

#: how many of the best sub-clusters' plans :func:`allocate` has priced exactly (``finish``)
FINISHED = 2


def allocate(problem: Problem, solve: Solve, *, exhaustive: int = 8, progress: Progress = no_progress,
             deadline: float | None = None, screen: Screen | None = None, screen_above: int = 128,
             workers: int = 1, shares: TimeShares | None = None,
             finish: Callable[[Plan], Plan] | None = None) -> Plan:
    """The best plan of ``solve`` over sub-clusters of whole machines (module docstring);
    past ``deadline`` (``time.monotonic()``) no further sub-cluster is solved (the whole cluster
    always is; where nothing fits it, the sub-clusters are still tried, and its error is raised
    only if nothing fits any of them). ``screen`` (greedy mode, clusters of more than ``screen_above`` devices): a
    cheap plan for a neighbour sub-cluster (e.g. a short search); the neighbour is searched in
    full only when that plan already beats the best, or the same screen's plan on the sub-cluster
    the step starts from (at most :data:`SCREENED_SOLVES` of them, the best screens first); ``workers`` > 1: a step's screens run in
    that many processes (the screen must then ignore its plan argument), and the first step's
    screens start in ``workers - 1`` forked processes before the whole cluster is searched, beside
    that search (the scores are the same, so is the descent); ``shares``: told before each
    solve what part of the time left it gets; once spent, no further sub-cluster is solved;
    its ``solver`` section gains ``allocation`` (how many sub-clusters were solved, the mode,
    the machines used) and ``idle`` (:func:`idle_groups`). ``finish``: for a solver whose plans
    are priced by a model while it searches (hexiscale), the exact pricing of a plan it returned:
    the :data:`FINISHED` best sub-clusters' plans are finished and the best of those wins, so
    only they are priced exactly."""
    objective = problem.objective
    objective.check_prices(problem.cluster)
    classes = machine_classes(problem.cluster)
    full = tuple(len(c) for c in classes)
    s = _Search(problem, solve, objective, classes, {}, deadline=deadline, progress=progress, screen=screen,
                shares=shares)
    total = math.prod(n + 1 for n in full) - 1
    mode = "exhaustive" if total <= exhaustive else "greedy"
    types = _group_moves(problem.cluster, classes)
    vectors = sorted(itertools.product(*(range(n + 1) for n in full)), key=lambda v: -sum(v)) \
        if mode == "exhaustive" else []
    screened = mode == "greedy" and screen is not None and len(problem.cluster.devices) > screen_above
    near = list(_neighbours(full, classes, types))
    near += [v for v in fastest_types(problem.cluster, classes, full) if v not in near]
    # the first step's screens run beside the whole cluster's search (they do not depend on it)
    early = s.prescreen_start([full, *near], workers - 1) if screened and workers > 1 else None
    try:
        s.trial(full, first=True, ahead=s.ahead(vectors) if vectors else s.ahead([full, *near]) + s.largest(near))
        if early is not None:
            s.quick.update(early.result())
    finally:
        if early is not None:
            early.cancel()
    if mode == "exhaustive":
        for i, v in enumerate(vectors):
            progress(f"allocation: sub-cluster {i + 1}/{len(vectors)}", 0.5 + 0.5 * (i + 1) / (len(vectors) + 1))
            s.trial(v, ahead=s.ahead(vectors[i:]))
    else:
        s.descend(full, types, screened, workers)
    complete = len(s.trials) == total
    if objective.budget_per_hour is not None and (s.best is None or s.best.score[0] == INF):
        s.trimmed()
    if finish is not None:
        s.finished(finish)
    best = s.best
    if best is None or best.plan is None or best.score[0] == INF:
        raise s.whole_error if s.whole_error is not None else objective.unmet(problem, s.trials)
    info = dict(best.plan.solver or {})
    info["allocation"] = {"mode": mode, "solved": sum(1 for t in s.trials.values() if t is not None),
                          "considered": len(s.trials), "screened": s.screened, "machines": list(best.machines),
                          "objective": objective.to_dict()}
    info.update(rate(best.plan))
    info.update(_overall_bound(s, best, info, complete=complete))
    info["idle"] = idle_groups(problem.cluster, best.plan, [t for t in s.trials.values() if t is not None])
    progress(f"allocation: done, {len(best.machines)} of {len(problem.cluster.machines)} machines used", 1.0)
    return best.plan.with_solver(info)


def _overall_bound(s: _Search, best: Trial, info: dict, complete: bool) -> dict:
    """A solver's proven ``bound`` (and ``OPTIMAL`` status) speaks of the sub-cluster it solved;
    over the whole cluster the bound is the least over every sub-cluster: a solved one's own
    bound or the FLOPs bound of :func:`_lower_bound`, whichever is higher (a search stopped early
    may have proven little), none where no plan can be (memory, or the solver proved it), else
    (pruned, out of time, not visited: ``complete`` false) the FLOPs bound. ``OPTIMAL`` stays
    only when no sub-cluster's bound lies below the chosen one's; solvers without bounds: no change."""
    if info.get("bound") is None:
        return {}
    cl = s.problem.cluster
    bounds = [] if complete else [_lower_bound(s.flops, cl, tuple(m.name for m in cl.machines))]
    for machines, t in s.trials.items():
        if machines in s.vacant:
            continue  # no plan at all there
        own = (t.plan.solver or {}).get("bound", None) if t is not None and t.plan is not None else None
        if t is not None and t.plan is not None and own is None:
            return {"bound": None, "status": "FEASIBLE" if info.get("status") == "OPTIMAL" else info.get("status")}
        bounds.append(max(own or 0.0, _lower_bound(s.flops, cl, machines)))  # each is a valid bound
    bound = min(bounds, default=info["bound"])
    out = {"bound": bound}
    if info.get("status") == "OPTIMAL" and bound < info["bound"] * (1 - 1e-9):
        out["status"] = "FEASIBLE"
    return out


def idle_groups(cluster: Cluster, plan: Plan, trials: list) -> list[dict]:
    """Devices no pipeline of ``plan`` uses, per GPU type left out entirely, else per zone
    left out entirely, else per machine
    (else the single devices): ``{"kind", "name", "devices", "iteration_s", ...}`` where
    ``iteration_s`` / ``tokens_per_s`` / ``usd_per_mtok`` describe the best plan found that uses
    the group (null when no solved sub-cluster used it); ``trials``: the allocation's solved
    sub-clusters (:class:`Trial`)."""
    used = set(plan.devices)
    idle = [d for d in cluster.devices if d.id not in used]
    if not idle:
        return []
    groups: list[tuple[str, str, list[str]]] = []
    types = {d.gpu.name for d in cluster.devices if d.id in used}
    done: set[str] = set()
    for d in idle:
        if d.id in done:
            continue
        zone = cluster.machine(d.machine).zone
        if d.gpu.name not in types:
            members = [e.id for e in idle if e.gpu.name == d.gpu.name]
            groups.append(("gpu", d.gpu.name, members))
        elif zone is not None and all(e.id not in used for e in cluster.devices
                                      if cluster.machine(e.machine).zone == zone):
            members = [e.id for e in idle if cluster.machine(e.machine).zone == zone and e.id not in done]
            groups.append(("zone", zone, members))
        else:
            members = [e.id for e in idle if e.machine == d.machine]
            whole = all(e.id not in used for e in cluster.devices if e.machine == d.machine)
            groups.append(("machine" if whole else "devices", d.machine, members))
        done.update(members)
    out = []
    for kind, name, members in groups:
        need = {cluster.device(m).machine for m in members}
        using = [t for t in trials if t.plan is not None and need <= set(t.machines) and not t.part]
        top = min(using, key=lambda t: t.score, default=None)
        row = {"kind": kind, "name": name, "devices": members, "iteration_s": None}
        if top is not None:
            row.update({"iteration_s": top.plan.estimate.iteration_s, **rate(top.plan)})
        out.append(row)
    return out


def on_devices_for_objective(problem: Problem, solve_all: Callable[[Problem, Progress], Plan], *,
                             progress: Progress = no_progress) -> Plan:
    """``solve_all(problem, progress)`` under the default objective; otherwise the best of it
    over sub-clusters (module docstring)."""
    if problem.objective == Objective():
        return solve_all(problem, progress)
    return allocate(problem, solve_all, progress=progress)
