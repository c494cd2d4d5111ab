"""Megatron-LM's symmetric DP x TP x PP layouts, shared by the baseline solvers.

A symmetric layout splits ``n`` devices into ``dp`` equal pipelines of ``pp`` stages of ``tp``
devices each, in Megatron's rank order (TP innermost, then DP, then PP) over a device order, with
near-equal contiguous layer ranges per stage and the global batch split equally over DP. The
``megatron`` solver searches all of them; the homogeneous baselines (``plugins/solvers/baselines.py``)
search them inside each GPU type. Pure functions of a :class:`~hexicore.planner.problem.Problem`.
"""

from __future__ import annotations

from typing import Iterator

from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.planner.pricing import is_auto
from hexicore.planner.problem import Problem


def even_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Near-equal contiguous ranges: the first ``n_layers % n_stages`` stages get one more."""
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for j in range(n_stages):
        hi = lo + base + (1 if j < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def factorisations(n: int) -> Iterator[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp * tp * pp == n."""
    for dp in range(1, n + 1):
        if n % dp:
            continue
        rest = n // dp
        for tp in range(1, rest + 1):
            if rest % tp == 0:
                yield dp, tp, rest // tp


def legal(problem: Problem, dp: int, tp: int, pp: int) -> bool:
    """Megatron's constraints: TP divides the heads, KV heads and FFN width (and is at most the
    problem's ``max_tp`` where it sets one), the global batch
    divides into DP equal shares of whole micro-batches, and the schedule runs the pipeline: the
    layers give each of the PP stages a layer per chunk its schedule runs there (PP <= layers for
    one chunk each, :func:`least_layers`) and each share has the micro-batches the schedule needs
    on PP ranks (:func:`least_micro_batches`; DualPipeV: 2 PP)."""
    m, t = problem.model, problem.train
    if problem.max_tp is not None and tp > problem.max_tp:
        return False
    if tp > min((m.max_tp for m in problem.cluster.machines if m.max_tp is not None), default=tp):
        return False  # a machine's own cap (symmetric layouts give every machine the same TP)
    if not (m.tp_divides(tp) and pp <= m.layers and t.global_batch % (dp * t.micro_batch) == 0):
        return False
    return sum(least_layers(problem, pp)) <= m.layers and \
        t.global_batch // (dp * t.micro_batch) >= least_micro_batches(problem, pp)


def least_layers(problem: Problem, pp: int) -> list[int]:
    """Per stage of a ``pp``-stage pipeline the fewest layers: a layer per chunk of the problem's
    schedule (``problem.pricing``'s ``least``); one each without a book or under ``auto`` (each
    pipeline's own choice)."""
    book, ref = problem.pricing, dict(problem.schedule)
    return [1] * pp if book is None or is_auto(ref) else list(book.least(ref, pp))


def least_micro_batches(problem: Problem, pp: int) -> int:
    """The fewest micro-batches a ``pp``-stage pipeline runs with under the problem's schedule
    (``problem.pricing``'s ``min_micro_batches``); one without a book or under ``auto``."""
    book, ref = problem.pricing, dict(problem.schedule)
    return 1 if book is None or is_auto(ref) else book.min_micro_batches(ref, pp)


def layout_devices(problem: Problem, devices: list[str] | None = None) -> list[str]:
    """The devices a symmetric layout uses (default: the cluster's, in order): all of them when
    some (dp, tp, pp) of their count is :func:`legal`, else the most that have one, leaving the
    slowest idle (catalog TFLOP/s; the last in order among equals), in their order. A
    Megatron-LM user whose GPU count factors into no legal layout (a prime count above the
    layers, a batch DP cannot split) runs on fewer GPUs; one device (1, 1, 1) is always legal."""
    devices = list(devices if devices is not None else (d.id for d in problem.cluster.devices))
    n = len(devices)
    keep = next((k for k in range(n, 0, -1) if any(legal(problem, *f) for f in factorisations(k))), n)
    if keep == n:
        return devices
    tflops = {d: problem.cluster.device(d).tflops for d in devices}
    idle = set(sorted(range(n), key=lambda i: (tflops[devices[i]], -i))[: n - keep])
    return [d for i, d in enumerate(devices) if i not in idle]


def symmetric_plan(problem: Problem, dp: int, tp: int, pp: int, devices: list[str] | None = None) -> Plan:
    """The Megatron layout of (dp, tp, pp) over ``devices`` (default: the cluster's order).

    Global rank r has tp index r % tp, dp index (r // tp) % dp, pp index r // (tp * dp).
    """
    devices = list(devices if devices is not None else (d.id for d in problem.cluster.devices))
    train, model = problem.train, problem.model
    ranges = even_layers(model.layers, pp)
    pipelines = []
    for i in range(dp):
        stages = []
        for j in range(pp):
            base = j * tp * dp + i * tp
            stages.append(Stage(tuple(devices[base:base + tp]), tp, ranges[j]))
        pipelines.append(Pipeline(train.global_batch // dp, tuple(stages), problem.schedule))
    return Plan(model, problem.cluster, train, tuple(pipelines))
