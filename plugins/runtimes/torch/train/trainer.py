"""The training loop of one rank: build its stages, run the steps, checkpoint, report.

A :class:`Trainer` builds the rank's :class:`~..parallel.layout.ParallelLayout` once, its
parallelised stage chunks and executor (:func:`~..parallel.parallelize.parallelize`), and advances
a :class:`TrainState` (step, losses, step times, gradient norms, optimizer) that checkpoints record.
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
from hexicore.core.emulation import EmulatedLinks, Emulation
from hexicore.core.settings import (CheckpointSettings, DataSettings, OptimizerSettings, OutputSettings,
                                    TrainSettings)

from ..checkpoint import native as checkpoint, sharded as sharded_checkpoint
from ..checkpoint.hugging_face import SafeTensors
from ..launch.settings import LaunchSettings
from .metric_log import MetricLog
from ..model.stage_module import Seeded
from ..parallel.assignment import RankAssignment
from ..parallel.layout import ParallelLayout
from ..parallel.parallelize import parallelize
from ..parallel.pipeline import Executor
from ..profile import measure
from .data_source import make_source
from .lr_schedule import OptimSchedule

METRICS_FORMAT = "hexicore.metrics/1"
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs for one run (picklable; no config, no registry): the run's
    settings objects as the app and the runtime resolved them — ``train``
    (:class:`~hexicore.core.settings.TrainSettings`: steps, seed, dtype, recomputation; the
    batch and sequence length that run are the layout's), ``optimizer``, ``data``,
    ``checkpoint`` (``resume`` resolved to a checkpoint folder, ``init_from`` checked, None when
    resuming), ``output`` and ``launch`` (:class:`~..launch.settings.LaunchSettings`) — and what
    only the worker needs: the ``layout`` with its built action lists, the data source's
    identity (``data_id``: what resuming must match; ``data_checked``: the launcher checked the
    token file's ids, workers do not scan it again), ``final_extras`` (token ids, generation
    config, tokenizer for ``final/``: :class:`hexicore.core.hf_export.FinalExtras`), the plan
    file, the plan's ZeRO stage ``zero`` (1/2/3 shard the training state among each chunk's
    holders), per global rank ``shard_weights`` (``zero_split=memory``; None: even shards),
    ``machines`` (hybrid sharding, ``zero_scope=machine``), ``emulation`` (the cluster
    file's ``emulate`` per rank, a test aid) and ``links`` (its ``emulate: {links: true}``: the
    links every transfer is held to; None: the host's own), metrics.json's ``predicted``, and ``return_state`` (tests:
    rank 0 also returns the final state_dict)."""

    layout: RankAssignment
    train: TrainSettings
    optimizer: OptimizerSettings = OptimizerSettings()
    data: DataSettings = DataSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    output: OutputSettings = OutputSettings()
    launch: LaunchSettings = LaunchSettings()
    data_id: dict[str, Any] | None = None
    data_checked: bool = False
    final_extras: Any = None
    plan: str | None = None
    zero: int = 0
    shard_weights: tuple[float, ...] | None = None
    machines: tuple[str, ...] | None = None
    emulation: tuple[Emulation, ...] = ()
    links: EmulatedLinks | None = None
    predicted: dict[str, Any] | None = None
    return_state: bool = False


def choose_backend(requested: str) -> str:
    """``auto``: NCCL when CUDA is available, else gloo."""
    if requested in ("auto", None):
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    return requested


