"""Bench: the error of the search's pricing models against exact pricing, every schedule, on a grid.

For every installed schedule (``hexicore.registry.Registry.default()``; Hanayo with W = 1, 2 and
``auto``), P in {2, 3, 4, 6, 8, 12, 16} ranks and M in {P, 2P, 4P, 8P, 64, 256, 1024, 4096}
micro-batches (M >= P and at least the schedule's fewest), uneven stage times (seeded: 0.7-1.3,
one slow rank 1.5-2x) with free links and with hops of 0.05-0.2 of the mean stage time, it
prices each cell with the tiers of :class:`hexicore.pipeline.pricer.SchedulePricer` and compares
them with the exact price (``pipeline_time``, what final plans are priced with):

* (a) ``model_time``: the search's anchored model (exact up to P, then affine through the exact
  times at P, 2P and 3P and on with the growth from 2P to 3P, at least the busiest rank's work per
  micro-batch, or blocks of P, as the schedule's
  ``Pricing.growth`` says; synth's own);
* (b) ``pricer.steady_state``: warm-up + periods from short exact simulations (``steady_fit``);
* (c) ``time_bound``: a lower bound, so ``time_bound <= exact`` in every cell (a violation is a bug:
  printed loudly, exit status 1).

Relative error = (model - exact) / exact. Each tier's seconds (wall) are measured on its own
schedule object (its caches cold for each stage-time draw): ``exact`` per cell, the steady fit
once per stage-time draw plus its per-cell evaluation, ``anchored`` per cell (its anchors
in the first cells). A computation that runs past ``--cap`` CPU seconds is stopped, and a cell
whose exact price is predicted (from the smaller M of the same draw) to run past it is not
started: both are reported as skipped, with the reason.

    python bench/pricing_error.py            # the full grid: ~40 process-minutes on the shared
                                             # 2-core host, in --jobs 2 processes
    python bench/pricing_error.py --quick    # P 2 and 4, M <= 64: a smoke run (~40 s)
    python bench/pricing_error.py --only synth hanayo --out a.json   # a part of the grid ...
    python bench/pricing_error.py --render a.json b.json             # ... parts merged, tabulated

Writes bench/out/pricing_error.json (``--out``) and the ``## Pricing error of the search's
models`` section of docs/results.md (the quick run writes neither unless ``--write``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hexicore.registry import Registry

HERE = Path(__file__).resolve().parent
SECTION = "## Pricing error of the search's models"
RANKS = (2, 3, 4, 6, 8, 12, 16)
QUICK_RANKS = (2, 4)
#: micro-batch counts: multiples of P, then fixed counts
MULTIPLES, COUNTS = (1, 2, 4, 8), (64, 256, 1024, 4096)
QUICK_COUNTS = (64,)
#: (name, parameters) priced; any installed schedule not named here is added with its defaults.
#: synth as ``schedule=auto``'s final re-pricing runs it (effort quick); Hanayo auto with the
#: ``auto`` options' ``max_waves: 4``.
SCHEDULES = [("1f1b", {}), ("gpipe", {}), ("interleaved_1f1b", {"chunks": 2}), ("looped_bfs", {"chunks": 2}),
             ("chimera", {}), ("hanayo", {"waves": 1}), ("hanayo", {"waves": 2}),
             ("hanayo", {"waves": "auto", "max_waves": 4}), ("zb_h1", {}), ("zb_h2", {}), ("zb_v", {}),
             ("interleaved_zb", {"chunks": 2}), ("dualpipe_v", {}), ("synth", {"effort": "quick"})]
EXACT = 1e-9   # a relative error below this is "exact" (rounding)
GOAL = 5e-3    # the steady-state model's goal on kept plans: 0.5 %


class OverCap(Exception):
    """A computation ran past the per-cell CPU cap."""


def _alarm(signum: int, frame: Any) -> None:
    raise OverCap()


def timed(fn: Callable[[], float], cap: float) -> tuple[float, float, float]:
    """``(fn(), wall seconds, CPU seconds)``; :class:`OverCap` once it has run ``cap`` CPU
    seconds (on a loaded host this one's CPU clock advances in ticks of a few ms: short
    computations are compared by the wall clock)."""
    signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, cap)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        value = fn()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return value, time.perf_counter() - t0, time.process_time() - c0


def label(name: str, params: dict) -> str:
    shown = {k: v for k, v in params.items() if k not in ("chunks", "max_waves", "effort")}
    return name + "".join(f" {k}={v}" for k, v in shown.items())


#: the tables' row order
ORDER = {label(n, p): i for i, (n, p) in enumerate(SCHEDULES)}


def draw(ranks: int, hops: bool, seed: int) -> tuple[list[float], list[float]]:
    """Stage times 0.7-1.3 with one slow rank 1.5-2x; hops 0.05-0.2 of the mean stage time or free."""
    rng = random.Random(f"{seed}/{ranks}/{hops}")
    stages = [rng.uniform(0.7, 1.3) for _ in range(ranks)]
    stages[rng.randrange(ranks)] *= rng.uniform(1.5, 2.0)
    mean = sum(stages) / ranks
    return stages, [rng.uniform(0.05, 0.2) * mean if hops else 0.0 for _ in range(ranks - 1)]


def counts(ranks: int, fixed: tuple[int, ...]) -> list[int]:
    return sorted({m * ranks for m in MULTIPLES} | {m for m in fixed if m >= ranks})


@dataclass
class Group:
    """One schedule under one stage-time draw: its cells in increasing M."""

    name: str
    params: dict
    ranks: int
    hops: bool
    stages: list
    hop_times: list
    fit_s: float | None = None
    fit: Any = None       # (k, c) or None (no period) or "over cap"


def predicted(history: list[tuple[int, float]], n_mb: int) -> float:
    """CPU seconds the exact price at ``n_mb`` should take, from the last two cells of the draw
    (growth exponent between 1 and 2.5)."""
    if not history:
        return 0.0
    (m1, t1), (m0, t0) = history[-1], history[-2] if len(history) > 1 else (None, None)
    g = 1.0
    if m0 and t0 > 0.05 and t1 > 0.05:
        g = min(max(math.log(t1 / t0) / math.log(m1 / m0), 1.0), 2.5)
    return t1 * (n_mb / m1) ** g


def run_group(reg: Registry, grp: Group, fixed: tuple[int, ...], cap: float, log: Callable) -> list[dict]:
    """Every cell of ``grp``: exact, anchored, steady state and bound, each on its own object."""
    make = lambda: reg.create("schedule", grp.name, **grp.params)  # noqa: E731
    on_exact, on_steady, on_anchored = make(), make(), make()  # one object (and cache) per tier
    st, hop = grp.stages, grp.hop_times
    least = on_exact.pricing.min_micro_batches(grp.ranks)
    try:
        fit, grp.fit_s, _ = timed(lambda: on_steady.pricer.steady_fit(st, hop), cap)
        grp.fit = None if fit is None else (fit[0], fit[1])
    except OverCap:
        grp.fit, grp.fit_s = "over cap", cap
    cells, history, stop = [], [], None
    for M in counts(grp.ranks, fixed):
        cell = {"schedule": label(grp.name, grp.params), "P": grp.ranks, "M": M, "hops": grp.hops}
        cells.append(cell)
        if M < least:
            cell["skipped"] = f"needs M >= {least}"
            continue
        guess = predicted(history, M)
        if stop or guess > cap:
            cell["skipped"] = stop or f"exact predicted {guess:.0f} s > cap {cap:.0f} s"
            stop = stop or f"exact over cap from M={M}"
            continue
        try:
            cell["exact"], cell["exact_s"], cell["exact_cpu"] = timed(lambda: on_exact.pipeline_time(st, hop, M), cap)
        except OverCap:
            cell["skipped"] = stop = f"exact over cap {cap:.0f} s at M={M}"
            continue
        history.append((M, cell["exact_cpu"]))
        cell["bound"] = on_exact.time_bound(st, hop, M)
        try:
            cell["anchored"], cell["anchored_s"], _ = timed(lambda: on_anchored.model_time(st, hop, M), cap)
        except OverCap:
            cell["anchored_skipped"] = f"over cap {cap:.0f} s"
        if grp.fit == "over cap":
            cell["steady_skipped"] = f"fit over cap {cap:.0f} s"
        else:
            try:
                cell["steady"], cell["steady_s"], _ = timed(lambda: on_steady.pricer.steady_state(st, hop, M), cap)
                modelled = grp.fit is not None and M >= grp.fit[0] + grp.fit[1]
                cell["steady_mode"] = "model" if modelled else "simulated" if grp.fit else "no period"
            except OverCap:
                cell["steady_skipped"] = f"over cap {cap:.0f} s"
        for tier in ("anchored", "steady"):
            if tier in cell:
                cell[f"{tier}_err"] = (cell[tier] - cell["exact"]) / cell["exact"]
        cell["bound_ok"] = cell["bound"] <= cell["exact"] * (1 + 1e-9)
        if not cell["bound_ok"]:
            log(f"!!! BOUND VIOLATION: {cell['schedule']} P={grp.ranks} M={M} hops={grp.hops}: "
                f"time_bound {cell['bound']:.6g} > exact {cell['exact']:.6g}")
    return cells


# ------------------------------------------------------------------ summary
def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def exact_from(cells: list[dict]) -> str:
    """The least grid M from which every measured cell's steady state is exact ("-" if the largest is not)."""
    by_m: dict[int, bool] = {}
    for c in cells:
        if "steady_err" in c:
            by_m[c["M"]] = by_m.get(c["M"], True) and abs(c["steady_err"]) < EXACT
    start = None
    for m in sorted(by_m, reverse=True):
        if not by_m[m]:
            break
        start = m
    return "-" if start is None else ("all" if start == min(by_m) else str(start))


