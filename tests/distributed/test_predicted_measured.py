"""Predicted vs measured: the cost model's forward/backward split of each stage
(hexicore.cost.split), the ``predicted`` object built from an estimate and its comparison rows
(hexicore.core.prediction), ``evaluate`` printing the predictions, and one slow plan run whose
``metrics.json`` holds both objects, with an emulated slow stage measured as slower."""

from __future__ import annotations

import json

import pytest

from hexicore.core.estimate import Estimate
from hexicore.core.prediction import comparison_rows, error_pct, predictions
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.profiled import ProfiledCostModel
from tests.conftest import run_cli
from tests.helpers import CPU6_SEQ as SEQ, plan_of, tiny
from tests.helpers import SAMPLE_CLUSTER as PCLUSTER, SAMPLE_MODEL as PMODEL, sample_profile as profile


# ------------------------------------------------------------------ the cost model's split
@pytest.mark.parametrize("recompute", [False, True])
def test_analytic_breakdown_splits_each_stage_into_forward_and_backward(recompute):
    """forward = compute / k (k = 3, or 4 with recomputation) + TP comm x 4 / c (c = 8, or 12);
    forward + backward = the stage time; pipeline 0 is tp2 [0,5) + tp1 [5,8), pipeline 1 three tp1."""
    base = plan_of([(5, "1f1b", [(2, 5), (1, 3)]), (3, "gpipe", [(1, 3), (1, 3), (1, 2)])])
    plan = Plan.from_dict({**json.loads(base.to_json()), "train": {
        "global_batch": 8, "micro_batch": 1, "seq_len": SEQ, "dtype": "fp32", "recompute": recompute}})
    est = AnalyticCostModel().estimate(plan)
    m, c = tiny(), plan.cluster
    flops_s = c.device("M.0").tflops * 1e12 * 0.55  # catalog peak x the default efficiency
    tokens = 1 * SEQ  # forward FLOPs = tokens x layer FLOPs/token: k cancels out of compute x 1/k
    layer = m.layer_flops_per_token(SEQ)
    msg = tokens * m.hidden * 4  # fp32 activation of one micro-batch
    tp_comm = (12.0 if recompute else 8.0) * 5 * (10e-6 + msg / (2 * 32e9))  # 5 layers, 2 devices, one peer
    want = [[tokens * 5 * layer / (2 * flops_s) + tp_comm * 4 / (12.0 if recompute else 8.0),
             tokens * (3 * layer + m.head_flops_per_token()) / flops_s],
            [tokens * 3 * layer / flops_s, tokens * 3 * layer / flops_s,
             tokens * (2 * layer + m.head_flops_per_token()) / flops_s]]
    for p, expect in zip(est.breakdown["pipelines"], want):
        assert p["forward_s"] == pytest.approx(expect, rel=1e-12)
        assert [f + b for f, b in zip(p["forward_s"], p["backward_s"])] == pytest.approx(p["stage_s"], rel=1e-12)
        assert all(b > f > 0 for f, b in zip(p["forward_s"], p["backward_s"]))


def test_profiled_forward_share_is_the_measured_blocks():
    """rtx4090 blocks at TP 1: forward 0.010 + 0.025 of forward + backward 0.090 (+ recompute 0.035)."""
    cost = ProfiledCostModel(profile=profile())
    plain = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False)
    re = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=True)
    assert cost.forward_fraction(PCLUSTER, PMODEL, plain, ["A.0"]) == pytest.approx(0.035 / 0.105)
    assert cost.forward_fraction(PCLUSTER, PMODEL, re, ["A.0"]) == pytest.approx(0.035 / 0.140)
    assert cost.forward_fraction(PCLUSTER, PMODEL, plain, ["A.0", "A.1"]) == pytest.approx(0.008 / 0.024)
    assert cost.forward_fraction(PCLUSTER, PMODEL, plain, ["B.0"]) == pytest.approx(1 / 3)  # not profiled


