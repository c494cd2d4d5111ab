"""Benchmark: tokens/s of hexicore's action-list executor vs torch.distributed.pipelining.

Same Llama model (built by the runtime, same seed), same ranks, micro-batches and data; GPipe and
1F1B from both. Second table: the event simulator (:mod:`hexicore.pipeline.simulate`) fed with per-stage
forward/backward times profiled on the executor and a measured transfer time, against the
measured step time. ``python bench/runtime.py [--ranks 2] [--micro-batches 8] [--steps 6]`` starts the
workers with ``elastic_launch`` (gloo on CPU, NCCL on CUDA), prints a table and writes
``bench/out/runtime.json``. Tokens/s is the median over the steps after the first (warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from pathlib import Path

from hexicore.core.settings import OptimizerSettings, TrainSettings
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.launch.settings import LaunchSettings

OUT = Path(__file__).resolve().parent / "out"


def _model(args):
    from hexicore.core.model import ModelSpec

    return ModelSpec("bench", layers=args.layers, hidden=args.hidden, heads=8, kv_heads=4, ffn=args.hidden * 11 // 4,
                     vocab=1024, seq_len=args.seq)


def _ours(args, schedule, rank, world, device):
    from hexicore_plugins.runtimes.torch.parallel.assignment import build_layout, single_pipeline_layout
    from hexicore_plugins.runtimes.torch.train.trainer import WorkerSpec, train

    gb = args.micro_batches * args.micro_batch
    lay = single_pipeline_layout(_model(args), {"name": schedule}, world, registry=Registry.default(), global_batch=gb,
                                 micro_batch=args.micro_batch, seq_len=args.seq)
    lay = build_layout(lay.model, [(gb, list(lay.pipelines[0].groups), lay.pipelines[0].actions)], global_batch=gb,
                       micro_batch=args.micro_batch, seq_len=args.seq, world=world)
    settings = TrainSettings(global_batch=gb, micro_batch=args.micro_batch, seq_len=args.seq, dtype="fp32",
                             recompute=False, steps=args.steps)
    out = train(WorkerSpec(layout=lay, train=settings, launch=LaunchSettings(progress=False)), rank, world, device)
    return out["metrics"]["step_s"] if out else None


def _torch(args, schedule, rank, world, device):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from hexicore_plugins.runtimes.torch.train.data_source import SyntheticTokens
    from hexicore_plugins.runtimes.torch.parallel.assignment import single_pipeline_layout
    from hexicore_plugins.runtimes.torch.model.stage_module import build_stages, seeded
    from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup

    model, gb = _model(args), args.micro_batches * args.micro_batch
    lay = single_pipeline_layout(model, {"name": "gpipe"}, world, registry=Registry.default(), global_batch=gb,
                                 micro_batch=args.micro_batch, seq_len=args.seq)
    chunk = build_stages(model, lay.pipelines[0], rank, TPGroup(), full=seeded(0), recompute=False,
                         device=device)[rank].module

    class Wrap(torch.nn.Module):  # torch's stages return outputs; the loss is the schedule's loss_fn
        def __init__(self, c):
            super().__init__()
            self.c = c

        def forward(self, x):
            h = self.c.model.embed_tokens(x) if self.c.first else x
            for b in self.c.model.layers.values():
                h = b(h, self.c.cos, self.c.sin)
            return self.c.lm_head(self.c.model.norm(h)) if self.c.last else h

    wrap = Wrap(chunk)
    scale = 1.0 / (gb * args.seq)

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                                                 reduction="sum") * scale

    stage = PipelineStage(wrap, rank, world, device)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, args.micro_batches, loss_fn=loss_fn, scale_grads=False)
    adam = OptimizerSettings()  # the executor's AdamW
    opt = torch.optim.AdamW(wrap.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay)
    data = SyntheticTokens(model.vocab, args.seq, gb, 0)
    times = []
    for step in range(args.steps):
        tokens = data.batch(step).to(device)
        t0 = time.perf_counter()
        if rank == 0:
            sched.step(tokens[:, :-1])
        elif rank == world - 1:
            sched.step(target=tokens[:, 1:])
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return times


def _hop_time(rank, shape, device, reps: int = 10) -> float:
    """One activation transfer between ranks 0 and 1 (half a ping-pong), the simulator's hop."""
    import torch
    import torch.distributed as dist

    t = torch.zeros(shape, device=device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)
    dist.barrier()
    return (time.perf_counter() - t0) / (2 * reps)


