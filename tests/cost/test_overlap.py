"""The overlapped data-parallel sync (hexicore/cost/overlap.py): ready times, sync starts and the
iteration by hand, against App. A's step-end sync."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.cost import overlap
from tests.helpers import (HAND_CLUSTER as CLUSTER, HAND_MODEL as MODEL, HAND_TRAIN as TRAIN, HAND_COST as COST,
                           HAND_H as H, HAND_V as V, HAND_LAYER_PARAMS as LAYER_PARAMS)


def _plan(**train) -> Plan:
    return Plan(MODEL, CLUSTER, replace(TRAIN, **train), (
        Pipeline(2, (Stage(("A.0",), 1, (0, 2)), Stage(("A.1",), 1, (2, 4)))),
        Pipeline(2, (Stage(("B.0",), 1, (0, 2)), Stage(("B.1",), 1, (2, 4)))),
    ))


def test_ready_times_follow_the_last_micro_batch_down_the_chain():
    assert overlap.ready_times(10.0, [1.0, 2.0, 3.0], [0.5, 0.25], chained=True) == [10.0, 8.5, 6.25]
    assert overlap.ready_times(10.0, [1.0, 2.0, 3.0], [0.5, 0.25], chained=False) == [10.0, 10.0, 10.0]


def test_a_sync_starts_when_every_holder_of_its_blocks_is_ready():
    # pipeline 0 cuts the 4 blocks 0-1 | 2-3, pipeline 1 cuts them 0-2 | 3: stage (0, 1) shares
    # block 2 with (1, 0) and block 3 + the head with (1, 1); (0, 0) shares the embedding and
    # blocks 0-1 with (1, 0) only
    layers = [[(0, 2), (2, 4)], [(0, 3), (3, 4)]]
    ready = [[10.0, 7.0], [9.0, 8.0]]
    assert overlap.sync_starts(layers, ready) == {(0, 0): 10.0, (0, 1): 9.0, (1, 0): 10.0, (1, 1): 8.0}


def test_overlapped_iteration_by_hand():
    plan = _plan()
    est = COST.estimate(plan)
    pipes = est.breakdown["pipelines"]
    t_a, t_b = est.pipeline_s
    # each stage syncs its 2 blocks A.i <-> B.i over 1 GB/s (fp32 gradients) + embedding / head
    per_layer = 2 * (100e-6 + LAYER_PARAMS * 4 / 2e9)
    emb = 2 * (100e-6 + V * H * 4 / 2e9)
    head = 2 * (100e-6 + (H + V * H) * 4 / 2e9)
    # the first stages end their pipelines; the last stages' gradients are final one backward of
    # the first stage + one hop earlier
    ready_last = [t - q["backward_s"][0] - q["hop_s"][0] for t, q in zip((t_a, t_b), pipes)]
    expect = max(t_a, t_b, max(t_a, t_b) + 2 * per_layer + emb, max(ready_last) + 2 * per_layer + head)
    assert est.iteration_s == pytest.approx(expect)
    assert est.dp_s == pytest.approx(expect - max(t_a, t_b))
    plain = COST.estimate(_plan(dp_overlap=False))
    assert est.pipeline_s == plain.pipeline_s
    assert est.iteration_s < plain.iteration_s  # the head's sync is hidden by stage 0's cool-down


def test_zero_1_overlaps_the_reduce_scatter_and_gathers_after_the_step():
    est = COST.estimate(_plan(zero=1))
    t_a, t_b = est.pipeline_s
    pipes = est.breakdown["pipelines"]
    per_layer = 2 * (100e-6 + LAYER_PARAMS * 4 / 2e9)
    sync = [2 * per_layer + 2 * (100e-6 + V * H * 4 / 2e9), 2 * per_layer + 2 * (100e-6 + (H + V * H) * 4 / 2e9)]
    ready_last = max(t - q["backward_s"][0] - q["hop_s"][0] for t, q in zip((t_a, t_b), pipes))
    reduced = max(t_a, t_b, max(t_a, t_b) + sync[0] / 2, ready_last + sync[1] / 2)
    assert est.iteration_s == pytest.approx(reduced + max(sync) / 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 2), st.floats(0, 1), st.floats(0, 3)), min_size=2, max_size=6),
       st.sampled_from([0, 1, 2, 3]), st.booleans())
def test_overlap_never_exceeds_the_step_end_sync_nor_undercuts_the_pipelines(stages, zero, chained):
    """Per stage (pipeline time, backward, hop, sync): one stage per pipeline position, every
    pipeline cutting the same blocks; the overlapped step lies between the slowest pipeline and
    App. A's ``max T + max sync`` (+ the ZeRO gather, which App. A counts in the sync)."""
    n = len(stages)
    pipes = [max(t for t, _, _, _ in stages), min(t for t, _, _, _ in stages)]
    layers = [[(j, j + 1) for j in range(n)]] * 2
    ready = [overlap.ready_times(t, [b for _, b, _, _ in stages], [h for _, _, h, _ in stages][:-1], chained)
             for t in pipes]
    parts = {(i, j): (s, 0.0) for i in range(2) for j, (_, _, _, s) in enumerate(stages)}
    got = overlap.overlapped_step(pipes, overlap.sync_starts(layers, ready), parts, zero)
    worst = max(s for _, _, _, s in stages)
    assert max(pipes) - 1e-12 <= got <= max(pipes) + (0.0 if zero == 3 else worst) + 1e-9
