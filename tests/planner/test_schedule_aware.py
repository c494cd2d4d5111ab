"""schedule=auto: per-pipeline schedule choice, schedule-priced cost model, memory."""

import json
import random

import pytest

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.cost import AnalyticCostModel
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Pipeline, Stage
from hexicore.core.settings import TrainSettings
from hexicore.planner.problem import Problem
from hexicore.registry import Registry
from hexicore.planner.pricing import ScheduleBook, auto_defaults, options, timed_cost
from hexicore.planner.plan_check import validate_plan

from tests.conftest import CONF
from tests.conftest import run_cli
from tests.helpers import SEARCH_FAST as FAST, search_random_cluster as random_cluster


DEFAULT_OPTIONS = auto_defaults()["options"]  # conf/schedule/auto.yaml
AUTO = {"name": "auto", "options": [dict(o) for o in DEFAULT_OPTIONS]}


def solve(problem, seed=0):
    return Registry.default().create("solver", "hexiscale", **FAST).solve(
        problem, time_limit=None, seed=seed, progress=lambda m, f: None)


def problems(cluster, batch, seq=2048):
    """The same cluster under schedule=1f1b and schedule=auto, one schedule-priced cost model."""
    reg = Registry.default()
    cost = timed_cost(AnalyticCostModel(), ScheduleBook(reg))
    model = ModelSpec.load(CONF / "model" / "gpt3_1.3b.yaml")
    train = TrainSettings(global_batch=batch, micro_batch=1, seq_len=seq)
    return (Problem(cluster, model, train, cost, {"name": "1f1b"}, reg),
            Problem(cluster, model, train, cost, AUTO, reg))


@pytest.mark.parametrize("seed", range(4))
def test_auto_never_worse_than_1f1b_on_random_clusters(seed):
    rng = random.Random(seed)
    one, auto = problems(random_cluster(rng), rng.choice([8, 16]))
    base, _ = validate_plan(solve(one), one.cost)
    plan = solve(auto)
    est, _ = validate_plan(plan, auto.cost)
    assert est.fits and est.iteration_s <= base.iteration_s + 1e-9
    names = {o["name"] for o in DEFAULT_OPTIONS + auto_defaults()["final_options"]}
    assert all(p.schedule["name"] in names for p in plan.pipelines)
    assert all(isinstance(p.schedule["waves"], int) for p in plan.pipelines if p.schedule["name"] == "hanayo")
    assert plan.solver["schedules"] == [dict(p.schedule) for p in plan.pipelines]


def test_pipeline_term_and_memory_follow_each_pipelines_schedule(paper_case, llama13b):
    reg = Registry.default()
    book = ScheduleBook(reg)
    cost = timed_cost(AnalyticCostModel(), book)
    train = TrainSettings(global_batch=8, micro_batch=1, seq_len=4096)
    stages = tuple(Stage((d,), 1, (10 * k, 10 * k + 10)) for k, d in enumerate(["A.0", "A.1", "A.2", "B.0"]))
    from hexicore.core.plan import Plan

    for sec in ({"name": "1f1b"}, {"name": "interleaved_1f1b", "chunks": 2}, {"name": "hanayo", "waves": 2}):
        plan = Plan(llama13b, paper_case, train, (Pipeline(8, stages, sec),))
        est = cost.estimate(plan)
        st, hops = cost.pipeline_pieces(plan, plan.pipelines[0])
        sched = reg.create("schedule", sec["name"], **{k: v for k, v in sec.items() if k != "name"})
        assert est.pipeline_s[0] == pytest.approx(sched.pipeline_time(st, hops, 8))
        from hexicore.pipeline.schedule import ScheduleSpec

        peaks = sched.peak_activations(ScheduleSpec(4, 8))
        assert [cost.in_flight(plan.pipelines[0], j, 8) for j in range(4)] == pytest.approx(list(peaks))
    plain = AnalyticCostModel()  # no schedule injected: the cost model's default rule, P - j
    assert [plain.in_flight(Pipeline(8, stages, {"name": "hanayo"}), j, 8) for j in range(4)] == [4, 3, 2, 1]


def test_options_validation():
    assert options({"name": "1f1b"}) == ({"name": "1f1b"},)
    assert [o["name"] for o in options({"name": "auto"})] == ["1f1b", "interleaved_1f1b", "zb_h1", "zb_v",
                                                             "interleaved_zb", "zb_h2"]
    from hexicore.core.errors import HexicoreError

    with pytest.raises(HexicoreError, match="options"):
        options({"name": "auto", "options": ["1f1b"]})