def _predicted(args, schedule, rank, world, device):
    """Profile per-stage F/B times on the executor, then simulate the action list with them:
    (measured step, predicted makespan) of the steps after the first."""
    import torch
    import torch.distributed as dist

    from hexicore.pipeline.simulate import Timing, simulate
    from hexicore_plugins.runtimes.torch.train.data_source import SyntheticTokens
    from hexicore_plugins.runtimes.torch.parallel.pipeline import Executor
    from hexicore_plugins.runtimes.torch.parallel.layout import ParallelLayout
    from hexicore_plugins.runtimes.torch.parallel.assignment import single_pipeline_layout
    from hexicore_plugins.runtimes.torch.model.stage_module import build_stages, seeded

    gb = args.micro_batches * args.micro_batch
    lay = single_pipeline_layout(_model(args), {"name": schedule}, world, registry=Registry.default(), global_batch=gb,
                                 micro_batch=args.micro_batch, seq_len=args.seq)
    part, parallel = lay.pipelines[0], ParallelLayout.build(lay, rank, world)
    stages = build_stages(lay.model, part, rank, parallel.tp, full=seeded(0), recompute=False, device=device)
    opt = torch.optim.AdamW([p for s in stages.values() for p in s.module.parameters()], lr=OptimizerSettings().lr)
    ex = Executor(parallel, stages, optimizer=opt, act_shape=(args.micro_batch, args.seq, lay.model.hidden),
                  device=device, loss_scale=1.0 / (gb * args.seq), timeout_s=LaunchSettings().timeout_s)
    data, measured, spans = SyntheticTokens(lay.model.vocab, args.seq, gb, 0), [], []
    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        ex.run_step(data.batch(step))
        dist.barrier()
        measured.append(time.perf_counter() - t0)
        spans += ex.timeline if step else []
    hop_s = _hop_time(rank, (args.micro_batch, args.seq, lay.model.hidden), device)
    every = [None] * world
    dist.all_gather_object(every, spans)
    if rank != 0:
        return None
    al = part.actions
    mean = {op: [statistics.mean([e - s for r in every for (o, st, _, s, e) in r if o == op and st == k] or [0.0])
                 for k in range(al.stages)] for op in ("F", "B")}
    timing = Timing(tuple(mean["F"]), tuple(mean["B"]), (hop_s,) * (world - 1))
    return statistics.median(measured[1:] or measured), simulate(al, timing).makespan


def worker(args):
    import torch
    import torch.distributed as dist

    from hexicore_plugins.runtimes.torch.train.trainer import choose_backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # no oversubscription on CPU
    backend = choose_backend("auto")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rows = []
    for schedule in ("gpipe", "1f1b"):
        for name, fn in (("hexicore", _ours), ("torch.pipelining", _torch)):
            times = fn(args, schedule, rank, world, device)
            if rank == 0:
                med = statistics.median(times[1:] or times)
                rows.append({"runtime": name, "schedule": schedule, "step_s": med,
                             "tokens_per_s": args.micro_batches * args.micro_batch * args.seq / med})
    sims = []
    for schedule in ("gpipe", "1f1b", "hanayo"):
        got = _predicted(args, schedule, rank, world, device)
        if rank == 0:
            sims.append({"schedule": schedule, "measured_s": got[0], "predicted_s": got[1],
                         "error": got[1] / got[0] - 1.0})
    dist.destroy_process_group()
    return rows, sims


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=args.ranks, run_id=str(uuid.uuid4()),
                       rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    rows, sims = elastic_launch(cfg, worker)(args)[0]
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.ranks} ranks, {args.micro_batches} micro-batches of {args.micro_batch} x {args.seq} tokens, "
                    f"{args.layers} layers, hidden {args.hidden}")
    for c in ("schedule", "runtime", "step (ms)", "tokens/s"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["schedule"], r["runtime"], f"{1e3 * r['step_s']:.1f}", f"{r['tokens_per_s']:,.0f}")
    Console().print(t)
    t2 = Table(title="simulator (per-stage F/B times from profiled steps, measured hop) vs measured step")
    for c in ("schedule", "measured (ms)", "predicted (ms)", "error"):
        t2.add_column(c)
    for r in sims:
        t2.add_row(r["schedule"], f"{1e3 * r['measured_s']:.1f}", f"{1e3 * r['predicted_s']:.1f}", f"{r['error']:+.1%}")
    Console().print(t2)
    OUT.mkdir(exist_ok=True)
    (OUT / "runtime.json").write_text(json.dumps({"args": vars(args), "rows": rows, "simulator": sims}, indent=2) + "\n")
    write_results(args, rows, sims)


def write_results(args, rows, sims) -> None:
    """The ``## Runtime`` section of docs/results.md: both tables as markdown."""
    from results import write_section

    body = [f"Measured by `python bench/runtime.py` (CPU, gloo, fp32): {args.ranks} ranks, {args.micro_batches} "
            f"micro-batches of {args.micro_batch} x {args.seq} tokens, a Llama of {args.layers} layers, hidden "
            f"{args.hidden}; median over steps after the first. Run-to-run variation on this 2-core machine is a few "
            "percent when it is otherwise idle and up to ~30% when other work shares the cores.", "",
            "### hexicore's executor vs torch.distributed.pipelining", "",
            "| schedule | runtime | step (ms) | tokens/s |", "|---|---|---|---|"]
    body += [f"| {r['schedule']} | {r['runtime']} | {1e3 * r['step_s']:.1f} | {r['tokens_per_s']:,.0f} |" for r in rows]
    body += ["", "### Simulator (per-stage times from a profiling step, measured hop) vs measured step", "",
             "| schedule | measured (ms) | predicted (ms) | error |", "|---|---|---|---|"]
    body += [f"| {r['schedule']} | {1e3 * r['measured_s']:.1f} | {1e3 * r['predicted_s']:.1f} | {r['error']:+.1%} |"
             for r in sims]
    write_section("## Runtime", "\n".join(body))


if __name__ == "__main__":
    main()
