"""ZeRO per unit and per micro-batch in the torch runtime: shard pieces by hand, the rounds that
pair collectives of ranks whose schedules differ, and ZeRO-2 on schedules that give a rank
several stage chunks (interleaved 1F1B, Hanayo's waves, Chimera's copies) against one process."""

import pytest

pytest.importorskip("torch")

from hexicore.core.plan import Plan  # noqa: E402

from hexicore.core.settings import TrainSettings
from hexicore.cost import AnalyticCostModel  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.data.sync import apportion  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.data.zero_state import gather_needs, reduce_needs, rounds  # noqa: E402

GIB = 2**30


def test_apportion_tiles_every_atom_and_keeps_each_members_total_within_one_element():
    # 24 : 80 of atoms of 7, 5, 9, 3 elements (24 in all): member 0's share is 24 * 24/104 = 5.54
    got = apportion([7, 5, 9, 3], [24.0, 80.0], 2)
    assert got == [[(0, 2), (2, 7)], [(0, 1), (1, 5)], [(0, 2), (2, 9)], [(0, 1), (1, 3)]]
    assert [sum(b[j][1] - b[j][0] for b in got) for j in range(2)] == [6, 18]
    even = apportion([7, 5, 9, 3], None, 3)  # 8 each
    assert [sum(b[j][1] - b[j][0] for b in even) for j in range(3)] == [8, 8, 8]
    assert all(b[0][0] == 0 and b[-1][1] == n for b, n in zip(even, [7, 5, 9, 3]))
    assert all(b[1] == (b[1][0], b[1][0]) for b in apportion([7, 5], [1.0, 0.0, 1.0], 3))  # weight 0: nothing


def test_rounds_carry_every_members_kth_need_together():
    # rank 0 runs a forward (units -1, 0, 1, 2) where rank 1 runs a backward (2, 1, 0)
    needs = {0: [(-1,), (0,), (1,), (2,)], 1: [(2,), (1,), (0,)]}
    atom_of = {-1: 0, 0: 1, 1: 2, 2: 3}
    assert rounds(needs, (0, 1), atom_of) == [(0, 3), (1, 2), (1, 2), (3,)]
    assert rounds(needs, (0, 1), {1: 0}) == [(), (0,), (0,), ()]  # a group of unit 1 only


def test_needs_follow_the_action_list():
    from tests.helpers import layout_of
    layout = layout_of([(2, "1f1b", [(1, 8)]), (2, "zb_h1", [(1, 3), (1, 5)])], global_batch=4)
    last = layout.model.layers
    fwd, bwd = [(u,) for u in range(-1, last + 1)], [(u,) for u in range(last, -1, -1)]
    assert gather_needs(layout, 0) == (fwd + bwd) * 2  # F B F B; the embedding's backward reads no weight
    assert reduce_needs(layout, 0) == [(u,) for u in range(last, -2, -1)] * 2  # unit by unit, embedding last
    # zb_h1, first stage [0, 3), runs F0 F1 I0 W0 I1 W1: I computes no input gradient there, so
    # only F and W gather; W finishes the gradients
    f, w = [(-1,), (0,), (1,), (2,)], [(2,), (1,), (0,)]
    assert gather_needs(layout, 1) == f + f + w + w
    assert reduce_needs(layout, 1) == [(2,), (1,), (0,), (-1,)] * 2
    # last stage [3, 8) + head runs F0 I0 F1 I1 W0 W1: I and W both read every unit but the embedding
    f, b = [(u,) for u in range(3, last + 1)], [(u,) for u in range(last, 2, -1)]
    assert gather_needs(layout, 2) == f + b + f + b + b + b
    assert reduce_needs(layout, 2) == [(u,) for u in range(last, 2, -1)] * 2


#: TP 1 everywhere, so every layer's gradient is shared by one holder per pipeline
MULTI_CHUNK = {
    "interleaved": [(6, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 4), (1, 4)]), (2, "1f1b", [(1, 5), (1, 3)])],
    "hanayo": [(4, {"name": "hanayo", "waves": 1}, [(1, 4), (1, 4)]), (4, "gpipe", [(1, 6), (1, 2)])],
    "chimera": [(4, "chimera", [(1, 4), (1, 4)]), (4, "zb_h1", [(1, 3), (1, 5)])],
}


