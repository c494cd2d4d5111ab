"""Planner speed and plan quality at the sizes users plan for (docs/results.md, ``## Planner speed``).

A fixed set of cases — the presets, the README's default, clusters of 2-8 GPU types from 8 to
1024 GPUs (seeded), global batches 16-4096 — each planned twice: with 1F1B alone (the defaults)
and with every option on (``schedule=auto train.zero=auto train.micro_batch=auto``). Each plan is
made in its own process (``hexicore.app.compose.solve``, as ``hexicore plan`` does) and reports
the search time the plan prints (``solver.seconds``: the CLI's start-up aside) and its exactly
priced iteration time. With ``--reference REV`` the same cases are planned by the code at git
revision ``REV`` (a temporary worktree; ``train.micro_batch=auto`` is left out there where that
revision does not know it), each capped at ``--cap`` seconds, and the table shows both and their
ratio. A second table plans the ``micro_batch=auto`` cases at fixed micro-batch 1, 2, 4 and 8.

    python bench/planner_speed.py [--quick] [--reference d373b82 [--reference-only]] [--cap 240] [--out docs/results.md]

With ``--reference`` the reference's rows are kept in ``bench/out/planner_speed_reference.json``
(``--reference-only``: only them), with the plans they made; a later run without ``--reference``
reads them from there (a row that ran past the cap for the same revision is not run again). The
ratio compares plans: the reference's plan is priced again by this tree's cost model (as
``hexicore evaluate`` prices it), so a correction to the prices since moves both sides alike.

Timings are wall-clock seconds on the machine it runs on (the table says which); run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

from results import write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Planner speed"
ALL_ON = ["schedule=auto", "train.zero=auto", "train.micro_batch=auto"]
#: the GPU types random clusters draw from, with an intra-machine link each (GB/s)
TYPES = {"h100-80g": 450, "a100-80g": 300, "a100-40g": 300, "a800-80g-nvlink": 200, "l40s": 32, "rtx4090": 32,
         "rtx3090": 16, "v100-32g": 150, "rtx-a6000": 32}
MODELS = {"gpt_neo_2.7b": {"name": "gpt_neo_2.7b", "layers": 32, "hidden": 2560, "heads": 20, "kv_heads": 20,
                           "ffn": 10240, "vocab": 50257, "seq_len": 2048}}


def fleet(name: str, machines: list[tuple[str, int]], inter: float) -> dict:
    """A cluster file's mapping: ``machines`` as (GPU type, count) in order."""
    return {"name": name, "inter": {"bandwidth_gbs": inter, "latency_us": 50},
            "machines": [{"name": f"M{i}", "gpu": g, "count": c, "bandwidth_gbs": TYPES[g], "latency_us": 5}
                         for i, (g, c) in enumerate(machines)]}


