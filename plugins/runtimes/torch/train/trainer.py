"""The training loop of one rank: build its stages, run the steps, checkpoint, report.

One :class:`WorkerSpec` is one training run as a worker sees it (the layout with its built
action lists, plus settings); the runtime derives it from the app's
:class:`~hexicore.core.run_spec.RunSpec`. It is plain data, so the launcher hands it to spawned
workers (they read no config and need no registry) and one launched job can run several specs
in sequence on the same process group (the tests do). ``parallel=none`` is the same loop on one
process with no process group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hexicore.core import schema
from hexicore.core.emulation import Emulation

from ..checkpoint import native as checkpoint, sharded as sharded_checkpoint
from ..profile import measure
from .data_source import make_source
from ..parallel.pipeline import Executor
from ..parallel.layout import build_groups
from ..parallel.assignment import Layout
from ..checkpoint.hugging_face import SafeTensors
from .lr_schedule import OptimSchedule
from ..model.stage_module import Seeded, build_stages

METRICS_FORMAT = "hexicore.metrics/1"
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs for one run (picklable; no config, no registry)."""

    layout: Layout
    steps: int
    seed: int = 0
    dtype: str = "fp32"
    recompute: bool = False
    lr: float = 3e-4  # AdamW as Llama (Touvron et al. 2023, §2.2): betas (0.9, 0.95), eps 1e-5, decay 0.1
    eps: float = 1e-5
    weight_decay: float = 0.1
    lr_schedule: str = "constant"  # constant | linear | cosine after warmup_steps (.lr_schedule.lr_at)
    warmup_steps: int = 0
    min_lr: float = 0.0
    clip_grad: float | None = None  # max global gradient L2 norm (.grad_norm); None: no clipping
    data: str = "synthetic"
    data_file: str | None = None
    out: str | None = None
    resume: str | None = None
    init_from: str | None = None  # a Hugging Face checkpoint directory (each rank reads its slices)
    shard_bytes: int = 5 * 2**30  # final/ is sharded per stage above this many bytes
    final_extras: Any = None  # hexicore.core.hf_export.FinalExtras: token ids, generation config, tokenizer
    data_id: dict[str, Any] | None = None  # what resuming must match (data kind, file, size)
    data_checked: bool = False  # the launcher checked the token file's ids: workers do not scan it again
    checkpoint_every: int = 0
    timeout_s: float = 120.0
    backend: str = "auto"
    progress: bool = True
    plan: str | None = None
    fault: dict[str, Any] | None = None  # testing aid: {"rank": r, "step": k, "kind": "die"|"hang"}
    return_state: bool = False  # tests: rank 0 also returns the final state_dict
    emulation: tuple[Emulation, ...] = ()  # per global rank, the cluster file's emulate (test aid)
    zero: int = 0  # ZeRO stage of the plan: 1/2/3 shard the training state among each chunk's holders
    shard_weights: tuple[float, ...] | None = None  # per global rank (zero_split=memory); None: even shards
    machines: tuple[str, ...] | None = None  # per global rank, its machine: hybrid sharding (zero_scope=machine)
    predicted: dict[str, Any] | None = None  # metrics.json's "predicted" (hexicore.core.prediction), plan runs


def choose_backend(requested: str) -> str:
    """``auto``: NCCL when CUDA is available, else gloo."""
    if requested in ("auto", None):
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    return requested


def _inject_fault(spec: WorkerSpec, rank: int, step: int) -> None:
    f = spec.fault or {}
    if f.get("rank") == rank and f.get("step", 0) == step:
        if f.get("kind") == "die":
            print(f"hexicore: rank {rank}: injected fault: dying at step {step}", file=sys.stderr, flush=True)
            os._exit(13)
        if f.get("kind") == "stop":  # stopped by the OS: ignores SIGTERM, only SIGKILL ends it
            print(f"hexicore: rank {rank}: injected fault: SIGSTOP at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if f.get("kind") == "hang":
            print(f"hexicore: rank {rank}: injected fault: hanging at step {step}", file=sys.stderr, flush=True)
            time.sleep(10**6)


class _Progress:
    """Rich progress bar on rank 0 when stderr is a terminal: step, loss, tokens/s."""

    def __init__(self, enabled: bool, total: int, done: int, label: str):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                                TimeElapsedColumn(), console=Console(stderr=True))
            self.task = self.bar.add_task(label, total=total, completed=done, loss="-", tps="-")
            self.bar.start()

    def update(self, loss: float, tps: float) -> None:
        if self.bar:
            self.bar.update(self.task, advance=1, loss=f"{loss:.4f}", tps=f"{tps:,.0f}")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()


