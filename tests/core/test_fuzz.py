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


# ------------------------------------------------ the newer surfaces: profiles, Hugging Face files,
# token sidecars, synth sections, checkpoint meta (each a valid document broken at one place)
from tests.helpers import sample_raw_profile  # noqa: E402

PROFILE = json.loads(json.dumps(sample_raw_profile()))
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 256, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": [2, 3]}
SAFETENSORS = {"__metadata__": {"generator": "hexicore"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
               "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}
SIDECAR = {"format": "hexicore.tokens/1", "dtype": "uint16", "vocab": 300, "tokens": 40, "documents": 2, "eos": 1,
           "max_id": 12, "stamp": {"bytes": 80, "mtime_ns": 1}, "tokenizer": "t.json"}
SYNTH = {"name": "synth", "memory": [2, 3], "stage_times": [0.5, 0.25], "hop_times": [0.01], "effort": "quick"}
META = {"format": "hexicore.checkpoint/2", "step": 2, "losses": [1.0, 0.9], "step_s": [0.1, 0.1], "seed": 0,
        "adam_step": 2, "model": {}, "data": {}, "plan": "x", "global_batch": 4, "seq_len": 8,
        "grad_norms": [1.0, None]}


@FAST
@given(doc=broken(PROFILE))
def test_fuzz_profile_files(doc, tmp_path, rss_guard):
    from hexicore.core.profile import Profile

    _check(Profile.load, doc, tmp_path / "p.yaml", True)


from tests.cost.test_profile_v2 import raw_v2  # noqa: E402

PROFILE_V2 = json.loads(json.dumps(raw_v2()))


@FAST
@given(doc=broken(PROFILE_V2))
def test_fuzz_profile_files_of_format_2(doc, tmp_path, rss_guard):
    """Format /2's own entries (heads, embeddings, link points, the step overhead) broken one
    place at a time: loaded or refused in one line, never a traceback."""
    from hexicore.core.profile import Profile

    _check(Profile.load, doc, tmp_path / "p.yaml", True)


@FAST
@given(doc=broken(HF_CONFIG))
def test_fuzz_hf_configs(doc, tmp_path, rss_guard):
    from hexicore.core.hf_config import load_hf_config

    _check(load_hf_config, doc, tmp_path / "config.json", False)


@FAST
@given(doc=broken(SAFETENSORS))
def test_fuzz_safetensors_headers(doc, tmp_path, rss_guard):
    hf = pytest.importorskip("hexicore_plugins.runtimes.torch.checkpoint.hugging_face")

    def load(path):
        head = path.read_bytes()
        st = path.with_suffix(".safetensors")
        st.write_bytes(len(head).to_bytes(8, "little") + head + bytes(24))
        return hf.read_header(st)

    _check(load, doc, tmp_path / "h.json", False)


@FAST
@given(doc=broken(SIDECAR))
def test_fuzz_token_sidecars(doc, tmp_path, rss_guard):
    from hexicore.core.token_file import TokenFile

    data = tmp_path / "x.bin"
    data.write_bytes(bytes(80))
    _check(lambda p: TokenFile.open(data).check(300, 8) or True, doc, tmp_path / "x.bin.json", False)


@FAST
@given(doc=broken(SYNTH))
def test_fuzz_synth_sections(doc, tmp_path, rss_guard):
    from hexicore.planner.pricing import ScheduleBook
    from hexicore.registry import Registry

    book = ScheduleBook(Registry.default())
    _check(lambda p: book.priced(json.loads(p.read_text()), 2), doc, tmp_path / "s.json", False)


@FAST
@given(doc=broken(META))
def test_fuzz_checkpoint_meta(doc, tmp_path, rss_guard):
    native = pytest.importorskip("hexicore_plugins.runtimes.torch.checkpoint.native")
    _check(lambda p: native.check_meta(json.loads(p.read_text()), str(p)) or True, doc, tmp_path / "meta.json", False)
