"""The ``profiled`` cost model (hexicore.cost.profiled) and the profile file
(hexicore.core.profile): measured block times and links replace catalog peaks and configured
links, interpolated in FLOPs; what the profile lacks falls back to App. A with a warning."""

from __future__ import annotations

import logging

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import Profile, parse_profile
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.profiled import ProfiledCostModel, block_flops, interpolate, profiled_from_config
from tests.conftest import run_cli
from tests.helpers import (SAMPLE_CLUSTER as CLUSTER, SAMPLE_MODEL as MODEL, SAMPLE_SHAPE as SHAPE,
                           sample_profile as profile, sample_raw_profile as raw_profile)


def test_interpolation_is_affine_inside_and_proportional_outside():
    pts = [(10.0, 1.0), (40.0, 2.5)]
    assert interpolate(pts, 20.0) == pytest.approx(1.5)
    assert interpolate(pts, 80.0) == pytest.approx(5.0)
    assert interpolate(pts, 5.0) == pytest.approx(0.5)
    assert interpolate([(10.0, 1.0)], 30.0) == pytest.approx(3.0)


def test_block_time_measured_and_interpolated():
    cost = ProfiledCostModel(profile=profile())
    t1 = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    assert cost.compute_s(CLUSTER, MODEL, t1, ["A.0"], 3) == pytest.approx(3 * 0.030)
    t2 = TrainSettings(global_batch=8, micro_batch=2, seq_len=32, recompute=True)
    # micro-batch 2 lies a third of the way (in FLOPs) from 1 to 4: 0.040 + (0.100 - 0.040) / 3
    assert cost.compute_s(CLUSTER, MODEL, t2, ["A.0"], 1) == pytest.approx(0.060)
    assert cost.tp_comm_s(CLUSTER, MODEL, t1, ["A.0", "A.1"], 2) == 0.0  # measured at TP 2: inside
    assert cost.compute_s(CLUSTER, MODEL, t1, ["A.0", "A.1"], 2) == pytest.approx(2 * 0.024)


def test_links_are_the_measured_ones():
    cost = ProfiledCostModel(profile=profile())
    m = cost.measured(CLUSTER)
    assert m.beta("A.0", "B.0") == pytest.approx(0.5e9) and m.alpha("A.0", "B.0") == pytest.approx(1e-4)
    assert m.beta("A.0", "A.1") == pytest.approx(20e9) and m.beta("B.0", "B.1") == CLUSTER.beta("B.0", "B.1")
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    msg = 1 * 32 * 64 * t.dtype_bytes
    assert cost.hop_s(CLUSTER, MODEL, t, ["A.0"], ["B.0"]) == pytest.approx(2 * (1e-4 + msg / 0.5e9))


def test_missing_pieces_fall_back_with_a_warning(caplog):
    cost = ProfiledCostModel(profile=profile())
    ana = AnalyticCostModel()
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32)
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        got = cost.compute_s(CLUSTER, MODEL, t, ["B.0"], 2)
        cost.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1", "B.0", "B.1"][:2], 2)
        cost.compute_s(CLUSTER, MODEL, TrainSettings(8, 1, 32), ["A.0"], 2)
    assert got == ana.compute_s(CLUSTER, MODEL, t, ["B.0"], 2)
    assert any("rtx3090 was not profiled" in r.message for r in caplog.records)


def test_a_profile_of_another_block_shape_is_scaled_by_flops_with_a_warning(caplog):
    """A profile measured on another model's blocks prices this one by FLOPs, and says so once;
    a block of this model's shape (or one that records no shape) says nothing."""
    other = {"micro_batch": 1, "tp": 1, "seq_len": 32, "forward_s": 0.01, "backward_s": 0.02,
             "hidden": 128, "ffn": 352, "heads": 4, "kv_heads": 4}
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    for blk, warned in ((other, True), ({**other, **SHAPE}, False), ({k: v for k, v in other.items()
                                                                      if k not in SHAPE}, False)):
        cost = ProfiledCostModel(profile=parse_profile(
            {"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [blk]}}}, "p"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hexicore"):
            got = cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 1)
            cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 2)
        notes = [r.message for r in caplog.records if "shape" in r.message]
        assert len(notes) == int(warned) and (not warned or "hidden 64, ffn 176" in notes[0]), notes
        b = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [blk]}}}, "p")
        scale = block_flops(b.devices["rtx4090"].blocks[0], MODEL) / (MODEL.layer_flops_per_token(32) * 32)
        assert got == pytest.approx(0.03 / scale)


