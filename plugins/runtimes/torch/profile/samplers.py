"""One sample at a time of each ``hexicore profile`` measurement (:mod:`.profiler` drives them).

Each ``*_samples`` function is a generator: it builds what it times once, then yields one sample
per ``next()``, so :func:`.profiler.run_worker` can interleave the repeats of every measurement.
Compute goes through :func:`..launch.emulated_device.emulated` as the executor's compute actions do.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from hexicore.core.emulation import Emulation
from hexicore.core.settings import OptimizerSettings

from ..launch.emulated_device import emulated, settle
from ..model.llama import Block, LlamaChunk, rope_tables
from ..parallel.tensor import TPGroup
from ..train.trainer import plain_adamw

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _init(module: torch.nn.Module, seed: int) -> None:
    """Small seeded weights (norms stay 1): parameters made with ``torch.empty`` hold garbage."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def _autocast(job: Any, device: torch.device):
    import contextlib

    dt = AUTOCAST[job.dtype]
    return contextlib.nullcontext() if dt is None else torch.autocast(device.type, dtype=dt)


def _timed(fn: Any, emulation: Emulation, device: torch.device) -> tuple[Any, float]:
    """``fn()`` emulated as the executor emulates a compute action; (result, wall seconds)."""
    settle(device)
    t0 = time.perf_counter()
    with emulated(emulation, device):
        out = fn()
    settle(device)
    return out, time.perf_counter() - t0


def block_samples(job: Any, t: Any, rank: int, device: torch.device, group: Any) -> Iterator[tuple]:
    """(forward, backward, recompute seconds, activation bytes, optimizer-step seconds, the
    action share) of one block, one sample per step. Recompute is what activation recomputation
    adds to a backward as the runtime runs it: the backward of the block under
    ``torch.utils.checkpoint`` minus the plain backward (the recomputation stops once the saved
    tensors backward needs are rebuilt, so it skips the block's last products, e.g. the MLP's
    down projection: less than a forward). The optimizer step is the trainer's AdamW +
    ``zero_grad`` over the block's parameters on this rank; the action share, from a chain of two
    blocks in one action timed right after the single block, gives one action's fixed cost
    (:func:`action_share`)."""
    spec, slow = job.model, job.devices[rank][3]
    tp = TPGroup(t.ranks.index(rank), len(t.ranks), group)
    block = Block(spec, tp).to(device)
    _init(block, job.seed + tp.rank)
    cos, sin = (x.to(device) for x in rope_tables(job.seq_len, spec.head_dim, spec.rope_theta, dict(spec.rope_scaling)))
    gen = torch.Generator().manual_seed(job.seed)
    x = (torch.randn(t.micro_batch, job.seq_len, spec.hidden, generator=gen) * 0.1).to(device).requires_grad_()
    grad = (torch.randn(t.micro_batch, job.seq_len, spec.hidden, generator=gen) * 1e-3).to(device)
    act = activation_bytes(block, x, cos, sin, job, device)
    second = Block(spec, tp).to(device)  # a chain of two blocks: one action's fixed cost
    _init(second, job.seed + tp.rank + 1)
    # the trainer's AdamW (fused on CUDA, :func:`~..train.trainer.plain_adamw`), at an lr too small to move the weights
    optim = plain_adamw(list(block.parameters()), replace(OptimizerSettings(), lr=1e-12), device)

    def step() -> None:
        optim.step()
        optim.zero_grad(set_to_none=True)

    while True:
        with _autocast(job, device):
            y, fwd = _timed(lambda: block(x, cos, sin), slow, device)
        _, bwd = _timed(lambda: y.backward(grad), slow, device)
        with _autocast(job, device):  # as the runtime recomputes: the block checkpointed, untimed forward
            again = checkpoint(block, x, cos, sin, use_reentrant=False)
        _, bwd_again = _timed(lambda: again.backward(grad), slow, device)
        rec = max(bwd_again - bwd, 0.0)  # what recomputation adds to a backward
        with _autocast(job, device):
            two, fwd2 = _timed(lambda: second(block(x, cos, sin), cos, sin), slow, device)
        _, bwd2 = _timed(lambda: two.backward(grad), slow, device)
        del y, again, two
        x.grad = None
        second.zero_grad(set_to_none=True)
        _, opt = _timed(step, slow, device)
        yield fwd, bwd, rec, act, opt, action_share(fwd + bwd, fwd2 + bwd2)


def action_share(one: float, chain: float) -> float:
    """The share of a block's forward + backward (``one``) that is the fixed cost of a forward and
    a backward action, from one sample of it and of a chain of two blocks in one action
    (``chain``): with ``t(n) = a + n b``, ``a / t(1) = 2 - t(2) / t(1)``, kept in ``[0, 1]``
    (noise can put it outside). One sample's two timings are taken back to back, so the host's
    load, which stretches both alike, cancels in the ratio; the profile keeps the median share
    over the samples times the block's kept time (differencing the two kept times instead let one
    disturbed sample of either make half of a block "fixed")."""
    return min(max(2.0 - chain / one, 0.0), 1.0) if one > 0 else 0.0


