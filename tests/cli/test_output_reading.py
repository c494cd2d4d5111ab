"""Output a person reads at a glance: durations in a unit that shows them, simulate's units,
a synthesised schedule's parameters out of the plan table, the objective said, memory in GiB
with the reserve named, evaluate saying the plan is valid, and a note where a plan for catalog
GPUs ran on this CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console

from hexicore.app.report import _fmt_s, memory_table, plan_table
from hexicore.cost.analytic import AnalyticCostModel
from tests.conftest import run_cli
from tests.helpers import make_plan


def rendered(table) -> str:
    console = Console(width=400, record=True)
    console.print(table)
    return console.export_text()


def test_durations_take_the_unit_that_shows_them():
    assert [_fmt_s(x) for x in (123.4, 1.5, 0.25, 0.0123, 0.0004, 2e-5, 0.0)] == \
        ["123.4 s", "1.500 s", "0.250 s", "12.3 ms", "0.4 ms", "20 us", "0 s"]


def test_a_tiny_plan_prints_no_zero_seconds(tmp_path, capsys):
    assert run_cli(["plan", "model=tiny", "cluster=tight8", "train.global_batch=8", f"out={tmp_path / 'p.json'}"]) == 0
    out = capsys.readouterr().out
    assert "0.000 s" not in out and " ms" in out


def test_simulate_names_its_units(tmp_path, capsys):
    assert run_cli(["simulate", "schedule=1f1b", "pipeline.ranks=2", "pipeline.micro_batches=4",
                    f"out={tmp_path / 's'}"]) == 0
    out = capsys.readouterr().out
    assert "makespan" in out and "time units" in out and "peak activations (micro-batches)" in out


def test_a_synthesised_schedule_keeps_the_plan_table_narrow(paper_case, llama13b):
    plan = make_plan(paper_case, llama13b)
    long = {"name": "synth", "stage_times": [[0.123456, 0.234567, 0.3456]] * 4, "memory_caps": [1.5, 2.5, 3.5, 4.5]}
    plan = replace(plan, pipelines=(replace(plan.pipelines[0], schedule=long), plan.pipelines[1]))
    text = rendered(plan_table(plan))
    assert "synth (parameters: plan JSON)" in text and "stage_times" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) < 160


def test_memory_is_gib_and_the_reserve_is_named(paper_case, llama13b):
    plan = make_plan(paper_case, llama13b)
    text = rendered(memory_table(plan, AnalyticCostModel()))
    assert "GiB" in text and "1 GiB reserve" in text and "cost.reserve_gb" in text


def test_the_objective_and_a_valid_plan_are_said(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert run_cli(["plan", "cluster=mixed_price", "model=llama2_7b", "objective=cost", "train.global_batch=32",
                    f"out={plan}"]) == 0
    out = capsys.readouterr().out
    assert "objective cost (least $ per million tokens)" in out and "GB" not in out.replace("GiB", "")
    assert run_cli(["evaluate", f"plan_file={plan}"]) == 0
    assert "plan valid:" in capsys.readouterr().out


@pytest.mark.slow
def test_a_plan_for_catalog_gpus_run_on_this_cpu_says_so(tmp_path, capsys):
    plan = tmp_path / "tiny.json"
    assert run_cli(["plan", "model=tiny", "cluster=tight8", "train.global_batch=8", "solver=megatron",
                    f"out={plan}"]) == 0
    capsys.readouterr()
    assert run_cli(["train", f"plan_file={plan}", "train.steps=2", "train.dtype=fp32", "runtime.progress=false",
                    f"out={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    assert "the prediction is for the plan's devices" in out and "this machine's" in out


def test_a_sweep_table_shows_what_differs_uncut(tmp_path, capsys):
    assert run_cli(["plan", "-m", "solver=megatron,metis_like", "cluster=tight8", "model=tiny", "train.global_batch=8",
                    f"hydra.sweep.dir={tmp_path / 's'}"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("sweep summary"):]
    assert "…" not in table
    assert "metis_like" in table and "the same in every job: " in table and "cluster=" in table


def test_the_plan_picture_names_devices(tmp_path, monkeypatch, paper_case, llama13b):
    import hexicore.app.picture as picture

    assert picture.device_span(["A1.0", "A1.3"]) == "A1.0,3"
    assert picture.device_span(["A.0", "A.1", "A.2", "B.0"]) == "A.0-2+B.0"
    figures = []
    monkeypatch.setattr(picture, "save_png", lambda fig, path, dpi: figures.append(fig) or path)
    picture.save_plan_picture(make_plan(paper_case, llama13b), tmp_path / "p.png")
    texts = {t.get_text() for ax in figures[0].axes for t in ax.texts}
    assert "A.0\ns0" in texts and "C.1\ns3" in texts and not any(t.startswith("p0s") for t in texts)
    assert "A.0-1\ntp2" in texts and "C.0-1\ntp2" in texts


def test_the_timeline_legend_lists_what_it_draws_and_tells_chunks_apart(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from hexicore.pipeline import timeline

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    for i, overrides in enumerate((["schedule=1f1b"], ["schedule=interleaved_1f1b", "schedule.chunks=2"],
                                   ["schedule=zb_h1"])):
        assert run_cli(["simulate", *overrides, "pipeline.ranks=2", "pipeline.micro_batches=4",
                        f"out={tmp_path / str(i)}"]) == 0
    legends = [[t.get_text() for t in f.axes[0].get_legend().get_texts()] for f in figures]
    labels = [{t.get_text() for t in f.axes[0].texts} for f in figures]
    assert legends[0] == ["forward", "backward"] and "W (weight grad)" in legends[2]
    assert any("chunk" in x for x in legends[1]) and "0c1" in labels[1] and "0c0" in labels[1]
    assert all(timeline.TIME_UNIT in f.axes[0].get_xlabel() for f in figures)