def test_a_block_of_another_head_width_is_not_taken_for_this_models(caplog):
    """hidden, ffn and heads equal but heads 512 wide (a Hugging Face ``head_dim``): the block's
    attention does ~9x the FLOPs, so it prices this model's block at its FLOPs' share, with the
    shape warning; the same block recording this model's width (16) is this model's, measured as is."""
    wide = {"micro_batch": 1, "tp": 1, "seq_len": 32, **SHAPE, "head_dim": 512, "forward_s": 0.01, "backward_s": 0.02}
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    for blk, own in ((wide, False), ({**wide, "head_dim": 16}, True)):
        prof = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [blk]}}}, "p")
        cost = ProfiledCostModel(profile=prof)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hexicore"):
            got = cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 1)
        notes = [r.message for r in caplog.records if "shape" in r.message]
        assert len(notes) == int(not own) and (own or "heads 4/4 of width 16" in notes[0]), notes
        flops = block_flops(prof.devices["rtx4090"].blocks[0], MODEL)
        assert (flops > 5 * MODEL.layer_flops_per_token(32) * 32) != own
        assert got == pytest.approx(0.03 * MODEL.layer_flops_per_token(32) * 32 / flops)
    assert parse_profile(prof.to_dict(), "again").devices["rtx4090"].blocks[0].head_dim == 16


def test_a_head_the_profile_lacks_or_measured_for_another_vocabulary_is_said(caplog):
    """No head in the profile: the analytic head, with a warning; a head measured at another
    vocabulary: scaled by FLOPs, with a warning naming both sizes."""
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    head = {"micro_batch": 1, "seq_len": 32, "hidden": 64, "vocab": 32000, "forward_s": 0.5, "backward_s": 1.0}
    for extra, words in (({}, "no head was profiled"), ({"head": head}, "vocab 32000, this model's is 64 x 256")):
        raw = raw_profile()
        raw["devices"]["rtx4090"].update(extra)
        cost = ProfiledCostModel(profile=parse_profile(raw, "p"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hexicore"):
            got = cost.head_s(CLUSTER, MODEL, t, ["A.0"])
        assert any(words in r.message for r in caplog.records), [r.message for r in caplog.records]
        if extra:
            assert got == pytest.approx(1.5 * 256 / 32000)


def test_tp_not_measured_scales_by_flops_per_device():
    p = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [
        {"micro_batch": 1, "tp": 1, "seq_len": 32, "forward_s": 0.01, "backward_s": 0.02}]}}}, "p")
    cost = ProfiledCostModel(profile=p)
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    assert cost.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1) == pytest.approx(0.015)
    assert cost.tp_comm_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1) > 0  # priced on the measured link


def test_profile_round_trip_and_errors(tmp_path):
    p = profile()
    path = p.save(tmp_path / "profile.yaml")
    assert Profile.load(path) == p
    assert block_flops(p.devices["rtx4090"].blocks[0], MODEL) == pytest.approx(MODEL.layer_flops_per_token(32) * 32)
    with pytest.raises(HexicoreError) as exc:
        parse_profile({"format": "hexicore.profile/1", "devices": {"x": {"blocks": [{"tp": 1}]}}}, "bad.yaml")
    assert exc.value.field == "devices.x.blocks[0].micro_batch"
    with pytest.raises(HexicoreError, match="cost.profile_file"):
        profiled_from_config({})


