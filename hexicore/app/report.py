"""Rich tables for plans and estimates (results print as tables, docs/cli.md)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from hexicore.core.plan import Plan
from hexicore.planner.allocation.objective import rate


def _fmt_s(x: float) -> str:
    """A duration in the unit that shows it: s, ms or us (a tiny model's step is no ``0.000 s``)."""
    if x == 0:
        return "0 s"
    if x >= 100:
        return f"{x:.1f} s"
    if x >= 0.1:
        return f"{x:.3f} s"
    if x >= 1e-4:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} us"


#: a schedule's parameters longer than this are left out of the plan table (a synthesised
#: schedule's stage times and memory caps: the plan JSON has them)
SCHEDULE_CELL = 32


def _short(value: Any) -> str:
    """A schedule parameter as the plan table shows it: floats to 3 significant digits (a
    synthesised schedule records its stage times and memory caps, full precision, in the JSON)."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def plan_table(plan: Plan) -> Table:
    """One row per stage: pipeline, batch, schedule, stage, devices, TP, layers, memory."""
    est = plan.estimate
    mem: Mapping[str, float] = est.memory_gb if est is not None else {}
    pipe_s = est.pipeline_s if est is not None else ()
    idle = len(plan.cluster.devices) - len(plan.devices)
    t = Table(title=f"plan: {plan.model.name} on {plan.cluster.name} "
                    f"({len(plan.devices)}/{len(plan.cluster.devices)} GPUs{f', {idle} idle' if idle else ''}, global batch {plan.train.global_batch}, "
                    f"micro-batch {plan.train.micro_batch})")
    for col, just in (("pipe", "right"), ("batch", "right"), ("schedule", "left"), ("stage", "right"),
                      ("devices", "left"), ("tp", "right"), ("layers", "left"), ("memory / GPU", "right"),
                      ("pipeline time", "right")):
        t.add_column(col, justify=just)
    for i, p in enumerate(plan.pipelines):
        sched = ", ".join(f"{k}={_short(v)}" for k, v in p.schedule.items() if k != "name")
        sched = f"{p.schedule.get('name', '?')}" + (f" ({sched})" if sched and len(sched) <= SCHEDULE_CELL else
                                                     " (parameters: plan JSON)" if sched else "")
        for j, s in enumerate(p.stages):
            gpus = sorted({plan.cluster.device(d).gpu.name for d in s.devices})
            peak = max((mem.get(d, 0.0) for d in s.devices), default=0.0)
            cap = min(plan.cluster.device(d).memory_gb for d in s.devices)
            t.add_row(str(i) if j == 0 else "", str(p.batch) if j == 0 else "", sched if j == 0 else "", str(j),
                      f"{','.join(s.devices)} [{'/'.join(gpus)}]", str(s.tp), f"[{s.layers[0]}, {s.layers[1]})",
                      f"{peak:.1f} / {cap:g} GiB" if mem else "",
                      _fmt_s(pipe_s[i]) if (j == 0 and i < len(pipe_s)) else "")
    return t


def summary_lines(plan: Plan) -> list[str]:
    est = plan.estimate
    lines = []
    if est is not None:
        hidden = " not hidden by the schedule" if plan.train.dp_overlap and len(plan.pipelines) > 1 else ""
        lines.append(f"predicted iteration time {_fmt_s(est.iteration_s)}  (slowest pipeline "
                     f"{_fmt_s(max(est.pipeline_s, default=0.0))} + DP sync{hidden} {_fmt_s(est.dp_s)})")
        r = rate(plan)
        money = (f"   $/hour {r['usd_per_hour']:.2f}   $/M tokens {r['usd_per_mtok']:.4f}"
                 if r["usd_per_mtok"] is not None else "")
        lines.append(f"MFU {100 * est.mfu:.2f}%   tokens/s {est.tokens_per_s:.0f}{money}")
    s = plan.solver or {}
    objective = ((s.get("allocation") or {}) if isinstance(s.get("allocation"), dict) else {}).get("objective")
    if isinstance(objective, dict) and objective.get("kind"):
        limits = [f"budget ${objective['budget_per_hour']:g}/hour" if objective.get("budget_per_hour") is not None else "",
                  f"at least {objective['min_tokens_per_s']:g} tokens/s" if objective.get("min_tokens_per_s") is not None else ""]
        goal = {"throughput": "least iteration time", "cost": "least $ per million tokens"}.get(objective["kind"], "")
        lines.append(f"objective {objective['kind']}" + (f" ({goal})" if goal else "")
                     + "".join(f", {x}" for x in limits if x))
    lines += idle_lines(s.get("idle") or [])
    if s:
        extra = f"  params {s.get('params')}" if s.get("params") else ""
        line = f"solver {s.get('name')}: {s.get('status', '')} in {s.get('seconds') or 0:.2f} s{extra}"
        alloc = s.get("allocation") if isinstance(s.get("allocation"), dict) else None
        if alloc and alloc.get("solved") is not None:  # each sub-cluster is one solve (its own time limit)
            line += f"  sub-clusters solved {alloc['solved']} of {alloc.get('considered', '?')} ({alloc.get('mode', '')})"
        if s.get("bound") is not None and est is not None:
            gap = (est.iteration_s - s["bound"]) / est.iteration_s if est.iteration_s else 0.0
            line += f"  bound {_fmt_s(s['bound'])}  gap {100 * gap:.2f}%"
        lines.append(line)
    return lines


def memory_table(plan: Plan, cost: Any) -> Table | None:
    """Per-device peak memory by part (GiB): weights, gradients, optimizer, activations,
    workspace (the cost model's ``memory_parts``; None for a cost model without it). Devices
    with the same breakdown share a row."""
    probe = getattr(cost, "memory_parts", None)
    if probe is None:
        return None
    keys = ("weights", "gradients", "optimizer", "activations", "workspace")
    rows: dict[tuple, list[str]] = {}
    for d, parts in probe(plan).items():
        gpu = plan.cluster.device(d).gpu.name
        rows.setdefault((gpu, *(round(parts.get(k, 0.0), 2) for k in keys)), []).append(d)
    zero = plan.train.zero_stage
    title = f"memory per device (GiB), ZeRO-{zero}" + (f" over {len(plan.pipelines)} holders" if zero else "") + \
        (", sharded within each machine" if zero and plan.train.zero_scope == "machine" else "")
    reserve = getattr(cost, "reserve_gb", None)
    if isinstance(reserve, (int, float)) and reserve:
        title += f"; workspace includes the {reserve:g} GiB reserve (cost.reserve_gb: CUDA context, allocator slack)"
    t = Table(title=title)
    for c in ("devices", "gpu", *keys, "total / GPU (GiB)"):
        t.add_column(c, justify="left" if c in ("devices", "gpu") else "right")
    for (_, *vals), devs in rows.items():
        dev = plan.cluster.device(devs[0])
        shown = ",".join(devs) if len(devs) <= 4 else f"{','.join(devs[:3])},... ({len(devs)})"
        t.add_row(shown, dev.gpu.name, *(f"{v:.2f}" for v in vals), f"{sum(vals):.1f} / {dev.memory_gb:g}")
    return t
def idle_lines(idle: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per idle group of a plan's ``solver.idle`` (docs/formats.md): what it is and
    the best plan found that uses it."""
    out = []
    for g in idle:
        what = {"gpu": "GPU type", "zone": "zone", "machine": "machine"}.get(g.get("kind"), "devices on")
        devs = list(g.get("devices") or [])
        head = f"idle {what} {g.get('name')} ({len(devs)} GPUs: {', '.join(devs[:8])}{', ...' if len(devs) > 8 else ''})"
        if g.get("iteration_s") is None:
            out.append(head + ": no plan found that uses it")
            continue
        tail = f"{_fmt_s(g['iteration_s'])}"
        if g.get("tokens_per_s"):
            tail += f", {g['tokens_per_s']:.0f} tokens/s"
        if g.get("usd_per_mtok") is not None and g.get("usd_per_hour") is not None:
            tail += f", ${g['usd_per_hour']:.2f}/hour, ${g['usd_per_mtok']:.4f}/M tokens"
        out.append(f"{head}: the best plan using it takes {tail}")
    return out


def console(stderr: bool = False) -> Console:
    """A rich console; when output is not a terminal (pipes, CI logs) tables get 160 columns
    instead of rich's 80 so plan rows are not folded."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def print_plan(plan: Plan, out: Console | None = None) -> None:
    out = out or console()
    out.print(plan_table(plan))
    for line in summary_lines(plan):
        out.print(line)


def rows_table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A table of text cells; a narrow terminal folds cells rather than cutting them to ``abc…``."""
    t = Table(title=title)
    for c in columns:
        t.add_column(str(c), overflow="fold")
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def _fmt_value(quantity: str, x: Any) -> str:
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:.4g} GiB" if quantity.endswith("memory_gb") else f"{x:.4g} s"


