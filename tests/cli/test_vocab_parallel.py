"""``train.vocab_parallel`` on the command line and in a plan: planned and recorded, inherited by
``hexicore train plan_file=`` unless given, handed to the runtime's layout, refused in one line
when it is no boolean."""

from __future__ import annotations

import json

from hexicore.app.compose import config_from_overrides
from hexicore.app.training import build_run_spec
from hexicore.registry import Registry
from tests.conftest import run_cli


def _spec(overrides):
    reg = Registry.default()
    return build_run_spec(config_from_overrides(list(overrides), registry=reg), reg, None)


def test_a_plan_records_it_and_a_run_inherits_it(tmp_path, capsys):
    path = tmp_path / "plan.json"
    base = ["cluster=tight8", "model=tiny", "train.global_batch=8", "train.seq_len=32", "solver.max_tp=2",
            "solver.dp_min=1"]
    assert run_cli(["plan", *base, "train.vocab_parallel=true", f"out={path}"]) == 0
    plan = json.loads(path.read_text())
    assert plan["train"]["vocab_parallel"] is True
    assert run_cli(["plan", *base, f"out={tmp_path / 'off.json'}"]) == 0
    assert "vocab_parallel" not in json.loads((tmp_path / "off.json").read_text())["train"]
    capsys.readouterr()
    run = ["model=tiny", "runtime.progress=false", f"plan_file={path}"]
    spec = _spec(run)
    assert spec.train.vocab_parallel is True
    assert _spec([*run, "train.vocab_parallel=false"]).train.vocab_parallel is False
    from hexicore_plugins.runtimes.torch.runtime import TorchRuntime

    assert TorchRuntime().layout(spec, registry=Registry.default()).vocab_parallel is True
    assert _spec(["model=tiny", "pipeline.ranks=2", "train.vocab_parallel=true"]).train.vocab_parallel is True


def test_no_boolean_is_one_line(tmp_path, capsys):
    assert run_cli(["plan", "cluster=tight8", "model=tiny", "train.vocab_parallel=maybe",
                    f"out={tmp_path / 'p.json'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vocab_parallel" in err and not (tmp_path / "p.json").exists()
    path = tmp_path / "plan.json"
    assert run_cli(["plan", "cluster=tight8", "model=tiny", "train.global_batch=8", "train.seq_len=32",
                    f"out={path}"]) == 0
    capsys.readouterr()
    plan = json.loads(path.read_text())
    plan["train"]["vocab_parallel"] = "yes"
    path.write_text(json.dumps(plan))
    assert run_cli(["evaluate", f"plan_file={path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.vocab_parallel: expected true or false" in err
