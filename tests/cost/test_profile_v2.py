"""Profile format /2 (hexicore.core.profile): heads and embeddings per micro-batch and TP, link
points per message size, the per-step overhead; written, read back, and each entry priced by
the ``profiled`` cost model the way it should; /1 files still load."""

from __future__ import annotations

import copy

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.profile import FORMAT, Profile, parse_profile
from hexicore.core.settings import TrainSettings
from hexicore.cost.profiled import ProfiledCostModel
from tests.helpers import SAMPLE_CLUSTER as CLUSTER, SAMPLE_MODEL as MODEL, sample_raw_profile

T = TrainSettings(global_batch=8, micro_batch=2, seq_len=32, recompute=False)
MSG = 2 * 32 * 64 * T.dtype_bytes  # one hop's activation


def raw_v2() -> dict:
    raw = sample_raw_profile(step_overhead_s=0.003)
    raw["format"] = FORMAT
    end = {"seq_len": 32, "hidden": 64, "vocab": 256}
    raw["devices"]["rtx4090"]["heads"] = [{"micro_batch": 1, "tp": 1, **end, "forward_s": 0.002, "backward_s": 0.004,
                                           "activation_bytes": 65536},
                                          {"micro_batch": 4, "tp": 1, **end, "forward_s": 0.005, "backward_s": 0.010}]
    raw["devices"]["rtx4090"]["embeddings"] = [{"micro_batch": 1, "tp": 1, **end, "forward_s": 0.001,
                                                "backward_s": 0.002},
                                               {"micro_batch": 4, "tp": 1, **end, "forward_s": 0.004,
                                                "backward_s": 0.005}]
    raw["links"][0]["points"] = [[1024, 2e-4], [MSG // 2, 3e-4], [MSG * 2, 9e-4]]
    return raw


def test_a_v2_profile_round_trips_through_its_file(tmp_path):
    prof = parse_profile(raw_v2(), "p.yaml")
    back = Profile.load(prof.save(tmp_path / "p.yaml"))
    assert back == prof and back.step_overhead_s == 0.003
    dev = back.devices["rtx4090"]
    assert [h.micro_batch for h in dev.heads] == [1, 4] and dev.heads[0].activation_bytes == 65536
    assert [e.micro_batch for e in dev.embeddings] == [1, 4] and dev.head == dev.heads[0]
    assert back.link("B", "A").points == ((1024, 2e-4), (MSG // 2, 3e-4), (MSG * 2, 9e-4))


def test_each_v2_entry_prices_its_part():
    """Head: interpolated per micro-batch (2 of 1..4: a third of the way, 0.006 + (0.015 - 0.006)
    / 3), the same at TP 2 (the head is whole on each TP rank); embedding: added to the first
    stage only; a hop: its message from the link's points (halfway between MSG/2 and 2 MSG:
    3e-4 + 6e-4 / 3); the per-step overhead: in the step's part after the pipelines."""
    cost = ProfiledCostModel(profile=parse_profile(raw_v2(), "p.yaml"))
    assert cost.head_s(CLUSTER, MODEL, T, ["A.0"]) == pytest.approx(0.009)
    assert cost.head_s(CLUSTER, MODEL, T, ["A.0", "A.1"]) == pytest.approx(0.009)
    assert cost.embedding_s(CLUSTER, MODEL, T, ["A.0"]) == pytest.approx(0.003 + 0.006 / 3)
    first = cost.stage_s(CLUSTER, MODEL, T, ["A.0"], 2, first=True)
    assert first - cost.stage_s(CLUSTER, MODEL, T, ["A.0"], 2) == pytest.approx(0.005)
    assert cost.message_s(CLUSTER, "A.0", "B.0", MSG) == pytest.approx(3e-4 + 6e-4 / 3)
    assert cost.hop_s(CLUSTER, MODEL, T, ["A.0"], ["B.0"]) == pytest.approx(2 * (3e-4 + 6e-4 / 3))
    plan = Plan(MODEL, CLUSTER, T, (Pipeline(4, (Stage(("A.0",), 1, (0, 2)), Stage(("B.0",), 1, (2, 4)))),))
    plain = ProfiledCostModel(profile=parse_profile({**raw_v2(), "step_overhead_s": 0.0}, "p.yaml"))
    assert cost.dp_s(plan) - plain.dp_s(plan) == pytest.approx(0.003)


def test_changing_an_entry_changes_the_price_as_it_should():
    base = ProfiledCostModel(profile=parse_profile(raw_v2(), "p.yaml"))
    slower = raw_v2()
    for h in slower["devices"]["rtx4090"]["heads"]:
        h["backward_s"] *= 3  # the head's backward three times as long
    for e in slower["devices"]["rtx4090"]["embeddings"]:
        e["forward_s"] += 0.01
    slower["links"][0]["points"][2][1] = 1.5e-3
    cost = ProfiledCostModel(profile=parse_profile(slower, "p.yaml"))
    grown = (0.004 * 2) + (0.010 * 2 - 0.004 * 2) / 3  # the backward's share of the interpolated head
    assert cost.head_s(CLUSTER, MODEL, T, ["A.0"]) - base.head_s(CLUSTER, MODEL, T, ["A.0"]) == pytest.approx(grown)
    assert cost.embedding_s(CLUSTER, MODEL, T, ["A.0"]) - base.embedding_s(CLUSTER, MODEL, T, ["A.0"]) == \
        pytest.approx(0.01)
    assert cost.message_s(CLUSTER, "A.0", "B.0", MSG) == pytest.approx(3e-4 + 1.2e-3 / 3)
    assert cost.message_s(CLUSTER, "A.0", "B.0", MSG * 4) == base.message_s(CLUSTER, "A.0", "B.0", MSG * 4)  # the fit


def test_v1_files_still_load_and_may_not_carry_v2_fields():
    raw = sample_raw_profile()
    raw["devices"]["rtx4090"]["head"] = {"micro_batch": 1, "seq_len": 32, "forward_s": 0.5, "backward_s": 1.0}
    prof = parse_profile(raw, "old.yaml")
    assert prof.devices["rtx4090"].head.forward_s == 0.5 and prof.devices["rtx4090"].head.tp == 1
    for where, change in (("step_overhead_s", lambda r: r.update(step_overhead_s=0.1)),
                          ("devices.rtx4090.embeddings", lambda r: r["devices"]["rtx4090"].update(embeddings=[])),
                          ("links[0].points", lambda r: r["links"][0].update(points=[]))):
        bad = copy.deepcopy(raw)
        change(bad)
        with pytest.raises(HexicoreError) as e:
            parse_profile(bad, "old.yaml")
        assert e.value.field == where and "hexicore.profile/2" in str(e.value)


def test_bad_v2_entries_name_their_field():
    for where, change in (
            ("devices.rtx4090.heads[1]", lambda r: r["devices"]["rtx4090"]["heads"][1].update(micro_batch=1)),
            ("links[0].points", lambda r: r["links"][0]["points"].reverse()),
            ("links[0].points[0]", lambda r: r["links"][0]["points"][0].append(3)),
            ("devices.rtx4090.embeddings[0].forward_s",
             lambda r: r["devices"]["rtx4090"]["embeddings"][0].update(forward_s=0))):
        bad = raw_v2()
        change(bad)
        with pytest.raises(HexicoreError) as e:
            parse_profile(bad, "p.yaml")
        assert e.value.field == where, (where, e.value)