def _weights(spec: WorkerSpec, ck: dict[str, Any] | None):
    if ck:
        return checkpoint.model_source(ck)
    if spec.init_from:
        return SafeTensors.directory(spec.init_from)
    return Seeded(spec.seed)


def train(spec: WorkerSpec, rank: int, world: int, device: torch.device) -> dict[str, Any] | None:
    """Run ``spec`` on this rank; rank 0 returns ``{"metrics": ..., "state": ...}``."""
    layout = spec.layout
    groups = build_groups(layout, rank, world, zero=spec.zero, machines=spec.machines, weights=spec.shard_weights)
    role = groups.role
    ck = checkpoint.load(spec.resume) if spec.resume else None
    weights = _weights(spec, ck)
    stages, executor, optimizer, rows, blank = _build_rank(spec, groups, weights, ck, rank, device)
    _record_reads(spec, weights, rank)
    source = make_source(spec.data, vocab=layout.model.vocab, seq_len=layout.seq_len,
                         global_batch=layout.global_batch, seed=spec.seed, path=spec.data_file,
                         check_ids=not spec.data_checked)
    start = int(ck["step"]) if ck else 0
    losses = [float(x) for x in ck["losses"]][:start] if ck else []
    sched = optim_schedule(spec)
    norms = list(ck.get("grad_norms") or [None] * start)[:start] if ck else []
    if executor is not None:
        executor.clip_grad = spec.clip_grad
    step_s = [float(x) for x in ck.get("step_s", [])][:start] if ck else []
    tokens = layout.global_batch * layout.seq_len
    out = Path(spec.out) if spec.out else None
    bar = _Progress(spec.progress and rank == 0 and sys.stderr.isatty(), spec.steps, start, layout.schedule_name)
    recorder = measure.Recorder()
    measure.reset_peak(device)
    try:
        for step in range(start, spec.steps):
            _inject_fault(spec, rank, step)
            t0 = time.perf_counter()
            if executor is None:
                local = torch.zeros((), device=device)
                norms.append(None)  # an idle rank takes no part in the gradient norm
            else:
                executor.lr = sched.lr_at(step)
                local = executor.run_step(source.batch(step, *rows) if rows else blank)
                norms.append(executor.grad_norm)
            loss = local.detach().clone() if role is not None and groups.tp.rank == 0 else torch.zeros_like(local)
            if world > 1:
                dist.all_reduce(loss)
            losses.append(float(loss))
            step_s.append(time.perf_counter() - t0)
            recorder.record(executor)
            bar.update(losses[-1], tokens / step_s[-1])
            if spec.checkpoint_every and ((step + 1) % spec.checkpoint_every == 0 or step + 1 == spec.steps):
                _save_checkpoint(spec, stages, groups, optimizer, executor, step + 1, losses, step_s, out, norms)
    finally:
        bar.close()
    kept, state_bytes = _sharded_state(spec, groups, stages, optimizer, executor, world)
    summaries = measure.gather(recorder.summary(role, device), world)
    state = None
    if spec.return_state:
        got = checkpoint.gather(stages, groups.tp, optimizer, role.pipeline if role else -1, rank=rank, world=world)
        state = got[0] if got else None
    if out is not None:
        checkpoint.write_final(out / "final", stages, groups, layout, rank=rank, world=world,
                               shard_bytes=spec.shard_bytes, extras=spec.final_extras)
    if rank != 0:
        return None
    mine = step_s[start:]  # this process's steps: its first pays one-off costs (allocator, lazy imports)
    steady = mine[1:] or mine
    metrics = {"format": METRICS_FORMAT, "losses": losses,
               "tokens_per_s": tokens * len(steady) / max(sum(steady), 1e-12), "step_s": step_s, "ranks": world,
               "plan": spec.plan, "schedule": layout.schedule_name, "seed": spec.seed,
               "lr": [sched.lr_at(k) for k in range(spec.steps)], "grad_norm": norms}
    if state_bytes is not None:
        metrics["optimizer_state_bytes"] = state_bytes
    if kept is not None and any(k is not None for k in kept):
        metrics["state_bytes"] = kept
    metrics["predicted"] = spec.predicted
    metrics["measured"] = measure.measured(summaries, step_s[start:], [len(p.groups) for p in layout.pipelines],
                                           "cuda" if device.type == "cuda" else "rss")
    if out is not None:
        schema.write_text_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return {"metrics": metrics, "state": state}


