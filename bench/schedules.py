"""Bench: bubble ratios of every schedule against the papers' closed forms, and the speed of
build + validate + simulate (issue 5 "exact checks" and "speed"). Writes bench/out/schedules.md.

    python bench/schedules.py [--big P W M]     # default big case: P=64, W=8, M=512
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hexicore.comm import insert_comm
from hexicore.schedule import ScheduleSpec
from hexicore.simulate import simulate
from hexicore.validate_actions import validate_actions
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo, hanayo_bubble
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1


def bubble(sched, P, M) -> float:
    return sched.simulate(ScheduleSpec(P, M))[1].bubble_ratio


def hanayo_table() -> list[str]:
    rows = ["| P | W | closed form (2P-2)/(3PW+P-1) | hexicore greedy (M = P) | difference |", "|---|---|---|---|---|"]
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


def speed(P: int, W: int, M: int) -> list[str]:
    t0 = time.perf_counter()
    al = Hanayo(waves=W).order(ScheduleSpec(P, M))
    t1 = time.perf_counter()
    full = insert_comm(al)
    t2 = time.perf_counter()
    validate_actions(full, comm=True)
    t3 = time.perf_counter()
    res = simulate(full)
    t4 = time.perf_counter()
    n = sum(len(a) for a in full.actions)
    return [f"hanayo P={P} W={W} M={M}: {n} actions; order {t1 - t0:.2f} s, comm pass {t2 - t1:.2f} s, "
            f"validate {t3 - t2:.2f} s, simulate {t4 - t3:.2f} s, total {t4 - t0:.2f} s "
            f"(bubble {res.bubble_ratio:.4f})"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", nargs=3, type=int, default=(64, 8, 512), metavar=("P", "W", "M"))
    args = ap.parse_args()
    lines = ["# pipeline schedules: bubbles and speed", "", "T_B = 2 T_F, T_C = 0.", "", "## Hanayo", "",
             *hanayo_table(), "", "## Other schedules", "", *others_table(), "", "## Speed", ""]
    for P, W, M in ((16, 4, 64), (32, 8, 128), tuple(args.big)):
        lines += speed(P, W, M)
        print(lines[-1], flush=True)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "schedules.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
