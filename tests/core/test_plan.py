"""Plan JSON contract (docs/formats.md) and the validator's precise refusals."""

import json

import pytest

from hexicore.cost import AnalyticCostModel
from hexicore.core.errors import HexicoreError, PlanError
from hexicore.core.plan import Pipeline, Plan, Stage, check_structure
from hexicore.core.settings import TrainSettings
from hexicore.planner.plan_check import validate_plan
from tests.helpers import make_plan


def test_json_round_trip(paper_case, llama13b, tmp_path):
    plan = make_plan(paper_case, llama13b)
    plan = plan.with_estimate(AnalyticCostModel().estimate(plan).to_dict())
    path = plan.save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["format"] == "hexicore.plan/1"
    assert data["pipelines"][0]["stages"][0] == {"devices": ["A.0", "A.1"], "tp": 2, "layers": [0, 22]}
    assert {d["id"] for d in data["cluster"]["devices"]} >= {"A.0", "C.1"}
    again = Plan.load(path)
    assert again.pipelines == plan.pipelines and again.model == plan.model and again.train == plan.train
    assert again.to_dict() == plan.to_dict()


def _broken(plan, i, j, **changes):
    p = plan.pipelines[i]
    stages = list(p.stages)
    s = stages[j]
    stages[j] = Stage(changes.get("devices", s.devices), changes.get("tp", s.tp), changes.get("layers", s.layers))
    pipes = list(plan.pipelines)
    pipes[i] = Pipeline(changes.get("batch", p.batch), tuple(stages), p.schedule)
    return Plan(plan.model, plan.cluster, plan.train, tuple(pipes))


@pytest.mark.parametrize("change, field, words", [
    ({"devices": ("A.0", "Z.1"), "tp": 2}, "pipelines[0].stages[0].devices", "unknown device"),
    ({"devices": ("A.0", "A.2"), "tp": 2}, "pipelines[0].stages[1].devices", "also used"),
    ({"tp": 1}, "pipelines[0].stages[0].tp", "does not match"),
    ({"layers": (0, 20)}, "pipelines[0].stages[1].layers", "gap (no stage holds [20, 22))"),
    ({"layers": (0, 24)}, "pipelines[0].stages[1].layers", "overlap (both hold [22, 24))"),
    # a reversed or empty first range was reported as a "gap" after a previous stage it lacks
    ({"layers": (3, 1)}, "pipelines[0].stages[0].layers", "layer range [3, 1) is reversed"),
    ({"layers": (3, 3)}, "pipelines[0].stages[0].layers", "layer range [3, 3) is empty"),
    ({"layers": (2, 22)}, "pipelines[0].stages[0].layers", "the first stage starts at layer 2"),
])
def test_structural_refusals(paper_case, llama13b, change, field, words):
    plan = _broken(make_plan(paper_case, llama13b), 0, 0, **change)
    with pytest.raises(PlanError) as e:
        check_structure(plan, "p.json")
    assert e.value.field == field and words in e.value.message and e.value.source == "p.json"


def test_batches_must_sum_and_be_multiples(paper_case, llama13b):
    plan = _broken(make_plan(paper_case, llama13b), 0, 0, batch=13)
    with pytest.raises(PlanError, match="sum to 23"):
        check_structure(plan)
    plan = make_plan(paper_case, llama13b, micro_batch=4)
    with pytest.raises(PlanError, match="not a multiple of micro-batch 4") as e:
        check_structure(plan)
    assert e.value.field == "pipelines[0].batch"


def test_layers_must_cover_model(paper_case, llama13b):
    plan = _broken(make_plan(paper_case, llama13b), 0, 1, layers=(22, 39))
    with pytest.raises(PlanError, match="cover layers"):
        check_structure(plan)


def test_memory_over_capacity_is_refused(paper_case, llama13b):
    # all 40 layers of 13B on one 24 GB card
    plan = Plan(llama13b, paper_case, TrainSettings(), (Pipeline(24, (Stage(("B.0",), 1, (0, 40)),)),))
    with pytest.raises(PlanError, match=r"B\.0 needs .* GB but has 24 GB"):
        validate_plan(plan, AnalyticCostModel())


def test_cross_machine_tp_is_legal_but_warned(paper_case, llama13b):
    plan = Plan(llama13b, paper_case, TrainSettings(), (
        Pipeline(24, (Stage(("A.0", "A.1"), 2, (0, 30)), Stage(("A.2", "B.0"), 2, (30, 40)))),))
    _, warnings = validate_plan(plan, AnalyticCostModel(state_bytes_per_param=8))
    assert any("spans machines A, B" in w for w in warnings)


def test_parse_errors_name_json_fields(paper_case, llama13b):
    data = make_plan(paper_case, llama13b).to_dict()
    data["pipelines"][1]["stages"][0]["layers"] = [0]
    with pytest.raises(HexicoreError) as e:
        Plan.from_dict(data, "p.json")
    assert e.value.field == "pipelines[1].stages[0].layers"
    with pytest.raises(HexicoreError, match="malformed JSON"):
        Plan.from_json("{", "p.json")


def test_plan_from_another_tool_with_devices_only_cluster(paper_case, llama13b):
    """docs/formats.md lists the cluster as its devices plus links: machines are derived from them."""
    data = make_plan(paper_case, llama13b).to_dict()
    data["cluster"] = {"name": "foreign", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                       "intra": {"bandwidth_gbs": 100, "latency_us": 5},
                       "devices": [dict(d) for d in data["cluster"]["devices"] if d["id"] != "B.1"]
                       + [{"id": "B.1", "machine": "B", "gpu": "rtx4090", "tflops": 165.2, "memory_gb": 24}]}
    plan = Plan.from_dict(data, "foreign.json")
    assert len(plan.cluster.devices) == 8 and plan.cluster.bandwidth_gbs("A.0", "A.1") == 100
    assert plan.cluster.bandwidth_gbs("A.0", "C.1") == 1.0 and plan.cluster.device("C.0").tflops == 71.0
    assert AnalyticCostModel().estimate(plan).iteration_s > 0
    data["cluster"]["devices"][0]["id"] = "A0"
    with pytest.raises(HexicoreError, match="<machine>.<index>") as e:
        Plan.from_dict(data, "foreign.json")
    assert e.value.field == "cluster.devices[0].id"