def test_cli_schedule_auto_records_schedules(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = run_cli(["plan", "schedule=auto", "solver.iterations=6", f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    from hexicore.planner.final_schedules import final_options

    allowed = {o.name for o in options({"name": "auto"}) + final_options({"name": "auto"})}
    for p in data["pipelines"]:  # an option or a final option (zb_h2 wins on the default problem)
        assert p["schedule"]["name"] in allowed
    problem = build_problem(config_from_overrides(["schedule=auto"]), Registry.default())
    from hexicore.core.plan import Plan

    est, _ = validate_plan(Plan.from_dict(data), problem.cost)
    assert est.iteration_s == pytest.approx(data["estimate"]["iteration_s"])
    from hexicore.app.compose import evaluate  # `hexicore evaluate` prices each pipeline by its schedule too

    again = evaluate(Plan.from_dict(data), AnalyticCostModel(), registry=Registry.default())[1]
    assert again.iteration_s == pytest.approx(data["estimate"]["iteration_s"])


def test_auto_keeps_the_seed_plans(tmp_path):
    """The seed solvers (megatron) see the first option, not 'auto': on hetero2 with one
    iteration the 1F1B search's best is megatron's re-laid-out plan, and auto must not lose it."""
    reg = Registry.default()
    over = ["cluster=hetero2", "model=llama2_7b", "train.global_batch=128"]
    one = build_problem(config_from_overrides(over + ["schedule=1f1b"]), reg)
    from dataclasses import replace

    one = replace(one, cost=timed_cost(one.cost, ScheduleBook(reg)))
    auto = build_problem(config_from_overrides(over + ["schedule=auto"]), reg)
    fast = {"iterations": 1, "use_all_devices": True}
    plan = reg.create("solver", "hexiscale", **fast).solve(one)
    assert plan.solver["origin"].startswith("seed:megatron"), plan.solver["origin"]
    base = validate_plan(plan, one.cost)[0]
    est = validate_plan(reg.create("solver", "hexiscale", **fast).solve(auto), auto.cost)[0]
    assert est.iteration_s <= base.iteration_s + 1e-9


def test_builtins_declare_their_pricing_and_the_rules_match_the_simulator():
    from hexicore.core.schedule_ref import ScheduleRef
    from hexicore.pipeline.schedule import BLOCKS, STEADY, ScheduleSpec
    from hexicore.pipeline.simulate import simulate

    reg = Registry.default()
    one, gpipe, hanayo = (reg.create("schedule", n) for n in ("1f1b", "gpipe", "hanayo"))
    for P in (1, 2, 4):
        for M in (1, 3, 8):
            for s in (one, gpipe):
                assert s.peak_rule(P, M) == pytest.approx(simulate(s.order(ScheduleSpec(P, M))).peak_activations)
    assert one.pricing.cost_model_time and not gpipe.pricing.cost_model_time
    assert (hanayo.pricing.growth, hanayo.pricing.min_ranks, hanayo.pricing.fewer_ranks) == \
        (BLOCKS, 2, ScheduleRef("1f1b"))
    assert one.pricing.growth == STEADY and reg.create("schedule", "chimera").peak_rule(4, 8) is None
    book = ScheduleBook(reg)
    wave = ScheduleRef("hanayo", {"waves": "auto", "max_waves": 4})
    assert book.effective(wave, 1) == ScheduleRef("1f1b") and not book.usable(wave, 1)
    assert book.exact(wave, [3.0], [], 5) == pytest.approx(15.0)  # one rank: 1F1B, no bubble
    st, hop = [3.0, 3.0, 2.0, 4.0], [0.1, 0.1, 0.1]
    assert book.model(wave, st, hop, 9) == pytest.approx(3 * book.exact(wave, st, hop, 4))  # blocks of P
    steady = ScheduleRef("interleaved_1f1b", {"chunks": 2})
    a, b = book.exact(steady, st, hop, 4), book.exact(steady, st, hop, 8)
    assert book.model(steady, st, hop, 6) == pytest.approx(a + (b - a) / 2)  # affine through P and 2P
    chosen, secs = book.resolve(wave, st, hop, 4)
    assert chosen.name == "hanayo" and set(chosen.params) == {"waves"} and isinstance(chosen["waves"], int)
    assert secs == pytest.approx(book.exact(chosen, st, hop, 4))
    few, _ = book.resolve(wave, [1.0] * 4, [0.0] * 3, 8, rank_layers=(2, 2, 3, 2))  # 2W chunks <= 2 blocks
    assert book.resolve(wave, [1.0] * 4, [0.0] * 3, 8)[0]["waves"] > 1 and few["waves"] == 1


def test_schedule_pricing_keeps_the_cost_models_formula_only_where_the_schedule_says_so():
    from hexicore.planner.pricing import schedule_pricing

    reg = Registry.default()
    cost, book = schedule_pricing(AnalyticCostModel(), {"name": "1f1b"}, reg)
    assert book is None and cost.pipeline_timer is None and cost.activation is not None
    for sched in ({"name": "gpipe"}, {"name": "auto"}):
        cost, book = schedule_pricing(AnalyticCostModel(), sched, reg)
        assert isinstance(book, ScheduleBook) and cost.pipeline_timer is not None
    stages = tuple(Stage((f"A.{k}",), 1, (k, k + 1)) for k in range(3))
    cost, _ = schedule_pricing(AnalyticCostModel(), {"name": "gpipe"}, reg)
    assert [cost.in_flight(Pipeline(6, stages, {"name": "gpipe"}), j, 6) for j in range(3)] == [6, 6, 6]


def test_the_search_gets_its_book_from_the_problem():
    """No book is fished out of the cost model: ``Problem.pricing`` is the book the search uses."""
    from hexicore.planner.search.context import make_context
    from hexicore.planner.search.search_config import SearchConfig

    reg = Registry.default()
    problem = build_problem(config_from_overrides(["schedule=gpipe"]), reg)
    assert isinstance(problem.pricing, ScheduleBook)
    assert make_context(problem, SearchConfig()).book is problem.pricing
    plain = build_problem(config_from_overrides(["schedule=1f1b"]), reg)
    assert plain.pricing is None and make_context(plain, SearchConfig()).book is None


def test_plan_with_a_schedule_that_needs_two_ranks(tmp_path):
    """Chimera (two directions) declares two ranks at least: the search prices one-rank
    candidates as 1F1B instead of failing on them, and the plan's pipelines run Chimera. (Every
    rank keeps two weight copies, so 13B's 208 GB of state twice exceeds paper_case's 360 GB: 7B.)"""
    out = tmp_path / "p.json"
    assert run_cli(["plan", "schedule=chimera", "model=llama2_7b", "solver.iterations=6",
                    "solver.time_budget=null",  # the seed alone decides, not the host's load (0.9 s budget)
                    f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    pipes = json.loads(out.read_text())["pipelines"]
    assert all(p["schedule"]["name"] == "chimera" and len(p["stages"]) >= 2 for p in pipes)
    from hexicore.core.schedule_ref import ScheduleRef

    assert ScheduleBook(Registry.default()).effective(ScheduleRef("chimera"), 1) == ScheduleRef("1f1b")


def test_choose_exact_models_and_prices_only_what_ends_within_the_deadline(monkeypatch):
    """The exact re-choice models an option, or prices one exactly, only while the slowest such
    step so far still ends by the deadline; the pipeline's own schedule is priced whatever the
    time (on 320 GPUs at batch 1024, modelling every option for two pipelines of 80 stages and
    512 micro-batches took a search 2.7 s past its budget). A fake clock: a model takes 1 s, an
    exact pricing 0.5 s."""
    import types
    from dataclasses import dataclass

    from hexicore.core.plan import Pipeline
    from hexicore.core.schedule_ref import ScheduleRef
    from hexicore.planner import pricing

    now, modelled, priced = [0.0], [], []
    times = {"own": 10.0, "a": 9.0, "b": 8.0, "c": 7.0}

    class Book:
        def runs(self, ref, ranks, n):
            return True

        def model(self, ref, stage_s, hop_s, n):
            now[0] += 1.0
            modelled.append(ref.name)
            return times[ref.name]

    def resolve(book, cost, plan, pipe):
        now[0] += 0.5
        priced.append(pipe.schedule.name)
        return pipe.schedule, times[pipe.schedule.name]

    @dataclass(frozen=True)
    class Plan:
        pipelines: tuple
        train: object

    monkeypatch.setattr(pricing, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(pricing, "resolve_placed", resolve)
    monkeypatch.setattr(pricing, "fits", lambda *a: True)
    monkeypatch.setattr(pricing, "placed_bound", lambda *a: 0.0)
    cost = types.SimpleNamespace(pipeline_pieces=lambda plan, pipe: ([1.0], []))
    plan = Plan((Pipeline(4, ("stage",), {"name": "own"}),), types.SimpleNamespace(micro_batch=1))
    refs = [ScheduleRef.from_mapping({"name": n}) for n in ("own", "a", "b", "c")]

    def choose(deadline):
        now[0] = 0.0
        modelled.clear()
        priced.clear()
        return pricing.choose_exact(Book(), cost, plan, refs, deadline)[0].pipelines[0].schedule.name

    assert choose(float("inf")) == "c" and modelled == ["a", "b", "c"] and priced == ["own", "c"]
    # 2.2 s: a and b modelled (a third would end at 3 s), own priced (to 2.5 s), b's pricing not begun
    assert choose(2.2) == "own" and modelled == ["a", "b"] and priced == ["own"]
    # 4.1 s: every option modelled (to 3 s), own and c priced (to 4 s); b's would end at 4.5 s
    assert choose(4.1) == "c" and modelled == ["a", "b", "c"] and priced == ["own", "c"]
    # past the deadline: only the pipeline's own, priced
    assert choose(-1.0) == "own" and modelled == [] and priced == ["own"]
