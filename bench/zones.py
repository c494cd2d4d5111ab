"""Geo-distributed planning: the ``two_zone`` preset with its wide-area link swept.

For each inter-zone bandwidth (latency fixed at the preset's 30 ms, or as given), hexiscale
plans Llama-2 7B and 13B; the table shows the predicted iteration time, which zones the plan
uses, how many pipelines cross the zone boundary, whether any DP group (holders of the same
layer) spans both zones, and the time of the best plan on the faster zone alone. Writes
``## Geo-distributed fleets (zones)`` in docs/results.md.

    python bench/zones.py [--gbs 0.01 0.1 1.25 10 25] [--batch 128]
"""

from __future__ import annotations

import argparse
import datetime
import time

from results import write_section

import hexicore

HEADING = "## Geo-distributed fleets (zones)"


def crossings(plan) -> tuple[int, bool]:
    """(pipelines whose stages span zones, whether some layer's DP holders span zones)."""
    zone = {d.id: plan.cluster.machine(d.machine).zone for d in plan.cluster.devices}
    cross = sum(1 for p in plan.pipelines if len({zone[d] for s in p.stages for d in s.devices}) > 1)
    holders: dict[int, set] = {}
    for p in plan.pipelines:
        at = 0
        for s in p.stages:
            for layer in range(at, at + s.n_layers):
                holders.setdefault(layer, set()).update(zone[d] for d in s.devices)
            at += s.n_layers
    return cross, any(len(z) > 1 for z in holders.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gbs", nargs="*", type=float, default=[0.01, 0.1, 1.25, 10.0, 25.0])
    ap.add_argument("--latency-us", type=float, default=30000.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--models", nargs="*", default=["llama2_7b", "llama2_13b"])
    args = ap.parse_args(argv)
    rows = []
    for model in args.models:
        west = hexicore.plan(cluster="two_zone", model=model,
                             overrides=[f"train.global_batch={args.batch}", "exclude=[E0.0,E0.1,E0.2,E0.3,E0.4,"
                                        "E0.5,E0.6,E0.7,E1.0,E1.1,E1.2,E1.3,E1.4,E1.5,E1.6,E1.7]"])
        for gbs in args.gbs:
            t0 = time.perf_counter()
            plan = hexicore.plan(cluster="two_zone", model=model, overrides=[
                f"train.global_batch={args.batch}", f"cluster.inter_zone.bandwidth_gbs={gbs}",
                f"cluster.inter_zone.latency_us={args.latency_us}"])
            wall = time.perf_counter() - t0
            zones = sorted({plan.cluster.machine(plan.cluster.device(d).machine).zone for d in plan.devices})
            cross, dp_cross = crossings(plan)
            rows.append(f"| {model} | {gbs:g} | {plan.estimate.iteration_s:.3f} | {'+'.join(zones)} | "
                        f"{len(plan.pipelines)} | {cross} | {'yes' if dp_cross else 'no'} | "
                        f"{west.estimate.iteration_s:.3f} | {wall:.1f} |")
            print(rows[-1], flush=True)
    body = (f"`bench/zones.py` on this machine, {datetime.date.today()}: the `two_zone` preset (2 x 8 A100-80G in "
            f"zone east, 2 x 8 H100 in zone west, 25 GB/s inside a zone), inter-zone latency "
            f"{args.latency_us / 1000:g} ms and the bandwidth below, global batch {args.batch}, hexiscale, analytic "
            "costs. *Crossing* pipelines have stages in both zones (activations cross per micro-batch); *DP "
            "across* means some layer's replicas sit in both zones (its gradient all-reduce crosses). The planner "
            "decides by the cost model alone; a zone it leaves out is idle in the plan.\n\n"
            "| model | inter-zone GB/s | iteration s | zones used | pipelines | crossing | DP across | west zone alone s | "
            "search s |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    write_section(HEADING, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