def drawn(seed: int, gpus: int, types: int, per_machine: int = 8) -> dict:
    """A seeded cluster of ``gpus`` GPUs in machines of ``per_machine``, ``types`` GPU types
    taking turns, Ethernet of 1-25 GB/s between machines."""
    rng = random.Random(seed)
    kinds = rng.sample(sorted(TYPES), types)
    machines = [(kinds[i % types], per_machine) for i in range(gpus // per_machine)]
    return fleet(f"r{seed}_{gpus}", machines, rng.choice([1.0, 3.0, 12.5, 25.0]))


def cases(quick: bool) -> list[dict]:
    """(label, cluster mapping or preset, model preset or mapping, global batch)."""
    out = [
        {"label": "paper case (README default)", "cluster": "paper_case", "model": "llama2_13b", "batch": 24},
        {"label": "hetero1, 7B", "cluster": "hetero1", "model": "llama2_7b", "batch": 128},
        {"label": "16: 8 A100-40 + 8 V100, GPT-Neo 2.7B", "model": "gpt_neo_2.7b", "batch": 128,
         "cluster": fleet("a100v100", [("a100-40g", 8), ("v100-32g", 8)], 12.5)},
        {"label": "same, batch 2048", "model": "gpt_neo_2.7b", "batch": 2048,
         "cluster": fleet("a100v100", [("a100-40g", 8), ("v100-32g", 8)], 12.5)},
        {"label": "24: 2x4 A100 + 2x8 RTX 4090, 13B", "model": "llama2_13b", "batch": 512,
         "cluster": fleet("a100x4090", [("a100-80g", 4), ("a100-80g", 4), ("rtx4090", 8), ("rtx4090", 8)], 3.0)},
        {"label": "32 GPUs, 4 types, 7B", "cluster": drawn(1, 32, 4, 4), "model": "llama2_7b", "batch": 4096},
    ]
    if quick:
        return out
    out += [
        {"label": "hetero2, 13B", "cluster": "hetero2", "model": "llama2_13b", "batch": 256},
        {"label": "hetero3, 30B", "cluster": "hetero3", "model": "llama_30b", "batch": 128},
        {"label": "16 GPUs, 2 types, 7B", "cluster": drawn(2, 16, 2, 4), "model": "llama2_7b", "batch": 16},
        {"label": "24 GPUs, 3 types, GPT-Neo", "cluster": drawn(3, 24, 3, 4), "model": "gpt_neo_2.7b", "batch": 512},
        {"label": "64 GPUs, 8 types, 13B", "cluster": drawn(4, 64, 8), "model": "llama2_13b", "batch": 1024},
        {"label": "320 GPUs, 6 types, 70B", "model": "llama2_70b", "batch": 24,
         "cluster": fleet("big320", [(t, 8) for _ in range(7) for t in ("h100-80g", "a100-80g", "a800-80g-nvlink",
                                                                         "l40s", "rtx4090", "rtx3090")][:40], 12.5)},
        {"label": "320 GPUs, 6 types, 70B, batch 1024", "cluster": drawn(5, 320, 6), "model": "llama2_70b",
         "batch": 1024},
        {"label": "1024 GPUs, 8 types, 70B", "cluster": drawn(6, 1024, 8), "model": "llama2_70b", "batch": 2048},
    ]
    return out


def overrides(case: dict, folder: Path) -> list[str]:
    """The command line of a case (cluster and model files written into ``folder``)."""
    out = [f"train.global_batch={case['batch']}"]
    if isinstance(case["cluster"], str):
        out.append(f"cluster={case['cluster']}")
    else:
        path = folder / f"{case['cluster']['name']}.yaml"
        path.write_text(yaml.safe_dump(case["cluster"], sort_keys=False), encoding="utf-8")
        out.append(f"cluster_file={path}")
    if case["model"] in MODELS:
        path = folder / f"{case['model']}.yaml"
        path.write_text(yaml.safe_dump(MODELS[case["model"]], sort_keys=False), encoding="utf-8")
        out.append(f"model_file={path}")
    else:
        out.append(f"model={case['model']}")
    return out


PLAN_ONE = """
import json, sys, time
from hexicore.app import compose
from hexicore.registry import Registry
registry = Registry.default()
try:
    plan, _ = compose.solve(compose.config_from_overrides(sys.argv[1:], registry=registry), registry)
except Exception as exc:  # the row says why
    print(json.dumps({"error": str(exc).splitlines()[0][:100]}))
    raise SystemExit(0)
print(json.dumps({"seconds": plan.solver.get("seconds"), "iteration_s": plan.estimate.iteration_s,
                  "modelled_s": plan.solver.get("modelled_s"),
                  "pipelines": len(plan.pipelines), "micro_batch": plan.train.micro_batch, "zero": plan.train.zero,
                  "gpus": len(plan.devices), "schedules": sorted({p.schedule.name for p in plan.pipelines}),
                  "plan": plan.to_dict()}))
"""

#: a kept plan (stdin) priced by this tree's cost model and simulator, as ``hexicore evaluate`` does
REPRICE = """
import json, sys
from hexicore.app import compose
from hexicore.core.plan import Plan
from hexicore.registry import Registry
registry = Registry.default()
cost = compose.build_cost_model(compose.config_from_overrides(sys.argv[1:], registry=registry), registry)
try:
    _, est, _ = compose.evaluate(Plan.from_dict(json.load(sys.stdin)), cost, registry=registry)
except Exception as exc:  # the row says why
    print(json.dumps({"error": str(exc).splitlines()[0][:100]}))
    raise SystemExit(0)
print(json.dumps({"iteration_s": est.iteration_s}))
"""


def plan_one(args: list[str], cap: float, path: str | None = None) -> dict:
    """One plan in a fresh process (``path``: the PYTHONPATH of a reference tree)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = path
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", PLAN_ONE, *args], capture_output=True, text=True, timeout=cap,
                              env=env, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"error": f"> {cap:g} s", "wall": cap}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:100]}
    row["wall"] = time.perf_counter() - t0
    return row


def rows_json(kept: dict) -> str:
    """The kept reference rows as JSON, one row (with its plan) a line."""
    rows = (f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in kept.items())
    return "{\n" + ",\n".join(rows) + "\n}\n"


def reprice(args: list[str], plan: dict) -> dict:
    """A kept plan priced by this tree (:data:`REPRICE`, a fresh process): the reference's plan
    under today's cost model, so that a ratio compares plans, not two versions of the prices."""
    done = subprocess.run([sys.executable, "-c", REPRICE, *args], input=json.dumps(plan), capture_output=True,
                          text=True, cwd=tempfile.gettempdir())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:100]}


