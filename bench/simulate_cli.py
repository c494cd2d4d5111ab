"""``hexicore simulate`` end to end from the CLI, files included, and the library call
(``hexicore.simulate``) at large sizes; replaces the ``## Simulate from the CLI`` section of
docs/results.md.

    python bench/simulate_cli.py                # the issue's case: hanayo, W=8, P=64, M=512
    python bench/simulate_cli.py --cases 64,8,512 16,4,64 --repeat 3

Each case runs the installed ``hexicore`` entry point in a fresh process (interpreter start, Hydra
composition, building, validating and simulating the action lists, writing the files: what a
user waits for) with the default ``simulate.files=auto``, and once with ``simulate.files=all``
where asked (``--all``); wall time is the best of ``--repeat`` runs, peak memory the largest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "docs" / "results.md"
HEADING = "## Simulate from the CLI"


def cli_run(P: int, W: int, M: int, files: str, out: Path) -> tuple[float, float, list[str]]:
    """Wall seconds, peak RSS (MB) of the child, and the files written."""
    exe = Path(sys.executable).with_name("hexicore")
    cmd = [str(exe), "simulate", "schedule=hanayo", f"schedule.waves={W}", f"pipeline.ranks={P}",
           f"pipeline.micro_batches={M}", f"simulate.files={files}", f"out={out}", "overwrite=true",
           f"hydra.run.dir={out / 'hydra'}", "hydra.output_subdir=null"]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-2000:]}")
    rss = usage.ru_maxrss / 1024
    return wall, rss, sorted(p.name for p in out.iterdir() if p.is_file())


def library_run(P: int, W: int, M: int) -> float:
    import hexicore

    t0 = time.perf_counter()
    hexicore.simulate("hanayo", ranks=P, micro_batches=M, overrides=[f"schedule.waves={W}"])
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=["64,8,512"], help="P,W,M triples")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="also time simulate.files=all")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for case in args.cases:
        P, W, M = (int(x) for x in case.split(","))
        for files in (["auto", "all"] if args.all else ["auto"]):
            with tempfile.TemporaryDirectory() as tmp:
                runs = [cli_run(P, W, M, files, Path(tmp)) for _ in range(args.repeat)]
            wall = min(r[0] for r in runs)
            rows.append(f"| hanayo W={W}, P={P}, M={M} | `simulate.files={files}` | {wall:.2f} | "
                        f"{max(r[1] for r in runs):.0f} | {', '.join(runs[0][2])} |")
            print(rows[-1], flush=True)
        lib = min(library_run(P, W, M) for _ in range(args.repeat))
        rows.append(f"| hanayo W={W}, P={P}, M={M} | library `hexicore.simulate(...)` | {lib:.2f} | — | — |")
        print(rows[-1], flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0]
    body = (f"`python bench/simulate_cli.py {' '.join(sys.argv[1:])}`".replace(" `", "`") +
            f" ({cores} cores, 1-minute load {load:.1f} at the end: the machine is shared). "
            f"Wall time of the whole command in a fresh process (best of {args.repeat}), its peak "
            "memory, and the files written; `simulate.files=auto` writes every file up to 100,000 "
            "actions and `summary.json` + a summary `timeline.png` above (the full action and trace "
            "files of millions of actions are written when asked).\n\n"
            "| case | how | wall (s) | peak RSS (MB) | files |\n|---|---|---|---|---|\n" + "\n".join(rows))
    if not args.no_docs:
        sys.path.insert(0, str(HERE))
        from results import write_section

        write_section(HEADING, body, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
