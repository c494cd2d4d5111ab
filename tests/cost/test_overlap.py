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


def test_chunks_are_final_as_the_last_micro_batch_leaves_them():
    # 1F1B, 3 stages: stage j final when the last micro-batch's gradient has crossed the stages before it
    got = overlap.chunk_ready(10.0, [1.0, 2.0, 3.0], [0.5, 0.25], overlap.plain_chain(3), [(0, 2), (2, 4), (4, 8)])
    assert got == [[(0, 2, 1.0, 10.0, True, False)], [(2, 4, 1.0, 8.5, False, False)], [(4, 8, 1.0, 6.25, False, True)]]
    # interleaved, 2 ranks x 2 chunks: positions 0, 1, 2, 3 = (rank 0, chunk 0), (1, 0), (0, 1), (1, 1);
    # the wrap 1 -> 0 crosses the slowest hop
    chain = ((0, 0.5), (1, 0.5), (0, 0.5), (1, 0.5))
    got = overlap.chunk_ready(10.0, [2.0, 4.0], [0.5], chain, [(0, 4), (4, 8)])
    assert got == [[(0, 2, 0.5, 10.0, True, False), (2, 4, 0.5, 10.0 - 1.5 - 2.5, False, False)],
                   [(4, 6, 0.5, 8.5, False, False), (6, 8, 0.5, 10.0 - 1.5 - 2.5 - 1.5, False, True)]]
    # no chain: everything at the end
    assert overlap.chunk_ready(10.0, [1.0, 2.0], [0.5], None, [(0, 1), (1, 2)])[1] == [(1, 2, 1.0, 10.0, False, True)]


def test_a_sync_waits_for_every_holder_of_its_blocks_and_runs_the_highest_chunks_first():
    # pipeline 0 cuts the 4 blocks 0-1 | 2-3, pipeline 1 cuts them 0-2 | 3: stage (0, 1) shares
    # block 2 with (1, 0) (final at 10) and block 3 + the head with (1, 1) (at 8)
    chunks = [[[(0, 2, 1.0, 10.0, True, False)], [(2, 4, 1.0, 7.0, False, True)]],
              [[(0, 3, 1.0, 10.0, True, False)], [(3, 4, 1.0, 8.0, False, True)]]]
    parts = {(0, 0): (0.0, 0.0), (0, 1): (1.0, 0.0), (1, 0): (0.0, 0.0), (1, 1): (0.5, 0.0)}
    assert overlap.overlapped_step([10.0, 10.0], chunks, parts, 0) == 11.0  # (0, 1) waits for (1, 0)
    parts[(0, 1)] = (0.0, 0.0)
    assert overlap.overlapped_step([10.0, 10.0], chunks, parts, 0) == 10.0  # (1, 1): 8 + 0.5, hidden
    # two chunks on one rank: the higher one (final at 6) syncs first, the lower one after it
    two = [[[(0, 2, 0.5, 10.0, True, False), (2, 4, 0.5, 6.0, False, True)]]] * 2
    assert overlap.overlapped_step([10.0, 10.0], two, {(0, 0): (6.0, 0.0), (1, 0): (6.0, 0.0)}, 0) == 13.0
    # ZeRO-1: one bucket from the latest chunk, half of it overlapped, the gather after the step
    assert overlap.overlapped_step([10.0, 10.0], two, {(0, 0): (6.0, 0.0), (1, 0): (6.0, 0.0)}, 1) == 16.0


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
       st.sampled_from([0, 1, 2, 3]), st.sampled_from([None, 1, 2]))
def test_overlap_never_exceeds_the_step_end_sync_nor_undercuts_the_pipelines(stages, zero, chunks):
    """Per stage (pipeline time, backward, hop, sync): one stage per pipeline position, every
    pipeline cutting the same blocks (two each), no chain or a chain of 1 or 2 chunks per stage;
    the overlapped step lies between the slowest pipeline and App. A's ``max T + max sync``
    (+ the ZeRO gather, which App. A counts in the sync)."""
    n = len(stages)
    pipes = [max(t for t, _, _, _ in stages), min(t for t, _, _, _ in stages)]
    layers = [(2 * j, 2 * j + 2) for j in range(n)]
    chain = None if chunks is None else tuple((r, 1.0 / chunks) for _ in range(chunks) for r in range(n))
    ready = [overlap.chunk_ready(t, [b for _, b, _, _ in stages], [h for _, _, h, _ in stages][:-1], chain, layers)
             for t in pipes]
    parts = {(i, j): (s, 0.0) for i in range(2) for j, (_, _, _, s) in enumerate(stages)}
    got = overlap.overlapped_step(pipes, ready, parts, zero)
    worst = max(s for _, _, _, s in stages)
    assert max(pipes) - 1e-12 <= got <= max(pipes) + (0.0 if zero == 3 else worst) + 1e-9


