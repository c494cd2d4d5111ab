"""Planner consistency on random clusters: every solver, schedule and objective on clusters no
configuration names.

Each case draws a cluster (1-4 machines of random GPU types, counts 1-8, intra links 16-200
GB/s, inter 0.5-10 GB/s), a solver (hexiscale, megatron, metis_like, galvatron_like, fsdp,
cpsat), a schedule (default, auto, 1f1b, synth, hanayo, interleaved_1f1b, zb_h1, gpipe), a model
(llama2_7b, llama2_13b, tiny), a global batch and an objective (throughput, cost, a budget), and
plans through the library (``hexicore.plan``). A case is a **violation** when:

* the plan ends in anything but a plan or one :class:`HexicoreError` (a traceback);
* the plan written to JSON and re-read by ``hexicore.evaluate`` gets another iteration time
  (the planner's price must be the one every later command sees);
* the torch runtime's layout check refuses a written plan;
* a solver says no plan fits where ``solver=megatron`` finds one (its plans are in every
  solver's space);
* under the throughput objective hexiscale's plan is slower than megatron's (it starts from it).

``python bench/planner_fuzz.py [--seed 0] [--cases 60]`` prints every case, writes
``bench/out/planner_fuzz.json`` and the ``## Planner consistency on random clusters`` section of
docs/results.md; exit status 1 if any case is a violation. Time limits: cpsat 3 s and hexiscale
5 s a solve (each sub-cluster cpsat solves gets its own).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

from results import write_section

HERE = Path(__file__).resolve().parent
SECTION = "## Planner consistency on random clusters"
GPUS = ["a800-80g-nvlink", "rtx4090", "rtx3090", "a100-80g", "h100-80g", "v100-32g"]
SOLVERS = ["hexiscale", "megatron", "metis_like", "galvatron_like", "fsdp", "cpsat"]
SCHEDULES = [None, "auto", "1f1b", "synth", "hanayo", "interleaved_1f1b", "zb_h1", "gpipe"]
NO_FIT = ("no plan fits", "fits on no", "no candidate fits")


def draw(rng: random.Random, case: int) -> dict:
    """One case: cluster mapping, solver, schedule, model, overrides."""
    machines = [{"name": f"M{i}", "gpu": rng.choice(GPUS), "count": rng.choice([1, 2, 3, 4, 8]),
                 "bandwidth_gbs": rng.choice([16, 32, 200]), "latency_us": 5} for i in range(rng.randint(1, 4))]
    cluster = {"name": f"r{case}", "inter": {"bandwidth_gbs": rng.choice([0.5, 1.0, 10.0]), "latency_us": 50},
               "machines": machines}
    solver, schedule, model = rng.choice(SOLVERS), rng.choice(SCHEDULES), rng.choice(["llama2_7b", "llama2_13b", "tiny"])
    overrides = [f"train.global_batch={rng.choice([8, 16, 24, 32])}"]
    limits = {"cpsat": "solver.time_limit=3", "hexiscale": "solver.time_limit=5"}
    objective = rng.choice(["throughput", "cost", "budget"])
    overrides += [limits[solver]] if solver in limits else []
    overrides += {"throughput": [], "cost": ["objective=cost"], "budget": ["budget_per_hour=8"]}[objective]
    return {"cluster": cluster, "solver": solver, "schedule": schedule, "model": model, "overrides": overrides,
            "objective": objective}


def megatron(c: dict, path: Path):
    """megatron's plan for the case (its schedule; ``auto`` is hexiscale's alone), or None."""
    import hexicore
    from hexicore.core.errors import HexicoreError

    try:
        return hexicore.plan(model=c["model"], solver="megatron", schedule=None if c["schedule"] == "auto" else c["schedule"],
                             cluster_file=path, overrides=[o for o in c["overrides"] if not o.startswith("solver.")])
    except HexicoreError:
        return None


def check(c: dict, path: Path, tmp: Path) -> tuple[str, str]:
    """(outcome, detail): ``ok``, ``refused`` or ``VIOLATION``."""
    import hexicore
    from hexicore.core.errors import HexicoreError
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout

    try:
        plan = hexicore.plan(model=c["model"], solver=c["solver"], schedule=c["schedule"], cluster_file=path,
                             overrides=c["overrides"])
    except HexicoreError as exc:
        other = megatron(c, path) if any(s in str(exc) for s in NO_FIT) else None
        if other is not None:
            return "VIOLATION", f"{exc}; megatron finds {other.estimate.iteration_s:.3f} s"
        return "refused", str(exc)
    except Exception:  # noqa: BLE001 - the point of the check
        return "VIOLATION", traceback.format_exc(limit=4)
    out = tmp / f"{path.stem}.json"
    out.write_text(plan.to_json())
    again = hexicore.evaluate(out)
    a, b = plan.estimate.iteration_s, again.estimate.iteration_s
    if abs(a - b) > 1e-9 * max(1.0, a):
        return "VIOLATION", f"plan prices {a!r} s, evaluate {b!r} s"
    back = hexicore.load_plan(out)
    plan_layout(back, [dict(p.schedule) for p in back.pipelines], registry=Registry.default(), seq_len=back.train.seq_len)
    if c["solver"] == "hexiscale" and c["objective"] == "throughput":
        other = megatron(c, path)
        if other is not None and other.estimate.iteration_s < a * (1 - 1e-9):
            return "VIOLATION", f"hexiscale {a:.4f} s slower than megatron {other.estimate.iteration_s:.4f} s"
    return "ok", f"{a:.4f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=60)
    args = ap.parse_args(argv)
    rng, rows = random.Random(args.seed), []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for case in range(args.cases):
            c = draw(rng, case)
            path = tmp / f"c{case}.yaml"
            path.write_text(yaml.safe_dump(c["cluster"]))
            t0 = time.perf_counter()
            outcome, detail = check(c, path, tmp)
            gpus = " + ".join(f"{m['count']} x {m['gpu']}" for m in c["cluster"]["machines"])
            rows.append({"case": case, "solver": c["solver"], "schedule": c["schedule"] or "default",
                         "model": c["model"], "objective": c["objective"], "cluster": gpus, "outcome": outcome,
                         "detail": detail.strip().splitlines()[-1][:200], "seconds": round(time.perf_counter() - t0, 1)})
            print(f"case {case}: {c['solver']} {c['schedule']} {c['model']} {c['overrides']} [{gpus}]: "
                  f"{outcome} ({rows[-1]['seconds']} s) {detail.strip()[:300]}", flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "planner_fuzz.json").write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if r["outcome"] == "VIOLATION"]
    count = {k: sum(r["outcome"] == k for r in rows) for k in ("ok", "refused", "VIOLATION")}
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python bench/planner_fuzz.py "
             f"--seed {args.seed} --cases {args.cases}`: {args.cases} random cases (module docstring of the script: "
             "what is drawn, what counts as a violation).", "",
             f"- plans: {count['ok']}, every one re-priced to the same iteration time by `evaluate` and accepted "
             "by the runtime's layout check" if not bad else f"- plans: {count['ok']}",
             f"- refused with one line: {count['refused']} (no memory for the model, a budget no plan meets, "
             "`schedule=auto` with a solver other than hexiscale, a time limit without a plan)",
             f"- violations: {count['VIOLATION']}"]
    lines += [f"  - case {r['case']} ({r['solver']}, {r['schedule']}, {r['model']}, {r['cluster']}): {r['detail']}"
              for r in bad]
    write_section(SECTION, "\n".join(lines))
    print(f"{count['ok']} plans, {count['refused']} refused, {count['VIOLATION']} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
