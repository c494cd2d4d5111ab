"""A schedule plugin that exists only in this test suite — ``grouped_gpipe``,
tests/schedule_plugin_example.py, the walkthrough of docs/plugins.md — works in ``simulate``,
prices itself in the planner, is planned with under ``schedule=auto`` (chosen when it is the
best, weighed and passed over when it is not) and trains on the torch runtime exactly like one
process: all with no change to hexicore."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import tests.schedule_plugin_example as example
from hexicore.core.cluster import parse_cluster
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost import AnalyticCostModel
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import simulate
from hexicore.planner.stage_layout.pipeline_fit import fits
from hexicore.planner.pricing import ScheduleBook, schedule_pricing
from hexicore.planner.problem import Problem
from hexicore.planner.plan_check import validate_plan
from hexicore.registry import Registry
from tests.conftest import CONF, run_cli

ROOT = Path(__file__).resolve().parents[2]
NAME = "grouped_gpipe"
FAST = {"iterations": 6, "polish_rounds": 2, "polish_evals": 30, "time_budget": None}


def registry() -> Registry:
    """Hermetic: the installed plugins (built-ins) plus the example, on a fresh registry."""
    return Registry(plugins=[example], entry_points=True)


@pytest.fixture
def installed():
    """The example registered on the registry the CLI uses, with its structured config stored,
    as an installed distribution's would be (the ``hexicore`` entry-point group); undone after."""
    from hydra.core.config_store import ConfigStore

    reg = Registry.default()
    reg.register(example, name="tests.schedule_plugin_example")
    reg.store_configs()
    try:
        yield reg
    finally:
        reg.unregister(name="tests.schedule_plugin_example")
        ConfigStore.instance().repo.get("schedule", {}).pop(f"{NAME}.yaml", None)


# ----------------------------------------------------------------------------- simulate
def test_simulate_prints_its_own_closed_form(installed, tmp_path, capsys):
    code = run_cli(["simulate", f"schedule={NAME}", "schedule.group=2", "pipeline.ranks=3",
                    "pipeline.micro_batches=6", f"out={tmp_path}", f"hydra.run.dir={tmp_path / 'h'}"])
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["schedule"] == {"name": NAME, "group": 2}
    assert s["bubble_ratio"] == pytest.approx(0.5) and s["closed_form_bubble"] == pytest.approx(0.5)  # 3*2/(6+3*2)
    assert s["peak_activations"] == [2, 2, 2] and s["makespan"] == pytest.approx((6 + 3 * 2) * 3.0)
    assert "(closed form 0.5000)" in out
    actions = json.loads((tmp_path / "actions.json").read_text())
    assert actions["schedule"] == {"name": NAME, "group": 2}
    assert any(a["op"] == "SEND_F" for a in actions["actions"][0])  # the shared comm pass ran


def test_its_closed_forms_agree_with_the_simulator():
    for P, M, group in [(4, 8, "auto"), (3, 7, 2), (1, 5, "auto"), (4, 6, 4)]:
        sched = example.GroupedGPipe(group=group)
        spec = ScheduleSpec(P, M)
        res = simulate(sched.actions(spec), comm=True)
        assert sched.pipeline_time([3.0] * P, [0.0] * (P - 1), M) == pytest.approx(res.makespan)
        assert sched.closed_bubble(spec, sched.order(spec).schedule) == pytest.approx(res.bubble_ratio)
        assert sched.peaks(P, M) == pytest.approx(res.peak_activations)


# ------------------------------------------------------------------------------ pricing
def test_the_planner_prices_it_by_its_declarations():
    book = ScheduleBook(registry())
    ref = ScheduleRef(NAME)
    st, hop = [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0]
    assert book.exact(ref, st, hop, 8) == pytest.approx((8 + 2 * 3) * 3.0)  # closed form, G = P = 4
    uneven, slow = [3.0, 4.0, 2.0, 3.0], [0.5, 0.5, 0.5]
    sched = book.schedule(ref)
    sim = simulate(sched.template(4, 8), ScheduleSpec.from_pieces(uneven, slow, 8).timing(sched.template(4, 8)))
    assert book.exact(ref, uneven, slow, 8) == pytest.approx(sim.makespan)  # no closed form: simulated
    assert book.model(ref, uneven, slow, 12) == pytest.approx(3 * book.exact(ref, uneven, slow, 4))  # BLOCKS
    assert book.peaks(ref, 4, 8) == (4.0,) * 4 and book.peaks(ScheduleRef(NAME, {"memory": 1}), 4, 8) == (1.0,) * 4
    assert book.usable(ref, 1) and not book.native(ref)
    chosen, secs = book.resolve(ScheduleRef(NAME, {"memory": 3}), st, hop, 8)
    assert chosen == ScheduleRef(NAME, {"group": 3}) and secs == pytest.approx((8 + 3 * 3) * 3.0)


