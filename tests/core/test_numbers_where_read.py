"""Every number of every file format is checked where it is read (finite, in range, of its type),
and an error message never formats an unbounded value: Hugging Face configs (architectures,
special token ids), checkpoint meta, synth schedule sections, zones and emulation in a cluster
file, the objective's limits and seeds on the command line, token files whose sidecar lies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.hf_config import load_hf_config
from tests.conftest import run_cli

HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
      "max_position_embeddings": 128}


@pytest.mark.parametrize("change, field", [
    ({"architectures": [{}]}, "architectures"),
    ({"architectures": [["LlamaForCausalLM"]]}, "architectures"),
    ({"architectures": "LlamaForCausalLM"}, "architectures"),
    ({"model_type": ["llama"], "architectures": []}, "model_type"),
    ({"bos_token_id": "abc"}, "bos_token_id"),
    ({"eos_token_id": 256}, "eos_token_id"),
    ({"eos_token_id": [1, 10**40]}, "eos_token_id"),
    ({"pad_token_id": 1.5}, "pad_token_id"),
])
def test_hf_config_fields_are_checked_where_read(change, field, tmp_path):
    """``TypeError: unhashable type`` for odd architectures; token ids that planning accepted and
    only training refused."""
    (tmp_path / "config.json").write_text(json.dumps({**HF, **change}))
    with pytest.raises(HexicoreError) as err:
        load_hf_config(tmp_path)
    assert err.value.field == field and len(str(err.value)) < 300 and "\n" not in str(err.value)


def test_checkpoint_meta_numbers_are_finite_and_in_range():
    native = pytest.importorskip("hexicore_plugins.runtimes.torch.checkpoint.native")
    good = {"format": native.FORMAT, "step": 2, "losses": [1.0, 0.9], "step_s": [0.1, 0.1], "seed": 0,
            "adam_step": 2, "model": {}, "data": {}, "plan": "x"}
    native.check_meta(dict(good), "meta.json")
    for field, value in [("losses", [math.nan, 1.0]), ("losses", [1.0, math.inf]), ("step_s", [0.1, math.nan]),
                         ("adam_step", 1e30), ("adam_step", math.inf), ("adam_step", 3), ("seed", 10**40),
                         ("grad_norms", [1.0, math.nan])]:
        with pytest.raises(HexicoreError) as err:
            native.check_meta({**good, field: value}, "meta.json")
        assert err.value.field == field and len(str(err.value)) < 300, str(err.value)


@pytest.mark.parametrize("params, field", [
    ({"memory": [math.inf, 2]}, "schedule.memory"),
    ({"memory": math.nan}, "schedule.memory"),
    ({"stage_times": [1e300, 1e-300]}, "schedule.stage_times"),
    ({"stage_times": [1.0, 1.0], "hop_times": [1e300]}, "schedule.hop_times"),
    ({"stage_times": list(range(1, 10**5))}, "schedule.stage_times"),  # fine; its error would be huge
])
def test_synth_sections_are_finite_and_in_range(params, field):
    synth = pytest.importorskip("hexicore_plugins.schedules.synth")
    if len(params.get("stage_times", ())) > 10:
        params = {"stage_times": [*params["stage_times"][:-1], -1]}
    with pytest.raises(HexicoreError) as err:
        synth.Synth(**params)
    assert err.value.field == field and len(str(err.value)) < 400, str(err.value)


def test_error_messages_show_bounded_values():
    from hexicore.core.errors import shown

    assert shown(10**5000).startswith("an integer of about 5")
    assert len(shown(list(range(10**6)))) <= 80 and "1000000 items" in shown(list(range(10**6)), 200)
    assert len(shown("x" * 10**6)) <= 80 and shown({"a": [10**5000]}, 200).count("digits") == 1


CLUSTER = {"name": "z", "inter": {"bandwidth_gbs": 25, "latency_us": 5},
           "machines": [{"name": "E0", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 300, "zone": "east"},
                        {"name": "W0", "gpu": "h100-80g", "count": 2, "bandwidth_gbs": 450, "zone": "west"}]}


def test_zones_need_their_link_and_emulate_says_something():
    with pytest.raises(HexicoreError, match="no link between zones east and west") as err:
        parse_cluster(CLUSTER, "c.yaml")
    assert err.value.field == "inter_zone"
    parse_cluster({**CLUSTER, "zone_links": [{"between": ["east", "west"], "bandwidth_gbs": 1}]}, "c.yaml")
    one = {**CLUSTER, "machines": [{**CLUSTER["machines"][0], "emulate": None}]}
    with pytest.raises(HexicoreError) as err:
        parse_cluster(one, "c.yaml")
    assert err.value.field == "machines[0].emulate"


@pytest.mark.parametrize("override, field", [
    ("budget_per_hour=inf", "budget_per_hour"),
    ("min_tokens_per_s=inf", "min_tokens_per_s"),
    ("seed=1234567890123456789012345678901234567890", "seed"),
])
def test_command_line_numbers_are_finite_and_in_range(override, field, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = run_cli(["plan", "model=tiny", "solver=megatron", override, "out=p.json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{field}:" in err, err
    assert list(tmp_path.iterdir()) == []


def test_warm_start_schedules_are_checked_as_evaluate_checks_them(tmp_path, monkeypatch, capsys):
    """A warm_start plan whose synth stage_times hold NaN: evaluate refused the file, plan took it."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(["plan", "model=tiny", "solver=megatron", "out=p.json"]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    for pipe in plan["pipelines"]:
        pipe["schedule"] = {"name": "synth", "stage_times": [math.nan] * len(pipe["stages"]),
                            "hop_times": [0.0] * (len(pipe["stages"]) - 1)}
    (tmp_path / "w.json").write_text(json.dumps(plan))
    capsys.readouterr()
    code = run_cli(["plan", "model=tiny", "solver=megatron", "warm_start=w.json", "out=q.json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "stage_times" in err and "w.json" in err, err
    assert not (tmp_path / "q.json").exists()


def test_a_sidecar_that_lies_about_its_largest_id_is_caught_where_ids_are_read(tmp_path):
    """A sidecar whose ``max_id`` and stamp are forged: the ids are checked as each window is
    read (an IndexError inside the model's forward before)."""
    pytest.importorskip("torch")
    from hexicore.core.token_file import file_stamp, write_sidecar
    from hexicore_plugins.runtimes.torch.train.data_source import make_source

    path = tmp_path / "x.bin"
    np.full(200, 60000, dtype=np.uint16).tofile(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 256, "tokens": 200, "max_id": 5, "stamp": file_stamp(path)})
    source = make_source("tokens", vocab=256, seq_len=8, global_batch=2, seed=0, path=str(path))
    with pytest.raises(HexicoreError, match="60000") as err:
        source.batch(0)
    assert err.value.field == "runtime.data_file"


def test_a_plans_synth_section_carries_its_lists(tmp_path, monkeypatch, capsys):
    """A plan whose synth section has no stage_times/hop_times: evaluate (and train) rebuilt other
    lists than the plan was priced with, exit 0, no word."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(["plan", "model=tiny", "solver=megatron", "out=p.json"]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    for pipe in plan["pipelines"]:
        pipe["schedule"] = {"name": "synth", "memory": 2}
    (tmp_path / "s.json").write_text(json.dumps(plan))
    capsys.readouterr()
    code = run_cli(["evaluate", "plan_file=s.json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pipelines[0].schedule" in err and "stage_times" in err, err


@pytest.mark.parametrize("digits", [400, 4000])
@pytest.mark.parametrize("path", [("machines", 0, "count"), ("machines", 0, "bandwidth_gbs"), ("inter", "latency_us")])
def test_integers_of_hundreds_or_thousands_of_digits_are_one_line(digits, path, tmp_path):
    """A cluster file's number of 400 digits overflowed float conversion (OverflowError), one of
    4000 digits made the message itself long: each is one short line naming the field."""
    from hexicore.core.cluster import Cluster

    doc = {"name": "c", "inter": {"bandwidth_gbs": 1, "latency_us": 5},
           "machines": [{"name": "A", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100}]}
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = 10**digits
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(HexicoreError) as err:
        Cluster.load(tmp_path / "c.json")
    assert len(str(err.value)) < 300 and str(err.value.field).startswith(path[0]), str(err.value)[:300]
