"""Fuzzing (hypothesis): malformed cluster, model, plan and action files and override values.

Each case starts from a valid document and breaks it at a random place (a value replaced by
any JSON value — huge, negative, NaN, wrong type, nested —, a key dropped, an unknown key
added), or is an override of a random value. Every case must end in a valid result or one
:class:`HexicoreError` (exit 2 and one line from the CLI), never another exception, within a
time bound (hypothesis ``deadline``) and a memory bound (peak RSS growth). The whole module
runs in well under half a minute.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from hexicore.core.cluster import Cluster  # noqa: E402
from hexicore.core.errors import HexicoreError  # noqa: E402
from hexicore.core.model import ModelSpec  # noqa: E402
from hexicore.core.plan import Plan  # noqa: E402
from hexicore.pipeline.actions import ActionList  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=60, deadline=3000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-3, max_value=10),
    st.sampled_from([0, -1, 10**9, 10**15, 2**63, 1e308, -0.0, math.nan, math.inf]),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=8),
    st.sampled_from(["a100-80g", "0", "1e9", "[0, 1]", "A.0", "F", "hanayo"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def _paths(doc, prefix=()):
    """Every (path, value) in a JSON-like document, the root included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:4]):
            yield from _paths(v, prefix + (i,))


@st.composite
def broken(draw, doc):
    """``doc`` with one random place broken (a deep copy; ``doc`` itself is untouched)."""
    doc = json.loads(json.dumps(doc))
    paths = [p for p, _ in _paths(doc) if p]
    path = draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    how = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
    if how == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == "add" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
    else:
        parent[path[-1]] = draw(values)
    return doc


def _valid(value):
    return value is not None


def _check(load, doc, path: Path, as_yaml: bool):
    path.write_text(yaml.safe_dump(doc) if as_yaml else json.dumps(doc), encoding="utf-8")
    try:
        assert _valid(load(path))
    except HexicoreError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)


def _doc(name):
    p = ROOT / name
    return yaml.safe_load(p.read_text()) if p.suffix == ".yaml" else json.loads(p.read_text())


def _actions_doc():
    import hexicore

    return json.loads(hexicore.simulate("1f1b", ranks=2, micro_batches=2).action_list.to_json())


@pytest.fixture(scope="module")
def rss_guard():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 500  # MB


CLUSTER, MODEL, PLAN = _doc("conf/cluster/paper_case.yaml"), _doc("conf/model/tiny.yaml"), _doc("tests/data/plan_v1.json")
ACTIONS = _actions_doc()


@FAST
@given(doc=broken(CLUSTER))
def test_fuzz_cluster_files(doc, tmp_path, rss_guard):
    _check(Cluster.load, doc, tmp_path / "c.yaml", True)


@FAST
@given(doc=broken(MODEL))
def test_fuzz_model_files(doc, tmp_path, rss_guard):
    _check(ModelSpec.load, doc, tmp_path / "m.yaml", True)


@FAST
@given(doc=broken(PLAN))
def test_fuzz_plan_files(doc, tmp_path, rss_guard):
    _check(Plan.load, doc, tmp_path / "p.json", False)


@FAST
@given(doc=broken(ACTIONS))
def test_fuzz_action_files(doc, tmp_path, rss_guard):
    _check(ActionList.load, doc, tmp_path / "a.json", False)


override_values = st.one_of(
    st.integers(min_value=-5, max_value=40).map(str),
    st.sampled_from(["abc", "1e309", "nan", "-inf", "10000000000000", "[1,2]", "{a: 1}", "null", "true", "''",
                     "0.5", "1.5", "-0.25"]))
SIM_KEYS = ["pipeline.ranks", "pipeline.micro_batches", "schedule.waves", "timing.forward", "timing.backward",
            "timing.comm", "seed", "overwrite", "simulate.files"]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(SIM_KEYS), value=override_values)
def test_fuzz_overrides(key, value, tmp_path, capsys, rss_guard):
    code = run_cli(["simulate", "schedule=hanayo", "pipeline.ranks=2", "pipeline.micro_batches=2",
                    f"{key}={value}", f"out={tmp_path / 'o'}", "overwrite=true", f"hydra.run.dir={tmp_path / 'h'}"]
                   if key != "overwrite" else
                   ["simulate", "schedule=hanayo", "pipeline.ranks=2", "pipeline.micro_batches=2",
                    f"{key}={value}", f"out={tmp_path / 'o'}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), err
    if code == 2:
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