#: stage and rank rows a prediction table lists one by one; a larger plan's table shows the largest
#: of each quantity and the largest errors instead (a run's ``metrics.json`` keeps every row)
DETAIL_ROWS = 48


def _condensed(rows: list[tuple[str, Any, Any, float | None]]) -> tuple[list[tuple[str, Any, Any, float | None]], int]:
    """``rows`` as a table shows them, and how many it leaves out: step, pipelines and DP sync
    always; the per-stage, per-hop and per-rank rows all when there are at most :data:`DETAIL_ROWS`,
    else the largest of each quantity (forward, backward, hop, peak memory; by measured value where
    there is one) and the eight largest errors, in their order."""
    detail = [i for i, (q, *_) in enumerate(rows) if q.startswith("rank ") or " stage " in q or " hop " in q]
    if len(detail) <= DETAIL_ROWS:
        return rows, 0

    def value(i: int) -> float:
        _, p, m, _ = rows[i]
        v = m if isinstance(m, (int, float)) else p
        return float(v) if isinstance(v, (int, float)) else float("-inf")

    keep = {max((i for i in detail if rows[i][0].endswith(kind)), key=value, default=None)
            for kind in ("forward_s", "backward_s", "peak_memory_gb")}
    keep.add(max((i for i in detail if " hop " in rows[i][0]), key=value, default=None))
    erred = sorted((i for i in detail if rows[i][3] is not None), key=lambda i: -abs(rows[i][3]))
    keep |= set(erred[:8])
    shown = [r for i, r in enumerate(rows) if i not in detail or i in keep]
    return shown, len(rows) - len(shown)


