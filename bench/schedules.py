"""Bench: bubble ratios of every schedule against the papers' closed forms, and the speed of
build + validate + simulate (exact checks and speed). Writes bench/out/schedules.md and
the ``## Schedules`` section of docs/results.md (only that section).

    python bench/schedules.py [--big P W M]     # default big case: P=64, W=8, M=512
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hexicore.pipeline.comm import insert_comm
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.validate import validate_actions
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo, hanayo_bubble
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1


def bubble(sched, P, M) -> float:
    return sched.simulate(ScheduleSpec(P, M))[1].bubble_ratio


def hanayo_table() -> list[str]:
    rows = ["| P | W | closed form (2P-2)/(3PW+P-1) | hexicore wave order (greedy + justification, M = P) | difference |", "|---|---|---|---|---|"]
    for P in (2, 4, 8, 16):
        for W in (1, 2, 4, 8):
            got, cf = bubble(Hanayo(waves=W), P, P), hanayo_bubble(P, W)
            rows.append(f"| {P} | {W} | {cf:.4f} | {got:.4f} | {got - cf:+.4f} |")
    return rows


def others_table() -> list[str]:
    rows = ["| schedule | P | M | bubble | 1F1B closed form (P-1)/(M+P-1) | note |", "|---|---|---|---|---|---|"]
    for P, M in ((4, 4), (4, 8), (8, 8), (8, 32)):
        cf = (P - 1) / (M + P - 1)
        megatron = f"Megatron {((P - 1) / 2) / (M + (P - 1) / 2):.4f}" if M % P == 0 else ""
        for s, note in ((GPipe(), ""), (OneFOneB(), ""), (Interleaved1F1B(chunks=2), megatron),
                        (Chimera(), f"Chimera (P-2)/(2M+P-2) = {(P - 2) / (2 * M + P - 2):.4f}"),
                        (ZeroBubbleH1(), f"ZB-H1 (P-1)/(3M+P-1) = {(P - 1) / (3 * M + P - 1):.4f}")):
            rows.append(f"| {s.name} | {P} | {M} | {bubble(s, P, M):.4f} | {cf:.4f} | {note} |")
    return rows


def speed(P: int, W: int, M: int) -> tuple[str, dict[str, float]]:
    """Wall and CPU seconds of build (order), comm pass, validate and simulate for hanayo."""
    wall, cpu = [time.perf_counter()], [time.process_time()]

    def tick() -> None:
        wall.append(time.perf_counter())
        cpu.append(time.process_time())

    al = Hanayo(waves=W).order(ScheduleSpec(P, M))
    tick()
    full = insert_comm(al)
    tick()
    validate_actions(full, comm=True)
    tick()
    res = simulate(full)
    tick()
    n = full.n_actions
    w = [b - a for a, b in zip(wall, wall[1:])]
    c = [b - a for a, b in zip(cpu, cpu[1:])]
    row = (f"| {P} | {W} | {M} | {n} | {w[0]:.2f} | {w[1]:.2f} | {w[2]:.2f} | {w[3]:.2f} | **{sum(w):.2f}** "
           f"| {sum(c):.2f} | {res.bubble_ratio:.4f} |")
    return row, {"total": sum(w), "cpu": sum(c)}


SPEED_HEAD = ["| P | W | M | actions | build s | comm s | validate s | simulate s | total s (wall) | total s (CPU) "
              "| bubble |", "|---|---|---|---|---|---|---|---|---|---|---|"]
BEFORE = ("Before the array paths (object lists, event simulator; commit 77d6534): P=64, W=8, M=512 took "
          "build 2.95 s, comm 9.70 s, validate 15.73 s, simulate 17.62 s, total 46.01 s; P=16, W=4, M=64 0.55 s.")


def write_results(hanayo: list[str], others: list[str], rows: list[str], path: Path) -> None:
    """The ``## Schedules`` section of docs/results.md: bubbles vs closed forms, then speed."""
    from results import write_section

    body = ["Measured by `python bench/schedules.py`: the event simulator on each schedule's action lists, "
            "T_B = 2 T_F, T_C = 0 (bubble ratio = 1 - busy / (P x makespan)).", "",
            "### Hanayo vs its closed form (M = P)", "", *hanayo, "",
            "### Other schedules vs the 1F1B closed form", "", *others, "",
            "### Speed: Hanayo build + comm pass + validate + simulate", "",
            "Target: P=64, W=8, M=512 under 2 s. Wall clock on the shared 2-core machine; CPU is this process's "
            "time.", "", *SPEED_HEAD, *rows, "", BEFORE]
    write_section("## Schedules", "\n".join(body), path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", nargs=3, type=int, default=(64, 8, 512), metavar=("P", "W", "M"))
    args = ap.parse_args()
    hanayo, others = hanayo_table(), others_table()
    lines = ["# pipeline schedules: bubbles and speed", "", "T_B = 2 T_F, T_C = 0.", "", "## Hanayo", "",
             *hanayo, "", "## Other schedules", "", *others, "", "## Speed", "", *SPEED_HEAD]
    rows = []
    for P, W, M in ((16, 4, 64), (32, 8, 128), tuple(args.big)):
        row, _ = speed(P, W, M)
        rows.append(row)
        print(row, flush=True)
    lines += rows + ["", BEFORE]
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "schedules.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_results(hanayo, others, rows, Path(__file__).resolve().parent.parent / "docs" / "results.md")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