def summarize(name: str, cells: list[dict], groups: list[Group]) -> dict:
    done = [c for c in cells if "exact" in c]
    a = [abs(c["anchored_err"]) for c in done if "anchored_err" in c]
    s = [abs(c["steady_err"]) for c in done if "steady_err" in c]
    modelled = [abs(c["steady_err"]) for c in done if c.get("steady_mode") == "model"]
    worst = lambda key: max((c for c in done if key in c), key=lambda c: abs(c[key]), default=None)  # noqa: E731
    cell_of = lambda c: None if c is None else {k: c[k] for k in ("P", "M", "hops")}  # noqa: E731
    fits = [g.fit_s for g in groups if g.fit != "over cap" and g.fit_s is not None]
    evals = [c["steady_s"] for c in done if "steady_s" in c]
    periods = sorted({g.fit[1] for g in groups if isinstance(g.fit, tuple)})
    return {
        "schedule": name, "cells": len(done),
        "skipped": [cell_of(c) | {"why": c["skipped"]} for c in cells
                    if "skipped" in c and not c["skipped"].startswith("needs")],
        "anchored_max": max(a, default=None), "anchored_median": _median(a),
        "anchored_within_goal": sum(x <= GOAL for x in a) / len(a) if a else None,
        "anchored_worst": cell_of(worst("anchored_err")),
        "anchored_signed_range": [min((c["anchored_err"] for c in done if "anchored_err" in c), default=None),
                                  max((c["anchored_err"] for c in done if "anchored_err" in c), default=None)],
        "steady_max": max(s, default=None), "steady_median": _median(s),
        "steady_exact_share": sum(x < EXACT for x in s) / len(s) if s else None,
        "steady_within_goal": sum(x <= GOAL for x in s) / len(s) if s else None,
        "steady_modelled_cells": len(modelled), "steady_modelled_max": max(modelled, default=None),
        "steady_exact_from": exact_from(done), "steady_worst": cell_of(worst("steady_err")),
        "steady_no_period": sum(g.fit is None for g in groups), "steady_fit_over_cap": sum(g.fit == "over cap" for g in groups),
        "steady_periods": periods,
        "bound_violations": [cell_of(c) for c in done if not c["bound_ok"]],
        "anchored_below_bound": sum("anchored" in c and c["anchored"] < c["bound"] * (1 - 1e-9) for c in done),
        "exact_s_median": _median([c["exact_s"] for c in done]), "exact_s_max": max((c["exact_s"] for c in done), default=None),
        "fit_s_median": _median(fits), "fit_s_max": max(fits, default=None),
        "steady_eval_s_median": _median(evals), "steady_eval_s_max": max(evals, default=None),
        "anchored_s_median": _median([c["anchored_s"] for c in done if "anchored_s" in c]),
        "anchored_s_max": max((c["anchored_s"] for c in done if "anchored_s" in c), default=None),
    }


