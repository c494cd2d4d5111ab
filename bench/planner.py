"""Planner quality and search time (HexiScale §5; docs/background.md).

Runs every solver on the paper's settings and prints one table: predicted iteration time and
MFU under the analytic cost model, and the solver's wall/CPU seconds. The rows
``hexiscale (metis, no seeds)`` and ``hexiscale (random, no seeds)`` compare the partitioners
alone at equal iterations (the paper's Fig. 8) — the seeds (megatron's plans) would otherwise
lift both. A second table times the search on large synthetic fleets. Writes the tables to
docs/results.md under ``## Planner quality`` (only that section is replaced).

    python bench/planner.py [--quick] [--scale 64,320] [--one-machine 1024] [--out docs/results.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from results import write_section

from hexicore.app import compose as app
from hexicore.core.errors import HexicoreError
from hexicore.core.estimate import Estimate
from hexicore.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

#: (label, cluster, model, global batch). The paper gives no global batch for §5; we use 128
#: sequences of 4096 tokens (0.5M tokens) there and the case study's 24 on paper_case.
SETTINGS = [
    ("paper case, 13B", "paper_case", "llama2_13b", 24),
    ("hetero1, 7B", "hetero1", "llama2_7b", 128),
    ("hetero1, 13B", "hetero1", "llama2_13b", 128),
    ("hetero2, 7B", "hetero2", "llama2_7b", 128),
    ("hetero2, 13B", "hetero2", "llama2_13b", 128),
    ("hetero3, 30B", "hetero3", "llama_30b", 128),
]
#: HexiScale's reported MFU (FlashFlex README; paper case: 41.52 s -> 25.55 s).
PAPER = {"hetero1, 7B": "31.19%", "hetero1, 13B": "27.23%", "hetero2, 7B": "33.47%", "hetero2, 13B": "31.39%",
         "hetero3, 30B": "27.49% (Metis 17.1%)", "paper case, 13B": "25.55 s (Megatron 41.52 s)"}
EXPLAIN = """Where and why our plan differs from the paper's. With the paper's two pipelines the search
finds the paper's shape: pipeline 0 runs TP on machine A, machines B and C take few layers, the
batches differ (the faster pipeline gets more micro-batches), and the layers are aligned so
that every layer's gradient sync stays inside one machine. Left free, it prefers a single
pipeline: in our cost model one layer's sync across the 1 GB/s Ethernet costs about as much as
computing that layer for several micro-batches, while the 1F1B bubble of a 5-stage pipeline over
24 micro-batches is only (P - 1) / (n_mb + P - 1) = 14%, and with recomputation the in-flight
activations are one B_mb*S*H tensor per layer and micro-batch, so one pipeline fits even with
the 24 GB cards at its front (they hold the most micro-batches under 1F1B). The paper's
simulator prices the 3090 at 80 TFLOPS (we use the whitepaper's 71), applies empirical factors
to pipeline and DP time (1.8x and 1.1x in HexiScale's code) and does not align layers across
pipelines (its case study pays 5.07 s of cross-machine DP); each of these moves the balance
between the two shapes."""
SOLVERS = [
    ("hexiscale", "hexiscale", []),
    ("megatron", "megatron", []),
    ("metis_like", "metis_like", []),
    ("galvatron_like", "galvatron_like", []),
    ("fsdp", "fsdp", []),
    ("hexiscale (metis, no seeds)", "hexiscale", ["solver.seeds=[]"]),
    ("hexiscale (random, no seeds)", "hexiscale", ["solver.seeds=[]", "solver.partitioner=random", "solver.refiner=null"]),
]


def run(overrides: list[str], registry: Registry) -> tuple[Estimate | None, float, float, str]:
    """(estimate or None, wall s, cpu s, note)."""
    cfg = app.config_from_overrides(overrides)
    w, c = time.perf_counter(), time.process_time()
    try:
        plan, _ = app.solve(cfg, registry)
    except HexicoreError as exc:
        note = "OOM" if "fit" in str(exc) else str(exc).splitlines()[0][:60]
        return None, time.perf_counter() - w, time.process_time() - c, note
    est = plan.estimate
    shape = f"D_dp={len(plan.pipelines)}, stages " + "/".join(str(len(p.stages)) for p in plan.pipelines)
    return est, time.perf_counter() - w, time.process_time() - c, shape


def quality_table(registry: Registry, settings, solvers) -> list[str]:
    lines = ["| setting | solver | iteration (s) | MFU | plan | solver wall / CPU (s) | paper (HexiScale) |",
             "|---|---|---:|---:|---|---:|---|"]
    for label, cluster, model, batch in settings:
        base = [f"cluster={cluster}", f"model={model}", f"train.global_batch={batch}", "train.micro_batch=1"]
        for i, (name, solver, extra) in enumerate(solvers):
            est, wall, cpu, note = run(base + [f"solver={solver}"] + extra, registry)
            it = f"{est.iteration_s:.2f}" if est else "—"
            mfu = f"{100 * est.mfu:.2f}%" if est else "—"
            lines.append(f"| {label if i == 0 else ''} | {name} | {it} | {mfu} | {note} | {wall:.1f} / {cpu:.1f} | "
                         f"{PAPER.get(label, '') if i == 0 else ''} |")
            print(lines[-1], flush=True)
    return lines


SCALE_JOB = """
import json, resource, sys, time
OLD = sys.argv[1]
if OLD:  # an older checkout of the repository (its own hexicore, plugins and conf; editable install bypassed)
    sys.meta_path = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                     and "Editable" not in type(f).__name__]
    sys.path.insert(0, OLD)
    import importlib.util
    import hexicore
    for name, where in (("hexicore.conf", "conf"), ("hexicore_plugins", "plugins")):
        spec = importlib.util.spec_from_file_location(name, f"{OLD}/{where}/__init__.py",
                                                      submodule_search_locations=[f"{OLD}/{where}"])
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    hexicore.conf = sys.modules["hexicore.conf"]
from hexicore.app import compose as app
from hexicore.core.errors import HexicoreError
from hexicore.registry import Registry
cfg = app.config_from_overrides(sys.argv[2:])
w, c = time.perf_counter(), time.process_time()
try:
    plan, _ = app.solve(cfg, Registry.default())
    it, used, alloc = plan.estimate.iteration_s, len(plan.devices), (plan.solver or {}).get("allocation") or {}
except HexicoreError:
    it, used, alloc = None, 0, {}
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"it": it, "wall": time.perf_counter() - w, "cpu": time.process_time() - c + kids.ru_utime
                  + kids.ru_stime, "kids": kids.ru_utime + kids.ru_stime, "used": used, "solved": alloc.get("solved"),
                  "rss_mb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, kids.ru_maxrss) / 1024}))
"""


def scale_job(overrides: list[str], old: str = "") -> dict:
    """One solve in a fresh process (its own peak memory): iteration s, wall s, CPU s of the
    process and the workers it forked, peak RSS of either. ``old``: run an older checkout."""
    import json
    import subprocess

    proc = subprocess.run([sys.executable, "-c", SCALE_JOB, old, *overrides], capture_output=True, text=True,
                          cwd=old or None)
    if proc.returncode != 0:
        return {"it": None, "wall": 0.0, "cpu": 0.0, "used": 0, "solved": None, "rss_mb": 0.0,
                "error": proc.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scale_setting(n: int) -> tuple[str, int]:
    return ("llama2_13b", 128) if n <= 64 else ("llama2_70b", 512)


MODES = {"allocation": ("hexiscale (chooses machines)", []),
         "every": ("hexiscale, every device", ["solver.use_all_devices=true"])}


def kept_rows(path: Path, sizes: list[int]) -> list[str]:
    """The scale table's rows of ``path`` for fleet sizes not in ``sizes`` (``--keep``)."""
    import re

    text = path.read_text(encoding="utf-8") if path.exists() else ""
    sec = text.split("## Planner search time at scale", 1)[-1].split("\n## ", 1)[0] if text else ""
    return [ln for ln in sec.splitlines() if re.match(r"^\| \d+ \|", ln) and int(ln.split("|")[1]) not in sizes]


def repeated(overrides: list[str], old: str, times: int) -> dict | None:
    """``times`` solves of :func:`scale_job` (``old``: on that checkout, "": this one); None when
    ``times`` is 0: the median wall and CPU, the walls, the largest RSS (the plan is the same every time)."""
    import statistics

    if times < 1:
        return None
    runs = [scale_job(overrides, old) for _ in range(times)]
    out = dict(runs[0])
    for k in ("wall", "cpu", "kids"):
        out[k] = statistics.median(r.get(k, 0.0) for r in runs)
    out["walls"] = [r["wall"] for r in runs]
    out["rss_mb"] = max(r["rss_mb"] for r in runs)
    return out


def wall_cell(r: dict) -> str:
    """The median wall, with the range over the repeats when there were several."""
    walls = r.get("walls", [r["wall"]])
    return f"{r['wall']:.1f}" if len(walls) < 2 else f"{r['wall']:.1f} ({min(walls):.1f}-{max(walls):.1f})"


def scale_table(registry: Registry, sizes: list[int], old: str = "", old_max: int = 1024,
                done=lambda lines: None, modes=("allocation", "every"), keep: list[str] = (),
                repeat: int = 1) -> list[str]:
    """Search time on synthetic fleets, per size two rows: hexiscale as configured by default
    (allocation: it also chooses the machines) and with ``use_all_devices=true`` (the search
    alone); megatron's plan for scale; with ``old``, the same solves on that older checkout
    (sizes up to ``old_max``). ``repeat``: solves per cell (median wall and CPU, wall range)."""
    lines = ["| GPUs | model, batch | solver | iteration (s) | GPUs used | wall (s) | CPU (s) | of which workers (s) "
             "| peak RSS (MB) | before: iteration (s) | before: wall / CPU (s) | before: peak RSS (MB) |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f = (lambda x: f"{x:.2f}" if x else "none fits")
    for n in sizes:
        model, batch = scale_setting(n)
        base = ["cluster=synthetic", f"cluster.synthetic.gpus={n}", f"model={model}", f"train.global_batch={batch}"]
        mega, _, _, _ = run(base + ["solver=megatron"], registry)
        for label, extra in (MODES[m] for m in modes):
            new = repeated(base + ["solver=hexiscale"] + extra, "", repeat)
            was = repeated(base + ["solver=hexiscale"] + extra, old, repeat if old and n <= old_max else 0)
            before = (f"{f(was['it'])} | {wall_cell(was)} / {was['cpu']:.1f} | {was['rss_mb']:.0f}" if was
                      else "not run | | ")
            lines.append(f"| {n} | {model}, {batch} | {label} | {f(new['it'])} | {new['used']} | {wall_cell(new)} | "
                         f"{new['cpu']:.1f} | {new.get('kids', 0.0):.1f} | {new['rss_mb']:.0f} | {before} |")
            print(lines[-1], flush=True)
        lines.append(f"| {n} | {model}, {batch} | megatron (best symmetric) | {f(mega.iteration_s if mega else None)} "
                     f"| | | | | | | | |")
        rows = sorted(list(keep) + lines[2:], key=lambda ln: int(ln.split("|")[1]))  # stable: a size's rows stay in order
        done(lines[:2] + rows)  # each size is written as soon as it is measured
    return lines


ONE_MACHINE = "## Planner search time on one machine"


def one_machine_table(sizes: list[int], old: str = "", repeat: int = 1, gpu: str = "a800-80g-nvlink") -> list[str]:
    """Search time on a cluster of one machine of ``n`` identical GPUs (200 GB/s inside): every
    device interchangeable, so phase 1 cuts the device graph (the machine graph has one node);
    hexiscale as configured by default, beside ``old`` (an older checkout) when given."""
    import tempfile

    import yaml

    lines = ["| GPUs | model, batch | iteration (s) | wall (s) | CPU (s) | before: iteration (s) | before: wall / CPU (s) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    f = (lambda x: f"{x:.2f}" if x else "none fits")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"one{n}.yaml"
            path.write_text(yaml.safe_dump({"name": f"one{n}", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                                            "machines": [{"name": "A", "gpu": gpu, "count": n, "bandwidth_gbs": 200,
                                                          "latency_us": 5}]}))
            model, batch = scale_setting(n)
            base = [f"cluster_file={path}", f"model={model}", f"train.global_batch={batch}"]
            new, was = repeated(base, "", repeat), repeated(base, old, repeat if old else 0)
            same = "" if not was or was["it"] == new["it"] else " (differs)"
            before = f"{f(was['it'])}{same} | {wall_cell(was)} / {was['cpu']:.1f}" if was else "not run | "
            lines.append(f"| {n} | {model}, {batch} | {f(new['it'])} | {wall_cell(new)} | {new['cpu']:.1f} | {before} |")
            print(lines[-1], flush=True)
    return lines


def describe(plan) -> str:
    """One line per pipeline: batch and its stages as devices/TP/layers."""
    return "<br>".join(f"pipeline {i}: batch {p.batch}; " + ", ".join(
        f"{'+'.join(s.devices)} tp{s.tp} [{s.layers[0]},{s.layers[1]})" for s in p.stages)
        for i, p in enumerate(plan.pipelines))


def paper_case_lines(registry: Registry) -> list[str]:
    """The worked case (docs/background.md) beside the paper: our best plan, our best plan with the
    paper's two pipelines, and the per-layer prices that explain the difference."""
    from hexicore.core.plan import Stage

    rows = []
    for label, extra in (("hexiscale (free D_dp)", []), ("hexiscale, D_dp = 2 (the paper's shape)",
                                                         ["solver.dp_min=2", "solver.dp_max=2"]),
                         ("megatron (best symmetric)", ["solver=megatron"])):
        # the paper's 8 B/parameter state (at the runtime's 16 B no symmetric layout fits paper_case)
        cfg = app.config_from_overrides(["solver=hexiscale", "cost.state_bytes_per_param=8"] + extra)
        plan, _ = app.solve(cfg, registry)
        e = plan.estimate
        rows.append(f"| {label} | {e.iteration_s:.2f} | {max(e.pipeline_s):.2f} | {e.dp_s:.2f} | "
                    f"{describe(plan)} |")
    problem = app.build_problem(app.config_from_overrides([]), registry)
    c, m, t, cost = problem.cluster, problem.model, problem.train, problem.cost
    cross = cost.dp_layer_s(c, [Stage(("A.0",), 1, (0, 1)), Stage(("B.0",), 1, (0, 1))], m.layer_params(), t.dtype_bytes)
    inside = cost.dp_layer_s(c, [Stage(("B.0",), 1, (0, 1)), Stage(("B.1",), 1, (0, 1))], m.layer_params(), t.dtype_bytes)
    per = {g: cost.stage_s(c, m, t, (d,), 1) for g, d in (("A800", "A.0"), ("4090", "B.0"), ("3090", "C.0"))}
    return ["| plan | iteration (s) | slowest pipeline (s) | DP sync (s) | layout |", "|---|---:|---:|---:|---|",
            *rows, "| paper: HexiScale / Megatron (2,1,4) | 25.55 / 41.52 | | 5.07 (B, 5 layers) | two pipelines, "
            "TP on machine A, fewer layers on B and C, batches differing by 40% |", "",
            f"Prices under our cost model: one layer's gradient sync across machines (1 GB/s) {cross:.2f} s, "
            f"inside machine B {inside:.3f} s; one layer of one micro-batch takes {per['A800']:.3f} s on an A800, "
            f"{per['4090']:.3f} s on a 4090 and {per['3090']:.3f} s on a 3090 (fwd + bwd + recompute)."]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="paper case only")
    ap.add_argument("--scale-only", action="store_true", help="only the synthetic-fleet table (keeps the rest)")
    ap.add_argument("--scale", default="64,320,1024,4096", help="synthetic fleet sizes to time (comma list, '' for none)")
    ap.add_argument("--before", default="", help="an older checkout of the repository to time beside (scale table)")
    ap.add_argument("--before-max", type=int, default=1024, help="largest fleet the older checkout is timed on")
    ap.add_argument("--before-label", default="", help="how the table names the older checkout (e.g. its commit)")
    ap.add_argument("--modes", default="allocation,every", help="hexiscale modes to time: allocation, every")
    ap.add_argument("--keep", action="store_true", help="keep the table's rows of the sizes not timed now")
    ap.add_argument("--repeat", type=int, default=1, help="solves per cell: the table shows the median wall and "
                    "CPU time and the range of the walls (the host's speed drifts)")
    ap.add_argument("--remark", default="", help="a paragraph written after the scale table (e.g. measurements "
                    "of the older checkout made separately)")
    ap.add_argument("--one-machine", default="", help="also time clusters of one machine of N GPUs (comma list; "
                    "with --scale-only --scale '' only these)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    registry = Registry.default()
    sizes = [int(x) for x in args.scale.split(",") if x.strip()]
    if sizes:
        start = os.getloadavg()[0]

        def note() -> str:  # the load average when the run started and when this size was written
            return SCALE_NOTE.format(date=time.strftime("%Y-%m-%d"), before=args.before_label or args.before or "none",
                                     before_max=args.before_max, load=f"{start:.1f} / {os.getloadavg()[0]:.1f}",
                                     nice=os.nice(0), repeat=args.repeat)
        keep = kept_rows(Path(args.out), sizes) if args.keep else []
        scale_table(registry, sizes, args.before, args.before_max,
                    lambda lines: write_section("## Planner search time at scale", note() + "\n".join(lines) + "\n"
                                                + (f"\n{args.remark}\n" if args.remark else ""),
                                                Path(args.out)), tuple(args.modes.split(",")), keep, args.repeat)
    one = [int(x) for x in args.one_machine.split(",") if x.strip()]
    if one:
        lines = one_machine_table(one, args.before, args.repeat)
        write_section(ONE_MACHINE, ONE_NOTE.format(date=time.strftime("%Y-%m-%d"), load=f"{os.getloadavg()[0]:.1f}",
                                                   before=args.before_label or args.before or "none",
                                                   repeat=args.repeat) + "\n".join(lines) + "\n", Path(args.out))
    if args.scale_only:
        print(f"written to {args.out}")
        return 0
    settings = SETTINGS[:1] if args.quick else SETTINGS
    quality = quality_table(registry, settings, SOLVERS)
    paper = paper_case_lines(registry)
    body = ("Predicted by the analytic cost model (`cost=analytic`, 1F1B), micro-batch 1, sequence 4096, "
            "recomputation on; `bench/planner.py` on this machine (2 CPU cores, shared).\n\n"
            + "\n".join(quality) + "\n")
    body += "\n### The worked case (paper_case, Llama-2 13B, global batch 24)\n\n" + "\n".join(paper) + "\n" \
        + "\n" + EXPLAIN + "\n"
    write_section("## Planner quality", body, Path(args.out))
    print(f"written to {args.out}")
    return 0


SCALE_NOTE = """`bench/planner.py --scale-only --scale N,... [--repeat K] [--before OLD_CHECKOUT]`, {date}: synthetic
fleets (`cluster=synthetic`, mix 3090:4090:A100 = 1:2:1, 8 GPUs a machine, 0.7 GB/s between
machines), each solve in a fresh process on this machine (2 CPU cores shared with other jobs;
this run at niceness {nice}, load average at its start / end: {load}), {repeat} solve(s) per cell:
wall and CPU time are the median, the wall's range in brackets. Wall time depends on the
load; CPU time is of the process and the workers it forks, and counts work done ahead that the
search may not use (screens cancelled when the search ends, guessed walk steps that did not
come), so it is larger on an idle host, where the workers get a core, than on a loaded one; peak
RSS is the larger of the process's and its workers'.
"chooses machines" is the default solver (allocation: greedy descent over sub-clusters, each
neighbour screened by a short search above 128 GPUs; the first step's screens run in a forked
process beside the whole cluster's search, later steps' screens in parallel); "every device" is
`solver.use_all_devices=true`, the search alone. Up to 512 GPUs the sweep's phase 2 runs ahead in
a second process and so does the walk's, guessed (the best `D_dp` and cut assumed to stay;
layouts kept per part and seed, so the plan is the one-process plan). Above 512 GPUs phase 1 partitions whole
machines and phase 2 is shared by parts of one machine-class signature
(`solver.machine_graph_above`). "before": the same solves on the older checkout named below,
in the same run, up to {before_max} GPUs. Older checkout: {before}.

"""

ONE_NOTE = """`bench/planner.py --scale-only --scale '' --one-machine N,... [--repeat K] [--before OLD_CHECKOUT]`,
{date}: one machine of N A800s (200 GB/s inside), hexiscale as configured by default, each solve
in a fresh process on this machine (2 CPU cores shared with other jobs; load average {load} at
the end), {repeat} solve(s) per cell (median wall and CPU, wall range in brackets). "before": the
same solves on the older checkout {before}, in the same run; "(differs)" marks a cell whose
iteration time is not the one this checkout finds.

"""


if __name__ == "__main__":
    sys.exit(main())
