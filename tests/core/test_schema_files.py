"""File readers and writers (hexicore.core.schema): hostile YAML/JSON is one error, concurrent
writers of one path never fail each other and a reader never sees half a file."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

from hexicore.core import schema
from hexicore.core.errors import HexicoreError


def test_yaml_alias_bomb_is_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(HexicoreError, match="aliases expand"):
        schema.load_yaml(p, "cluster")


def test_small_aliases_still_work(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("base: &b {bandwidth_gbs: 1.0}\nother: *b\nmerged: {<<: *b, latency_us: 3}\n")
    assert schema.load_yaml(p, "cluster")["merged"] == {"bandwidth_gbs": 1.0, "latency_us": 3}


@pytest.mark.parametrize("text, field", [("a: 1\nb: 2\na: 3\n", "a"), ("m:\n  x: 1\n  x: 2\n", "x")])
def test_duplicate_yaml_keys(tmp_path, text, field):
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(HexicoreError) as exc:
        schema.load_yaml(p, "cluster")
    assert exc.value.field == field and "duplicate key" in exc.value.message


def test_duplicate_json_keys_and_deep_nesting(tmp_path):
    p = tmp_path / "dup.json"
    p.write_text('{"format": "x", "format": "y"}')
    with pytest.raises(HexicoreError, match="duplicate key"):
        schema.load_json(p, "plan")
    for name, text in (("deep.json", "[" * 5000 + "]" * 5000), ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000)):
        q = tmp_path / name
        q.write_text(text if name.endswith("yaml") else '{"a": ' + text + "}")
        with pytest.raises(HexicoreError, match="nested deeper"):
            (schema.load_yaml if name.endswith("yaml") else schema.load_json)(q, "plan")


def _writer(path: str, tag: int, n: int, errors) -> None:
    body = json.dumps({"tag": tag, "pad": "x" * (1 << 20)})
    try:
        for _ in range(n):
            schema.write_text_atomic(path, body)
    except Exception as exc:  # noqa: BLE001 - counted by the test
        errors.put(repr(exc))


def _reader(path: str, n: int, errors) -> None:
    seen = 0
    while seen < n:
        try:
            with open(path) as fh:
                json.loads(fh.read())
            seen += 1
        except FileNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - a partial file
            errors.put(repr(exc))
            seen += 1


def test_concurrent_writers_and_a_reader(tmp_path):
    path = str(tmp_path / "summary.json")
    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, t, 60, errors)) for t in (1, 2)]
    procs.append(ctx.Process(target=_reader, args=(path, 200, errors)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    assert json.loads(open(path).read())["tag"] in (1, 2)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(schema.TMP_SUFFIX)]


def test_stale_temps_are_cleaned(tmp_path):
    dead = tmp_path / f".plan.json.999999999.abcdef{schema.TMP_SUFFIX}"
    dead.write_text("half")
    mine = schema.temp_path(tmp_path / "plan.json")
    mine.write_text("in progress")
    assert schema.clean_stale_temps(tmp_path) == 1
    assert not dead.exists() and mine.exists()


def test_unknown_fields_in_plan_and_action_files_are_refused_with_their_place():
    """A misspelled or foreign key in a plan or action-list file is an error naming it, never ignored."""
    from hexicore.core.plan import parse_plan
    from hexicore.pipeline.actions import Action, ActionList, parse_actions
    from hexicore.app.api import plan as plan_api

    good = plan_api(cluster="paper_case", model="tiny", overrides=["train.global_batch=8", "solver.iterations=2"]).to_dict()
    assert parse_plan(good, "p.json").pipelines
    for where, field in ((lambda d: d, "foo"), (lambda d: d["train"], "train.foo"),
                         (lambda d: d["pipelines"][0], "pipelines[0].foo"),
                         (lambda d: d["pipelines"][0]["stages"][0], "pipelines[0].stages[0].foo")):
        bad = json.loads(json.dumps(good))
        where(bad)["foo"] = 1
        with pytest.raises(HexicoreError, match="unknown field") as e:
            parse_plan(bad, "p.json")
        assert e.value.field == field
    al = ActionList({"name": "hand"}, 1, 1, 1, (0,), ((Action("F", 0, 0), Action("B", 0, 0)),)).to_dict()
    assert parse_actions(al, "a.json").ranks == 1
    for bad, field in (({**al, "rankz": 1}, "rankz"),
                       ({**al, "actions": [[{"op": "F", "stage": 0, "mbb": 0}]]}, "actions[0][0].mbb")):
        with pytest.raises(HexicoreError, match="unknown field") as e:
            parse_actions(bad, "a.json")
        assert e.value.field == field