def test_plan_with_the_profiled_cost_model(tmp_path, capsys):
    path = profile().save(tmp_path / "profile.yaml")
    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\nmachines:\n"
                       "  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}\n"
                       "  - {name: B, gpu: rtx3090, count: 2, bandwidth_gbs: 16, latency_us: 10}\n")
    code = run_cli(["plan", f"cluster_file={cluster}", "model=tiny", "cost=profiled", f"cost.profile_file={path}",
                    "train.global_batch=8", f"out={tmp_path / 'plan.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    code = run_cli(["evaluate", f"plan_file={tmp_path / 'plan.json'}", "cost=profiled", f"cost.profile_file={path}",
                    f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err


def _bad(change) -> dict:
    doc = raw_profile()
    change(doc)
    return doc


BLOCKS = ("devices", "rtx4090", "blocks")
BAD_PROFILES = [
    (lambda d: d.update(colour=1), "colour"),
    (lambda d: (d["links"][0].update(between=["Y", "Z"]), d["links"][1].update(between=["Y", "Y"])),
     "links[0].between"),  # measured on another cluster: none of its machines is planned
    (lambda d: d["devices"]["rtx4090"]["blocks"].append({**d["devices"]["rtx4090"]["blocks"][0], "forward_s": 0.5}),
     "devices.rtx4090.blocks[3]"),
    (lambda d: d["devices"]["rtx4090"].update(blocks=[]), "devices.rtx4090.blocks"),
    (lambda d: d["devices"]["rtx4090"].update(blocks=None), "devices.rtx4090.blocks"),
    (lambda d: d.update(devices={}), "devices"),
    (lambda d: d["devices"]["rtx4090"]["blocks"][0].update(forward_s=0), "devices.rtx4090.blocks[0].forward_s"),
    (lambda d: d["links"].append(dict(d["links"][0], between=["B", "A"])), "links[2]"),
    (lambda d: d["links"][0].update(bandwidth_gbs=1e300), "links[0].bandwidth_gbs"),
    (lambda d: d["links"][0].update(latncy_s=1), "links[0].latncy_s"),
    (lambda d: d["devices"]["rtx4090"]["blocks"][0].update(action_s=1.0), "devices.rtx4090.blocks[0].action_s"),
]


@pytest.mark.parametrize("change, field", BAD_PROFILES, ids=[f for _, f in BAD_PROFILES])
def test_bad_profile_file_is_one_line_exit_2(change, field, tmp_path, capsys):
    import yaml

    path, out, cluster = tmp_path / "profile.yaml", tmp_path / "plan.json", tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(_bad(change)))
    cluster.write_text(yaml.safe_dump(CLUSTER.to_dict()))
    code = run_cli(["plan", f"cluster_file={cluster}", "model=tiny", "cost=profiled", f"cost.profile_file={path}",
                    "train.global_batch=8", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: {field}:" in err and not out.exists(), err


def _opt_profile(tp1: float, tp2: float) -> Profile:
    blk = {"seq_len": 32, **SHAPE, "forward_s": 0.010, "backward_s": 0.020}
    return parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {"blocks": [
        {"micro_batch": 1, "tp": 1, **blk, "optimizer_s": tp1}, {"micro_batch": 2, "tp": 1, **blk, "optimizer_s": tp1},
        {"micro_batch": 1, "tp": 2, **blk, "optimizer_s": tp2}]}}}, "p.yaml")


def test_optimizer_step_is_the_slowest_ranks_measured_update_added_to_dp():
    """OPT = max_d P(d) x r: r = a block's measured optimizer_s / its parameters on one TP rank."""
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.cost.precision import tp_replicated_layer_params

    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp32")
    plan = Plan(MODEL, CLUSTER, t, (Pipeline(8, (Stage(("A.0",), 1, (0, 1)), Stage(("A.1",), 1, (1, 4))),
                                             {"name": "1f1b"}),), solver={"name": "hand"})
    rate = 0.004 / MODEL.layer_params()
    last = (3 * MODEL.layer_params() + MODEL.head_params()) * rate  # A.1: 3 blocks + head > A.0: 1 + embedding
    cost = ProfiledCostModel(profile=_opt_profile(0.004, 0.003))
    assert cost.optimizer_s(plan) == pytest.approx(last)
    without = ProfiledCostModel(profile=_opt_profile(0.0, 0.0))  # no optimizer_s: the old estimate
    assert without.optimizer_s(plan) == 0.0
    assert cost.estimate(plan).dp_s == pytest.approx(without.estimate(plan).dp_s + last)
    assert cost.estimate(plan).iteration_s == pytest.approx(without.estimate(plan).iteration_s + last)
    # a TP-2 stage keeps half the split parameters, priced at the TP-2 rate
    tp2 = Plan(MODEL, CLUSTER, t, (Pipeline(8, (Stage(("A.0", "A.1"), 2, (0, 4)),), {"name": "1f1b"}),),
               solver={"name": "hand"})
    rep = tp_replicated_layer_params(MODEL)
    r2 = 0.003 / ((MODEL.layer_params() - rep) / 2 + rep)
    want = (4 * ((MODEL.layer_params() - rep) / 2 + rep) + MODEL.embedding_params() + MODEL.head_params()) * r2
    assert cost.optimizer_s(tp2) == pytest.approx(want)
    # B's GPU type was not profiled: its ranks add nothing; the field round-trips through the file
    on_b = Plan(MODEL, CLUSTER, t, (Pipeline(8, (Stage(("B.0",), 1, (0, 4)),), {"name": "1f1b"}),),
                solver={"name": "hand"})
    assert cost.optimizer_s(on_b) == 0.0
    assert parse_profile(_opt_profile(0.004, 0.003).to_dict(), "again") == _opt_profile(0.004, 0.003)