def optim_schedule(spec: WorkerSpec) -> OptimSchedule:
    """The run's per-step lr and clipping (:mod:`.lr_schedule`)."""
    return OptimSchedule(lr=spec.lr, steps=spec.steps, schedule=spec.lr_schedule, warmup_steps=spec.warmup_steps,
                         min_lr=spec.min_lr, clip_grad=spec.clip_grad)


def optim_meta(spec: WorkerSpec) -> dict[str, Any]:
    """What a checkpoint records of the optimizer settings (:data:`.lr_schedule.RECORDED`)."""
    return {"lr": spec.lr, "min_lr": spec.min_lr, "lr_schedule": spec.lr_schedule, "warmup_steps": spec.warmup_steps,
            "clip_grad": spec.clip_grad, "eps": spec.eps, "weight_decay": spec.weight_decay}


def _build_rank(spec: WorkerSpec, groups, weights, ck, rank: int, device: torch.device):
    """This rank's stages, executor, optimizer, and which token rows it reads (or a blank batch)."""
    stages, executor, optimizer, rows, blank = {}, None, None, None, None
    layout, role = spec.layout, groups.role
    if role is not None:
        part = layout.pipelines[role.pipeline]
        stages = build_stages(layout.model, part, role.pipe_rank, groups.tp, full=weights, recompute=spec.recompute,
                              device=device)
        params = list({id(p): p for s in sorted(stages) for p in stages[s].module.parameters()}.values())
        if spec.zero and groups.dp is not None:  # ZeRO: the DP-synced tensors step sharded
            groups.dp.sharded = _sharded(spec, groups, stages)
            skip = groups.dp.sharded.synced()
            params = list({id(p): p for s in sorted(stages) for n, p in stages[s].module.named_parameters()
                           if (s, n) not in skip}.values())
        optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), eps=spec.eps,
                                      weight_decay=spec.weight_decay) if params else None
        if ck:
            checkpoint.restore_optimizer(optimizer, stages, groups.tp, ck)
            if groups.dp is not None and groups.dp.sharded is not None:
                sharded_checkpoint.restore(groups.dp.sharded, stages, groups.tp, ck)
        mb_rows = part.batch // part.actions.micro_batches
        executor = Executor(part, role.pipe_rank, stages, groups, optimizer=optimizer,
                            act_shape=(mb_rows, layout.seq_len, layout.model.hidden), device=device,
                            loss_scale=1.0 / (layout.global_batch * layout.seq_len),
                            autocast_dtype=AUTOCAST[spec.dtype], timeout_s=spec.timeout_s,
                            emulation=spec.emulation[rank] if rank < len(spec.emulation) else Emulation())
        if any(st.first or st.last for st in stages.values()):  # only ends of a chain read token rows
            rows = (part.offset, part.offset + part.batch)
        else:
            blank = torch.zeros((part.batch, layout.seq_len + 1), dtype=torch.long)
    return stages, executor, optimizer, rows, blank


def _sharded_state(spec: WorkerSpec, groups, stages, optimizer, executor, world: int) -> tuple[Any, Any]:
    """After the last step, collectively: every rank's kept state bytes (ZeRO-2/3 per micro-batch)
    and optimizer-state bytes (any ZeRO stage); ZeRO-3 then gathers the full weights back for
    the results (state, ``final/``)."""
    sharded = groups.dp.sharded if groups.dp is not None else None
    kept = _every(sharded.kept_bytes(stages) if hasattr(sharded, "kept_bytes") else None, world) \
        if spec.zero >= 2 else None
    if hasattr(sharded, "materialize"):
        sharded.materialize(executor._wait)
    return kept, _optimizer_bytes(groups, optimizer, world) if spec.zero else None


