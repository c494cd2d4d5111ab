"""Bounded work (hexicore/core/limits.py): absurd sizes in overrides, cluster, model, plan and
action files end at once with one line naming the field and the limit, before anything of that
size is built (the time and memory of these checks do not grow with the number typed)."""

from __future__ import annotations

import json
import resource
import time

import pytest

from hexicore.core import limits
from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.pipeline.actions import parse_actions
from tests.conftest import run_cli

HUGE = 10**14


def one_line(code, capsys, field):
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and field in err and "limit" in err, err


@pytest.mark.parametrize("argv,field", [
    (["plan", "model=tiny", f"train.global_batch={HUGE}"], "train.global_batch"),
    (["plan", "model=tiny", "train.global_batch=1048576", "train.micro_batch=1"], "train.micro_batch"),
    (["simulate", "pipeline.ranks=100000"], "pipeline.ranks"),
    (["simulate", f"pipeline.micro_batches={HUGE}"], "pipeline.micro_batches"),
    (["simulate", "schedule=hanayo", "schedule.waves=100000"], "schedule.waves"),
    (["simulate", "schedule=hanayo", "schedule.waves=200", "pipeline.ranks=64", "pipeline.micro_batches=4096"],
     "pipeline.micro_batches"),
])
def test_cli_sizes_end_at_once(argv, field, tmp_path, capsys):
    t0 = time.perf_counter()
    one_line(run_cli([*argv, f"out={tmp_path / 'o'}", f"hydra.run.dir={tmp_path / 'h'}"]), capsys, field)
    assert time.perf_counter() - t0 < 30  # generous: the point is "not minutes"
    assert not (tmp_path / "o").exists()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_files_with_huge_counts_are_refused_in_bounded_memory(tmp_path):
    before = _rss_mb()
    machine = {"name": "A", "gpu": "a100-80g", "count": HUGE, "bandwidth_gbs": 100}
    with pytest.raises(HexicoreError, match="machines.*limit of 4,096"):
        parse_cluster({"machines": [machine]}, "c.yaml")
    with pytest.raises(HexicoreError, match="synthetic.gpus.*limit"):
        parse_cluster({"synthetic": {"gpus": HUGE, "mix": {"a100-80g": 1}}}, "c.yaml")
    with pytest.raises(HexicoreError, match="devices\\[0\\].id.*limit"):
        parse_cluster({"devices": [{"id": f"A.{HUGE}", "gpu": "a100-80g"}]}, "c.yaml")
    with pytest.raises(HexicoreError, match="layers.*limit of 1,024"):
        ModelSpec(name="m", layers=HUGE, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=100, seq_len=32)
    with pytest.raises(HexicoreError, match="train.global_batch.*limit"):
        TrainSettings(global_batch=HUGE, micro_batch=1, seq_len=32)
    actions = {"format": "hexicore.actions/1", "schedule": {"name": "x"}, "ranks": 1, "stages": 1,
               "micro_batches": HUGE, "stage_rank": [0], "actions": [[]]}
    with pytest.raises(HexicoreError, match="micro_batches.*limit"):
        parse_actions(actions, "a.json")
    assert _rss_mb() - before < 200


def test_a_plan_file_with_a_huge_batch_is_one_line(tmp_path, capsys):
    p = tmp_path / "p.json"
    assert run_cli(["plan", "model=tiny", f"out={p}", f"hydra.run.dir={tmp_path / 'h'}"]) == 0
    capsys.readouterr()
    d = json.loads(p.read_text())
    d["train"]["global_batch"] = HUGE
    d["pipelines"][0]["batch"] = HUGE
    p.write_text(json.dumps(d))
    one_line(run_cli(["evaluate", f"plan_file={p}"]), capsys, "train.global_batch")
    with pytest.raises(HexicoreError, match="limit"):
        Plan.load(p)


def test_the_limits_table_is_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    for value in limits.TABLE.values():
        assert f"{value:,}" in text


@pytest.mark.parametrize("key, value, shown", [
    ("latency_us", 10000001.0, "10000001.0 us is outside"),  # not "1e+07 us is outside ... 0 to 1e+07"
    ("bandwidth_gbs", 1000000.5, "1000000.5 GB/s is outside"),
    ("bandwidth_gbs", 2e6, "2e+06 GB/s is outside"),
])
def test_a_value_just_outside_a_range_is_shown_as_given(key, value, shown):
    machine = {"name": "A", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32, key: value}
    with pytest.raises(HexicoreError, match=shown.replace("+", "\\+")) as e:
        parse_cluster({"name": "c", "machines": [machine]}, "c.yaml")
    assert e.value.field == f"machines[0].{key}"