def pct(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    return "0" if x < EXACT else f"{100 * x:.{digits}f}%"


def secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e6:.0f} us" if x < 1e-3 else f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def skipped_text(skipped: list[dict]) -> str:
    """Skipped cells folded per (P, hops): ``P=16 M>=1024`` (the first M not measured)."""
    first: dict[tuple, int] = {}
    for c in skipped:
        key = (c["P"], c["hops"])
        first[key] = min(first.get(key, c["M"]), c["M"])
    per_p: dict[int, list] = {}
    for (p, hops), m in sorted(first.items()):
        per_p.setdefault(p, []).append((hops, m))
    parts = []
    for p, rows in per_p.items():
        ms = {m for _, m in rows}
        parts.append(f"P={p} M>={min(ms)}" + ("" if len(rows) == 2 and len(ms) == 1 else
                                               " (" + ", ".join(f"{'hops' if h else 'free'} M>={m}" for h, m in rows) + ")"))
    return "; ".join(parts) or "none"


def error_table(summary: list[dict]) -> list[str]:
    rows = ["| schedule | cells | (a) anchored: max / median | (a) <= 0.5% | (b) steady: max / median | (b) exact "
            "| (b) exact from M | (b) <= 0.5% | (b) modelled cells: max | (b) periods c / no period | (c) bound violations "
            "| (a) below bound |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        viol = len(s["bound_violations"])
        rows.append(f"| {s['schedule']} | {s['cells']} | {pct(s['anchored_max'])} / {pct(s['anchored_median'])} "
                    f"| {pct(s['anchored_within_goal'], 0) if s['anchored_within_goal'] else '0%'} "
                    f"| {pct(s['steady_max'])} / {pct(s['steady_median'])} "
                    f"| {pct(s['steady_exact_share'], 0) if s['steady_exact_share'] else '0%'} | {s['steady_exact_from']} "
                    f"| {pct(s['steady_within_goal'], 0) if s['steady_within_goal'] else '0%'} "
                    f"| {s['steady_modelled_cells']}: {pct(s['steady_modelled_max'])} "
                    f"| {', '.join(map(str, s['steady_periods'])) or '-'} / {s['steady_no_period']}{' (+' + str(s['steady_fit_over_cap']) + ' fit over cap)' if s['steady_fit_over_cap'] else ''} "
                    f"| {'**' + str(viol) + '**' if viol else 0} | {s['anchored_below_bound']} |")
    return rows


def cost_table(summary: list[dict]) -> list[str]:
    rows = ["| schedule | exact per cell: median / max | steady fit (once per stage times): median / max "
            "| steady per cell: median / max | anchored per cell: median / max | skipped (exact over the cap) |",
            "|---|---|---|---|---|---|"]
    for s in summary:
        rows.append(f"| {s['schedule']} | {secs(s['exact_s_median'])} / {secs(s['exact_s_max'])} "
                    f"| {secs(s['fit_s_median'])} / {secs(s['fit_s_max'])} "
                    f"| {secs(s['steady_eval_s_median'])} / {secs(s['steady_eval_s_max'])} "
                    f"| {secs(s['anchored_s_median'])} / {secs(s['anchored_s_max'])} | {skipped_text(s['skipped'])} |")
    return rows


def growth_table(cells: list[dict], groups: list[Group], ranks: int) -> list[str]:
    """Seconds against M at one P (hops on): exact vs steady state (fit + evaluation)."""
    ms = sorted({c["M"] for c in cells if c["P"] == ranks})
    head = "| schedule | " + " | ".join(f"M={m}" for m in ms) + " |"
    rows = [head, "|---|" + "---|" * len(ms)]
    fit = {(label(g.name, g.params)): g.fit_s for g in groups if g.ranks == ranks and g.hops}
    for name in dict.fromkeys(c["schedule"] for c in cells):
        by_m = {c["M"]: c for c in cells if c["schedule"] == name and c["P"] == ranks and c["hops"]}
        out = []
        for m in ms:
            c = by_m.get(m, {})
            if "exact_s" not in c:
                out.append("skipped" if "skipped" in c and not c["skipped"].startswith("needs") else "-")
                continue
            steady = secs((fit.get(name) or 0.0) + c["steady_s"]) if "steady_s" in c else "-"
            out.append(f"{secs(c['exact_s'])} / {steady}")
        rows.append(f"| {name} | " + " | ".join(out) + " |")
    return rows


def machine() -> str:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), load {load:.1f} at the end"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="P 2 and 4, M <= 64, a 2 s cap: a smoke run")
    ap.add_argument("--cap", type=float, default=None, help="CPU seconds per tier per cell (default 10; quick 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--only", nargs="*", help="schedule names to price (default: every installed one)")
    ap.add_argument("--write", action="store_true", help="with --quick: still write the JSON and docs/results.md")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "pricing_error.json", help="the JSON written")
    ap.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: tabulate JSONs this script wrote (runs split by --only, merged), "
                         "write them as one to --out and the section of docs/results.md")
    args = ap.parse_args(argv)
    write, out = not args.quick or args.write, args.out
    installed = Registry.default().names("schedule")
    bad = [n for n in args.only or () if n not in installed]
    if bad or (args.cap is not None and args.cap <= 0) or args.jobs < 1:
        what = f"--only {', '.join(bad)}: not installed (installed: {', '.join(installed)})" if bad else \
            "--cap must be > 0" if args.cap is not None and args.cap <= 0 else "--jobs must be >= 1"
        print(f"error: {what}", file=sys.stderr)
        return 2
    if args.render:
        meta, cells, groups = {}, [], []
        for path in args.render:
            try:
                saved = json.loads(path.read_text())
                cells += saved["cells"]
                groups += [Group(**{k: g[k] for k in ("name", "params", "ranks", "hops", "stages", "hop_times",
                                                       "fit_s")}, fit=tuple(g["fit"]) if isinstance(g["fit"], list)
                                 else g["fit"]) for g in saved["groups"]]
                wall = meta.get("wall_s", 0.0) + saved["meta"]["wall_s"]
                meta = {**saved["meta"], "wall_s": wall, "runs": meta.get("runs", 0) + saved["meta"].get("runs", 1)}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"error: {path}: not a JSON written by bench/pricing_error.py ({exc})", file=sys.stderr)
                return 2
        write = True
    else:
        meta, cells, groups = measure(args, out if write else None)
    cells.sort(key=lambda c: (ORDER.get(c["schedule"], len(ORDER)), c["schedule"], c["P"], c["hops"], c["M"]))
    groups.sort(key=lambda g: (ORDER.get(label(g.name, g.params), len(ORDER)), g.name, g.ranks, g.hops))
    summary = [summarize(name, [c for c in cells if c["schedule"] == name],
                         [g for g in groups if label(g.name, g.params) == name])
               for name in sorted(dict.fromkeys(c["schedule"] for c in cells), key=lambda n: ORDER.get(n, len(ORDER)))]
    violations = [v | {"schedule": s["schedule"]} for s in summary for v in s["bound_violations"]]
    text = report(summary, cells, groups, meta, violations)
    print("\n" + text)
    if violations:
        print(f"\n!!! {len(violations)} cells where time_bound > exact: a bug in a bound", file=sys.stderr)
    if write:
        save(out, meta, cells, groups, summary)
        sys.path.insert(0, str(HERE))
        from results import write_section
        write_section(SECTION, text)
    return 1 if violations else 0