def _sharded(spec: WorkerSpec, groups, stages):
    """The sharded optimizer of this rank: ZeRO-2 for every layout and ZeRO-3 on one-stage or
    mirrored pipelines (:func:`.zero.zero3_runs`; hybrid too: pieces inside each machine,
    summed across machines at the step), per micro-batch (:class:`.zero.ShardedState`);
    ZeRO-1, and ZeRO-2 under hybrid sharding, at the step (:class:`.dp_sync.ShardedAdamW`)."""
    from ..parallel.data.zero import ShardedAdamW, ShardedState
    from ..parallel.assignment import zero3_runs

    adam = {"lr": spec.lr, "betas": (0.9, 0.95), "eps": spec.eps, "weight_decay": spec.weight_decay}
    if spec.zero == 3 and not zero3_runs(spec.layout):
        raise ValueError("ZeRO-3 runs only on one-stage or mirrored pipelines (zero.zero3_runs)")
    if spec.zero == 3 or (spec.zero == 2 and spec.machines is None):
        params = {(s, n): p for s in sorted(stages) for n, p in stages[s].module.named_parameters()}
        return ShardedState(groups.dp, params, stage=spec.zero, weights=spec.shard_weights, layout=spec.layout,
                            stages=stages, machines=spec.machines if spec.zero == 3 else None, **adam)
    device = next(p.device for st in stages.values() for p in st.module.parameters())
    return ShardedAdamW(groups.dp, weights=spec.shard_weights, machines=spec.machines, device=device, **adam)


def _record_reads(spec: WorkerSpec, weights: Any, rank: int) -> None:
    """``out/reads/rank_R.json``: the tensors (name, bytes) this rank read to start (checkpoint runs)."""
    reads = getattr(weights, "reads", None)
    if reads is None or not spec.out:
        return
    d = Path(spec.out) / "reads"
    d.mkdir(parents=True, exist_ok=True)
    doc = {"format": "hexicore.reads/1", "rank": rank, "tensors": [n for n, _ in reads],
           "bytes": sum(b for _, b in reads)}
    schema.write_text_atomic(d / f"rank_{rank}.json", json.dumps(doc, indent=1) + "\n")
    weights.close()


def _optimizer_bytes(groups, optimizer, world: int) -> list[int]:
    """Per rank, the bytes of optimizer state it keeps (AdamW moments, sharded or not)."""
    mine = groups.dp.sharded.state_bytes() if groups.dp is not None and groups.dp.sharded is not None else 0
    if optimizer is not None:
        mine += sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    return [int(x) for x in _every(mine, world)]


def _every(mine: Any, world: int) -> list:
    """``mine`` of every rank, in rank order (a collective over the world)."""
    if world == 1:
        return [mine]
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return every


def _save_checkpoint(spec, stages, groups, optimizer, executor, step, losses, step_s, out, norms) -> None:
    """``out/checkpoints/step_K`` (collective): ZeRO pieces are gathered into full local tensors
    first (:func:`.sharded_checkpoint.full_local`), so the files do not depend on the stage."""
    rank, world = groups.rank, groups.world
    sharded = groups.dp.sharded if groups.dp is not None else None
    full = sharded_checkpoint.full_local(sharded, stages, executor._wait) if sharded is not None else None
    got = checkpoint.gather(stages, groups.tp, optimizer, groups.role.pipeline if groups.role else -1,
                            rank=rank, world=world, sharded=full)
    if rank == 0 and out is not None:
        model, optim = got
        meta = {"step": step, "losses": list(losses), "step_s": list(step_s), "seed": spec.seed,
                "schedule": spec.layout.schedule_name, "model": spec.layout.model.to_dict(),
                "data": spec.data_id or {"kind": spec.data}, "plan": checkpoint.plan_fingerprint(spec.layout),
                "plan_file": spec.plan, "global_batch": spec.layout.global_batch, "seq_len": spec.layout.seq_len,
                "grad_norms": list(norms), "train_steps": spec.steps, **optim_meta(spec)}
        checkpoint.save(out / "checkpoints" / f"step_{step}", model, optim, meta)
