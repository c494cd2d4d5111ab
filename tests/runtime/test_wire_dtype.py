"""Pipeline messages travel in the training dtype (bf16/fp16 under autocast, fp32 otherwise) and
are widened to fp32 on arrival: the bytes the cost model prices a hop at (``B_mb*S*H*B_type``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from hexicore.pipeline.actions import Action  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel import pipeline as ex  # noqa: E402


def executor(autocast, *, leader: bool = True, tp: int = 1):
    e = ex.Executor.__new__(ex.Executor)
    e.wire = autocast or torch.float32
    e.leader, e.pending_sends, e.consumed, e.messages = leader, [], 0, []
    e.device, e.act_shape = torch.device("cpu"), (1, 2, 3)
    e.parallel = SimpleNamespace(tp=SimpleNamespace(size=tp, group=None), tp_leader=0)
    e._peer, e._tag = (lambda p: p), (lambda *a: 0)
    e._recv_ops = lambda upto: []
    e.sent = []
    e._issue = lambda ops: e.sent.extend(op for op, _ in ops)
    return e


@pytest.mark.parametrize("autocast, wire", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                            (None, torch.float32)])
def test_sends_in_the_training_dtype(autocast, wire, monkeypatch):
    monkeypatch.setattr(ex.dist, "P2POp", lambda fn, t, peer, tag: t)
    e = executor(autocast)
    x = torch.randn(1, 2, 3, requires_grad=True)
    e._send(0, Action("SEND_F", 0, 0, peer=1), x * 1.0, 1)
    (t,) = e.sent
    assert t.dtype == wire and t.shape == x.shape and not t.requires_grad
    assert torch.allclose(t.float(), x.detach(), rtol=1e-2)


def test_receives_in_the_training_dtype_and_widens_to_fp32(monkeypatch):
    seen = []

    def broadcast(buf, src, group):
        seen.append(buf.dtype)
        buf.fill_(1.5)

    monkeypatch.setattr(ex.dist, "broadcast", broadcast)
    got = executor(torch.bfloat16, leader=False, tp=2)._receive(0, Action("RECV_F", 1, 0, peer=0))
    assert seen == [torch.bfloat16] and got.dtype == torch.float32 and torch.all(got == 1.5)


def test_tp_backward_all_reduces_in_the_autocast_dtype(monkeypatch):
    """Megatron's ``f`` under autocast: the gradient it all-reduces is bf16 (the cost model's
    ``B_type``), and the projections' forward is what it was (they cast their input anyway)."""
    from hexicore_plugins.runtimes.torch.parallel import tensor as tpm

    seen = []
    monkeypatch.setattr(tpm.torch.distributed, "all_reduce", lambda t, group=None: seen.append(t.dtype))
    tp = tpm.TPGroup(0, 2, group=object())
    w = torch.randn(8, 4)
    x = torch.randn(3, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(tpm.copy_to(x, tp), w)
        plain = torch.nn.functional.linear(x, w)
    assert torch.equal(y, plain) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert seen == [torch.bfloat16] and x.grad.dtype == torch.float32
