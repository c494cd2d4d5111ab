"""``schedule=auto`` with and without its final options (synth re-priced on the final plan's
pipelines, hexicore.planner.final_schedules): the plan's iteration time, each pipeline's chosen
schedule, and the wall and CPU seconds of ``hexicore plan schedule=auto`` (whole command: start,
search over sub-clusters, final re-pricing, outputs), each run ``--repeat`` times in a fresh
process (the least wall and CPU kept: the machine is shared). Writes the table under
``## schedule=auto with synthesised schedules`` in docs/results.md (only that section).

    python bench/auto_final.py [--repeat 2] [--all] [--out docs/results.md]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import write_section

from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.synthesis import lower_bound

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## schedule=auto with synthesised schedules"
#: (label, overrides): bench/planner.py's settings
SETTINGS = [
    ("paper case, 13B", ["cluster=paper_case", "model=llama2_13b", "train.global_batch=24"]),
    ("hetero1, 7B", ["cluster=hetero1", "model=llama2_7b", "train.global_batch=128"]),
]
MORE = [
    ("hetero2, 7B", ["cluster=hetero2", "model=llama2_7b", "train.global_batch=128"]),
    ("hetero3, 30B", ["cluster=hetero3", "model=llama_30b", "train.global_batch=128"]),
]
OFF = "schedule.final_options=[]"


def run_plan(overrides: list[str], repeat: int) -> tuple[dict, float, float]:
    """(plan JSON, least wall s, least CPU s) of ``hexicore plan`` in a fresh process."""
    walls, cpus, data = [], [], None
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            cmd = [sys.executable, "-m", "hexicore.app.cli", "plan", "schedule=auto", *overrides, f"out={out}",
                   f"hydra.run.dir={tmp}/run"]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            data = json.loads(out.read_text())
    return data, min(walls), min(cpus)


def chosen(data: dict) -> str:
    """Per pipeline: its schedule (synth: its layout cap per rank too), grouped with counts."""
    names = []
    for p in data["pipelines"]:
        s = p["schedule"]
        extra = f" (v={s['chunks']})" if "chunks" in s else f" (W={s['waves']})" if "waves" in s else ""
        if "memory" in s:
            extra = f" (memory {'/'.join(f'{c:g}' for c in s['memory'])})"
        names.append(s["name"] + extra)
    return ", ".join(f"{names.count(n)}x {n}" for n in dict.fromkeys(names))


def vs_bound(data: dict) -> str:
    """The largest ratio, over the pipelines that chose synth, of its time (``solver.schedule_s``)
    to the lower bound of :func:`hexicore.pipeline.synthesis.lower_bound` for the stage and hop times
    the plan records."""
    worst = None
    mb = data["train"]["micro_batch"]
    for p, tried in zip(data["pipelines"], data["solver"].get("schedule_s") or []):
        s = p["schedule"]
        if s["name"] != "synth":
            continue
        spec = ScheduleSpec.from_pieces(s["stage_times"], s["hop_times"], p["batch"] // mb)
        r = tried["synth"] / lower_bound(spec) - 1
        worst = r if worst is None else max(worst, r)
    return "" if worst is None else f"{worst:+.2%}"


def table(settings, repeat: int) -> list[str]:
    rows = ["| setting | auto, options only | auto + final synth | gain | schedules (options only) | schedules (+ synth) "
            "| synth vs lower bound | wall s (before / after) | CPU s (before / after) | slowdown (wall / CPU) |",
            "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for label, ov in settings:
        b, bw, bc = run_plan(ov + [OFF], repeat)
        a, aw, ac = run_plan(ov, repeat)
        tb, ta = b["estimate"]["iteration_s"], a["estimate"]["iteration_s"]
        assert ta <= tb + 1e-9, (label, ta, tb)  # the final options never make the plan slower
        rows.append(f"| {label} | {tb:.3f} s | {ta:.3f} s | {tb / ta - 1:+.1%} | {chosen(b)} | {chosen(a)} | {vs_bound(a)} | "
                    f"{bw:.1f} / {aw:.1f} | {bc:.1f} / {ac:.1f} | {aw / bw - 1:+.0%} / {ac / bc - 1:+.0%} |")
        print(rows[-1], flush=True)
    return rows


NOTE = """`bench/auto_final.py`: `hexicore plan schedule=auto` (hexiscale, 50 iterations, seed 0, the
allocation over sub-clusters), with `schedule.final_options=[]` (*options only*: today's
`options` of conf/schedule/auto.yaml, searched and re-chosen exactly per pipeline) and with the
shipped final options (*+ final synth*: `{{name: synth, effort: quick}}` tried once on the final
plan's pipelines, each synthesised for the pipeline's own stage and hop times under the
pipeline's own per-rank memory cap, the in-flight micro-batches every stage's devices hold,
`memory` in the table). A pipeline keeps synth only when it is faster and fits; the plan only
when its full estimate is not slower (the script asserts it). *synth vs lower bound*: the
slowest synth pipeline's time over `hexicore.pipeline.synthesis.lower_bound` (stated under
"synth vs named schedules on uneven stage times" above; memory ignored) for the stage and hop
times the plan records. Seconds: the whole command in a
fresh process (Python start, Hydra, search, outputs), least of {repeat} runs, on this shared
2-core machine (other jobs running: wall is noisy, CPU is the steadier figure).
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="also hetero2 7B and hetero3 30B")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    args = ap.parse_args(argv)
    rows = table(SETTINGS + (MORE if args.all else []), args.repeat)
    write_section(HEADING, NOTE.format(repeat=args.repeat) + "\n" + "\n".join(rows) + "\n", Path(args.out))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
