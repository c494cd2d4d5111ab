"""Sharded state in the torch runtime beyond one run: checkpoints of ZeRO-1/2/3 state in the
unsharded format (resumed under any stage) and hybrid sharding (``zero_scope=machine``)."""

import dataclasses

import pytest

from hexicore.cost import AnalyticCostModel
from tests.helpers import HYBRID, HYBRID3, _hybrid_plan

GIB = 2**30
#: two pipelines, different cuts, batches and schedules: 1f1b [0,3)+[3,8) | gpipe [0,8)
ASYM = [(5, "1f1b", [(1, 3), (1, 5)]), (3, "gpipe", [(1, 8)])]
#: interleaved (several chunks per rank): ZeRO-2 at the step, through ShardedAdamW
INTER = [(5, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 4), (1, 4)]), (3, "gpipe", [(1, 8)])]
#: one stage per pipeline: what ZeRO-3 runs on (:class:`ShardedState`)
FLAT = [(3, "1f1b", [(1, 8)]), (3, "gpipe", [(1, 8)]), (2, "1f1b", [(1, 8)])]


@pytest.mark.slow
def test_zero_checkpoints_resume_under_any_stage_like_the_uninterrupted_run(tmp_path):
    """One 3-rank job, 3 steps each, checkpoints at step 2: ZeRO-1 and ZeRO-2 at the step
    (ShardedAdamW; interleaved for ZeRO-2), ZeRO-3 (one stage per pipeline: ShardedState) each resumed from its own checkpoint end on the uninterrupted
    run's weights (1e-6); a ZeRO-1 checkpoint resumed with zero=0 and a zero=0 checkpoint with
    ZeRO-1 too, a ZeRO-3 checkpoint with zero=0; the files do not depend on the stage."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file

    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from tests.helpers import _max_abs, _max_rel, layout_of, worker_spec
    asym, flat = layout_of(ASYM), layout_of(FLAT)
    inter = dataclasses.replace(layout_of(INTER), world=3)

    def run(layout, zero, *, save=None, resume=None):
        kw = {"checkpoint_every": 2, "out": str(tmp_path / save)} if save else \
            {"resume": str(tmp_path / resume / "checkpoints" / "step_2")}
        return worker_spec(layout, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True,
                           zero=zero, **kw)

    runs = {"z0": run(asym, 0, save="z0"), "z1": run(asym, 1, save="z1"), "z1<z1": run(asym, 1, resume="z1"),
            "z0<z1": run(asym, 0, resume="z1"), "z1<z0": run(asym, 1, resume="z0"),
            "z2i": run(inter, 2, save="z2i"), "z2i<z2i": run(inter, 2, resume="z2i"),
            "z3": run(flat, 3, save="z3"), "z3<z3": run(flat, 3, resume="z3"), "z0<z3": run(flat, 0, resume="z3")}
    got = dict(zip(runs, launch(list(runs.values()), 3)))
    uninterrupted = {"z1<z1": "z1", "z0<z1": "z0", "z1<z0": "z1", "z2i<z2i": "z2i", "z3<z3": "z3",
                     "z0<z3": "z3"}
    for name, whole in uninterrupted.items():
        assert _max_abs(got[name]["state"], got[whole]["state"]) <= 1e-6, name
        assert _max_rel(got[name]["metrics"]["losses"], got[whole]["metrics"]["losses"]) <= 1e-6, name
    for zero in ("z1", "z2i", "z3"):  # the same tensors, names and shapes as unsharded training
        for f in ("model.safetensors", "optim.safetensors"):
            a, b = (load_file(tmp_path / z / "checkpoints" / "step_2" / f) for z in ("z0", zero))
            assert sorted(a) == sorted(b) and _max_abs(a, b) <= 1e-6, (zero, f)


@pytest.mark.slow
def test_hybrid_sharding_trains_like_one_process_and_keeps_the_predicted_optimizer_bytes(tmp_path):
    """One 4-rank job on :data:`HYBRID` (machines M: 3 ranks, N: 1): ZeRO-1 and ZeRO-2 with
    ``zero_scope=machine`` train like one process (1e-5); each rank's AdamW state equals the cost
    model's for ``zero_scope=machine`` (within one element per group); a hybrid checkpoint resumes
    under ``zero_scope=all`` and hybrid again like the uninterrupted run (1e-6). The same for
    hybrid ZeRO-3 on :data:`HYBRID3` (even shards, and uneven ones inside machine M)."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.data.sync import sync_plan
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from hexicore.registry import Registry
    from tests.helpers import CPU6_SEQ as SEQ, _max_abs, _max_rel, tiny, worker_spec
    m = tiny()
    ref = build_layout(m, [(8, [StageGroup((0,), m.layers)], reference_actions(8))], global_batch=8,
                       micro_batch=1, seq_len=SEQ, world=4)
    plan = _hybrid_plan(1)
    layout = plan_layout(plan, [p.schedule for p in plan.pipelines], registry=Registry.default(), seq_len=SEQ)
    machines = tuple(plan.cluster.device(d).machine for d in plan.devices)
    assert machines == ("M", "M", "M", "N")
    base = {"layout": layout, "steps": 3, "seed": 5, "dtype": "fp32", "recompute": False, "progress": False,
            "return_state": True}
    plan3 = _hybrid_plan(3, pipelines=HYBRID3)
    layout3 = plan_layout(plan3, [p.schedule for p in plan3.pipelines], registry=Registry.default(), seq_len=SEQ)
    base3, step2 = {**base, "layout": layout3, "zero": 3}, str(tmp_path / "h3" / "checkpoints" / "step_2")
    specs = [worker_spec(ref, steps=3, seed=5, dtype="fp32", recompute=False, progress=False, return_state=True),
             worker_spec(**base, zero=1, machines=machines, checkpoint_every=2, out=str(tmp_path / "h1")),
             worker_spec(**base, zero=2, machines=machines),
             worker_spec(**base, zero=1, resume=str(tmp_path / "h1" / "checkpoints" / "step_2")),
             worker_spec(**base, zero=1, machines=machines, resume=str(tmp_path / "h1" / "checkpoints" / "step_2")),
             worker_spec(**base3, machines=machines, checkpoint_every=2, out=str(tmp_path / "h3")),
             worker_spec(**base3, machines=machines, shard_weights=(1.0, 3.0, 2.0, 1.0)),
             worker_spec(**base3, resume=step2), worker_spec(**base3, machines=machines, resume=step2)]
    results = launch(specs, 4)
    for got in results[1:]:
        assert _max_rel(got["metrics"]["losses"], results[0]["metrics"]["losses"]) <= 1e-5
        assert _max_abs(got["state"], results[0]["state"]) <= 1e-5
    for resumed, whole in ((3, 1), (4, 1), (7, 5), (8, 5)):  # into zero_scope=all and into hybrid again
        assert _max_abs(results[resumed]["state"], results[whole]["state"]) <= 1e-6, resumed
    for zero, got, lay, p in ((1, results[1], layout, plan), (2, results[2], layout, plan),
                              (3, results[5], layout3, plan3)):
        parts = AnalyticCostModel().memory_parts(_hybrid_plan(zero, pipelines=HYBRID3 if zero == 3 else HYBRID))
        groups = sync_plan(lay).members()
        for r, b in enumerate(got["metrics"]["optimizer_state_bytes"]):
            slack = 8 * sum(1 for g in groups if r in g)
            assert abs(b - parts[p.devices[r]]["optimizer"] * GIB) <= slack, (zero, r, b)
    z3 = results[5]["metrics"]["optimizer_state_bytes"]  # N.0 keeps whole moments, M.0 a half or a third
    assert z3[3] == 8 * layout3.model.total_params() and z3[0] < z3[3] / 2
    every = AnalyticCostModel().memory_parts(_hybrid_plan(1, "all"))
    mine = results[1]["metrics"]["optimizer_state_bytes"]
    assert mine[3] > every["N.0"]["optimizer"] * GIB  # N.0 alone in its machine keeps whole moments
    assert mine[3] == pytest.approx(2 * mine[0], rel=1e-3)  # M.0 shares every chunk with one other holder in machine M


