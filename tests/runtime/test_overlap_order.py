"""When the overlapped DP sync may post a stage's gradient buckets (``final_after``), and the
order every rank posts them in (``launch_key``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hexicore.pipeline.actions import Op  # noqa: E402
from hexicore.registry import Registry  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.assignment import schedule_actions  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.data.sync import Chunk, launch_key  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.pipeline import final_after  # noqa: E402


def _replicas_of(al):
    def replicas(stage):
        chain = next(c for c in al.chains if stage in c)
        return tuple(c[chain.index(stage)] for c in al.chains)
    return replicas


@pytest.mark.parametrize("schedule,ranks", [({"name": "1f1b"}, 3), ({"name": "gpipe"}, 2),
                                            ({"name": "interleaved_1f1b", "chunks": 2}, 2), ({"name": "zb_h1"}, 3),
                                            ({"name": "chimera"}, 2), ({"name": "hanayo", "waves": 1}, 2)])
def test_a_stage_is_final_after_its_last_gradient_action_and_never_before(schedule, ranks):
    al = schedule_actions(schedule, ranks, 4, Registry.default())
    replicas = _replicas_of(al)
    for rank, actions in enumerate(al.actions):
        stages = {s for s in range(al.stages) if al.stage_rank[s] == rank}
        finals = final_after(actions, replicas, stages)
        seen = {}
        for index, found in finals.items():
            for stage in found:
                seen[stage] = index
        assert set(seen) == stages  # every local stage is posted before STEP (explicit REDUCEs here)
        for stage, index in seen.items():
            later = [a for a in actions[index + 1:] if a.op in (Op.B, Op.W, Op.I) and a.stage in replicas(stage)]
            assert not later, f"rank {rank}: stage {stage} posted at {index} before {later[0]}"
            if len(replicas(stage)) > 1:
                assert actions[index].op is Op.REDUCE


def test_1f1b_posts_right_after_each_ranks_last_backward():
    al = schedule_actions({"name": "1f1b"}, 3, 5, Registry.default())
    for rank, actions in enumerate(al.actions):
        finals = final_after(actions, _replicas_of(al), {rank})
        (index,) = finals
        assert actions[index].op is Op.B and actions[index].mb == 4
        assert all(a.op not in (Op.F, Op.B) for a in actions[index + 1:])


def test_buckets_of_later_layers_are_posted_first_in_one_order_everywhere():
    head = (Chunk("lm_head.weight", None, 0, 0, 0, 10), (), frozenset())
    block = (Chunk("model.layers.3.mlp.up_proj.weight", 0, 0, 4, 8, 40), (), frozenset())
    first = (Chunk("model.layers.0.self_attn.q_proj.weight", 0, 0, 4, 8, 40), (), frozenset())
    emb = (Chunk("model.embed_tokens.weight", None, 0, 0, 0, 10), (), frozenset())
    keys = {"head": launch_key((0, 2), [block, head]), "block": launch_key((1, 3), [block]),
            "first": launch_key((0, 2), [emb, first]), "emb": launch_key((1, 3), [emb])}
    assert sorted(keys, key=keys.get) == ["head", "block", "first", "emb"]


def test_without_the_overlap_step_waits_for_every_rank_of_the_plan_before_any_sync(monkeypatch):
    """``dp_overlap=false`` is App. A's step: the first collective of ``STEP`` is a wait over the
    plan's ranks (the norm group), before any data-parallel bucket; with the overlap, or with one
    pipeline, there is none."""
    import types

    import torch

    from hexicore_plugins.runtimes.torch.parallel import pipeline

    calls = []
    monkeypatch.setattr(torch.distributed, "all_reduce",
                        lambda tensor, group=None, **_: calls.append(("wait", tensor.numel(), group)))
    data = types.SimpleNamespace(run=lambda params, wait: calls.append(("sync",)))
    for pipelines, overlap, waits in ((2, False, True), (2, True, False), (1, False, False)):
        calls.clear()
        parallel = types.SimpleNamespace(assignment=types.SimpleNamespace(pipelines=(None,) * pipelines),
                                         norm_ranks=4, norm_group="plan ranks", data=data, tied=None)
        executor = pipeline.Executor.__new__(pipeline.Executor)
        executor.parallel, executor.stages, executor.params = parallel, {}, {}
        executor.device, executor.sync_s = torch.device("cpu"), 0.0
        executor.sync_after_all = pipeline.Executor.waits_for_every_pipeline(parallel, overlap)
        monkeypatch.setattr(executor, "_update", lambda: calls.append(("update",)), raising=False)
        executor._step()
        expected = ([("wait", 1, "plan ranks")] if waits else []) + [("sync",), ("update",)]
        assert calls == expected, (pipelines, overlap)