def prediction_table(predicted: Mapping[str, Any] | None,
                     measured: Mapping[str, Any] | None = None) -> Table | Group | None:
    """The predicted-vs-measured table of a run's ``metrics.json`` (quantity, predicted, measured,
    error %; :func:`hexicore.core.prediction.comparison_rows`), or the predictions alone
    (``measured`` None, as ``hexicore evaluate`` prints them); None when there is nothing. A
    large plan's stage and rank rows are condensed (:func:`_condensed`), a line below says so."""
    from hexicore.core.prediction import comparison_rows

    if predicted is None and measured is None:
        return None
    rows, hidden = _condensed(comparison_rows(predicted, measured))
    if predicted is None:  # a run without a plan: no cost model priced it
        t = rows_table("measured (no plan, nothing predicted)", ("quantity", "measured"),
                       ((q, _fmt_value(q, m)) for q, _, m, _ in rows))
    elif measured is None:
        t = rows_table("predicted (cost model)", ("quantity", "predicted"),
                       ((q, _fmt_value(q, p)) for q, p, _, _ in rows))
    else:
        t = rows_table("predicted vs measured", ("quantity", "predicted", "measured", "error %"),
                       ((q, _fmt_value(q, p), _fmt_value(q, m), "-" if e is None else f"{e:+.1f}")
                        for q, p, m, e in rows))
    if not hidden:
        return t
    shown = ("the largest of each quantity and the largest errors are; metrics.json has every row"
             if measured is not None else "the largest of each quantity is")
    return Group(t, Text(f"{hidden} stage, hop and rank rows not shown ({shown})"))
