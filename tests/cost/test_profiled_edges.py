"""The measured-cost loop at its edges: ``schedule=auto`` and chunked schedules priced with a
profile, blocks of either architecture priced at their measured time, extrapolation beyond the
profiled sizes warned about, absurd profile values and profile requests refused in one line."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import parse_profile
from hexicore.core.profile_request import ProfileRequest
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost.profiled import ProfiledCostModel
from tests.conftest import run_cli
from tests.helpers import (SAMPLE_CLUSTER as CLUSTER, SAMPLE_MODEL as MODEL, SAMPLE_SHAPE as SHAPE,
                           sample_profile as profile, sample_raw_profile as raw_profile)


TWO = ("name: two\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\nmachines:\n"
       "  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}\n"
       "  - {name: B, gpu: rtx3090, count: 2, bandwidth_gbs: 16, latency_us: 10}\n")


def _acting_profile() -> ProfiledCostModel:
    """rtx4090 blocks of 0.030 s, 0.006 s of it each action's fixed cost."""
    blk = {"seq_len": 32, **SHAPE, "forward_s": 0.010, "backward_s": 0.020, "action_s": 0.006}
    return ProfiledCostModel(profile=parse_profile({"format": "hexicore.profile/1", "devices": {"rtx4090": {
        "blocks": [{"micro_batch": 1, "tp": 1, **blk}]}}}, "p"))