def _inject_fault(spec: WorkerSpec, rank: int, step: int) -> None:
    fault = spec.launch.fault or {}
    if fault.get("rank") == rank and fault.get("step", 0) == step:
        if fault.get("kind") == "die":
            print(f"hexicore: rank {rank}: injected fault: dying at step {step}", file=sys.stderr, flush=True)
            os._exit(13)
        if fault.get("kind") == "stop":  # stopped by the OS: ignores SIGTERM, only SIGKILL ends it
            print(f"hexicore: rank {rank}: injected fault: SIGSTOP at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if fault.get("kind") == "hang":
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


def _weights(spec: WorkerSpec, resumed: dict[str, Any] | None):
    if resumed:
        return checkpoint.model_source(resumed)
    if spec.checkpoint.init_from:
        return SafeTensors.directory(spec.checkpoint.init_from)
    return Seeded(spec.train.seed)


@dataclass
class TrainState:
    """What one rank's run has done and carries from step to step (and into checkpoints):
    ``step``, the steps done; per step the summed ``losses``, wall seconds (``step_s``) and global
    gradient norms (``grad_norms``; None on an idle rank); the plain AdamW's ``optimizer`` (None
    where every tensor is ZeRO-sharded or the rank is idle). The data position is the step:
    step ``k`` reads batch ``k`` of the data source (:meth:`.data_source.SyntheticTokens.batch`)."""

    step: int
    losses: list[float]
    step_s: list[float]
    grad_norms: list[float | None]
    optimizer: torch.optim.Optimizer | None

    @property
    def data_position(self) -> int:
        """The batch the next step reads."""
        return self.step

    @classmethod
    def begin(cls, resumed: dict[str, Any] | None, optimizer: torch.optim.Optimizer | None) -> "TrainState":
        """A fresh run at step 0, or the state a checkpoint ``resumed``
        (:func:`..checkpoint.native.load`) recorded."""
        if not resumed:
            return cls(0, [], [], [], optimizer)
        start = int(resumed["step"])
        losses = [float(value) for value in resumed["losses"]][:start]
        step_s = [float(value) for value in resumed.get("step_s", [])][:start]
        return cls(start, losses, step_s, list(resumed.get("grad_norms") or [None] * start)[:start], optimizer)


class Trainer:
    """The training loop of one rank: its :class:`~..parallel.layout.ParallelLayout` (built once),
    its parallelised stage chunks and executor (:func:`~..parallel.parallelize.parallelize`), the
    data source, and the :class:`TrainState` it advances; :meth:`run` trains and reports."""

    def __init__(self, spec: WorkerSpec, rank: int, world: int, device: torch.device):
        self.spec, self.rank, self.world, self.device = spec, rank, world, device
        layout = spec.layout
        self.parallel = ParallelLayout.build(layout, rank, world, zero=spec.zero, machines=spec.machines,
                                             shard_weights=spec.shard_weights)
        resumed = checkpoint.load(spec.checkpoint.resume) if spec.checkpoint.resume else None
        weights = _weights(spec, resumed)
        self.stages, self.executor, optimizer, self.rows, self.blank = _build_rank(spec, self.parallel, weights,
                                                                                   resumed, device)
        self.reads = _reads_record(spec, weights, rank)  # written once every rank has started (run)
        self.source = make_source(spec.data.kind, vocab=layout.model.vocab, seq_len=layout.seq_len,
                                  global_batch=layout.global_batch, seed=spec.train.seed, path=spec.data.file,
                                  check_ids=not spec.data_checked)
        self.state = TrainState.begin(resumed, optimizer)
        self.start = self.state.step
        self.schedule = OptimSchedule(spec.optimizer, spec.train.steps)
        if self.executor is not None:
            self.executor.clip_grad = spec.optimizer.clip_grad
        self.tokens = layout.global_batch * layout.seq_len
        self.out = Path(spec.output.out) if spec.output.out else None
        self.log = MetricLog(spec.launch.log if rank == 0 else "none", self.out,
                             {"schedule": layout.schedule_name, "ranks": world, "seed": spec.train.seed,
                              "global_batch": layout.global_batch, "seq_len": layout.seq_len,
                              **spec.optimizer.recorded()})

    def run(self) -> dict[str, Any] | None:
        """Train the steps left; rank 0 returns ``{"metrics": ..., "state": ...}``."""
        spec, state = self.spec, self.state
        steps, every = spec.train.steps, spec.checkpoint.every
        bar = _Progress(spec.launch.progress and self.rank == 0 and sys.stderr.isatty(), steps, self.start,
                        spec.layout.schedule_name)
        recorder = measure.Recorder()
        measure.reset_peak(self.device)
        try:
            for step in range(self.start, steps):
                self.train_step(step)
                self._write_reads()  # past the first step's collectives: every rank loaded its weights
                recorder.record(self.executor)
                bar.update(state.losses[-1], self.tokens / state.step_s[-1])
                self.log.step(step, loss=state.losses[-1], lr=self.schedule.lr_at(step),
                              grad_norm=state.grad_norms[-1], tokens_per_s=self.tokens / state.step_s[-1],
                              step_s=state.step_s[-1])
                if every and ((step + 1) % every == 0 or step + 1 == steps):
                    self.save_checkpoint()
        except BaseException:
            self.log.close()
            raise
        finally:
            bar.close()
        self._write_reads()
        result = self._finish(recorder)
        self.log.finish(result["metrics"] if result else None, steps)
        return result

    def _write_reads(self) -> None:
        """``out/reads/rank_R.json`` (:func:`_reads_record`), once: only a run whose every rank
        started writes it (a rank refusing its weights leaves nothing behind)."""
        if self.reads is not None and self.out is not None:
            folder = self.out / "reads"
            folder.mkdir(parents=True, exist_ok=True)
            schema.write_text_atomic(folder / f"rank_{self.rank}.json", json.dumps(self.reads, indent=1) + "\n")
        self.reads = None

    def train_step(self, step: int) -> None:
        """One step: the executor runs the action list (an idle rank adds nothing); the loss is
        summed over the ranks; the state records loss, wall seconds and gradient norm. The loss's
        all-reduce ends the step: its seconds count in the executor's step-end sync
        (``Executor.sync_s``), as the cost model's COMM-DP term holds it (the profile's per-step
        overhead, the loss and norm all-reduces)."""
        spec, state, executor = self.spec, self.state, self.executor
        _inject_fault(spec, self.rank, step)
        started = time.perf_counter()
        if executor is None:
            local = torch.zeros((), device=self.device)
            state.grad_norms.append(None)  # an idle rank takes no part in the gradient norm
        else:
            executor.lr = self.schedule.lr_at(step)
            local = executor.run_step(self.source.batch(step, *self.rows) if self.rows else self.blank)
            state.grad_norms.append(executor.grad_norm)
        reports = self.parallel.role is not None and self.parallel.tp.rank == 0
        loss = local.detach().clone() if reports else torch.zeros_like(local)
        if self.world > 1:
            began = time.perf_counter()
            dist.all_reduce(loss)
            if executor is not None:
                executor.sync_s += time.perf_counter() - began
        state.losses.append(float(loss))
        state.step_s.append(time.perf_counter() - started)
        state.step = step + 1

    def _finish(self, recorder: Any) -> dict[str, Any] | None:
        """After the last step (collective): sharded-state sizes, measurements, the final state and
        ``final/``; rank 0 returns the metrics (``metrics.json``)."""
        spec, state, parallel, world = self.spec, self.state, self.parallel, self.world
        layout = spec.layout
        kept, state_bytes = _sharded_state(spec, parallel, self.stages, state.optimizer, self.executor, world)
        summaries = measure.gather(recorder.summary(parallel.role, self.device), world)
        final = None
        if spec.return_state:
            got = checkpoint.gather(self.stages, parallel.tp, state.optimizer,
                                    parallel.role.pipeline if parallel.role else -1, rank=self.rank, world=world)
            final = got[0] if got else None
        if self.out is not None:
            checkpoint.write_final(self.out / "final", self.stages, parallel, shard_bytes=spec.checkpoint.shard_bytes,
                                   extras=spec.final_extras)
        if self.rank != 0:
            return None
        step_s = state.step_s
        mine = step_s[self.start:]  # this process's steps: its first pays one-off costs (allocator, lazy imports)
        steady = mine[1:] or mine
        metrics = {"format": METRICS_FORMAT, "losses": state.losses,
                   "tokens_per_s": self.tokens * len(steady) / max(sum(steady), 1e-12), "step_s": step_s,
                   "ranks": world, "plan": spec.plan, "schedule": layout.schedule_name, "seed": spec.train.seed,
                   "lr": [self.schedule.lr_at(step) for step in range(spec.train.steps)],
                   "grad_norm": state.grad_norms}
        if state_bytes is not None:
            metrics["optimizer_state_bytes"] = state_bytes
        if kept is not None and any(kept_by_rank is not None for kept_by_rank in kept):
            metrics["state_bytes"] = kept
        metrics["predicted"] = spec.predicted
        metrics["measured"] = measure.measured(summaries, step_s[self.start:],
                                               [len(part.groups) for part in layout.pipelines],
                                               "cuda" if self.device.type == "cuda" else "rss")
        if self.out is not None:
            schema.write_text_atomic(self.out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
        return {"metrics": metrics, "state": final}

    def save_checkpoint(self) -> None:
        """``out/checkpoints/step_K`` of the state (collective): ZeRO pieces are gathered into full
        local tensors first (:func:`..checkpoint.sharded.full_local`), so the files do not depend on
        the stage."""
        spec, state, parallel = self.spec, self.state, self.parallel
        rank, world = parallel.rank, parallel.world
        sharded = parallel.data.sharded if parallel.data is not None else None
        full = sharded_checkpoint.full_local(sharded, self.stages, self.executor._wait) if sharded is not None else None
        pipeline = parallel.role.pipeline if parallel.role else -1
        got = checkpoint.gather(self.stages, parallel.tp, state.optimizer, pipeline, rank=rank, world=world,
                                sharded=full)
        if rank == 0 and self.out is not None:
            model, optim = got
            meta = {"step": state.step, "losses": list(state.losses), "step_s": list(state.step_s),
                    "seed": spec.train.seed, "schedule": spec.layout.schedule_name, "model": spec.layout.model.to_dict(),
                    "data": spec.data_id or {"kind": spec.data.kind}, "plan": checkpoint.plan_fingerprint(spec.layout),
                    "plan_file": spec.plan, "global_batch": spec.layout.global_batch, "seq_len": spec.layout.seq_len,
                    "grad_norms": list(state.grad_norms), "train_steps": spec.train.steps,
                    **spec.optimizer.recorded()}
            checkpoint.save(self.out / "checkpoints" / f"step_{state.step}", model, optim, meta)


def train(spec: WorkerSpec, rank: int, world: int, device: torch.device) -> dict[str, Any] | None:
    """Run ``spec`` on this rank (:class:`Trainer`); rank 0 returns ``{"metrics": ..., "state": ...}``."""
    return Trainer(spec, rank, world, device).run()


def plain_adamw(params: list, adam: Any, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the tensors ZeRO does not shard (``adam``: lr, betas, eps, weight decay): torch's
    fused kernel on CUDA (one launch for every tensor), its default elsewhere (on CPU the fused
    kernel rounds differently, ~1e-10 off the default after a few steps, and gains little)."""
    return torch.optim.AdamW(params, lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay,
                             fused=True if device.type == "cuda" else None)


def _build_rank(spec: WorkerSpec, parallel: ParallelLayout, weights, resumed, device: torch.device):
    """This rank's stages (:func:`~..parallel.parallelize.parallelize`), executor, plain AdamW over
    the tensors ZeRO does not shard (restored from ``ck``, as the sharded state), and which token
    rows it reads (or a blank batch)."""
    stages, executor, optimizer, rows, blank = {}, None, None, None, None
    layout, part = spec.layout, parallel.pipeline
    if part is not None:
        adam = spec.optimizer
        stages, sharded = parallelize(parallel, weights=weights, recompute=spec.train.recompute, device=device,
                                      optimizer=adam, compile=spec.launch.compile)
        skip = sharded.synced() if sharded is not None else set()
        params = list({id(param): param for index in sorted(stages)
                       for name, param in stages[index].module.named_parameters()
                       if (index, name) not in skip}.values())
        optimizer = plain_adamw(params, adam, device) if params else None
        if resumed:
            checkpoint.restore_optimizer(optimizer, stages, parallel.tp, resumed)
            if sharded is not None:
                sharded_checkpoint.restore(sharded, stages, parallel.tp, resumed)
        mb_rows = part.batch // part.actions.micro_batches
        rank = parallel.rank
        executor = Executor(parallel, stages, optimizer=optimizer,
                            act_shape=(mb_rows, layout.seq_len, layout.model.hidden), device=device,
                            loss_scale=1.0 / (layout.global_batch * layout.seq_len),
                            autocast_dtype=AUTOCAST[spec.train.dtype], timeout_s=spec.launch.timeout_s,
                            emulation=spec.emulation[rank] if rank < len(spec.emulation) else Emulation(),
                            cast_once=not spec.train.recompute, overlap=spec.train.dp_overlap)
        if any(stage.first or stage.last for stage in stages.values()):  # only ends of a chain read token rows
            rows = (part.offset, part.offset + part.batch)
        else:
            blank = torch.zeros((part.batch, layout.seq_len + 1), dtype=torch.long)
    return stages, executor, optimizer, rows, blank


def _sharded_state(spec: WorkerSpec, parallel: ParallelLayout, stages, optimizer, executor,
                   world: int) -> tuple[Any, Any]:
    """After the last step, collectively: every rank's kept state bytes (ZeRO-2/3 per micro-batch)
    and optimizer-state bytes (any ZeRO stage); ZeRO-3 then gathers the full weights back for
    the results (state, ``final/``)."""
    sharded = parallel.data.sharded if parallel.data is not None else None
    kept = _every(sharded.kept_bytes(stages) if sharded is not None else None, world) if spec.zero >= 2 else None
    if sharded is not None:
        sharded.materialize(executor._wait)
    return kept, _optimizer_bytes(parallel, optimizer, world) if spec.zero else None


def _reads_record(spec: WorkerSpec, weights: Any, rank: int) -> dict | None:
    """The record ``out/reads/rank_R.json`` gets (:meth:`Trainer._write_reads`): the tensors
    (name, bytes) this rank read to start (checkpoint runs); the source is closed. None where
    nothing was read from a file or there is no ``out``."""
    reads = getattr(weights, "reads", None)
    if reads is None or not spec.output.out:
        return None
    weights.close()
    return {"format": "hexicore.reads/1", "rank": rank, "tensors": [n for n, _ in reads],
            "bytes": sum(b for _, b in reads)}


def _optimizer_bytes(parallel: ParallelLayout, optimizer, world: int) -> list[int]:
    """Per rank, the bytes of optimizer state it keeps (AdamW moments, sharded or not)."""
    sharded = parallel.data.sharded if parallel.data is not None else None
    mine = sharded.state_bytes() if sharded is not None else 0
    if optimizer is not None:
        mine += sum(value.numel() * value.element_size() for moments in optimizer.state.values()
                    for value in moments.values()
                    if torch.is_tensor(value) and value.dim() > 0)
    return [int(x) for x in _every(mine, world)]


def _every(mine: Any, world: int) -> list:
    """``mine`` of every rank, in rank order (a collective over the world)."""
    if world == 1:
        return [mine]
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return every