def test_hybrid_segments_cut_at_every_machines_pieces_by_hand():
    """Machine M (ranks 0, 1, 2) and N (rank 3) holding a 10-element bucket: M cuts 4 | 3 | 3,
    N keeps all; the segments are M's pieces, each summed with rank 3; N's piece crosses three
    rings. With N split too (ranks 3, 4: 5 | 5) the cuts are 0, 4, 5, 7, 10."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.data.hybrid import atom_cross, atom_segments, communicators, peers_of, segments, split

    machines = ("M", "M", "M", "N", "N")
    assert segments((0, 1, 2, 3), 10, None, machines) == [(0, 4, (0, 3)), (4, 7, (1, 3)), (7, 10, (2, 3))]
    assert split((0, 1, 2, 3), 10, 3, None, machines).cross == ((0, 4, (0, 3)), (4, 7, (1, 3)), (7, 10, (2, 3)))
    sp = split((0, 1, 2, 3), 10, 1, None, machines)
    assert sp.peers == (0, 1, 2) and sp.piece == (4, 7) and sp.cross == ((4, 7, (1, 3)),)
    assert [s[:2] for s in segments((0, 1, 2, 3, 4), 10, None, machines)] == [(0, 4), (4, 5), (5, 7), (7, 10)]
    assert segments((0, 1, 2, 3, 4), 10, None, machines)[1][2] == (1, 3)
    assert split((0, 1), 10, 1, None, None).piece == (5, 10)  # no machines: among all members
    assert communicators({(0, 1, 2, 3): 10}, None, machines) == [(0, 3), (1, 3), (2, 3), (0, 1, 2)]
    assert communicators({(0, 3): 10, (1, 3): 10}, None, machines) == []  # one holder per machine: the groups
    # ZeRO-3 cuts unit by unit (atoms of 4 and 6): M apportions 2 | 1 | 1 and 2 | 2 | 2 (rounding carried)
    assert atom_segments((0, 1, 2, 3), [4, 6], None, machines) == [
        (0, 2, (0, 3)), (2, 3, (1, 3)), (3, 4, (2, 3)), (4, 6, (0, 3)), (6, 8, (1, 3)), (8, 10, (2, 3))]
    assert atom_cross((0, 1, 2, 3), [4, 6], 1, None, machines) == ((2, 3, (1, 3)), (6, 8, (1, 3)))
    assert peers_of((0, 1, 2, 3), 3, machines) == (3,) and peers_of((0, 3), 3, None) == (0, 3)
    assert communicators({(0, 1, 2, 3): 10}, None, machines, {(0, 1, 2, 3): [4, 6]}) == \
        [(0, 3), (1, 3), (2, 3), (0, 1, 2)]