def test_schedule_auto_plans_and_evaluates_with_a_profile(tmp_path, capsys):
    """``schedule=auto`` prices Hanayo's ``waves: auto`` before choosing W: it was a traceback
    (int('auto')) with ``cost=profiled``; the plan's estimate is what evaluate recomputes."""
    path = profile().save(tmp_path / "profile.yaml")
    (tmp_path / "two.yaml").write_text(TWO)
    out = tmp_path / "plan.json"
    code = run_cli(["plan", f"cluster_file={tmp_path / 'two.yaml'}", "model=tiny", "cost=profiled",
                    f"cost.profile_file={path}", "schedule=auto", "schedule.final_options=[]", "train.global_batch=8",
                    f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    planned = json.loads(out.read_text())["estimate"]["iteration_s"]
    code = run_cli(["evaluate", f"plan_file={out}", "cost=profiled", f"cost.profile_file={path}",
                    f"out={tmp_path / 'again.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "again.json").read_text())["estimate"]["iteration_s"] == pytest.approx(planned)


def test_a_plan_of_1f1b_pipelines_chosen_under_auto_carries_the_estimate_evaluate_recomputes(tmp_path, capsys):
    """``schedule=auto`` prices 1F1B by its lists while the search lasts, but a plan whose
    pipelines all run 1F1B is priced by the cost model's own closed form (App. A), as one planned
    with ``schedule=1f1b``: the estimate written is that one, not the search's (the two differ
    here by 2x, the hops between A and B paid per micro-batch; a search cut short by its budget
    before any other schedule was priced wrote the other, and evaluate disagreed with plan)."""
    path = profile().save(tmp_path / "profile.yaml")
    (tmp_path / "two.yaml").write_text(TWO)
    out, again = tmp_path / "plan.json", tmp_path / "again.json"
    assert run_cli(["plan", f"cluster_file={tmp_path / 'two.yaml'}", "model=tiny", "cost=profiled",
                    f"cost.profile_file={path}", "schedule=auto", "schedule.options=[{name:1f1b}]",
                    "schedule.final_options=[]", "train.global_batch=8", f"out={out}",
                    f"hydra.run.dir={tmp_path / 'r'}"]) == 0, capsys.readouterr().err
    planned = json.loads(out.read_text())
    assert {p["schedule"]["name"] for p in planned["pipelines"]} == {"1f1b"}
    assert run_cli(["evaluate", f"plan_file={out}", "cost=profiled", f"cost.profile_file={path}", f"out={again}",
                    f"hydra.run.dir={tmp_path / 'r'}"]) == 0, capsys.readouterr().err
    recomputed = json.loads(again.read_text())["estimate"]
    assert recomputed["iteration_s"] == pytest.approx(planned["estimate"]["iteration_s"])
    assert recomputed["pipeline_s"] == pytest.approx(planned["estimate"]["pipeline_s"])


@pytest.mark.parametrize("schedule, chunks", [({"name": "1f1b"}, 1), ({"name": "zb_v"}, 2),
                                              ({"name": "dualpipe_v"}, 2), ({"name": "hanayo", "waves": "auto"}, 2),
                                              ({"name": "hanayo", "waves": 2}, 4),
                                              ({"name": "interleaved_1f1b", "chunks": 3}, 3)])
def test_each_chunk_a_schedule_runs_on_a_rank_pays_the_fixed_cost(schedule, chunks):
    """The chunks come from the schedule's own lists (the V schedules run two per rank, which
    their parameters do not say), as the planner and evaluate price them."""
    from hexicore.planner.pricing import ScheduleBook, with_placement
    from hexicore.registry import Registry

    cost = with_placement(_acting_profile(), ScheduleBook(Registry.default()))
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp32")
    stages = (Stage(("A.0",), 1, (0, 4)), Stage(("A.1",), 1, (4, 8)))
    model = ModelSpec("m", 8, 64, 4, 4, 176, 256, 32)

    def pieces(ref: dict) -> list[float]:
        name = ref["name"]
        plan = Plan(model, CLUSTER, t, (Pipeline(8, stages, ScheduleRef(name, {k: v for k, v in ref.items()
                                                                                if k != "name"})),),
                    solver={"name": "hand"})
        return cost.pipeline_pieces(plan, plan.pipelines[0])[0]

    plain = pieces({"name": "1f1b"})
    assert pieces(schedule) == pytest.approx([x + (chunks - 1) * 0.006 for x in plain])


@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_a_block_measured_at_the_plans_size_is_priced_at_its_measured_time(arch):
    """GPT blocks have two MLP matrices, not SwiGLU's three: counted as three, a measured GPT
    block was priced at 0.79x its own time at the very point it was measured."""
    model = ModelSpec("m", 4, 64, 4, 4, 176, 256, 32, arch=arch, norm="layernorm" if arch == "gpt" else "rmsnorm")
    cost = ProfiledCostModel(profile=profile())
    for mb, want in ((1, 0.030), (4, 0.075)):
        t = TrainSettings(global_batch=8, micro_batch=mb, seq_len=32, recompute=False)
        assert cost.compute_s(CLUSTER, model, t, ["A.0"], 1) == pytest.approx(want, rel=1e-12)


def test_extrapolating_beyond_the_profiled_sizes_is_one_warning(caplog):
    cost = ProfiledCostModel(profile=profile())
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        for mb in (1, 2, 4):  # measured 1 and 4: inside the range
            cost.compute_s(CLUSTER, MODEL, TrainSettings(global_batch=16, micro_batch=mb, seq_len=32), ["A.0"], 1)
        assert not [r for r in caplog.records if "extrapolated" in r.getMessage()]
        for _ in range(2):
            cost.compute_s(CLUSTER, MODEL, TrainSettings(global_batch=16, micro_batch=8, seq_len=32), ["A.0"], 1)
    got = [r.getMessage() for r in caplog.records if "extrapolated" in r.getMessage()]
    assert len(got) == 1 and "micro-batch 8" in got[0] and "micro-batches 1-4" in got[0], got


ABSURD = [
    ("forward_s", 1e300), ("backward_s", 1.7e308), ("recompute_s", 1e300), ("optimizer_s", 1e9),
    ("action_s", 1e300), ("activation_bytes", 1e300), ("micro_batch", 10 ** 12), ("tp", 10 ** 9),
    ("seq_len", 10 ** 12), ("heads", 3),
    ("tp", 3),  # 4 heads cannot be split 3 ways: was used, and scaled from as if it could
]


@pytest.mark.parametrize("key, value", ABSURD, ids=[k for k, _ in ABSURD])
def test_absurd_measurements_are_refused_naming_the_field(key, value, tmp_path, capsys):
    doc = raw_profile()
    doc["devices"]["rtx4090"]["blocks"][0][key] = value
    path, out = tmp_path / "profile.yaml", tmp_path / "plan.json"
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "two.yaml").write_text(TWO)
    code = run_cli(["plan", f"cluster_file={tmp_path / 'two.yaml'}", "model=tiny", "cost=profiled",
                    f"cost.profile_file={path}", "train.global_batch=8", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{path}: devices.rtx4090.blocks[0].{key}:" in err and not out.exists(), err


@pytest.mark.parametrize("group", [1, 10 ** 12])
def test_an_allreduce_group_is_two_to_a_clusters_gpus(group):
    doc = raw_profile(allreduce=[{"between": ["A", "A"], "group": group, "bandwidth_gbs": 5.0}])
    with pytest.raises(HexicoreError, match=r"allreduce\[0\]\.group"):
        parse_profile(doc, "p.yaml")


def test_a_profile_request_measures_each_size_once_and_two_message_sizes():
    req = ProfileRequest(CLUSTER, MODEL, micro_batches=(1, 1, 2), tp=(1, 1), link_bytes=(64, 4096, 64),
                         allreduce_groups=(2, 2))
    assert (req.micro_batches, req.tp, req.link_bytes, req.allreduce_groups) == ((1, 2), (1,), (64, 4096), (2,))
    with pytest.raises(HexicoreError, match="link_bytes"):
        ProfileRequest(CLUSTER, MODEL, link_bytes=(4096, 4096))


@pytest.mark.parametrize("sizes", ["[4096]", "[4096,4096]"])
def test_one_message_size_is_refused_before_any_process(sizes, tmp_path, capsys):
    """One size gave a fit whose latency and bandwidth were both made up."""
    (tmp_path / "c.yaml").write_text("name: c\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", f"profile.link_bytes={sizes}",
                    f"out={tmp_path / 'p.yaml'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "command line: profile.link_bytes:" in err[0], err
    assert not (tmp_path / "p.yaml").exists()


def test_a_profile_measured_in_another_dtype_is_one_warning(caplog):
    cost = ProfiledCostModel(profile=parse_profile(raw_profile(environment={"dtype": "fp32"}), "p.yaml"))
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        cost.compute_s(CLUSTER, MODEL, TrainSettings(global_batch=8, seq_len=32, dtype="fp32"), ["A.0"], 1)
        assert not caplog.records
        for _ in range(2):
            cost.compute_s(CLUSTER, MODEL, TrainSettings(global_batch=8, seq_len=32, dtype="bf16"), ["A.0"], 1)
    got = [r.getMessage() for r in caplog.records]
    assert len(got) == 1 and "p.yaml: measured in fp32, the plan trains bf16" in got[0], got


@pytest.mark.parametrize("measured", [True, False])
def test_a_tp_stage_computes_the_whole_head_on_every_rank(measured):
    """The runtime replicates the head (every TP rank computes all the logits), as the analytic
    model prices it: a TP-2 last stage pays the head's whole time, not half of it."""
    head = {"micro_batch": 1, "seq_len": 32, "hidden": 64, "vocab": 256, "forward_s": 0.004, "backward_s": 0.008}
    doc = raw_profile()
    if measured:
        doc["devices"]["rtx4090"]["head"] = head
    cost = ProfiledCostModel(profile=parse_profile(doc, "p.yaml"))
    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=False, dtype="fp32")
    one, two = cost.head_s(CLUSTER, MODEL, t, ["A.0"]), cost.head_s(CLUSTER, MODEL, t, ["A.0", "A.1"])
    assert two == pytest.approx(one) and one == pytest.approx(0.012 if measured else one)
    if not measured:  # App. A's head on one member, as the analytic model's last stage
        from hexicore.cost.analytic import AnalyticCostModel
        plain = AnalyticCostModel()
        want = (plain.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1, last=True)
                - plain.compute_s(CLUSTER, MODEL, t, ["A.0", "A.1"], 1))
        assert two == pytest.approx(want)


def test_an_unmeasured_recompute_is_priced_as_the_forward_with_a_warning(caplog):
    """A profile without ``recompute_s`` (0: not measured) under recomputation priced the
    recomputed forward at 0 s; it is the measured forward, with one warning."""
    doc = raw_profile()
    del doc["devices"]["rtx4090"]["blocks"][0]["recompute_s"]
    cost = ProfiledCostModel(profile=parse_profile(doc, "p.yaml"))
    re = TrainSettings(global_batch=8, micro_batch=1, seq_len=32, recompute=True)
    with caplog.at_level(logging.WARNING, logger="hexicore"):
        assert cost.compute_s(CLUSTER, MODEL, re, ["A.0"], 1) == pytest.approx(0.010 + 0.020 + 0.010)
    assert any("recompute_s was not profiled" in r.getMessage() for r in caplog.records)
    assert cost.forward_fraction(CLUSTER, MODEL, re, ["A.0"]) == pytest.approx((0.010 + 0.025) / (0.040 + 0.100))


def test_predicted_prices_the_run_as_trained_not_the_plans_own_settings(tmp_path, capsys):
    """``train plan_file=P train.dtype=fp32 train.recompute=false train.seq_len=16`` trains in
    fp32 without recomputation at 16 tokens; metrics.json's ``predicted`` (the spec's estimate)
    priced the plan's bf16, recomputed, 32-token steps instead."""
    from hexicore.app.compose import config_from_overrides
    from hexicore.app.training import build_run_spec
    from hexicore.registry import Registry

    (tmp_path / "two.yaml").write_text(TWO)
    plan, edited = tmp_path / "plan.json", tmp_path / "as_trained.json"
    assert run_cli(["plan", f"cluster_file={tmp_path / 'two.yaml'}", "model=tiny", "train.global_batch=8",
                    f"out={plan}", f"hydra.run.dir={tmp_path / 'r'}"]) == 0, capsys.readouterr().err
    doc = json.loads(plan.read_text())
    assert (doc["train"]["dtype"], doc["train"]["recompute"], doc["train"]["seq_len"]) == ("bf16", True, 32)
    doc["train"].update(dtype="fp32", recompute=False, seq_len=16)
    edited.write_text(json.dumps(doc))
    assert run_cli(["evaluate", f"plan_file={edited}", f"out={tmp_path / 'again.json'}",
                    f"hydra.run.dir={tmp_path / 'r'}"]) == 0, capsys.readouterr().err
    want = json.loads((tmp_path / "again.json").read_text())["estimate"]
    reg = Registry.default()
    spec = build_run_spec(config_from_overrides([f"plan_file={plan}", "train.dtype=fp32", "train.recompute=false",
                                                 "train.seq_len=16", "train.steps=2"], registry=reg), reg)
    assert (spec.train.dtype, spec.train.recompute, spec.train.seq_len) == ("fp32", False, 16)
    assert spec.estimate.iteration_s == pytest.approx(want["iteration_s"])
    assert dict(spec.estimate.memory_gb) == pytest.approx(want["memory_gb"])
    assert spec.estimate.iteration_s != pytest.approx(doc["estimate"]["iteration_s"])


def test_a_profile_out_under_a_file_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """``out=notes.txt/p.yaml`` measured the whole cluster, then ended in a traceback
    (FileExistsError) when writing; it is one line naming out= before any process starts."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "c.yaml").write_text("name: c\nmachines:\n  - {name: A, gpu: rtx4090, count: 1, bandwidth_gbs: 32}\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", "train.dtype=fp32",
                    "profile.repeats=1", "profile.tp=[1]", "profile.micro_batches=[1]",
                    f"out={notes / 'p.yaml'}", f"hydra.run.dir={tmp_path / 'r'}"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{notes / 'p.yaml'}: out: {notes} is a file" in err[0], err
    assert "forward ms" not in captured.out and notes.read_text() == "mine\n"


@pytest.mark.parametrize("how", [["parallel=none"], ["schedule=1f1b", "pipeline.ranks=2"]])
def test_train_without_a_plan_still_checks_the_cost_model_it_is_given(how, tmp_path, capsys):
    """Nothing is priced without a plan, but ``cost=profiled cost.profile_file=`` naming an empty
    file was silently accepted; it is the same one-line error as with a plan, before any worker."""
    (tmp_path / "empty.yaml").write_text("")
    code = run_cli(["train", *how, "model=tiny", "train.steps=1", "train.dtype=fp32", "train.global_batch=2",
                    "cost=profiled", f"cost.profile_file={tmp_path / 'empty.yaml'}", f"out={tmp_path / 'run'}",
                    f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "empty.yaml: profile file is empty" in err, err
    assert not (tmp_path / "run").exists()


def test_an_unknown_measured_dtype_is_refused():
    with pytest.raises(HexicoreError) as e:
        profile(environment={"dtype": "int7"})
    assert e.value.field == "environment.dtype" and "unknown dtype 'int7'" in e.value.message
    assert profile(environment={"dtype": "fp32", "torch": "2.13.0"}).environment["dtype"] == "fp32"