def test_dp_sync_priced_from_the_measured_allreduce_bus_bandwidth():
    """COMM-DP-LAYER = 2 (g - 1) / g x P B / busbw(g), busbw linear in g between measured sizes;
    holders on machines without a measured all-reduce keep App. A's ring on the measured links."""
    from hexicore.core.plan import Stage
    from hexicore.cost.measured_allreduce import bus_bandwidth

    assert bus_bandwidth([(2, 1.0), (4, 0.5)], 3) == pytest.approx(0.75)
    assert bus_bandwidth([(2, 1.0), (4, 0.5)], 8) == 0.5 and bus_bandwidth([(2, 1.0)], 3) == 1.0
    cost = ProfiledCostModel(profile=profile(allreduce=[{"between": ["B", "A"], "group": 2, "bandwidth_gbs": 0.8},
                                                        {"between": ["A", "B"], "group": 4, "bandwidth_gbs": 0.4}]))
    two = [Stage(("A.0",), 1, (0, 4)), Stage(("B.0",), 1, (0, 4))]
    assert cost.dp_layer_s(CLUSTER, two, 1e6, 4) == pytest.approx(2 * 0.5 * 4e6 / 0.8e9)
    three = [Stage(("A.0",), 1, (0, 4)), Stage(("B.0",), 1, (0, 4)), Stage(("B.1",), 1, (0, 4))]
    assert cost.dp_layer_s(CLUSTER, three, 1e6, 4) == pytest.approx(2 * (2 / 3) * 4e6 / 0.6e9)
    tp = [Stage(("A.0", "A.1"), 2, (0, 4)), Stage(("B.0",), 1, (0, 4))]  # B.0 all-reduces both TP chunks
    assert cost.dp_layer_s(CLUSTER, tp, 1e6, 4) == pytest.approx(2 * 0.5 * 4e6 / 0.8e9)
    inside = [Stage(("A.0",), 1, (0, 4)), Stage(("A.1",), 1, (0, 4))]  # no A-A all-reduce measured: the ring
    ring = AnalyticCostModel().dp_layer_s(cost.measured(CLUSTER), inside, 1e6, 4)
    assert cost.dp_layer_s(CLUSTER, inside, 1e6, 4) == pytest.approx(ring) and ring > 0


def test_a_stage_pays_one_actions_fixed_cost_not_one_per_block():
    """n t - (n - 1) a: each measured block time t holds one action's fixed cost a; the head's own
    a comes off too. a / t(1) = 2 - t(2) / t(1) from a chain of two blocks (the profile's action
    share), kept in [0, 1]; a sample stretched by load alike in both timings gives the same share."""
    from hexicore_plugins.runtimes.torch.profile.samplers import action_share

    assert action_share(0.030, 0.054) == pytest.approx(0.2) and action_share(0.030, 0.061) == 0.0
    assert action_share(0.045, 0.081) == pytest.approx(0.2) and action_share(0.030, 0.0) == 1.0
    blk = {"seq_len": 32, **SHAPE, "forward_s": 0.010, "backward_s": 0.020, "action_s": 0.006}
    p = parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {
        "blocks": [{"micro_batch": 1, "tp": 1, **blk}],
        "head": {"micro_batch": 1, "seq_len": 32, "hidden": 64, "vocab": 256, "forward_s": 0.004,
                 "backward_s": 0.008}}}}, "p")
    cost = ProfiledCostModel(profile=p)
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    assert cost.action_s(CLUSTER, ["A.0"]) == 0.006 and cost.action_s(CLUSTER, ["A.0", "A.1"]) == 0.0  # TP: per block
    assert cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 3) == pytest.approx(3 * 0.030 - 2 * 0.006)
    assert cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 1) == pytest.approx(0.030)
    head = cost.head_s(CLUSTER, MODEL, t, ["A.0"])
    assert cost.compute_s(CLUSTER, MODEL, t, ["A.0"], 2, last=True) == pytest.approx(0.054 + head - 0.006)


def test_chunked_schedules_pay_the_fixed_cost_once_per_chunk():
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.schedule_ref import ScheduleRef
    from hexicore.cost.profiled import chunks_per_stage

    assert [chunks_per_stage(ScheduleRef(n, p)) for n, p in
            (("1f1b", {}), ("interleaved_1f1b", {"chunks": 3}), ("hanayo", {"waves": 2}))] == [1, 3, 4]
    blk = {"seq_len": 32, **SHAPE, "forward_s": 0.010, "backward_s": 0.020, "action_s": 0.006}
    cost = ProfiledCostModel(profile=parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {
        "blocks": [{"micro_batch": 1, "tp": 1, **blk}]}}}, "p"))
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp32")
    stages = (Stage(("A.0",), 1, (0, 2)), Stage(("A.1",), 1, (2, 4)))
    one = Plan(MODEL, CLUSTER, t, (Pipeline(8, stages, ScheduleRef("1f1b", {})),), solver={"name": "hand"})
    two = Plan(MODEL, CLUSTER, t, (Pipeline(8, stages, ScheduleRef("interleaved_1f1b", {"chunks": 2})),),
               solver={"name": "hand"})
    plain, _ = cost.pipeline_pieces(one, one.pipelines[0])
    chunked, _ = cost.pipeline_pieces(two, two.pipelines[0])
    assert plain[0] == pytest.approx(2 * 0.030 - 0.006)
    assert chunked == pytest.approx([x + 0.006 for x in plain])