def reference_tree(rev: str) -> tuple[str, Path]:
    """A worktree of ``rev`` and a folder whose ``hexicore`` / ``hexicore_plugins`` point into it
    (its PYTHONPATH)."""
    base = Path(tempfile.mkdtemp(prefix="hexicore-ref-"))
    tree = base / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                   capture_output=True)
    path = base / "path"
    (path / "hexicore").mkdir(parents=True)  # the package with its config groups (conf/ is hexicore.conf)
    for entry in (tree / "hexicore").iterdir():
        (path / "hexicore" / entry.name).symlink_to(entry)
    (path / "hexicore" / "conf").symlink_to(tree / "conf")
    (path / "hexicore_plugins").symlink_to(tree / "plugins")
    return str(path), tree


def cell(row: dict | None, key: str = "iteration_s") -> str:
    if row is None:
        return "-"
    if "error" in row:
        return row["error"]
    return f"{row[key]:.4g}" if isinstance(row.get(key), (int, float)) else str(row.get(key))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="six cases only")
    ap.add_argument("--reference", help="git revision to compare with (today's planner)")
    ap.add_argument("--cap", type=float, default=240.0, help="seconds a reference plan may take")
    ap.add_argument("--new-cap", type=float, default=120.0, help="seconds a plan of this tree may take")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reference-json", type=Path, default=HERE / "out" / "planner_speed_reference.json",
                    help="where the reference's rows are kept: written with --reference, read without it")
    ap.add_argument("--reference-only", action="store_true", help="plan the reference's rows only, keep them")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="planner-speed-"))
    ref = reference_tree(args.reference) if args.reference else None
    before = json.loads(args.reference_json.read_text(encoding="utf-8")) if args.reference_json.exists() else {}
    kept = {} if ref is not None else before  # a reference row past the cap before is not run again
    rows, mb_rows = [], []
    try:
        for case in cases(args.quick):
            base = overrides(case, folder)
            for options, extra in (("1F1B", []), ("all on", ALL_ON)):
                key = f"{case['label']} | {options}"
                old = kept.get(key)
                if ref is not None:
                    old_extra = [o for o in extra if not o.startswith("train.micro_batch")]
                    past = before.get(key, {}) if before.get("_rev") == args.reference else {}
                    old = kept[key] = past if str(past.get("error", "")).startswith(">") else \
                        plan_one(base + old_extra, args.cap, ref[0])
                    kept["_rev"] = args.reference
                    args.reference_json.parent.mkdir(parents=True, exist_ok=True)
                    args.reference_json.write_text(rows_json(kept), encoding="utf-8")
                new = {"error": "not run"} if args.reference_only else plan_one(base + extra, args.new_cap)
                if old is not None and "plan" in old and not args.reference_only:
                    old = {**old, "repriced": reprice(base, old["plan"])}
                rows.append((case, options, new, old))
                print(f"{case['label']:<42} {options:<7} new {cell(new, 'seconds'):>8} s {cell(new):>9}   "
                      f"today {cell(old, 'seconds'):>8} s {cell(old):>9}", flush=True)
            size = sum(m["count"] for m in case["cluster"]["machines"]) if isinstance(case["cluster"], dict) else 0
            if not args.reference_only and size <= 64:
                fixed = {b: plan_one(base + ["schedule=auto", "train.zero=auto", f"train.micro_batch={b}"],
                                     args.new_cap) for b in (1, 2, 4, 8) if case["batch"] % b == 0}
                auto = next(r[2] for r in rows[::-1] if r[0] is case and r[1] == "all on")
                mb_rows.append((case, fixed, auto))
    finally:
        if ref is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref[1])], capture_output=True)
    body = render(rows, mb_rows, args.reference or (kept.get("_rev") if kept else None))
    print(body)
    if not args.reference_only and (args.out is not None or not args.quick):
        write_section(SECTION, body, **({"path": args.out} if args.out else {}))
    return 0


