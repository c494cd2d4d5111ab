"""Benchmark: tokens/s of hexicore's action-list executor vs torch.distributed.pipelining.

Same Llama model (built by the runtime, same seed), same ranks, micro-batches and data; GPipe and
1F1B from both. ``python bench/runtime.py [--ranks 2] [--micro-batches 8] [--steps 6]`` starts the
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

OUT = Path(__file__).resolve().parent / "out"


def _model(args):
    from hexicore.model import ModelSpec

    return ModelSpec("bench", layers=args.layers, hidden=args.hidden, heads=8, kv_heads=4, ffn=args.hidden * 11 // 4,
                     vocab=1024, seq_len=args.seq)


def _ours(args, schedule, rank, world, device):
    from hexicore_plugins.runtimes.torch.layout import build_layout, single_pipeline_layout
    from hexicore_plugins.runtimes.torch.trainer import RunSpec, train

    gb = args.micro_batches * args.micro_batch
    lay = single_pipeline_layout(_model(args), {"name": schedule}, world, global_batch=gb,
                                 micro_batch=args.micro_batch, seq_len=args.seq)
    lay = build_layout(lay.model, [(gb, list(lay.pipelines[0].groups), lay.pipelines[0].actions)], global_batch=gb,
                       micro_batch=args.micro_batch, seq_len=args.seq, world=world)
    out = train(RunSpec(layout=lay, steps=args.steps, progress=False), rank, world, device)
    return out["metrics"]["step_s"] if out else None


def _torch(args, schedule, rank, world, device):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from hexicore_plugins.runtimes.torch.data import SyntheticTokens
    from hexicore_plugins.runtimes.torch.layout import single_pipeline_layout
    from hexicore_plugins.runtimes.torch.stage import build_stages, seeded
    from hexicore_plugins.runtimes.torch.tensor_parallel import TPGroup

    model, gb = _model(args), args.micro_batches * args.micro_batch
    lay = single_pipeline_layout(model, {"name": "gpipe"}, world, global_batch=gb, micro_batch=args.micro_batch,
                                 seq_len=args.seq)
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
    opt = torch.optim.AdamW(wrap.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1)
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


def worker(args):
    import torch
    import torch.distributed as dist

    from hexicore_plugins.runtimes.torch.trainer import choose_backend

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
    dist.destroy_process_group()
    return rows


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
    rows = elastic_launch(cfg, worker)(args)[0]
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.ranks} ranks, {args.micro_batches} micro-batches of {args.micro_batch} x {args.seq} tokens, "
                    f"{args.layers} layers, hidden {args.hidden}")
    for c in ("schedule", "runtime", "step (ms)", "tokens/s"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["schedule"], r["runtime"], f"{1e3 * r['step_s']:.1f}", f"{r['tokens_per_s']:,.0f}")
    Console().print(t)
    OUT.mkdir(exist_ok=True)
    (OUT / "runtime.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