# ------------------------------------------------------------------ predictions from an estimate
EST = Estimate(2.5, 0.4, 1000.0, (2.0, 1.75), 0.5, {"A.1": 3.0, "A.0": 2.0, "B.0": 7.5}, (),
               {"pipelines": [{"stage_s": [0.3, 0.6], "hop_s": [0.05], "forward_s": [0.1, 0.2], "backward_s": [0.2, 0.4]},
                              {"stage_s": [0.9], "hop_s": [], "forward_s": [0.3], "backward_s": [0.6]}]})


def test_predictions_are_the_estimates_numbers_in_rank_order():
    got = predictions(EST, ["A.0", "A.1", "B.0"])
    assert got == {"step_s": 2.5, "pipelines_s": [2.0, 1.75], "dp_sync_s": 0.5, "peak_memory_gb": [2.0, 3.0, 7.5],
                   "stages": [[{"forward_s": 0.1, "backward_s": 0.2}, {"forward_s": 0.2, "backward_s": 0.4}],
                              [{"forward_s": 0.3, "backward_s": 0.6}]], "hops": [[0.025], []]}
    bare = Estimate(2.5, 0.4, 1000.0, (2.0,), 0.5, {"A.0": 2.0}, (), {"pipelines": [{"stage_s": [0.3]}]})
    assert predictions(bare, ["A.0"])["stages"] is None  # a breakdown that does not split its stages
    assert predictions(bare, ["A.0"])["hops"] is None  # nor gives its hops


def test_predicted_peaks_leave_out_the_memory_kept_free_for_the_cuda_context():
    """A CUDA allocator's peak counts the run's tensors, not the context and slack the cost model
    keeps free (``reserve_gb``): the predicted peak is ``memory_gb`` less the reserve."""
    est = Estimate(2.5, 0.4, 1000.0, (2.0,), 0.5, {"A.0": 2.0, "A.1": 0.5}, (), {"pipelines": [], "reserve_gb": 1.0})
    assert predictions(est, ["A.1", "A.0"])["peak_memory_gb"] == [0.0, 1.0]
    plan = plan_of([(5, "1f1b", [(2, 5), (1, 3)]), (3, "gpipe", [(1, 3), (1, 3), (1, 2)])])
    for reserve in (0.0, 1.5):
        priced = AnalyticCostModel(reserve_gb=reserve).estimate(plan)
        assert priced.breakdown["reserve_gb"] == reserve
        assert predictions(priced, plan.devices)["peak_memory_gb"] == [round(priced.memory_gb[d] - reserve, 3)
                                                                       for d in plan.devices]


def test_comparison_rows_and_error_percent():
    pred = predictions(EST, ["A.0", "A.1", "B.0"])
    meas = {"step_s": 2.0, "pipelines_s": [2.0, 1.0], "dp_sync_s": 0.0, "peak_memory_gb": [1.0, 4.0],
            "stages": [[{"forward_s": 0.05, "backward_s": 0.25}, {"forward_s": 0.2, "backward_s": 0.5}],
                       [{"forward_s": 0.3, "backward_s": 0.6}]], "hops": [[0.02], []]}
    rows = {q: (p, m, e) for q, p, m, e in comparison_rows(pred, meas)}
    assert len(rows) == 1 + 2 + 1 + 2 * 3 + 1 + 3
    assert rows["pipeline 0 hop 0 s"][:2] == (0.025, 0.02) and rows["pipeline 0 hop 0 s"][2] == pytest.approx(25.0)
    assert rows["step_s"] == (2.5, 2.0, 25.0)
    assert rows["pipeline 1 s"] == (1.75, 1.0, 75.0)
    assert rows["dp_sync_s"] == (0.5, 0.0, None)  # nothing measured to divide by
    assert rows["pipeline 0 stage 0 forward_s"] == (0.1, 0.05, 100.0)
    assert rows["pipeline 0 stage 1 backward_s"][2] == pytest.approx(-20.0)
    assert rows["rank 2 peak_memory_gb"] == (7.5, None, None)
    alone = comparison_rows(pred, None)  # evaluate: predictions only
    assert [r[2] for r in alone] == [None] * len(alone) and alone[0][:2] == ("step_s", 2.5)
    assert error_pct(1.0, 4.0) == -75.0 and error_pct(None, 1.0) is None