def test_a_plan_whose_slow_link_dp_group_finishes_early_wins_only_with_the_overlap():
    """Two mirror plans on the same devices: the DP group crossing the slow C-D link syncs the
    last stages (X: hidden by the first stages' cool-down) or the first stages (Y: nothing
    hides it). App. A prices them alike; the overlap prefers X."""
    from hexicore.core.cluster import parse_cluster

    cl = parse_cluster({"name": "mirror", "inter": {"bandwidth_gbs": 0.1, "latency_us": 100},
                        "links": [{"between": ["A", "C"], "bandwidth_gbs": 20.0, "latency_us": 10},
                                  {"between": ["A", "D"], "bandwidth_gbs": 20.0, "latency_us": 10}],
                        "machines": [{"name": "A", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100, "latency_us": 5},
                                     {"name": "C", "gpu": "a100-80g", "count": 1},
                                     {"name": "D", "gpu": "a100-80g", "count": 1}]}, "mirror")

    def plan(first: tuple[str, str], last: tuple[str, str], overlap: bool) -> Plan:
        return Plan(MODEL, cl, replace(TRAIN, global_batch=8, dp_overlap=overlap), tuple(
            Pipeline(4, (Stage((a,), 1, (0, 2)), Stage((b,), 1, (2, 4)))) for a, b in zip(first, last)))

    x = [COST.estimate(plan(("A.0", "A.1"), ("C.0", "D.0"), o)) for o in (False, True)]
    y = [COST.estimate(plan(("C.0", "D.0"), ("A.0", "A.1"), o)) for o in (False, True)]
    # App. A: the same pipelines and the same slow sync but for the head's norm (X) or the embedding (Y)
    head_minus_embedding = x[0].iteration_s - y[0].iteration_s
    assert abs(head_minus_embedding) < 1e-4 * x[0].iteration_s
    # the overlap: X's slow sync starts one backward of the first stage + one hop before the end
    early = x[1].breakdown["pipelines"][0]["backward_s"][0] + x[1].breakdown["pipelines"][0]["hop_s"][0]
    assert early > 10 * abs(head_minus_embedding)
    assert y[1].iteration_s - x[1].iteration_s == pytest.approx(early - head_minus_embedding, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([("1f1b", {}), ("gpipe", {}), ("interleaved_1f1b", {"chunks": 2}),
                        ("interleaved_1f1b", {"chunks": 3}), ("looped_bfs", {"chunks": 2}), ("hanayo", {"waves": 1}),
                        ("hanayo", {"waves": 2})]),
       st.integers(2, 5), st.integers(1, 4), st.data())
def test_declared_gradient_chains_bound_the_simulated_last_gradients(schedule, ranks, groups, data):
    """Simulated with uneven stage times and hops, every chunk's last B ends no later than the
    chain's ready time ``T - sum_{q'<q} (share BWD + HOP)`` (the declaration is a bound)."""
    from hexicore.pipeline.actions import Op
    from hexicore.pipeline.simulate import Timing, simulate
    from hexicore.pipeline.spec import ScheduleSpec
    from hexicore.registry import Registry

    name, params = schedule
    sched = Registry.default().create("schedule", name, **params)
    al = sched.actions(ScheduleSpec(ranks, groups * ranks))
    times = st.floats(0.1, 5.0)
    forward = data.draw(st.lists(times, min_size=ranks, max_size=ranks))
    backward = data.draw(st.lists(times, min_size=ranks, max_size=ranks))
    hops = data.draw(st.lists(st.floats(0.0, 1.0), min_size=ranks - 1, max_size=ranks - 1))
    res = simulate(al, Timing.from_ranks(al, forward, backward, hops), record=True)
    last: dict[int, float] = {}
    for e in res.events:
        if e.action.op in (Op.B, Op.W):
            last[e.action.stage] = max(last.get(e.action.stage, 0.0), e.end)
    chain = sched.gradient_chain(ranks)
    assert [r for r, _ in chain] == [al.stage_rank[s] for s in al.chains[0]]
    layers = [(2 * ranks * r, 2 * ranks * (r + 1)) for r in range(ranks)]
    ready = overlap.chunk_ready(res.makespan, backward, hops, chain, layers)
    assert sum(len(chunks) for chunks in ready) == len(al.chains[0])
    seen = [0] * ranks
    for stage in al.chains[0]:  # the k-th visit of rank r is its k-th chunk
        r = al.stage_rank[stage]
        chunk = ready[r][seen[r]]
        seen[r] += 1
        assert last[stage] <= chunk[3] + 1e-9, (r, stage, last[stage], chunk[3])


def test_schedules_that_defer_weight_gradients_claim_no_chain():
    from hexicore.registry import Registry

    for name in ("zb_h1", "zb_h2", "zb_v", "interleaved_zb", "dualpipe_v", "chimera"):
        assert Registry.default().create("schedule", name).gradient_chain(4) is None, name
