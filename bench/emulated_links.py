"""Benchmark: emulated links (``emulate: {links: true}``) hold a transfer to its declared link.

Two ranks, one per machine of a two-machine cluster whose link is ``--bandwidth-gbs`` and
``--latency-us``, compute unemulated. Per message size: a send from rank 0 to rank 1 timed by
the receiver from a barrier both leave at the same moment (``send``), half a ping-pong's round
trip (``ping-pong``, as ``hexicore profile`` measures links), and an all-reduce and a broadcast
of that size between the two, each against the cost model's time for it
(:mod:`hexicore.cost.transfer`: ``latency + bytes / bandwidth``, the all-reduce
``2 (latency + bytes / (2 bandwidth))``). Medians of ``--repeats`` after one warm-up.
``python bench/emulated_links.py [--sizes 1000 ... 100000000]`` prints the table and writes
``bench/out/emulated_links.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexicore.core.cluster import parse_cluster
from hexicore.core.emulation import EmulatedLinks
from hexicore.core.settings import OutputSettings
from hexicore.cost.transfer import allreduce_s, broadcast_s, send_s
from hexicore_plugins.runtimes.torch.launch.settings import LaunchSettings

OUT = Path(__file__).resolve().parent / "out"
SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)


def two_machines(bandwidth_gbs: float, latency_us: float) -> EmulatedLinks:
    """The links of a cluster of two one-device machines joined by one emulated link."""
    cluster = parse_cluster({"name": "link-bench", "emulate": {"links": True},
                             "inter": {"bandwidth_gbs": bandwidth_gbs, "latency_us": latency_us},
                             "machines": [{"name": "A", "gpu": "a100-80g", "count": 1},
                                          {"name": "B", "gpu": "a100-80g", "count": 1}]}, "bench")
    return cluster.emulated_links(d.id for d in cluster.devices)


@dataclass(frozen=True)
class LinkProbe:
    """The launcher's job (``execute`` on every rank): time each ``sizes`` transfer."""

    links: EmulatedLinks
    sizes: tuple[int, ...]
    repeats: int = 5
    launch: LaunchSettings = field(default_factory=lambda: LaunchSettings(progress=False))
    output: OutputSettings = OutputSettings()
    world: int = 2

    def execute(self, rank: int, world: int, device: Any) -> list[dict[str, float]] | None:
        return probe(self, rank)


def probe(job: LinkProbe, rank: int) -> list[dict[str, float]] | None:
    """Per size on rank 0: the measured seconds of each transfer (module docstring) and the
    declared link's time for it."""
    import torch
    import torch.distributed as dist

    c, (a, b) = job.links.cluster, job.links.devices
    rows = []
    for size in job.sizes:
        buf = torch.zeros(max(size // 4, 1))
        got: dict[str, list[float]] = {"send": [], "ping-pong": [], "all-reduce": [], "broadcast": []}
        for k in range(job.repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.send(buf, 1) if rank == 0 else dist.recv(buf, 0)
            one_way = time.perf_counter() - t0
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            pong = (time.perf_counter() - t0) / 2
            times = [one_way, pong]
            for op in (dist.all_reduce, lambda t: dist.broadcast(t, 0)):
                dist.barrier()
                t0 = time.perf_counter()
                op(buf)
                times.append(time.perf_counter() - t0)
            every = [None, None]
            dist.all_gather_object(every, times)
            if k:  # round 0 warms up
                for key, value in zip(got, [every[1][0], every[0][1], max(e[2] for e in every),
                                            max(e[3] for e in every)]):
                    got[key].append(value)
        n = buf.numel() * 4
        want = {"send": send_s(c, a, b, n), "ping-pong": send_s(c, a, b, n), "all-reduce": allreduce_s(c, (a, b), n),
                "broadcast": broadcast_s(c, a, (a, b), n)}
        rows.append({"bytes": n, **{f"{k}_s": statistics.median(v) for k, v in got.items()},
                     **{f"{k}_declared_s": want[k] for k in got}})
    return rows if rank == 0 else None


def run(links: EmulatedLinks, sizes: tuple[int, ...], repeats: int) -> list[dict[str, float]]:
    """Launch the probe on two local workers; rank 0's rows."""
    from hexicore_plugins.runtimes.torch.launch.launcher import launch

    (rows,) = launch([LinkProbe(links, tuple(sizes), repeats)], 2)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidth-gbs", type=float, default=0.2)
    ap.add_argument("--latency-us", type=float, default=10_000.0)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with open("/proc/loadavg", encoding="utf-8") as f:
        load = f.read().split()[:3]
    rows = run(two_machines(args.bandwidth_gbs, args.latency_us), tuple(args.sizes), args.repeats)
    print(f"link {args.bandwidth_gbs} GB/s, {args.latency_us} us; load average {' '.join(load)}")
    print(f"{'bytes':>11} " + " ".join(f"{k:>22}" for k in ("send", "ping-pong", "all-reduce", "broadcast")))
    for r in rows:
        cells = [f"{r[k + '_s'] * 1e3:8.2f} ms {100 * (r[k + '_s'] / r[k + '_declared_s'] - 1):+6.1f}%  "
                 for k in ("send", "ping-pong", "all-reduce", "broadcast")]
        print(f"{r['bytes']:>11} " + " ".join(f"{c:>22}" for c in cells))
    OUT.mkdir(exist_ok=True)
    (OUT / "emulated_links.json").write_text(json.dumps({"bandwidth_gbs": args.bandwidth_gbs,
                                                         "latency_us": args.latency_us, "load": load,
                                                         "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