def test_plan_schedule_auto_with_it_as_the_only_option(installed, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = run_cli(["plan", "schedule=auto", f"schedule.options=[{{name:{NAME}}}]", "solver.iterations=6",
                    f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    text = capsys.readouterr().out
    assert code == 0
    data = json.loads(out.read_text())
    assert {p["schedule"]["name"] for p in data["pipelines"]} == {NAME} and NAME in text
    assert run_cli(["evaluate", f"plan_file={out}", f"hydra.run.dir={tmp_path / 'e'}"]) == 0
    assert f"{data['estimate']['iteration_s']:.3f} s" in capsys.readouterr().out  # priced by it again


def small_cluster(memory_gb: float):
    return parse_cluster({"name": "small", "gpus": {"small": {"tflops": 100, "memory_gb": memory_gb}},
                          "machines": [{"name": "m", "gpu": "small", "count": 4, "bandwidth_gbs": 32,
                                        "latency_us": 10}],
                          "inter": {"bandwidth_gbs": 1, "latency_us": 50}}, "test")


def solve_auto(reg, memory_gb: float, opts: list[dict]) -> tuple[Plan, Problem]:
    model = ModelSpec.load(CONF / "model" / "gpt3_1.3b.yaml")
    train = TrainSettings(global_batch=8, micro_batch=1, seq_len=2048, recompute=False)
    schedule = {"name": "auto", "options": opts}
    cost, book = schedule_pricing(AnalyticCostModel(state_bytes_per_param=8), schedule, reg)  # sizes tuned to 8 B/param
    problem = Problem(small_cluster(memory_gb), model, train, cost, schedule, reg, pricing=book)
    plan = reg.create("solver", "hexiscale", **FAST).solve(problem, time_limit=None, seed=0, progress=lambda m, f: None)
    validate_plan(plan, problem.cost)
    return plan, problem


def test_auto_chooses_it_when_it_is_the_best_and_weighs_it_when_not():
    """Memory-tight GPUs: 1F1B's first stage holds P micro-batches and does not fit, the
    example with ``memory: 1`` holds one and does: auto picks it (and records the group it
    resolved). With room to spare, 1F1B is faster: the example is priced and passed over."""
    reg = registry()
    lean = {"name": NAME, "memory": 1}
    plan, problem = solve_auto(reg, 5.0, [lean, {"name": "1f1b"}])
    assert all(p.schedule == ScheduleRef(NAME, {"group": 1}) for p in plan.pipelines)
    tried = plan.solver["schedule_s"]
    assert all(set(t) == {NAME, "1f1b"} for t in tried)
    assert any(t["1f1b"] < t[NAME] for t in tried)  # faster, but it does not fit:
    book = problem.pricing
    assert not any(fits(book, problem.cost, plan, p.__class__(p.batch, p.stages, ScheduleRef("1f1b")))
                   for p in plan.pipelines if len(p.stages) > 1)

    plan, _ = solve_auto(reg, 7.0, [{"name": "1f1b"}, lean])
    assert {p.schedule.name for p in plan.pipelines} == {"1f1b"}
    # priced and slower, or not priced at all: its modelled time leaves it no chance (bounds first)
    assert all(t.get(NAME, math.inf) > t["1f1b"] for t in plan.solver["schedule_s"])


# ------------------------------------------------------------------------------ runtime
@pytest.mark.slow
def test_the_runtime_trains_a_plan_made_with_it_like_one_process(tmp_path):
    """Planned under ``schedule=auto`` (the example the only option) for three small GPUs, then
    run on three gloo ranks: losses and final weights equal the single-process reference."""
    pytest.importorskip("torch")
    from hexicore.app.compose import config_from_overrides, solve
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, plan_layout, reference_actions
    from tests.helpers import worker_spec
    reg = registry()
    cluster = tmp_path / "small3.yaml"
    cluster.write_text("name: small3\ninter: {bandwidth_gbs: 0.7, latency_us: 50}\nmachines:\n"
                       "  - {name: A, gpu: rtx3090, count: 1, bandwidth_gbs: 24, latency_us: 10}\n"
                       "  - {name: B, gpu: rtx4090, count: 1, bandwidth_gbs: 32, latency_us: 10}\n"
                       "  - {name: C, gpu: rtx4090, count: 1, bandwidth_gbs: 32, latency_us: 10}\n")
    cfg = config_from_overrides(["model=tiny", f"cluster_file={cluster}", "train.dtype=fp32", "train.recompute=false",
                                 "train.global_batch=6", "train.seq_len=32", "schedule=auto",
                                 f"schedule.options=[{{name:{NAME},group:2}}]", "solver.dp_max=1",
                                 "solver.iterations=6", "solver.use_all_devices=true"])
    plan, _ = solve(cfg, reg)
    assert [p.schedule for p in plan.pipelines] == [ScheduleRef(NAME, {"group": 2})]
    assert len(plan.pipelines[0].stages) > 1

    layout = plan_layout(plan, [p.schedule for p in plan.pipelines], registry=reg, seq_len=32)
    m = plan.model
    ref = build_layout(m, [(6, [StageGroup((0,), m.layers)], reference_actions(6))], global_batch=6,
                       micro_batch=1, seq_len=32, world=layout.world)
    specs = [worker_spec(x, steps=3, seed=7, dtype="fp32", recompute=False, progress=False, return_state=True)
             for x in (ref, layout)]
    want, got = launch(specs, layout.world)
    rel = max(abs(a - b) / abs(b) for a, b in zip(got["metrics"]["losses"], want["metrics"]["losses"]))
    weights = max((got["state"][k] - v).abs().max().item() for k, v in want["state"].items())
    assert len(got["metrics"]["losses"]) == 3 and all(math.isfinite(x) for x in got["metrics"]["losses"])
    assert rel <= 1e-5 and weights <= 1e-5, (rel, weights)


# --------------------------------------------------------------------------------- docs
def test_docs_walk_through_exactly_this_plugin():
    """docs/plugins.md's schedule walkthrough shows tests/schedule_plugin_example.py in full,
    in order (blank lines aside): a schedule written from the docs is this one."""
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = text[text.index("# Writing a schedule plugin"):text.index("# Testing plugins hermetically")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    source = (ROOT / "tests" / "schedule_plugin_example.py").read_text(encoding="utf-8")
    shown = [line for b in blocks for line in b.splitlines() if line.strip()]
    assert shown == [line for line in source.splitlines() if line.strip()]