def short(row: dict) -> dict:
    """A row with its seconds to 4 significant digits, its errors to 6, its prices to 12."""
    def cut(key: str, value: Any) -> Any:
        if not isinstance(value, float):
            return value
        digits = 4 if key.endswith(("_s", "_cpu")) else 6 if key.endswith("_err") else 12
        return float(f"{value:.{digits}g}")
    return {k: cut(k, v) for k, v in row.items()}


def save(path: Path, meta: dict, cells: list[dict], groups: list[Group], summary: list[dict] | None = None) -> None:
    """The JSON of a run: meta and summary indented, one line per stage-time draw and per cell."""
    path.parent.mkdir(exist_ok=True)
    lines = lambda rows: ",\n".join(json.dumps(short(r), separators=(",", ":")) for r in rows)  # noqa: E731
    head = json.dumps({"meta": meta, "summary": summary or []}, indent=1)[:-2]
    path.write_text(f'{head},\n "groups": [\n{lines(vars(g) for g in groups)}\n],\n "cells": [\n{lines(cells)}\n]\n}}\n')


def measure_unit(unit: tuple) -> tuple[list[dict], list[Group]]:
    """One schedule at one P, links free and with hops (a worker's unit)."""
    name, params, P, fixed, cap, seed = unit
    reg, cells, groups = Registry.default(), [], []
    for hops in (False, True):
        grp = Group(name, params, P, hops, *draw(P, hops, seed))
        cells += run_group(reg, grp, fixed, cap, lambda msg: print(msg, flush=True))
        groups.append(grp)
    return cells, groups


