"""Vocabulary parallelism in one process: the parallel cross-entropy against torch's, the
embedding's shards summed by hand, and each TP rank's parameters against the cost model's count."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F

from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.cost import AnalyticCostModel
from hexicore_plugins.runtimes.torch.model.llama import LlamaChunk
from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup, shard_range
from hexicore_plugins.runtimes.torch.parallel.vocab import VocabEmbedding, cross_entropy_sum
from tests.helpers import plan_of

GIB = 2**30


class ThreadGroup:
    """``size`` threads as one TP group: each member's ``all_reduce`` waits for the others and
    takes the sum (or the maximum) of what they all gave — a real all-reduce in one process."""

    def __init__(self, size: int):
        self.size, self.barrier, self.given = size, threading.Barrier(size), [None] * size

    def member(self, rank: int) -> TPGroup:
        group = self

        class Member(TPGroup):
            def all_reduce(self, t, op=None):
                group.given[rank] = t.clone()
                group.barrier.wait()
                stacked = torch.stack(group.given)
                total = stacked.amax(0) if op == torch.distributed.ReduceOp.MAX else stacked.sum(0)
                group.barrier.wait()
                return t.copy_(total)

        return Member(rank, self.size, None, True)


@pytest.mark.parametrize("size", [2, 3])
def test_parallel_cross_entropy_is_torchs(size):
    """11 vocabulary columns over 2 or 3 ranks (uneven rows): every rank's loss is torch's summed
    cross-entropy, and its logits' gradient its columns of torch's (1e-5)."""
    torch.manual_seed(0)
    logits, target = torch.randn(7, 11) * 4, torch.randint(0, 11, (7,))
    full = logits.clone().requires_grad_()
    want = F.cross_entropy(full, target, reduction="sum")
    (3 * want).backward()
    group, losses, grads = ThreadGroup(size), [None] * size, [None] * size

    def rank(r: int) -> None:
        lo, hi = shard_range(11, r, size)
        mine = logits[:, lo:hi].clone().requires_grad_()
        loss = cross_entropy_sum(mine, target, lo, group.member(r))
        (3 * loss).backward()
        losses[r], grads[r] = loss.detach(), mine.grad

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = float(want.detach())
    assert all(abs(float(x) - want) <= 1e-5 * abs(want) for x in losses)
    assert torch.allclose(torch.cat(grads, dim=1), full.grad, atol=1e-5)


def test_embedding_shards_sum_to_the_embedding():
    """Simulated shards (``group=None``: the all-reduce is the caller's): the rows of 10 tokens
    over 3 ranks, summed by hand, are the embedding's; each shard's gradient its rows of the full one."""
    torch.manual_seed(1)
    weight, ids = torch.randn(10, 4), torch.tensor([[0, 3, 9, 4, 3, 7]])
    ref = torch.nn.Embedding(10, 4)
    ref.weight.data.copy_(weight)
    grad_out = torch.randn(1, 6, 4)
    (ref(ids) * grad_out).sum().backward()
    out, grads = 0, []
    for r in range(3):
        emb = VocabEmbedding(10, 4, TPGroup(r, 3, None, True))
        emb.weight.data.copy_(weight[emb.lo:emb.hi])
        y = emb(ids)
        (y * grad_out).sum().backward()
        out, grads = out + y.detach(), grads + [emb.weight.grad]
    assert torch.equal(out, ref(ids).detach())
    assert torch.equal(torch.cat(grads), ref.weight.grad)


def _plan(vocab_parallel: bool, tied: bool, vocab: int = 256) -> Plan:
    p = plan_of([(8, "1f1b", [(2, 4), (2, 4)])])
    m = dataclasses.replace(p.model, tied_embeddings=tied, vocab=vocab)
    return Plan(m, p.cluster, TrainSettings(**{**p.train.to_dict(), "vocab_parallel": vocab_parallel}), p.pipelines)


def _state_bytes(plan: Plan, stage: int, tp_rank: int) -> int:
    """16 B (fp32 weight, gradient, two AdamW moments) per parameter of one TP rank's chunk, as
    the runtime builds it (on the meta device: shapes only; a tied Parameter once)."""
    s = plan.pipelines[0].stages[stage]
    tp = TPGroup(tp_rank, s.tp, None, plan.train.vocab_parallel)
    with torch.device("meta"):
        chunk = LlamaChunk(plan.model, *s.layers, first=stage == 0, last=stage == 1, tp=tp)
    return 16 * sum(p.numel() for p in chunk.parameters())


@pytest.mark.parametrize("tied", [False, True])
def test_each_ranks_state_is_the_predicted_and_falls_by_half_the_ends(tied):
    """Two TP-2 stages (tiny: V = 256, H = 64): each rank's weights, gradients and AdamW moments
    are the cost model's; vocabulary parallelism saves each rank ``16 B x V/2 x H`` per end it
    holds (a tied head's copy: one more end on the last stage)."""
    on, off = _plan(True, tied), _plan(False, tied)
    m, cost = on.model, AnalyticCostModel()
    for plan in (on, off):
        parts = cost.memory_parts(plan)
        for j, s in enumerate(plan.pipelines[0].stages):
            for r, d in enumerate(s.devices):
                predicted = sum(parts[d][k] for k in ("weights", "gradients", "optimizer")) * GIB
                assert _state_bytes(plan, j, r) == pytest.approx(predicted), (plan.train.vocab_parallel, d)
    saved = 16 * m.vocab // 2 * m.hidden
    assert _state_bytes(off, 0, 1) - _state_bytes(on, 0, 1) == saved
    assert _state_bytes(off, 1, 1) - _state_bytes(on, 1, 1) == saved


def test_an_uneven_vocabulary_stays_within_the_prediction():
    """255 rows over 2 ranks: rank 0 holds 128 (the cost model's count, its largest shard), rank 1 127."""
    plan = _plan(True, False, vocab=255)
    parts = AnalyticCostModel().memory_parts(plan)
    predicted = sum(parts["M.0"][k] for k in ("weights", "gradients", "optimizer")) * GIB
    assert _state_bytes(plan, 0, 0) == pytest.approx(predicted)
    assert _state_bytes(plan, 0, 0) - _state_bytes(plan, 0, 1) == 16 * plan.model.hidden
