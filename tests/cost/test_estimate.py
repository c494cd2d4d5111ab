"""The typed estimate (hexicore.core.estimate) and the unchanged plan JSON (docs/formats.md).

tests/data/plan_v1.json was written by ``hexicore plan schedule=auto solver.iterations=6`` before
the estimate became typed (plain-dict estimate); it must load and save byte for byte.
"""

import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

import hexicore
from hexicore.core.errors import HexicoreError
from hexicore.core.estimate import Estimate
from hexicore.core.plan import Plan
from hexicore.cost import AnalyticCostModel
from tests.conftest import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"


def test_plan_written_before_the_typed_estimate_saves_byte_identically(tmp_path):
    text = (DATA / "plan_v1.json").read_text()
    plan = hexicore.load_plan(DATA / "plan_v1.json")
    est = plan.estimate
    assert isinstance(est, Estimate)
    assert est.iteration_s == json.loads(text)["estimate"]["iteration_s"] == pytest.approx(15.59015209849356)
    assert est.memory_gb["A.0"] == 24.507 and est.oom == () and est.fits and len(est.pipeline_s) == 1
    assert est.breakdown["pipelines"][0]["micro_batches"] == 24 and est.extra == {}
    assert plan.to_json() + "\n" == text
    assert plan.save(tmp_path / "again.json").read_text() == text
    assert Plan.from_json(text).to_json() + "\n" == text
    assert Plan.from_dict(json.loads(text)).to_dict() == json.loads(text)


def test_plan_saved_and_reevaluated_by_the_cli_keeps_the_format(tmp_path):
    """``hexicore evaluate out=`` of the old file gives the old file back (same cost model, no
    reserve: the runtime's block memory is counted since the fixture was made, and its TP-2 RTX
    4090 stage needs 24.4 of 24 GB with 1 GB reserved). Since the fixture was made the hop prices
    the gradient's broadcast in the sending stage's TP group (COMM-PP-HOP): 15.5928 s against
    15.5902 s, within 0.02%."""
    out = tmp_path / "eval.json"
    assert run_cli(["evaluate", f"plan_file={DATA / 'plan_v1.json'}", f"out={out}", "cost.reserve_gb=0",
                    f"hydra.run.dir={tmp_path}"]) == 0
    old, new = json.loads((DATA / "plan_v1.json").read_text()), json.loads(out.read_text())
    assert list(new) == list(old) and list(new["estimate"]) == list(old["estimate"])
    assert new["estimate"]["iteration_s"] == pytest.approx(old["estimate"]["iteration_s"], rel=2e-4)


def _foreign_plan_text() -> str:
    """The fixture with an estimate as another tool might write it: other key order, integer
    values, no ``oom``/``breakdown``, keys hexicore does not know."""
    data = json.loads((DATA / "plan_v1.json").read_text())
    data["estimate"] = {"tool": "other-estimator 2.1", "mfu": 1, "iteration_s": 12, "dp_s": 0.5,
                        "pipeline_s": [11.5], "tokens_per_s": 8192, "memory_gb": {"A.0": 20},
                        "confidence": {"low": 11.0, "high": [13, 14]}}
    return json.dumps(data, indent=2)


def test_estimate_from_another_tool_round_trips_exactly():
    text = _foreign_plan_text()
    plan = Plan.from_json(text)
    est = plan.estimate
    assert est.iteration_s == 12 and isinstance(est.iteration_s, int) and est.mfu == 1
    assert est.extra == {"tool": "other-estimator 2.1", "confidence": {"low": 11.0, "high": [13, 14]}}
    assert est.oom == () and est.breakdown == {}
    assert plan.to_json() == text
    d = json.loads(text)["estimate"]
    assert Estimate.from_dict(d).to_dict() == d and list(Estimate.from_dict(d).to_dict()) == list(d)


def test_fresh_estimate_writes_every_key_in_the_contract_order(paper_case, llama13b):
    from tests.helpers import make_plan

    plan = make_plan(paper_case, llama13b)
    est = AnalyticCostModel().estimate(plan)
    d = est.to_dict()
    assert list(d) == ["iteration_s", "mfu", "tokens_per_s", "pipeline_s", "dp_s", "memory_gb", "oom", "breakdown"]
    assert Estimate.from_dict(d) == est and Estimate.from_dict(d).to_dict() == d
    priced = plan.with_estimate(est)
    assert priced.estimate is est
    assert plan.with_estimate(d).estimate == est  # the JSON mapping is read into the type
    assert pickle.loads(pickle.dumps(priced)) == priced
    # a changed optional field is written even where the file it came from lacked the key
    bare = Estimate.from_dict({k: v for k, v in d.items() if k != "oom"})
    assert "oom" not in bare.to_dict() and replace(bare, oom=("A.0",)).to_dict()["oom"] == ["A.0"]


def test_estimate_is_frozen_and_owns_its_data(paper_case, llama13b):
    mem = {"A.0": 1.0}
    est = Estimate(1.0, 0.5, 10.0, [1.0], 0.0, mem)
    mem["A.0"] = 99.0
    assert est.memory_gb == {"A.0": 1.0} and est.pipeline_s == (1.0,)
    with pytest.raises(AttributeError):
        est.iteration_s = 2.0
    with pytest.raises(ValueError, match="mfu"):
        Estimate(1.0, 0.5, 10.0, (1.0,), 0.0, {}, extra={"mfu": 3})


@pytest.mark.parametrize("change, field", [
    ({"mfu": None}, "estimate.mfu"),
    ({"iteration_s": "fast"}, "estimate.iteration_s"),
    ({"pipeline_s": [1.0, True]}, "estimate.pipeline_s"),
    ({"memory_gb": [1.0]}, "estimate.memory_gb"),
    ({"oom": "A.0"}, "estimate.oom"),
])
def test_bad_estimates_are_one_line_errors_naming_the_field(tmp_path, change, field):
    data = json.loads((DATA / "plan_v1.json").read_text())
    data["estimate"].update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HexicoreError) as err:
        hexicore.load_plan(path)
    assert err.value.source == str(path) and err.value.field == field
    assert run_cli(["evaluate", f"plan_file={path}", f"hydra.run.dir={tmp_path}"]) == 2


def test_plan_without_an_estimate(tmp_path):
    data = json.loads((DATA / "plan_v1.json").read_text())
    data["estimate"] = None
    plan = Plan.from_dict(data)
    assert plan.estimate is None and json.loads(plan.to_json())["estimate"] is None
    del data["estimate"]
    assert Plan.from_dict(data).estimate is None