def measure(args: argparse.Namespace, out: Path | None) -> tuple[dict, list[dict], list[Group]]:
    """Every cell of the grid, in ``args.jobs`` processes (one schedule at one P a unit, the
    largest P first); saved to ``out`` after each unit, where given."""
    cap = args.cap or (2.0 if args.quick else 10.0)
    ranks, fixed = (QUICK_RANKS, QUICK_COUNTS) if args.quick else (RANKS, COUNTS)
    reg = Registry.default()
    chosen = list(SCHEDULES) + [(n, {}) for n in reg.names("schedule") if n not in {s for s, _ in SCHEDULES}]
    chosen = [(n, p) for n, p in chosen if not args.only or n in args.only]
    units = [(n, p, P, fixed, cap, args.seed) for P in sorted(ranks, reverse=True) for n, p in chosen
             if P >= reg.create("schedule", n, **p).pricing.min_ranks]
    wall0 = time.perf_counter()
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cap_s": cap, "seed": args.seed, "jobs": args.jobs,
            "ranks": list(ranks), "counts": [list(MULTIPLES), list(fixed)], "quick": args.quick}
    cells, groups = [], []
    with multiprocessing.Pool(args.jobs) as pool:
        for done, (mine, mine_groups) in enumerate(pool.imap_unordered(measure_unit, units), 1):
            cells += mine
            groups += mine_groups
            skipped = sum("skipped" in c and not c["skipped"].startswith("needs") for c in mine)
            print(f"[{done}/{len(units)} {time.perf_counter() - wall0:4.0f} s] {mine[0]['schedule']:<18} "
                  f"P={mine[0]['P']:<2} {len(mine) - skipped} cells, {skipped} skipped", flush=True)
            meta.update(wall_s=time.perf_counter() - wall0, machine=machine())
            if out is not None:
                save(out, meta, cells, groups)
    return meta, cells, groups