def test_a_profile_of_a_larger_fleet_prices_part_of_it(tmp_path, capsys):
    """Links of machines the planned cluster lacks are unused, with one warning naming them."""
    import yaml

    path, out, cluster = tmp_path / "profile.yaml", tmp_path / "plan.json", tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(_bad(lambda d: d["links"].append(dict(d["links"][0], between=["A", "Z"])))))
    cluster.write_text(yaml.safe_dump(CLUSTER.to_dict()))
    code = run_cli(["plan", f"cluster_file={cluster}", "model=tiny", "cost=profiled", f"cost.profile_file={path}",
                    "train.global_batch=8", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 0 and out.exists(), err
    assert "unused: Z" in err
    # the logger's warning reads like every other warning on stderr (it was "[date][hexicore][WARNING] - ...");
    # the job's log file keeps the full record
    line = next(ln for ln in err.splitlines() if "unused: Z" in ln)
    assert line.startswith("warning: profiled cost model: ") and "[WARNING]" not in err, err
    assert "[hexicore][WARNING] - profiled cost model: " in (tmp_path / "r" / "plan.log").read_text()


def test_an_all_devices_profile_prices_each_device_by_its_own_entry(tmp_path, capsys):
    """A ``profile.all_devices=true`` profile (keyed by device id) of two machines of one GPU type,
    one emulated 3x slower: each device is priced from its own entry, a group by its slowest."""
    import json

    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "emu", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                                                     "machines": [{"name": "A", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32},
                                                                  {"name": "B", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32,
                                                                   "emulate": {"slowdown": 3}}]}))

    def entry(k: float) -> dict:
        return {"blocks": [{"micro_batch": 1, "tp": 1, "seq_len": 32, "hidden": 64, "ffn": 176, "heads": 4,
                            "kv_heads": 2, "forward_s": 0.01 * k, "backward_s": 0.02 * k}]}

    raw = {"format": "hexicore.profile/1", "devices": {"A.0": entry(1), "B.0": entry(3)},
           "links": [{"between": ["A", "B"], "latency_s": 5e-5, "bandwidth_gbs": 1.0}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    code = run_cli(["plan", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", "cost=profiled",
                    f"cost.profile_file={tmp_path / 'p.yaml'}", "solver=megatron", "train.global_batch=4",
                    "train.micro_batch=1", f"out={tmp_path / 'plan.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 0 and "its compute is the analytic" not in err, err
    from hexicore.core.cluster import Cluster
    from hexicore.core.plan import Plan

    plan, cost = Plan.load(tmp_path / "plan.json"), ProfiledCostModel(profile=Profile.load(tmp_path / "p.yaml"))
    cluster, model, train = Cluster.load(tmp_path / "c.yaml"), plan.model, plan.train
    a, b = (cost.compute_s(cluster, model, train, [d], 4) for d in ("A.0", "B.0"))
    # forward + backward + the recomputed forward (plan.train.recompute; recompute_s not profiled: the forward)
    assert b == pytest.approx(3 * a) and a == pytest.approx(4 * 0.04 * model.layer_flops_per_token(32)
                                                            / block_flops(Profile.load(tmp_path / "p.yaml")
                                                                          .devices["A.0"].blocks[0], model) * 32, rel=1e-6)
    # a TP group of both (TP 2 scaled from TP 1 by FLOPs per device) waits for the slower device
    assert cost.block_s(cluster, model, train, ["A.0", "B.0"]) == pytest.approx(cost.block_s(cluster, model, train,
                                                                                              ["B.0"]) / 2)
    pieces = json.loads((tmp_path / "plan.json").read_text())["estimate"]["breakdown"]["pipelines"]
    stage_s = {s.devices[0]: x for p, b in zip(plan.pipelines, pieces) for s, x in zip(p.stages, b["stage_s"])
               if len(s.devices) == 1}
    assert stage_s["B.0"] == pytest.approx(3 * stage_s["A.0"], rel=0.05), stage_s  # the emulated slowdown, priced