def test_a_hop_is_timed_from_the_post_to_the_arrival_where_the_receiver_was_waiting():
    """``hop_times`` pairs each receive with its send (kind, receiving stage, micro-batch, step):
    pipeline ranks 0 -> 1 (activations) and 1 -> 0 (gradients) cross boundary 0. Counted: a receive
    asked for before the post (arrival - post); not counted: one asked for after the post (it says
    when the receiver came, not when the bytes did), nor a wrap-around between ranks 0 and 2."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.profile.measure import hop_times

    sender = {"pipeline": 0, "stage": 0, "messages": [
        [("send", (0, 1, 0), 10.0, 10.0), ("send", (0, 1, 1), 20.0, 20.0), ("recv", (1, 0, 0), 29.0, 30.5),
         ("send", (0, 2, 0), 40.0, 40.0)],
        [("send", (0, 1, 0), 50.0, 50.0)]]}
    receiver = {"pipeline": 0, "stage": 1, "messages": [
        [("recv", (0, 1, 0), 9.0, 10.25), ("recv", (0, 1, 1), 21.0, 21.0), ("send", (1, 0, 0), 30.0, 30.0)],
        [("recv", (0, 1, 0), 49.0, 50.75)]]}
    last = {"pipeline": 0, "stage": 2, "messages": [[("recv", (0, 2, 0), 39.0, 40.5)], []]}
    other = {"pipeline": 1, "stage": 0, "messages": [[], []]}
    got = hop_times([sender, receiver, last, other], [3, 1])
    assert got[0][0] == pytest.approx(0.5)  # median of 0.25 (F, step 0), 0.5 (B), 0.75 (F, step 1)
    assert got[0][1] is None and got[1] == []  # (ranks 0 -> 2 is no neighbour's hop)


def test_evaluate_prints_the_predictions(tmp_path, capsys):
    plan = plan_of([(5, "1f1b", [(2, 5), (1, 3)]), (3, "gpipe", [(1, 3), (1, 3), (1, 2)])])
    path = tmp_path / "plan.json"
    plan.save(path)
    assert run_cli(["evaluate", f"plan_file={path}", f"out={tmp_path / 'priced.json'}"]) == 0
    out = capsys.readouterr().out
    est = Plan.load(tmp_path / "priced.json").estimate
    want = predictions(est, Plan.load(tmp_path / "priced.json").devices)
    assert "predicted (cost model)" in out
    for q, p, _, _ in comparison_rows(want, None):
        line = next(x for x in out.splitlines() if f" {q} " in x)
        assert (f"{p:.4g} GiB" if q.endswith("memory_gb") else f"{p:.4g} s") in line, q
    assert "pipeline 1 stage 2 backward_s" in out and "rank 4 peak_memory_gb" in out


def test_a_large_plans_table_shows_the_largest_rows_and_says_how_many_it_leaves_out():
    """30 stages x 2 ranks: 60 forward/backward rows, 29 hop rows and 60 memory rows, over the 48
    listed one by one; the table keeps step, pipelines and DP sync, the largest of each quantity
    (by measured value) and the eight largest errors, and the line below counts the rest."""
    from rich.console import Console

    from hexicore.app.report import DETAIL_ROWS, prediction_table

    stages = [{"forward_s": 0.1 + i / 1000, "backward_s": 0.2} for i in range(30)]
    pred = {"step_s": 7.0, "pipelines_s": [6.0], "dp_sync_s": 1.0, "stages": [stages],
            "peak_memory_gb": [5.0] * 60, "hops": [[0.01 + (0.01 if j == 11 else 0) for j in range(29)]]}
    meas = {**pred, "stages": [[{**s, "backward_s": 0.2 + (0.1 if i == 7 else 0)} for i, s in enumerate(stages)]],
            "peak_memory_gb": [5.0] * 59 + [6.0]}
    rows = comparison_rows(pred, meas)
    assert len(rows) - 4 > DETAIL_ROWS
    con = Console(width=200, record=True)
    con.print(prediction_table(pred, meas))
    out = con.export_text()
    listed = [q for q, *_ in rows if f" {q} " in out]
    assert listed[:3] == ["step_s", "pipeline 0 s", "dp_sync_s"]
    assert {"pipeline 0 stage 29 forward_s", "pipeline 0 stage 7 backward_s", "rank 59 peak_memory_gb",
            "pipeline 0 hop 11 s"} <= set(listed)
    assert len(listed) <= 3 + 4 + 8 and f"{len(rows) - len(listed)} stage, hop and rank rows not shown" in out
    con = Console(width=200, record=True)
    con.print(prediction_table(pred, None))  # evaluate: no errors, the largest of each quantity
    out = con.export_text()
    assert sum(f" {q} " in out for q, *_ in rows) == 3 + 4 and f"{len(rows) - 7} stage, hop and rank rows" in out


# ------------------------------------------------------------------ one training run
def _emulated_plan() -> dict:
    """Three ranks: pipeline 0 = F.0 [0,4) + S.0 [4,8), pipeline 1 = F.1 whole; S is slowed down
    10x, so a measured ratio of 2 holds however loaded the machine is."""
    d = json.loads(plan_of([(4, "1f1b", [(1, 4), (1, 4)]), (4, "1f1b", [(1, 8)])]).to_json())
    d["cluster"] = {"name": "emu", "inter": {"bandwidth_gbs": 0.7, "latency_us": 50},
                    "machines": [{"name": "F", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32, "latency_us": 10},
                                 {"name": "S", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32, "latency_us": 10,
                                  "emulate": {"slowdown": 10}}]}
    d["pipelines"][0]["stages"][0]["devices"] = ["F.0"]
    d["pipelines"][0]["stages"][1]["devices"] = ["S.0"]
    d["pipelines"][1]["stages"][0]["devices"] = ["F.1"]
    d.pop("estimate", None)
    return d


@pytest.mark.slow
def test_a_plan_run_writes_predicted_and_measured(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_emulated_plan()))
    assert run_cli(["evaluate", f"plan_file={path}", f"out={tmp_path / 'priced.json'}"]) == 0
    priced = Plan.load(tmp_path / "priced.json")
    capsys.readouterr()
    out = tmp_path / "run"
    assert run_cli(["train", f"plan_file={path}", "train.steps=4", "runtime.progress=false", f"out={out}"]) == 0
    printed = capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    assert m["predicted"] == predictions(priced.estimate, priced.devices)  # the estimate's numbers exactly
    meas = m["measured"]
    assert meas["steps"] == 3 and meas["memory"] == "rss"
    assert len(meas["pipelines_s"]) == 2 and len(meas["peak_memory_gb"]) == 3
    assert [len(p) for p in meas["stages"]] == [len(p.stages) for p in priced.pipelines] == [2, 1]
    assert all(x > 0 for x in [meas["step_s"], meas["dp_sync_s"], *meas["pipelines_s"], *meas["peak_memory_gb"]])
    assert all(st[k] > 0 for p in meas["stages"] for st in p for k in ("forward_s", "backward_s"))
    assert max(meas["pipelines_s"]) <= 1.1 * meas["step_s"]  # the schedule is inside the step (clock skew and load aside)
    per = meas["per_rank"]
    assert [(r["pipeline"], r["stage"]) for r in per] == [(0, 0), (0, 1), (1, 0)]
    assert meas["pipelines_s"] == [max(per[0]["schedule_s"], per[1]["schedule_s"]), per[2]["schedule_s"]]
    assert meas["dp_sync_s"] <= max(r["dp_sync_s"] for r in per)  # the last to arrive waited least
    fast, slow = meas["stages"][0]
    assert (fast["forward_s"], slow["backward_s"]) == (per[0]["forward_s"], per[1]["backward_s"])
    assert slow["forward_s"] > 2 * fast["forward_s"] and slow["backward_s"] > 2 * fast["backward_s"]
    assert "predicted vs measured" in printed and "pipeline 0 stage 1 backward_s" in printed
    assert m["losses"] and len(m["step_s"]) == 4  # the old keys are all still there