@pytest.mark.slow
def test_zero_2_per_micro_batch_on_multi_chunk_schedules_trains_like_one_process():
    """One 4-rank job: the reference, then interleaved 1F1B | 1F1B, Hanayo | GPipe and Chimera |
    zero-bubble H1 under ZeRO-2: losses and weights within 1e-5; between micro-batches each rank
    keeps the gradient piece of every layer it holds, ``1/n`` of it among the ``n`` holders
    (every unit's gradient is summed as soon as its backward is done: during a backward at most
    one block's full gradient exists); on the interleaved plan each rank's gradient, weight,
    AdamW and workspace bytes equal the cost model's, and on every plan each rank's weights equal
    the cost model's under the schedule's placement."""
    import dataclasses

    from hexicore.planner.pricing import ScheduleBook, timed_cost
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.parallel.data.sync import sync_plan
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, layout_of, plan_of, tiny, worker_spec
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=4)
    layouts = [dataclasses.replace(layout_of(c), world=4) for c in MULTI_CHUNK.values()]
    specs = [worker_spec(ref, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True)]
    specs += [worker_spec(x, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True, zero=2)
              for x in layouts]
    results = launch(specs, 4)
    for layout, got in zip(layouts, results[1:]):
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
        groups = sync_plan(layout).groups
        for r, kept in enumerate(got["metrics"]["state_bytes"]):
            mine = [(len(members), sum(c.numel for c, _, _ in items)) for members, items in groups.items() if r in members]
            share = sum(4 * n / k for k, n in mine)  # 4 B of gradient per element, 1/k of each group's bucket
            assert abs(kept["gradients"] - share) <= 4 * (m.layers + 2), r  # one element per unit
            assert kept["gradients"] < kept["weights"] / 1.9  # never a whole gradient: two or more holders
            assert kept["unsummed"] == 4 * m.layer_params()  # during a backward: one unit's (a block's) gradient
    # every rank's parameters where its schedule places them (Hanayo's head on rank 0, Chimera's
    # two copies with an embedding and a head on both end ranks): the cost model's weights
    placed = timed_cost(AnalyticCostModel(), ScheduleBook(Registry.default()))
    for c, got in zip(MULTI_CHUNK.values(), results[1:]):
        parts = placed.memory_parts(plan_of(c))
        for r, kept in enumerate(got["metrics"]["state_bytes"]):
            assert kept["weights"] == pytest.approx(parts[f"M.{r}"]["weights"] * GIB, abs=0.5), (c[0][1], r)
    plan = plan_of(MULTI_CHUNK["interleaved"])
    plan = Plan(plan.model, plan.cluster, TrainSettings(**{**plan.train.to_dict(), "zero": 2}), plan.pipelines)
    parts = AnalyticCostModel().memory_parts(plan)
    z1 = AnalyticCostModel().memory_parts(Plan(plan.model, plan.cluster, TrainSettings(**{**plan.train.to_dict(),
                                                                                          "zero": 1}), plan.pipelines))
    for r, kept in enumerate(results[1]["metrics"]["state_bytes"]):
        for part, size in (("weights", 4), ("gradients", 4), ("optimizer", 8)):
            assert abs(kept[part] - parts[f"M.{r}"][part] * GIB) <= size, (r, part)
        unsummed = (parts[f"M.{r}"]["workspace"] - z1[f"M.{r}"]["workspace"]) * GIB
        assert kept["unsummed"] == pytest.approx(unsummed, abs=0.5), r


#: identical pipelines (ZeRO-3 over multi-stage pipelines runs on mirrors): 2 stages of 1F1B;
#: of zero-bubble H1 (the last stage's I reads every unit); interleaved 1F1B (two chunks per
#: rank) with recomputation
MIRRORED = {
    "1f1b": ([(4, "1f1b", [(1, 3), (1, 5)])] * 2, False),
    "zb_h1": ([(4, "zb_h1", [(1, 5), (1, 3)])] * 2, False),
    "interleaved": ([(4, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 4), (1, 4)])] * 2, True),
}


