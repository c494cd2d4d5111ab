"""Regenerate every results table of docs/results.md, one benchmark after another.

    python bench/run_all.py            # everything (tens of minutes on 2 cores)
    python bench/run_all.py --quick    # the fast subset (paper case, small sizes)

Each script owns one ``## `` section of docs/results.md (bench/results.py) and says in it how it
was measured. The GPU calibration (bench/gpu_calibrate.py) needs a CUDA machine and is not run
here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (script, full arguments, quick arguments)
BENCHES = [
    ("planner.py", [], ["--quick", "--scale", "64"]),
    ("schedules.py", [], ["--big", "16", "4", "64"]),
    ("schedules_zb.py", [], ["--big", "16", "64", "--cpsat-limit", "10"]),
    ("pricing_error.py", [], ["--quick", "--write"]),
    ("cpsat.py", [], ["--time-limit", "10", "--sizes", "2", "3", "4"]),
    ("replan.py", [], []),
    ("auto_final.py", [], ["--repeat", "1"]),
    ("runtime.py", [], ["--steps", "3"]),
    ("asymmetric.py", [], ["--steps", "3"]),
    ("hf_io.py", [], ["--quick"]),
    ("simulate_cli.py", ["--cases", "64,8,512", "16,4,64", "--repeat", "3"], ["--repeat", "1"]),
    ("zero.py", [], ["--iterations", "6"]),
    ("zones.py", [], ["--models", "llama2_7b", "--gbs", "0.01", "25"]),
    ("planner_fuzz.py", ["--cases", "60"], ["--cases", "10"]),
    ("closed_loop.py", ["--base-slowdown", "4"], ["--steps", "3", "--repeats", "3", "--rounds", "1", "--base-slowdown", "4"]),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", help="script names to run (default: all)")
    args = ap.parse_args(argv)
    failed = []
    for script, full, quick in BENCHES:
        if args.only and script not in args.only and script[:-3] not in args.only:
            continue
        if not (HERE / script).exists():
            print(f"== {script}: missing, skipped")
            continue
        cmd = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"== {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(cmd, cwd=HERE.parent)
        print(f"== {script}: exit {code} in {time.perf_counter() - t0:.0f} s", flush=True)
        if code:
            failed.append(script)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
