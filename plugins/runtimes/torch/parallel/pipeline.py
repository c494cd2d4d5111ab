"""Executes one rank's action list (:mod:`hexicore.pipeline.actions`) for one training step.

The runtime only follows instructions, so any schedule runs on it (the Hanayo paper's runtime):
each action's kind (:class:`~hexicore.pipeline.actions.Op`) selects its handler in
:data:`HANDLERS`, a table from kind to method as in ``torch.distributed.pipelining``'s schedule
runtime. ``F``/``B`` run a stage chunk forward/backward for a micro-batch, ``I``/``W`` split the
backward into input-gradient and weight-gradient passes (zero-bubble family), ``SEND_*``/``RECV_*``
move activations and their gradients between ranks, ``REDUCE`` sums the gradients of a stage's
replicas (Chimera), ``STEP`` syncs data-parallel gradients (:mod:`.data.sync`) and steps the optimizer.
With ``overlap`` (``train.dp_overlap``) a stage's gradient buckets are posted right after the
action that makes them final (its last ``B`` or ``W``; for a stage with replicas the ``REDUCE``
after them, :func:`final_after`) and ``STEP`` waits only for what is still in flight. Without it
the sync is HexiScale App. A's: ``STEP`` first waits (a one-element all-reduce over the plan's
ranks) until every pipeline's list has ended, so no rank's sync overlaps another's schedule and
the run is what App. A's ``max_i T_i + COMM-DP`` prices.
Gradients accumulate across micro-batches in ``.grad``; the loss of a micro-batch is scaled by
``1 / tokens of the global batch`` so the sum over micro-batches and pipelines is the global mean.

Communication: P2P goes leader to leader through ``torch.distributed.batch_isend_irecv`` and is
asynchronous. Receives are *prefetched*: the next receive of the list is posted together with the
preceding send or receive, so it overlaps the compute in between (Hanayo's runtime), unless a send
to the same peer comes first (NCCL orders a pair's operations, and a receive queued before that
send could block it). Messages carry tags naming (kind, stage, micro-batch); on a TP stage the
leader broadcasts what it received inside its TP group. Consecutive stages of a chain on the same
rank hand tensors over directly. Every wait is bounded by ``timeout_s``. Messages travel in the
training dtype (``train.dtype``: bf16/fp16 under autocast, as Megatron-LM sends them; the cost
model prices a hop at ``B_mb*S*H*B_type`` bytes) and are widened to fp32 on arrival, the dtype of
the residual stream between blocks (the parameters are fp32 master weights).
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from hexicore.core.emulation import Emulation
from hexicore.pipeline.actions import Action, Op

from ..launch.emulated_device import emulated, settle
from ..model.stage_module import StageModule
from .data import grad_norm
from .data.zero_state import ShardedOptimizer
from .layout import ParallelLayout

KIND = {Op.SEND_F: 0, Op.RECV_F: 0, Op.SEND_B: 1, Op.RECV_B: 1}  # message tag kinds: activation, gradient
SENDS, RECVS = frozenset((Op.SEND_F, Op.SEND_B)), frozenset((Op.RECV_F, Op.RECV_B))
NOT_EMULATED = Emulation()  # a communication action runs at the host's speed


class ExecutionError(RuntimeError):
    """An action failed, timed out, or the list left work undone."""


class Executor:
    """One rank's stages of one pipeline plus the state of the step being executed."""

    #: the ZeRO-sharded training state of this rank (:class:`~.data.zero_state.ShardedOptimizer`): told
    #: before and after each compute action (ZeRO-2/3 gather and free units, sum finished
    #: gradients), it steps the tensors it shards; None without ZeRO
    sharded: ShardedOptimizer | None = None

    def __init__(self, parallel: ParallelLayout, stages: dict[int, StageModule], *,
                 optimizer: torch.optim.Optimizer | None, act_shape: tuple[int, ...], device: torch.device,
                 loss_scale: float, timeout_s: float, autocast_dtype: torch.dtype | None = None,
                 emulation: Emulation = Emulation(), cast_once: bool = False, overlap: bool = False):
        self.parallel, self.stages = parallel, stages
        self.pipeline, self.pipe_rank = parallel.pipeline, parallel.pipe_rank
        self.action_list = self.pipeline.actions
        self.actions: tuple[Action, ...] = self.action_list.actions[self.pipe_rank]
        self.optimizer, self.act_shape, self.device = optimizer, act_shape, device
        self.loss_scale, self.autocast_dtype = loss_scale, autocast_dtype
        self.cast_once = cast_once  # one cast of each weight per step, shared by its micro-batches (_step_casts)
        self.wire = autocast_dtype or torch.float32  # the dtype messages travel in (module docstring)
        self.timeout = timedelta(seconds=timeout_s)
        self.leader = parallel.is_tp_leader
        self.recv_queue = [index for index, action in enumerate(self.actions)
                           if action.op in RECVS] if self.leader else []
        self.explicit_step = any(action.op is Op.STEP for action in self.actions)
        self.emulation = emulation  # emulated device speed (test aid, launch/emulated_device.py)
        self.sharded = parallel.data.sharded if parallel.data is not None else None
        self.params = {(stage, name): param for stage in sorted(stages)
                       for name, param in stages[stage].module.named_parameters()}
        self.skip = self.sharded.synced() if self.sharded is not None else set()  # ZeRO-sharded: counted by pieces
        #: action index -> local stages whose gradients are final after it (overlapped DP sync)
        self.finals = final_after(self.actions, self.pipeline.replicas, set(stages)) \
            if overlap and parallel.data is not None and parallel.data.posts_early else {}
        #: without ``overlap`` the sync is App. A's: it starts once every pipeline's list has ended
        #: (a barrier over the plan's ranks, the same condition on every one of them)
        self.sync_after_all = self.waits_for_every_pipeline(parallel, overlap)
        #: this step's learning rate (None: the optimizers' own) and max global gradient norm (None: no
        #: clipping), set by the trainer; the step's pre-clip global gradient norm after it
        self.lr: float | None = None
        self.clip_grad: float | None = None
        self.grad_norm = 0.0
        self.messages: list[tuple[str, tuple[int, int, int], float, float]] = []  # (a step's: run_step)

    # ------------------------------------------------------------- helpers
    def _tag(self, kind: int, stage: int, mb: int) -> int:
        return (kind * self.action_list.stages + stage) * (self.action_list.micro_batches + 1) + mb

    def _local(self, stage: int | None) -> bool:
        return stage is not None and self.action_list.stage_rank[stage] == self.pipe_rank

    def _peer(self, pipe_rank: int) -> int:
        """Global rank of the same TP index (REDUCE) or the leader (P2P) of a pipeline rank."""
        return self.pipeline.groups[pipe_rank].leader

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # ZeRO-3 frees each unit after its forward: autocast's cache would keep every weight's cast
        cache = self.sharded is None or not self.sharded.frees_weights
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=cache)

    def _step_casts(self):
        """One cast of each weight per step (``cast_once``, under autocast, weights kept whole: no
        ZeRO-3): a disabled autocast region held around the step's actions keeps autocast's
        nesting above zero, so the casts each forward's own region caches (leaf weights) outlive
        it and the next micro-batch's forward reuses them — every in-flight micro-batch's
        backward then holds the same cast instead of its own. Backwards run outside any enabled
        region, as before; the cache is dropped when the step's actions end (before the next
        step's forwards read updated weights). Without it each forward casts anew and keeps its
        casts for its backward (the cost model's per-forward casts,
        :mod:`hexicore.cost.block_memory`)."""
        if not self.cast_once or self.autocast_dtype is None or \
                (self.sharded is not None and self.sharded.frees_weights):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, enabled=False)

    def _wait(self, works: list, what: str) -> None:
        limit = f"{self.timeout.total_seconds():g} s"
        for work in works:
            try:
                ok = work.wait(self.timeout)
            except RuntimeError as exc:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                text = text.split("] ", 1)[-1] if text.startswith("[") else text
                if "timed out" in text.lower():
                    raise ExecutionError(f"timed out after {limit} waiting for {what} (is that rank hung?)") from None
                raise ExecutionError(f"lost the connection while waiting for {what} (did that rank die?): "
                                     f"{text.split('. ')[0]}") from None
            if ok is False:
                raise ExecutionError(f"timed out after {limit} waiting for {what} (is that rank hung?)")

    def _issue(self, ops: list[tuple[Any, Any]]) -> None:
        """Post ``(P2POp, key)`` pairs in one ``batch_isend_irecv``; remember each op's work."""
        if not ops:
            return
        works = dist.batch_isend_irecv([op for op, _ in ops]) or []
        if len(works) == len(ops):
            for (_, key), work in zip(ops, works):
                self.works[key] = [work]
        else:  # coalesced into one handle: waiting for any op waits for the batch
            for _, key in ops:
                self.works[key] = list(works)

    def _recv_ops(self, upto: int) -> list[tuple[Any, Any]]:
        """irecv ops for receive-queue entries ``[next_post, upto)`` (stops before a send to that peer)."""
        ops = []
        while self.next_post < min(upto, len(self.recv_queue)):
            index = self.recv_queue[self.next_post]
            action = self.actions[index]
            if any(later.op in SENDS and later.peer == action.peer for later in self.actions[self.pos + 1:index]):
                break
            buffer = torch.empty(self.act_shape, dtype=self.wire, device=self.device)
            self.buffers[index] = buffer
            tag = self._tag(KIND[action.op], action.stage, action.mb)
            ops.append((dist.P2POp(dist.irecv, buffer, self._peer(action.peer), tag=tag), ("recv", index)))
            self.next_post += 1
        return ops

    def _receive(self, index: int, action: Action) -> torch.Tensor:
        if self.leader:
            position = self.recv_queue.index(index, self.consumed)
            self._issue(self._recv_ops(position + 2))
            asked = time.monotonic()
            self._wait(self.works.pop(("recv", index)), f"{action} from rank {self._peer(action.peer)}")
            buffer = self.buffers.pop(index)
            self.consumed = position + 1
        else:
            buffer = torch.empty(self.act_shape, dtype=self.wire, device=self.device)
        if self.parallel.tp.size > 1:
            dist.broadcast(buffer, src=self.parallel.tp_leader, group=self.parallel.tp.group)
        if self.leader:  # (arrived once the whole TP group has it, as COMM-PP-HOP prices the hop)
            self.messages.append(("recv", (KIND[action.op], action.stage, action.mb), asked, time.monotonic()))
        return buffer.to(torch.float32)

    def _send(self, index: int, action: Action, tensor: torch.Tensor, recv_stage: int) -> None:
        if not self.leader:
            return
        tensor = tensor.detach().to(self.wire).contiguous()
        tag = self._tag(KIND[action.op], recv_stage, action.mb)
        op = dist.P2POp(dist.isend, tensor, self._peer(action.peer), tag=tag)
        self.pending_sends.append(tensor)
        posted = time.monotonic()
        self.messages.append(("send", (KIND[action.op], recv_stage, action.mb), posted, posted))
        self._issue([(op, ("send", index))] + self._recv_ops(self.consumed + 1))

    # -------------------------------------------------------------- compute
    def _micro(self, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        # this pipeline's own rows, or the global batch
        offset = 0 if self.tokens.shape[0] == self.pipeline.batch else self.pipeline.offset
        first_row = offset + mb * self.pipeline.batch // self.action_list.micro_batches
        rows = self.tokens[first_row: first_row + self.pipeline.batch // self.action_list.micro_batches]
        return rows[:, :-1], rows[:, 1:]

    def _forward(self, stage: StageModule, mb: int) -> None:
        index = stage.index
        if stage.first:
            activation = self._micro(mb)[0]
        else:
            prev = self.action_list.prev_stage(index, mb)
            if self._local(prev):
                activation = self.outputs[(prev, mb)].detach().requires_grad_()
            elif (index, mb) in self.inputs:
                activation = self.inputs[(index, mb)]
            else:
                raise ExecutionError(f"F{mb} of stage {index} has no input: no RECV_F before it")
        self.inputs[(index, mb)] = activation
        with self._autocast():
            out = stage.module(activation, self._micro(mb)[1] if stage.last else None, self.loss_scale)
        self.outputs[(index, mb)] = out
        if stage.last:
            self.loss += out.detach().float()

    def _out_grad(self, stage: StageModule, mb: int) -> torch.Tensor | None:
        if stage.last:
            return None
        following = self.action_list.next_stage(stage.index, mb)
        store = self.in_grads if self._local(following) else self.out_grads
        key = (following, mb) if self._local(following) else (stage.index, mb)
        if key not in store:
            raise ExecutionError(f"backward of stage {stage.index} mb {mb} has no output gradient "
                                 f"({'B/I of stage ' + str(following) if self._local(following) else 'RECV_B'} "
                                 "missing before it)")
        return store.pop(key)

    def _backward(self, stage: StageModule, mb: int, op: str) -> None:
        key = (stage.index, mb)
        if op is Op.W and key in self.deferred:
            out, grad = self.deferred.pop(key)
        else:
            if key not in self.outputs:
                raise ExecutionError(f"{op}{mb} of stage {stage.index} before its forward")
            out, grad = self.outputs.pop(key), self._out_grad(stage, mb)
        if op is Op.B:
            torch.autograd.backward(out, grad)
            activation = self.inputs.pop(key)
            if not stage.first:
                self.in_grads[key] = activation.grad
        elif op is Op.I:
            activation = self.inputs.pop(key)
            if not stage.first:
                (self.in_grads[key],) = torch.autograd.grad(out, activation, grad, retain_graph=True)
            self.deferred[key] = (out, grad)
        else:  # W
            self.inputs.pop(key, None)
            params = [param for param in stage.module.parameters() if param.requires_grad]
            torch.autograd.backward(out, grad, inputs=params)

    # ---------------------------------------------------------- grad syncs
    def _flat_grads(self, stage: StageModule) -> torch.Tensor:
        return torch.cat([(param.grad if param.grad is not None else torch.zeros_like(param)).reshape(-1)
                          for param in stage.module.parameters()])

    def _set_grads(self, stage: StageModule, flat: torch.Tensor) -> None:
        at = 0
        for param in stage.module.parameters():
            count = param.numel()
            param.grad = flat[at: at + count].view_as(param).clone()
            at += count

    def _reduce(self, stage: int) -> None:
        """Sum the gradients of ``stage``'s replicas, in chain order, identically on every holder."""
        replicas = self.pipeline.replicas(stage)
        if len(replicas) == 1 or stage in self.reduced:
            return
        local = {replica: self._flat_grads(self.stages[replica]) for replica in replicas if self._local(replica)}
        tp_rank = self.parallel.tp.rank
        ops, remote = [], {}
        for replica in replicas:
            if self._local(replica):
                continue
            peer = self.pipeline.groups[self.action_list.stage_rank[replica]].ranks[tp_rank]
            remote[replica] = torch.empty_like(next(iter(local.values())))
            ops.append(dist.P2POp(dist.irecv, remote[replica], peer,
                                  tag=self._tag(2, replica, self.action_list.micro_batches)))
            for mine, grad in local.items():
                ops.append(dist.P2POp(dist.isend, grad, peer, tag=self._tag(2, mine, self.action_list.micro_batches)))
        if ops:
            self._wait(dist.batch_isend_irecv(ops) or [], f"REDUCE of stage {stage} with replicas {list(replicas)}")
        total = None
        for replica in replicas:
            grad = local[replica] if replica in local else remote[replica]
            total = grad.clone() if total is None else total + grad
        for replica in local:
            self._set_grads(self.stages[replica], total)
            self.reduced.add(replica)

    @staticmethod
    def waits_for_every_pipeline(parallel: ParallelLayout, overlap: bool) -> bool:
        """Whether ``STEP`` first waits for every rank of the plan (App. A's sync, without
        ``overlap``): only where there is a sync across pipelines; alike on every rank."""
        return not overlap and len(parallel.assignment.pipelines) > 1 and parallel.norm_ranks > 1

    def _step(self) -> None:
        settle(self.device)  # the step's queued compute is not the sync's
        started = time.perf_counter()
        if self.sync_after_all:  # App. A's step: no rank syncs before the slowest pipeline ends
            dist.all_reduce(torch.zeros(1, device=self.device), group=self.parallel.norm_group)
        for stage in sorted(self.stages):
            self._reduce(stage)
        # asymmetric DP: chunked all-reduce among each chunk's holders (ZeRO: pieces)
        if self.parallel.data is not None:
            self.parallel.data.run(self.params, self._wait)
        # tied embedding copies on other ranks: one summed gradient (after the DP sync, whose ZeRO-3
        # rounds may still need this rank)
        if self.parallel.tied is not None:
            self.parallel.tied.run(self.stages, self._wait)
        self._update()
        self.stepped = True
        settle(self.device)
        self.sync_s += time.perf_counter() - started

    def _update(self) -> None:
        """The global gradient norm (one scalar all-reduce over the used ranks, :mod:`.data.grad_norm`),
        then every optimizer's update at this step's ``lr``, gradients scaled by the clip
        coefficient; the plain AdamW's step is device compute, emulated like an action."""
        sharded = self.sharded
        local = grad_norm.squares(grad_norm.counted(self.stages, self.parallel.tp.rank, self.pipeline.index, self.skip),
                                  self.device)
        if sharded is not None:
            local += sharded.sq_norm(self.device)
        self.grad_norm = grad_norm.global_norm(local, self.parallel.norm_ranks, self.parallel.norm_group)
        coef = grad_norm.coefficient(self.grad_norm, self.clip_grad)
        if sharded is not None:
            sharded.apply(self.params, self._wait, lr=self.lr, coef=coef)
        if self.optimizer is not None:
            with emulated(self.emulation, self.device):
                grad_norm.step_plain(self.optimizer, self.lr, coef)

    # ----------------------------------------------------------------- run
    def run_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Execute the whole list on ``tokens``: this pipeline's rows ``[batch, seq_len + 1]`` (rows
        ``[offset, offset + batch)`` of the global batch) or the global batch; return this rank's
        share of the loss (scaled, summed over the micro-batches of its last stages)."""
        self.tokens = tokens.to(self.device)
        self.loss = torch.zeros((), dtype=torch.float32, device=self.device)
        self.inputs, self.outputs, self.in_grads, self.out_grads, self.deferred = {}, {}, {}, {}, {}
        self.works, self.buffers, self.pending_sends, self.reduced = {}, {}, [], set()
        self.next_post = self.consumed = 0
        self.pos = -1
        self.final: set[int] = set()  # local stages whose gradients are final (overlapped DP sync)
        if self.parallel.data is not None:
            self.parallel.data.begin()
        self.stepped = False
        self._issue(self._recv_ops(1))
        self.timeline = []  # (op, stage, mb, start, end) of compute actions, seconds from step start
        #: the leader's messages of the step: ``(side, (kind, receiving stage, mb), asked, done)``
        #: on the host's one clock (``time.monotonic``): a send when posted, a receive from when this
        #: rank waited for it to when its TP group has it (the leader's broadcast included:
        #: :func:`~..profile.measure.hop_times` pairs them)
        self.messages: list[tuple[str, tuple[int, int, int], float, float]] = []
        self.sync_s, events = 0.0, []  # seconds in _step (DP sync + optimizer); CUDA events of compute
        started = time.perf_counter()
        with self._step_casts():
            self._run_actions(started, events)
        self._wait([work for key, pending in list(self.works.items()) if key[0] == "send" for work in pending],
                   "outstanding sends")
        leftovers = [key for key in self.works if key[0] == "recv"] + list(self.outputs) + list(self.deferred)
        if leftovers:
            raise ExecutionError(f"the action list left work undone: {leftovers[:4]}")
        if not self.explicit_step:
            self._step()
        settle(self.device)
        #: this step's wall seconds without the DP sync and optimizer step (the schedule's part)
        self.schedule_s = time.perf_counter() - started - self.sync_s
        #: (op, stage, mb, seconds) of each compute action: device time on CUDA, wall time on CPU
        self.passes = [(op, stage, mb, (event_pair[0].elapsed_time(event_pair[1]) / 1e3) if events else end - begin)
                       for (op, stage, mb, begin, end), event_pair
                       in zip(self.timeline, events or [()] * len(self.timeline))]
        self.tokens = None
        return self.loss

    def _run_actions(self, started: float, events: list) -> None:
        """Every action of the list in order, each timed into ``self.timeline`` (``events``: CUDA
        events of the compute actions)."""
        for index, action in enumerate(self.actions):
            self.pos = index
            begin = time.perf_counter() - started
            if action.is_compute and self.device.type == "cuda":
                events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                events[-1][0].record()
            try:
                with emulated(self.emulation if action.is_compute else NOT_EMULATED, self.device):
                    self._execute(index, action)
            except ExecutionError as exc:
                raise ExecutionError(f"action {index} ({action}): {exc}") from None
            if action.is_compute:
                if events:
                    events[-1][1].record()
                self.timeline.append((action.op, action.stage, action.mb, begin, time.perf_counter() - started))
            if index in self.finals:
                self.final |= self.finals[index]
                self.parallel.data.ready(self.params, self.final)

    def _execute(self, index: int, action: Action) -> None:
        handler = HANDLERS.get(action.op)
        if handler is None:
            raise ExecutionError(f"this runtime has no handler for {action.op.value!r} actions")
        handler(self, index, action)

    # ------------------------------------------------------------ handlers
    def _on_forward(self, index: int, action: Action) -> None:
        sharded = self.sharded
        if sharded is not None:
            sharded.before(action, self._wait)
        self._forward(self.stages[action.stage], action.mb)
        if sharded is not None:
            sharded.after(action, self._wait)

    def _on_backward(self, index: int, action: Action) -> None:  # B, I, W
        sharded = self.sharded
        if sharded is not None:
            sharded.before(action, self._wait)
        self._backward(self.stages[action.stage], action.mb, action.op)
        if sharded is not None:
            sharded.after(action, self._wait)

    def _on_recv_f(self, index: int, action: Action) -> None:
        self.inputs[(action.stage, action.mb)] = self._receive(index, action).requires_grad_()

    def _on_recv_b(self, index: int, action: Action) -> None:
        self.out_grads[(action.stage, action.mb)] = self._receive(index, action)

    def _on_send_f(self, index: int, action: Action) -> None:
        receiver = self.action_list.next_stage(action.stage, action.mb)
        self._send(index, action, self.outputs[(action.stage, action.mb)], receiver)

    def _on_send_b(self, index: int, action: Action) -> None:
        if (action.stage, action.mb) not in self.in_grads:
            raise ExecutionError("SEND_B before the input gradient was computed (B or I)")
        receiver = self.action_list.prev_stage(action.stage, action.mb)
        self._send(index, action, self.in_grads.pop((action.stage, action.mb)), receiver)

    def _on_reduce(self, index: int, action: Action) -> None:
        self._reduce(action.stage)

    def _on_step(self, index: int, action: Action) -> None:
        self._step()


def final_after(actions: tuple[Action, ...], replicas: Callable[[int], tuple[int, ...]],
                stages: set[int]) -> dict[int, frozenset[int]]:
    """Index in ``actions`` -> the local ``stages`` whose gradients are final once it has run:
    a stage's last ``B`` or ``W``; a stage with replicas (Chimera) the first ``REDUCE`` of it
    after every local replica's last one (``REDUCE`` sums the replicas' gradients). A replicated
    stage without such a ``REDUCE`` is reduced at ``STEP``: not in the map."""
    last = {}
    for index, action in enumerate(actions):
        if action.op in (Op.B, Op.W) and action.stage in stages:
            last[action.stage] = index
    out: dict[int, set[int]] = {}
    for stage, index in last.items():
        copies = [r for r in replicas(stage) if r in stages]
        if len(replicas(stage)) > 1:
            after = max(last.get(r, -1) for r in copies)
            index = next((k for k, action in enumerate(actions) if k > after and action.op is Op.REDUCE
                          and stage in replicas(action.stage)), None)
            if index is None:
                continue
        out.setdefault(index, set()).add(stage)
    return {index: frozenset(found) for index, found in out.items()}


#: Action kind -> handler ``(executor, index in the list, action)``; one entry per
#: :class:`~hexicore.pipeline.actions.Op`.
HANDLERS: Mapping[Op, Callable[[Executor, int, Action], None]] = MappingProxyType({
    Op.F: Executor._on_forward, Op.B: Executor._on_backward, Op.I: Executor._on_backward,
    Op.W: Executor._on_backward, Op.SEND_F: Executor._on_send_f, Op.RECV_F: Executor._on_recv_f,
    Op.SEND_B: Executor._on_send_b, Op.RECV_B: Executor._on_recv_b, Op.REDUCE: Executor._on_reduce,
    Op.STEP: Executor._on_step,
})