def todays(old: dict | None) -> dict | None:
    """The reference's row the ratio divides by: its plan priced by this tree where that worked,
    else its own price (None: no reference plan)."""
    if not old or "error" in old:
        return None
    again = old.get("repriced")
    return again if again and "error" not in again else old


def repriced_cell(old: dict | None) -> str:
    """`` (x today)``: the reference's plan priced by this tree where that differs from its own price."""
    again = (old or {}).get("repriced")
    if not again or "error" in old:
        return ""
    if "error" in again:
        why = again["error"].split(": ", 1)[-1].split(" (")[0]
        return f" (refused by this tree: {why})"
    return "" if f"{again['iteration_s']:.4g}" == cell(old) else f" ({again['iteration_s']:.4g} today)"


def render(rows: list, mb_rows: list, reference: str | None) -> str:
    """The section's markdown."""
    lines = [f"Measured {date.today().isoformat()} by `python bench/planner_speed.py"
             f"{' --reference ' + reference if reference else ''}` on {os.cpu_count()} cores "
             f"(`{os.uname().machine}`). *search s*: the time the plan prints (`solver.seconds`, the CLI's "
             "start-up aside); *iteration s*: the plan's exactly priced iteration time. *all on*: "
             "`schedule=auto train.zero=auto train.micro_batch=auto` (the reference: without "
             "`train.micro_batch=auto`, which it does not know); in brackets, where it differs, the same plan priced "
             "by this tree's cost model (`hexicore evaluate`'s price: the reference's own prices lack what the model "
             "has learnt since). *ratio*: new iteration / today's plan, priced by this tree. *model error*: "
             "the search's modelled time of the plan it kept against that plan's exact time (schedules "
             "re-chosen exactly in between).", "",
             "| case | GPUs | batch | options | today search s | today iteration s | new search s | "
             "new iteration s | ratio | model error | new plan |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, options, new, old in rows:
        gpus = new.get("gpus", "?") if "error" not in new else "?"
        today = todays(old)
        ratio = f"{new['iteration_s'] / today['iteration_s']:.4f}" if today and "error" not in new else "-"
        shape = ("-" if "error" in new else
                 f"D_dp={new['pipelines']}, mb {new['micro_batch']}, ZeRO {new['zero']}, {'/'.join(new['schedules'])}")
        err = (f"{100 * (new['modelled_s'] - new['iteration_s']) / new['iteration_s']:+.2f}%"
               if "error" not in new and new.get("modelled_s") else "-")
        lines.append(f"| {case['label']} | {gpus} | {case['batch']} | {options} | {cell(old, 'seconds')} | "
                     f"{cell(old)}{repriced_cell(old)} | {cell(new, 'seconds')} | {cell(new)} | {ratio} | {err} | "
                     f"{shape} |")
    lines += ["", "`train.micro_batch=auto` against the plans at a fixed micro-batch (every other option on; "
              "iteration seconds):", "", "| case | mb 1 | mb 2 | mb 4 | mb 8 | auto | auto chose |",
              "|---|---|---|---|---|---|---|"]
    for case, fixed, auto in mb_rows:
        cells = [cell(fixed.get(b)) for b in (1, 2, 4, 8)]
        lines.append(f"| {case['label']} | {' | '.join(cells)} | {cell(auto)} | {cell(auto, 'micro_batch')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
