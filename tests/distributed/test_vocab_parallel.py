"""Vocabulary parallelism (``train.vocab_parallel``) in the torch runtime against one process."""

import dataclasses

import pytest

from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from tests.helpers import plan_of

GIB = 2**30
#: TP-2 ends of different pipelines: pipeline 0's embedding stage, pipeline 1's head stage
ASYMMETRIC = [(5, "1f1b", [(2, 3), (1, 5)]), (3, "gpipe", [(1, 3), (2, 5)])]
#: one pipeline of two TP-2 stages
TWO_TP2 = [(8, "1f1b", [(2, 4), (2, 4)])]


def _plan(pipes, *, zero: int = 0, tied: bool = False, vocab: int = 256) -> Plan:
    p = plan_of(pipes)
    m = dataclasses.replace(p.model, tied_embeddings=tied, vocab=vocab)
    return Plan(m, p.cluster, TrainSettings(**{**p.train.to_dict(), "zero": zero, "vocab_parallel": True}), p.pipelines)


@pytest.mark.slow
def test_vocab_parallel_trains_like_one_process(tmp_path):
    """One 6-rank job, 3 steps, clipped at 0.5 (the global norm counts each rank's rows once),
    against the one-process reference (1e-5): :data:`ASYMMETRIC` tied under ZeRO-1 (the tied
    group sums rows of TP-2 and one-rank copies; each rank's AdamW state is the cost model's);
    :data:`TWO_TP2` tied (the group of two TP-2 stages), its step-2 checkpoint resumed like the
    uninterrupted run (1e-6) and its ``final/`` the one-process model; :data:`ASYMMETRIC` untied
    with 255 rows (uneven: 128 + 127)."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file

    from hexicore.cost import AnalyticCostModel
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, worker_spec

    tied, two, odd = _plan(ASYMMETRIC, zero=1, tied=True), _plan(TWO_TP2, tied=True), _plan(ASYMMETRIC, vocab=255)

    def layout(plan):
        return dataclasses.replace(plan_layout(plan, [q.schedule for q in plan.pipelines], registry=Registry.default(),
                                               seq_len=SEQ), world=6)

    def reference(model):
        return build_layout(model, [(8, [StageGroup((0,), model.layers)], reference_actions(8))], global_batch=8,
                            micro_batch=1, seq_len=SEQ, world=6)

    base = {"steps": 3, "seed": 5, "dtype": "fp32", "recompute": False, "progress": False, "return_state": True,
            "clip_grad": 0.5}
    step2 = str(tmp_path / "two" / "checkpoints" / "step_2")
    specs = [worker_spec(reference(two.model), **base, out=str(tmp_path / "ref")),
             worker_spec(layout(tied), **base, zero=1),
             worker_spec(layout(two), **base, checkpoint_every=2, out=str(tmp_path / "two")),
             worker_spec(layout(two), **base, resume=step2),
             worker_spec(reference(odd.model), **base), worker_spec(layout(odd), **base)]
    ref, got_tied, got_two, resumed, ref_odd, got_odd = launch(specs, 6)
    for got, want in ((got_tied, ref), (got_two, ref), (got_odd, ref_odd)):
        assert _max_rel(got["metrics"]["losses"], want["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], want["state"]) <= 1e-5
        assert _max_rel(got["metrics"]["grad_norm"], want["metrics"]["grad_norm"]) <= 1e-5
    assert min(ref["metrics"]["grad_norm"]) > 0.5  # clipped: every rank scaled by the same global norm
    assert _max_abs(resumed["state"], got_two["state"]) <= 1e-6
    assert _max_rel(resumed["metrics"]["losses"], got_two["metrics"]["losses"]) <= 1e-6
    final, whole = load_file(tmp_path / "two" / "final" / "model.safetensors"), load_file(tmp_path / "ref" / "final" / "model.safetensors")
    assert sorted(final) == sorted(whole) and _max_abs(final, whole) <= 1e-5
    parts = AnalyticCostModel().memory_parts(tied)
    for r, d in enumerate(tied.devices):
        assert abs(got_tied["metrics"]["optimizer_state_bytes"][r] - parts[d]["optimizer"] * GIB) <= 64, d