def activation_bytes(block: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     job: Any, device: torch.device) -> int:
    """Bytes one forward of a block keeps for backward (:func:`saved_bytes`; the rotary tables,
    which every micro-batch shares, are not counted)."""
    return saved_bytes(lambda: block(x, cos, sin), (*block.parameters(), cos, sin), job, device)


def saved_bytes(forward: Any, shared: Any, job: Any, device: torch.device) -> int:
    """Bytes ``forward()`` keeps for backward: CUDA allocator growth; CPU: the distinct tensors
    autograd saves, less the ``shared`` ones (weights, tables every micro-batch shares)."""
    if device.type == "cuda":
        settle(device)
        before = torch.cuda.memory_allocated(device)
        with _autocast(job, device):
            y = forward()
        settle(device)
        grown = torch.cuda.memory_allocated(device) - before
        del y
        return max(int(grown), 0)
    params = {p.untyped_storage().data_ptr() for p in shared}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(job, device):
        y = forward()
    del y
    return sum(seen.values())


def ends_samples(job: Any, micro_batch: int, emulation: Emulation, device: torch.device) -> Iterator[tuple]:
    """(embedding forward, backward, head forward, backward seconds, embedding bytes, head bytes)
    of one micro-batch, per step: the runtime's first chunk without blocks (the token embedding)
    and its last (norm, output projection and loss), each timed as the executor times an action,
    and the bytes each forward keeps for backward (:func:`saved_bytes`; the head's: the logits)."""
    spec = job.model
    embed = LlamaChunk(spec, 0, 0, first=True, last=False).to(device)
    head = LlamaChunk(spec, 0, 0, first=False, last=True).to(device)
    _init(embed, job.seed)
    _init(head, job.seed + 1)
    gen = torch.Generator().manual_seed(job.seed)
    tokens = torch.randint(0, spec.vocab, (micro_batch, job.seq_len + 1), generator=gen).to(device)
    x = (torch.randn(micro_batch, job.seq_len, spec.hidden, generator=gen) * 0.1).to(device).requires_grad_()
    grad = (torch.randn(micro_batch, job.seq_len, spec.hidden, generator=gen) * 1e-3).to(device)
    embed_bytes = saved_bytes(lambda: embed(tokens[:, :-1]), tuple(embed.parameters()), job, device)
    head_bytes = saved_bytes(lambda: head(x, tokens[:, 1:], 1.0), tuple(head.parameters()), job, device)
    while True:
        with _autocast(job, device):
            h, e_fwd = _timed(lambda: embed(tokens[:, :-1]), emulation, device)
        _, e_bwd = _timed(lambda: h.backward(grad), emulation, device)
        with _autocast(job, device):
            loss, h_fwd = _timed(lambda: head(x, tokens[:, 1:], 1.0), emulation, device)
        _, h_bwd = _timed(loss.backward, emulation, device)
        embed.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        x.grad = None
        yield e_fwd, e_bwd, h_fwd, h_bwd, embed_bytes, head_bytes


def p2p_samples(job: Any, pair: tuple[int, ...], rank: int, device: torch.device) -> Iterator[Any]:
    """Per step, (bytes, one-way seconds) for each size by ping-pong from ``pair[0]``; the echoing
    rank yields None."""
    a, b = pair
    bufs = [torch.zeros(max(size // 4, 1), dtype=torch.float32, device=device) for size in job.link_bytes]
    while True:
        out = []
        for buf in bufs:
            settle(device)
            t0 = time.perf_counter()
            if rank == a:
                dist.send(buf, b)
                dist.recv(buf, b)
            else:
                dist.recv(buf, a)
                dist.send(buf, a)
            settle(device)
            out.append((buf.numel() * 4, (time.perf_counter() - t0) / 2))
        yield out if rank == a else None


def step_samples(device: torch.device) -> Iterator[float]:
    """Seconds of what every training step pays beyond its stages' work, per step: the trainer's
    loss all-reduce and the gradient norm's, a scalar each over every rank."""
    buf = torch.zeros(1, device=device)
    while True:
        dist.barrier()
        settle(device)
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        dist.all_reduce(buf)
        settle(device)
        yield time.perf_counter() - t0


def allreduce_samples(job: Any, device: torch.device, group: Any) -> Iterator[float]:
    """Seconds of one all-reduce of ``allreduce_bytes`` per rank in the group, per step."""
    buf = torch.zeros(max(job.allreduce_bytes // 4, 1), dtype=torch.float32, device=device)
    while True:
        dist.barrier(group=group)
        settle(device)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        settle(device)
        yield time.perf_counter() - t0
