"""Benchmark: measured step time of asymmetric plans vs the cost model's prediction .

Each plan (pipelines with different stage counts, layer cuts, TP degrees, batches and schedules)
runs on the torch runtime. A profiling pass records every compute action (``Executor.timeline``),
the chunked data-parallel sync and the optimizer step on every rank, plus one activation hop
(``bench/runtime.py``'s machinery). The prediction is the cost model's structure: the slowest
pipeline — each pipeline's own action list simulated (:mod:`hexicore.pipeline.simulate`) with its
profiled per-stage forward/backward times and the hop — plus the profiled DP sync and update.
``python bench/asymmetric.py [--steps 5]`` prints the table, writes ``bench/out/asymmetric.json``
and replaces the ``## Asymmetric execution`` section of ``docs/results.md``. On a shared CPU box
the processes share cores, so compare measured and predicted, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from hexicore.core.settings import OptimizerSettings
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.launch.settings import LaunchSettings

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
RESULTS = HERE.parent / "docs" / "results.md"
SECTION = "## Asymmetric execution"

#: name -> [(batch, schedule, [(tp, layers), ...])] over ranks 0.. in order
PLANS = {
    "[0,5)+[5,8) 1f1b b=12; [0,8) gpipe b=4": [(12, "1f1b", [(1, 5), (1, 3)]), (4, "gpipe", [(1, 8)])],
    "tp2 [0,5) + [5,8) 1f1b b=10; [0,3)+[3,6)+[6,8) gpipe b=6":
        [(10, "1f1b", [(2, 5), (1, 3)]), (6, "gpipe", [(1, 3), (1, 3), (1, 2)])],
}


def _model(args):
    from hexicore.core.model import ModelSpec

    return ModelSpec("bench", layers=8, hidden=args.hidden, heads=8, kv_heads=4, ffn=args.hidden * 11 // 4,
                     vocab=1024, seq_len=args.seq)


def _layout(args, plan, world):
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, schedule_actions

    pipes, rank = [], 0
    for batch, sched, stages in plan:
        groups = []
        for tp, n in stages:
            groups.append(StageGroup(tuple(range(rank, rank + tp)), n))
            rank += tp
        pipes.append((batch, groups, schedule_actions({"name": sched}, len(groups), batch // args.micro_batch, Registry.default())))
    gb = sum(b for b, _, _ in plan)
    return build_layout(_model(args), pipes, global_batch=gb, micro_batch=args.micro_batch, seq_len=args.seq,
                        world=world)


def _profile(args, plan, rank, world, device):
    """Run the plan; rank 0 returns (measured step, predicted step, parts of the prediction)."""
    import torch
    import torch.distributed as dist

    from hexicore.pipeline.simulate import Timing, simulate
    from hexicore_plugins.runtimes.torch.train.data_source import SyntheticTokens
    from hexicore_plugins.runtimes.torch.parallel.pipeline import Executor
    from hexicore_plugins.runtimes.torch.parallel.layout import ParallelLayout
    from hexicore_plugins.runtimes.torch.model.stage_module import build_stages, seeded
    from runtime import _hop_time  # bench/runtime.py: one activation transfer between ranks 0 and 1

    lay = _layout(args, plan, world)
    parallel = ParallelLayout.build(lay, rank, world)
    ex, tail = None, []
    if parallel.role is not None:
        part = parallel.pipeline
        stages = build_stages(lay.model, part, parallel.pipe_rank, parallel.tp, full=seeded(0), recompute=False,
                              device=device)
        opt = torch.optim.AdamW([p for s in stages.values() for p in s.module.parameters()], lr=OptimizerSettings().lr)
        ex = Executor(parallel, stages, optimizer=opt, device=device,
                      act_shape=(args.micro_batch, args.seq, lay.model.hidden),
                      loss_scale=1.0 / (lay.global_batch * args.seq), timeout_s=LaunchSettings().timeout_s)
        _timed(opt, "step", tail)
    data, measured, spans, update = SyntheticTokens(lay.model.vocab, args.seq, lay.global_batch, 0), [], [], []
    for step in range(args.steps):
        dist.barrier()
        tail.clear()  # optimizer.step wall time of this step
        t0 = time.perf_counter()
        if ex is not None:
            ex.run_step(data.batch(step))
        dist.barrier()
        measured.append(time.perf_counter() - t0)
        if step:
            spans += ex.timeline if ex is not None else []
            update.append(sum(tail))
    hop_s = _hop_time(rank, (args.micro_batch, args.seq, lay.model.hidden), device)
    sync = []  # the chunked DP sync on its own (inside a step it also absorbs the pipelines' skew)
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        if ex is not None and parallel.data is not None:
            parallel.data.run({(s, n): p for s in sorted(ex.stages) for n, p in ex.stages[s].module.named_parameters()},
                           ex._wait)
        sync.append(time.perf_counter() - t0)
    update = [u + statistics.median(sync) for u in update]
    every = [None] * world
    dist.all_gather_object(every, (parallel.role, spans, statistics.median(update or [0.0])))
    if rank != 0:
        return None
    makespans = []
    for part in lay.pipelines:
        mine = [sp for role, sp, _ in every if role is not None and role.pipeline == part.index]
        al = part.actions
        mean = {op: tuple(statistics.mean([e - s for sp in mine for (o, st, _, s, e) in sp if o == op and st == k]
                                          or [0.0]) for k in range(al.stages)) for op in ("F", "B")}
        timing = Timing(mean["F"], mean["B"], (hop_s,) * max(al.ranks - 1, 0))
        makespans.append(simulate(al, timing).makespan)
    sync = max(u for _, _, u in every)
    meas = statistics.median(measured[1:] or measured)
    return {"measured_s": meas, "pipelines_s": makespans, "sync_update_s": sync,
            "predicted_s": max(makespans) + sync, "error": (max(makespans) + sync) / meas - 1.0}


def _timed(obj, method: str, sink: list) -> None:
    """Add the wall time of every ``obj.method(...)`` call to ``sink``."""
    fn = getattr(obj, method)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            sink.append(time.perf_counter() - t0)
    setattr(obj, method, wrapper)


def worker(args):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo")
    rows = []
    for name, plan in PLANS.items():
        got = _profile(args, plan, rank, world, torch.device("cpu"))
        if rank == 0:
            rows.append({"plan": name, "ranks": sum(tp for _, _, st in plan for tp, _ in st), **got})
    dist.destroy_process_group()
    return rows


def _markdown(args, rows) -> str:
    lines = [SECTION, "",
             f"`python bench/asymmetric.py` (CPU, gloo, {args.steps} steps, median after the first; model: 8 layers, "
             f"hidden {args.hidden}, 8 heads / 4 kv heads, seq {args.seq}, micro-batch {args.micro_batch}; "
             f"{os.cpu_count()} cores shared by all ranks). Predicted = slowest pipeline (its own action list "
             "simulated with per-stage F/B times profiled on the executor and a measured hop) + the profiled "
             "chunked DP sync and AdamW update.", "",
             "| plan | ranks | measured (ms) | pipelines simulated (ms) | sync + update (ms) | predicted (ms) | error |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pipes = " / ".join(f"{1e3 * x:.1f}" for x in r["pipelines_s"])
        lines.append(f"| {r['plan']} | {r['ranks']} | {1e3 * r['measured_s']:.1f} | {pipes} | "
                     f"{1e3 * r['sync_update_s']:.1f} | {1e3 * r['predicted_s']:.1f} | {r['error']:+.1%} |")
    lines += ["", "With more ranks than cores the processes time-share the CPU, so profiled per-stage times and the "
              "measured step vary between runs, the more so the more ranks a plan has."]
    return "\n".join(lines) + "\n"


def write_results(text: str) -> None:
    """This benchmark's section of docs/results.md (the text starts with its heading)."""
    from results import write_section

    heading, body = text.split("\n", 1)
    write_section(heading, body, RESULTS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/results.md")
    args = p.parse_args()
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    world = max(sum(tp for _, _, st in plan for tp, _ in st) for plan in PLANS.values())
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=str(uuid.uuid4()),
                       rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    rows = elastic_launch(cfg, worker)(args)[0]
    text = _markdown(args, rows)
    print(text)
    OUT.mkdir(exist_ok=True)
    (OUT / "asymmetric.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    if not args.no_docs:
        write_results(text)


if __name__ == "__main__":
    main()