@pytest.mark.slow
def test_zero_3_on_identical_multi_stage_pipelines_trains_like_one_process_and_keeps_the_predicted_state():
    """One 4-rank job: the reference, then :data:`MIRRORED` under ZeRO-3: losses and weights
    within 1e-5; each rank's kept weights, gradients and AdamW state equal the cost model's
    (within one element), and the peaks of gathered unit weights and of gradients not summed
    yet equal its ZeRO-3 workspace (the stage's largest unit)."""
    import dataclasses

    from hexicore.cost.precision import largest_unit_params
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, layout_of, plan_of, tiny, worker_spec
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=4)
    specs = [worker_spec(ref, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True)]
    specs += [worker_spec(dataclasses.replace(layout_of(c), world=4), steps=3, seed=5, dtype="fp32", recompute=rc,
                          progress=False, return_state=True, zero=3) for c, rc in MIRRORED.values()]
    results = launch(specs, 4)
    for (c, _), got in zip(MIRRORED.values(), results[1:]):
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
        plan = plan_of(c)
        plan = Plan(plan.model, plan.cluster, TrainSettings(**{**plan.train.to_dict(), "zero": 3}), plan.pipelines)
        parts = AnalyticCostModel().memory_parts(plan)
        z1 = AnalyticCostModel().memory_parts(Plan(plan.model, plan.cluster,
                                                   TrainSettings(**{**plan.train.to_dict(), "zero": 1}), plan.pipelines))
        for r, kept in enumerate(got["metrics"]["state_bytes"]):
            dev, j = f"M.{r}", r % 2
            for part, size in (("weights", 4), ("gradients", 4), ("optimizer", 8)):
                assert abs(kept[part] - parts[dev][part] * GIB) <= size, (r, part)
            layers = c[0][2][j][1]
            unit = 4 * largest_unit_params(m, layers, 1, first=j == 0, last=j == 1)
            assert kept["gathered"] == kept["unsummed"] == unit == 4 * m.layer_params(), r
            assert kept["gathered"] + kept["unsummed"] == pytest.approx(
                (parts[dev]["workspace"] - z1[dev]["workspace"]) * GIB, abs=0.5)


#: one-stage pipelines (the fsdp baseline's plans) under schedules that give their one rank
#: several chunks: interleaved 1F1B (two chunks) and the V schedule (two chunks, I/W split)
ONE_STAGE_CHUNKS = [(3, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 8)]), (1, "zb_v", [(1, 8)])]


def test_zero_3_is_accepted_on_one_stage_pipelines_whatever_chunks_their_schedule_gives():
    """``hexicore plan solver=fsdp schedule=interleaved_1f1b`` writes one-stage pipelines whose
    rank holds two chunks; no rank waits on another pipeline's activations, so the runtime runs
    ZeRO-3 on them (it refused them before launch)."""
    from hexicore_plugins.runtimes.torch.runtime import check_zero_layout
    from hexicore_plugins.runtimes.torch.parallel.assignment import zero3_runs
    from tests.helpers import layout_of
    layout = layout_of(ONE_STAGE_CHUNKS, global_batch=4)
    assert [p.actions.stages for p in layout.pipelines] == [2, 2]
    assert zero3_runs(layout)
    check_zero_layout(TrainSettings(global_batch=4, micro_batch=1, seq_len=32, zero=3), layout, "p.json")
    differing = layout_of([(2, "1f1b", [(1, 3), (1, 5)]), (2, "gpipe", [(1, 8)])], global_batch=4)
    assert not zero3_runs(differing)  # a two-stage pipeline next to another shape: still refused


@pytest.mark.slow
def test_zero_3_on_one_stage_pipelines_with_several_chunks_trains_like_one_process():
    """One 2-rank job: the reference, then :data:`ONE_STAGE_CHUNKS` under ZeRO-3: losses and
    weights within 1e-5 of one process."""
    import dataclasses

    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_actions
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, layout_of, tiny, worker_spec
    m = tiny()
    ref = build_layout(m, [(4, [StageGroup((0,), m.layers)], reference_actions(4))], global_batch=4,
                       micro_batch=1, seq_len=SEQ, world=2)
    layout = dataclasses.replace(layout_of(ONE_STAGE_CHUNKS, global_batch=4), world=2)
    results = launch([worker_spec(ref, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True),
                      worker_spec(layout, steps=3, seed=5, dtype="fp32", recompute=False, progress=False,
                                  return_state=True, zero=3)], 2)
    assert _max_rel(results[1]["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
    assert _max_abs(results[1]["state"], results[0]["state"]) <= 1e-5
    assert all(k["weights"] < 4 * m.total_params() for k in results[1]["metrics"]["state_bytes"])  # sharded
