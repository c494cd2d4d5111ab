"""One weight cast per step: without recomputation every micro-batch's forward reuses the step's
bf16 cast of each weight, so a stage with several micro-batches in flight holds it once (the
executor's ``_step_casts``; the cost model's :func:`hexicore.cost.block_memory.casts_once`)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hexicore.cost.block_memory import head_cast_bytes, weight_cast_bytes
from hexicore.pipeline.actions import Action, ActionList
from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout
from hexicore_plugins.runtimes.torch.parallel.pipeline import Executor

MICRO_BATCHES = 4


def _fill_drain(stages: int = 1) -> ActionList:
    """Every forward before any backward (GPipe on one rank): all micro-batches in flight at once."""
    forward = [Action("F", s, m) for m in range(MICRO_BATCHES) for s in range(stages)]
    backward = [Action("B", s, m) for m in reversed(range(MICRO_BATCHES)) for s in reversed(range(stages))]
    return ActionList({"name": "fill_drain"}, 1, stages, MICRO_BATCHES, (0,) * stages,
                      (tuple(forward + backward + [Action("STEP")]),))


def _run(model, dtype: str, monkeypatch, cast_once: bool):
    """One bf16 step of the fill-drain list on one rank: the bytes of the distinct tensors its
    backwards kept (weights aside) and the trained state."""
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from tests.helpers import worker_spec

    if not cast_once:
        monkeypatch.setattr(Executor, "_step_casts", lambda self: contextlib.nullcontext())
    layout = build_layout(model, [(8, [StageGroup((0,), model.layers)], _fill_drain())], global_batch=8,
                          micro_batch=2, seq_len=32)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):  # a weight itself is kept by the model, not the step
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = launch([worker_spec(layout, steps=1, seed=5, dtype=dtype, recompute=False, progress=False,
                                  return_state=True)], 1)[0]
    monkeypatch.undo()
    return sum(seen.values()), out


def test_four_micro_batches_in_flight_hold_one_cast_of_each_weight(tiny, monkeypatch):
    once, got = _run(tiny, "bf16", monkeypatch, cast_once=True)
    each, ref = _run(tiny, "bf16", monkeypatch, cast_once=False)
    blocks = tiny.layers * weight_cast_bytes(tiny, 1, 2)
    head = head_cast_bytes(tiny, 2)  # the head's projection, cast as the blocks' are
    assert head == 2 * tiny.vocab * tiny.hidden
    assert each - once == (MICRO_BATCHES - 1) * (blocks + head)
    # the cost model prices the same fall: ZeRO-3 (weights gathered per use) casts per forward
    from hexicore.core.cluster import parse_cluster
    from hexicore.core.settings import TrainSettings
    from hexicore.cost.analytic import AnalyticCostModel
    from hexicore.cost.base import GIB

    cluster = parse_cluster({"name": "c", "machines": [{"name": "A", "gpu": "a100-80g", "count": 2}]}, "test")
    held = {zero: AnalyticCostModel().stage_memory_parts(
        cluster, tiny, TrainSettings(global_batch=8, micro_batch=2, seq_len=32, dtype="bf16", recompute=False, zero=zero),
        ["A.0"], tiny.layers, first=True, last=True, in_flight=MICRO_BATCHES, dp=2)["activations"] * GIB
        for zero in (0, 3)}
    assert held[3] - held[0] == pytest.approx(each - once)
    assert got["metrics"]["losses"] == ref["metrics"]["losses"]  # the same casts: the same numbers
    for key, value in ref["state"].items():
        assert torch.equal(got["state"][key], value), key


def test_fp32_casts_nothing(tiny, monkeypatch):
    once, got = _run(tiny, "fp32", monkeypatch, cast_once=True)
    each, ref = _run(tiny, "fp32", monkeypatch, cast_once=False)
    assert once == each and got["metrics"]["losses"] == ref["metrics"]["losses"]