def report(summary: list[dict], cells: list[dict], groups: list[Group], meta: dict, violations: list[dict]) -> str:
    """The docs/results.md section: how it was measured, the error table, the cost tables."""
    ranks = sorted({c["P"] for c in cells})
    growth_p = 8 if 8 in ranks else max(ranks)
    cap, wall = meta["cap_s"], meta["wall_s"]
    grid = "P in {" + ", ".join(map(str, ranks)) + "}, M in {P, 2P, 4P, 8P, " + \
        ", ".join(map(str, meta["counts"][1])) + "} (M >= P)"
    lines = [
        f"Measured {meta['date']} by `python bench/pricing_error.py{' --quick' if meta['quick'] else ''}`"
        f"{' (' + str(meta['runs']) + ' runs split with --only, merged with --render)' if meta.get('runs', 1) > 1 else ''}"
        f" on {meta['machine']} "
        f"(shared with other jobs: seconds are wall-clock and noisy; measuring took {wall / 60:.1f} min in all). "
        f"Grid: {grid}, stage times 0.7-1.3 with one slow rank 1.5-2x (seed {meta['seed']}), links free or "
        "hops of 0.05-0.2 of the mean stage time; every installed schedule (synth with `effort: quick`, as "
        "`schedule=auto` re-prices with it; Hanayo auto with `max_waves: 4`). Exact = `pipeline_time` (the "
        "final plan's price: the simulated default-time order; synth's lists synthesised for the cell's times; "
        "Hanayo auto's best W for them). Error = (model - exact) / exact, |max| and median over the cells.",
        "",
        "* (a) anchored = `model_time`, the search's model (exact up to P, affine through P, 2P and 3P and "
        "on with the growth from 2P to 3P, at least the busiest rank's work a micro-batch, or blocks of P; "
        "synth's two seed orders);",
        "* (b) steady = `SchedulePricer.steady_state` (warm-up + periods from 6P + 1 exact simulations at "
        "3P..9P micro-batches; below `k + c` micro-batches, or where no period shows, it is the simulation "
        "itself); *modelled cells* are those past `k + c` with a period found;",
        f"* (c) `time_bound` <= exact: {'**' + str(len(violations)) + ' violations**' if violations else 'held in every cell'}.",
        "",
        *error_table(summary),
        "",
        f"Seconds per tier (wall; each tier on its own schedule object, caches cold per stage-time draw; cap "
        f"{cap:.0f} CPU s per tier per cell: a cell whose exact price ran, or was predicted from the smaller M "
        "to run, past it is skipped):",
        "",
        *cost_table(summary),
        "",
        f"Cost against M at P = {growth_p}, hops on: exact / steady (fit + evaluation), wall:",
        "",
        *growth_table(cells, groups, growth_p),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
