"""ScheduleRef: the typed schedule section of plans and action lists; file formats unchanged;
the core names no schedule (hexicore/core/schedule_ref.py)."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.schedule_ref import DEFAULT_SCHEDULE, FrozenMap, ScheduleRef
from hexicore.pipeline.actions import ActionList, parse_actions

ROOT = Path(__file__).resolve().parents[2]


def test_from_mapping_round_trips_in_order():
    section = {"name": "hanayo", "waves": "auto", "max_waves": 4, "memory": None}
    ref = ScheduleRef.from_mapping(section)
    assert ref.name == "hanayo" and ref.params == {"waves": "auto", "max_waves": 4, "memory": None}
    assert list(ref.to_dict()) == ["name", "waves", "max_waves", "memory"] and ref.to_dict() == section
    assert json.dumps(ref.to_dict()) == json.dumps(section)
    assert ref.kwargs() == {"waves": "auto", "max_waves": 4, "memory": None}
    assert ref.get("waves") == "auto" and ref.get("chunks", 7) == 7 and ref["name"] == "hanayo"
    assert dict(ref) == section and ref == section


def test_equal_and_hashed_regardless_of_parameter_order():
    a = ScheduleRef("interleaved_1f1b", {"chunks": 2, "groups": 3})
    b = ScheduleRef.from_mapping({"groups": 3, "name": "interleaved_1f1b", "chunks": 2})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ScheduleRef("interleaved_1f1b", {"chunks": 3}) and a != ScheduleRef("other", {"chunks": 2, "groups": 3})
    assert {a: 1}[b] == 1


def test_nested_parameters_are_frozen_and_handed_out_as_copies():
    ref = ScheduleRef.from_mapping({"name": "auto", "options": [{"name": "1f1b"}, {"name": "x", "k": [1, 2]}]})
    hash(ref)
    assert isinstance(ref.params["options"], tuple) and isinstance(ref.params["options"][1], FrozenMap)
    opts = ref["options"]
    assert opts == [{"name": "1f1b"}, {"name": "x", "k": [1, 2]}] and isinstance(opts[1]["k"], list)
    opts[1]["k"].append(3)  # a copy: the reference is unchanged
    assert ref.to_dict()["options"][1]["k"] == [1, 2]
    with pytest.raises((AttributeError, TypeError)):
        ref.params["options"] = ()  # type: ignore[index]


def test_defaults_and_bad_sections():
    assert ScheduleRef.from_mapping(None) == ScheduleRef.default() == ScheduleRef(DEFAULT_SCHEDULE)
    assert ScheduleRef.from_mapping({"waves": 2}).name == DEFAULT_SCHEDULE
    assert ScheduleRef.from_mapping("gpipe") == {"name": "gpipe"}
    assert ScheduleRef.from_mapping({}, default="").to_dict() == {} and len(ScheduleRef("")) == 0
    with pytest.raises(HexicoreError, match="mapping with a schedule name") as e:
        ScheduleRef.from_mapping(5, source="p.json", field="pipelines[0].schedule")
    assert e.value.source == "p.json" and e.value.field == "pipelines[0].schedule"
    with pytest.raises(HexicoreError, match="must be a string"):
        ScheduleRef.from_mapping({"name": 3})
    with pytest.raises(HexicoreError, match="not a parameter"):
        ScheduleRef("x", {"name": "y"})


def test_pickles_across_processes():
    ref = ScheduleRef.from_mapping({"name": "hanayo", "waves": 2, "auto": {"1": 3.0}})
    back = pickle.loads(pickle.dumps(ref))
    assert back == ref and hash(back) == hash(ref) and back.to_dict() == ref.to_dict()


def test_plan_and_action_list_json_are_unchanged(tmp_path, paper_case, llama13b):
    from hexicore.core.settings import TrainSettings

    stages = (Stage(("A.0",), 1, (0, 20)), Stage(("A.1",), 1, (20, 40)))
    plan = Plan(llama13b, paper_case, TrainSettings(),
                (Pipeline(12, stages, {"name": "hanayo", "waves": 2}), Pipeline(12, (Stage(("B.0",), 1, (0, 40)),))))
    assert isinstance(plan.pipelines[0].schedule, ScheduleRef)
    assert plan.pipelines[1].schedule == ScheduleRef.default()
    text = plan.to_json()
    data = json.loads(text)
    assert data["pipelines"][0]["schedule"] == {"name": "hanayo", "waves": 2}
    assert data["pipelines"][1]["schedule"] == {"name": DEFAULT_SCHEDULE}
    assert Plan.from_json(text).to_json() == text
    del data["pipelines"][1]["schedule"]  # the format's default
    assert Plan.from_dict(data).pipelines[1].schedule.name == DEFAULT_SCHEDULE
    raw = {"format": "hexicore.actions/1", "schedule": {"name": "hanayo", "waves": 1, "auto": {"1": 2.5}},
           "ranks": 1, "stages": 1, "micro_batches": 1, "stage_rank": [0],
           "actions": [[{"op": "F", "stage": 0, "mb": 0}, {"op": "B", "stage": 0, "mb": 0}, {"op": "STEP"}]]}
    al = parse_actions(raw)
    assert isinstance(al.schedule, ScheduleRef) and al.to_json() == json.dumps(raw)
    assert ActionList({}, 1, 1, 1, (0,), ((),)).to_dict()["schedule"] == {}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_core_names_no_schedule():
    """Only the plan format's default may name a schedule in hexicore/ (docgen's picture
    examples call the library API by name, as a user would)."""
    from hexicore.registry import Registry

    names = set(Registry.default().names("schedule"))
    assert {"1f1b", "gpipe", "hanayo"} <= names
    allowed = {("core/schedule_ref.py", DEFAULT_SCHEDULE), ("app/docgen.py", "hanayo"), ("app/docgen.py", "1f1b")}
    found = [(str(p.relative_to(ROOT / "hexicore")), line, s) for p in sorted((ROOT / "hexicore").rglob("*.py"))
             for line, s in _code_strings(p) if s in names]
    assert [f for f in found if (f[0], f[2]) not in allowed] == []
    assert sum(1 for f in found if f[0] == "core/schedule_ref.py") == 1
