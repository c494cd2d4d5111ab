"""``schedule=auto``'s final options (synth re-priced on the final plan's pipelines under each
pipeline's own memory cap) and plans of ``schedule=synth``: never slower than auto without them,
each pipeline's choice recorded, and evaluate / the runtime rebuild the very lists priced."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hexicore.app.compose import build_problem, config_from_overrides, evaluate
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.pricer import worth_pricing
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.synthesis import synthesize
from hexicore.planner.final_schedules import final_options
from hexicore.planner.stage_layout.pipeline_fit import capped, fits, memory_caps
from hexicore.planner.pricing import ScheduleBook, auto_defaults, options
from hexicore.registry import Registry

from tests.conftest import run_cli

#: (cluster, model, global batch, extra overrides): the paper case through the allocation over
#: sub-clusters (the final options run once, after it), hetero1 on all its devices (quicker); batches
#: at which the final options have the memory to beat the plain options (hetero1 at 64 has none
#: since the runtime's block memory is counted: the plain 1F1B-family choice stands)
#: on hetero1 ZB-H2, a search option by default, is made a final option (its plan is then the
#: final options' to find: with it searched, no final option beats the search's plan there)
H2_FINAL = ["schedule.options=[{name: 1f1b}, {name: interleaved_1f1b, chunks: 2}, {name: zb_h1}, {name: zb_v},"
            " {name: interleaved_zb, chunks: 2}]",
            "schedule.final_options=[{name: zb_h2}, {name: dualpipe_v}, {name: looped_bfs, chunks: 2}, {name: chimera},"
            " {name: gpipe}, {name: synth, effort: quick}, {name: hanayo, waves: auto, max_waves: 4}]"]
PRESETS = [("paper_case", "llama2_13b", 20, []), ("hetero1", "llama2_7b", 48, H2_FINAL)]


def solve(over: list[str]) -> tuple[Plan, object]:
    reg = Registry.default()
    problem = build_problem(config_from_overrides(over), reg)
    every = any(o == "solver.use_all_devices=true" for o in over)
    # no time budget: the comparisons below are between complete searches, whatever the machine's load
    plan = reg.create("solver", "hexiscale", iterations=3, use_all_devices=every,
                      time_budget=None).solve(problem, seed=0)
    return plan, problem


def rebuilt_time(plan: Plan, pipe, cost) -> float:
    """The pipeline's time with the lists a runtime builds from the plan's schedule section
    (asking for P, M and each rank's blocks), under the plan's own stage and hop times."""
    ref = pipe.schedule
    sched = Registry.default().create("schedule", ref.name, **ref.kwargs())
    n = pipe.n_micro_batches(plan.train.micro_batch)
    al = sched.order(ScheduleSpec(len(pipe.stages), n, rank_layers=pipe.stage_layers))
    stage_s, hop_s = cost.pipeline_pieces(plan, pipe)
    return simulate(al, ScheduleSpec.from_pieces(stage_s, hop_s, n).timing(al), comm=False).makespan


def test_final_options_default_and_off():
    assert [o.name for o in final_options({"name": "auto"})] == [o["name"] for o in auto_defaults()["final_options"]]
    assert "synth" in [o.name for o in final_options({"name": "auto"})]
    assert final_options({"name": "auto", "final_options": []}) == ()
    assert final_options({"name": "zb_h1"}) == ()
    with pytest.raises(HexicoreError, match="final_options"):
        final_options({"name": "auto", "final_options": ["synth"]})
    mine = [{"name": "1f1b"}, {"name": "gpipe"}]  # own options: exactly those, unless finals are named too
    assert final_options({"name": "auto", "options": mine}) == ()
    assert final_options({"name": "auto", "options": mine, "final_options": auto_defaults()["final_options"]}) == ()
    assert [o.name for o in final_options({"name": "auto", "options": mine, "final_options": [{"name": "synth"}]})] \
        == ["synth"]
    assert final_options({"name": "auto", "options": auto_defaults()["options"]}) == final_options({"name": "auto"})


def test_per_rank_caps_are_kept_and_bind():
    spec = ScheduleSpec.from_pieces([0.5, 0.58, 0.52, 0.6, 0.58], [0.09, 0.0, 0.08, 0.0], 24)
    loose = synthesize(spec, [24.0, 24.0, 24.0, 24.0, 24.0], keep=1, admit_rounds=0, swaps=50)
    caps = [3.0, 24.0, 24.0, 24.0, 2.0]
    tight = synthesize(spec, caps, keep=1, admit_rounds=0, swaps=50)
    from hexicore.pipeline.actions import ActionList

    al = ActionList({}, 5, len(tight.stage_rank), 24, tight.stage_rank, tight.lists)
    peaks = simulate(al, spec.timing(al), comm=False).peak_activations
    assert all(p <= c + 1e-9 for p, c in zip(peaks, caps)) and peaks[0] > 2
    assert tight.makespan >= loose.makespan - 1e-9


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p[0])
def test_auto_with_final_options_is_never_slower_and_records_each_choice(preset):
    cluster, model, batch, extra = preset
    over = [f"cluster={cluster}", f"model={model}", f"train.global_batch={batch}", "schedule=auto", *extra]
    before, _ = solve([o for o in over if not o.startswith("schedule.final_options")] + ["schedule.final_options=[]"])
    plan, problem = solve(over)
    est, base = problem.cost.estimate(plan), problem.cost.estimate(before)
    assert est.fits and est.iteration_s <= base.iteration_s + 1e-9
    if plan.estimate is not None:
        assert plan.estimate.iteration_s == pytest.approx(est.iteration_s, abs=1e-9)
    # on both presets the pipelines' stage times are uneven: a final option is chosen and strictly
    # faster (zero-bubble H2 or synth; synth's V layout moves the head onto rank 0, the slowest
    # rank on paper_case, and a pipeline with a one-block rank gets synth's linear layout only)
    assert est.iteration_s < base.iteration_s - 1e-3
    assert plan.solver["schedules"] == [p.schedule.to_dict() for p in plan.pipelines]
    finals = {o.name for o in final_options(problem.schedule)}
    own = {o.name for o in options(problem.schedule)}
    book = ScheduleBook(Registry.default())
    refs = {o.name: o for o in options(problem.schedule) + final_options(problem.schedule)}
    # (the search's final candidates get the cheap final options too, so the plan may be a
    # runner-up of ``before``'s search: each pipeline is checked against what it records)
    for i, (p, tried) in enumerate(zip(plan.pipelines, plan.solver["schedule_s"])):
        # its fastest option that fits (a faster one may not: zb_h2 keeps more micro-batches in
        # flight than synth under the same caps), or a search option kept where the fastest
        # would slow the whole plan
        faster = [refs[k] for k, s in tried.items() if s < tried[p.schedule.name] - 1e-9]
        fastest = p.schedule.name in finals and not any(
            fits(book, problem.cost, plan, Pipeline(p.batch, p.stages, capped(book, problem.cost, plan, p, r)))
            for r in faster)
        assert fastest or p.schedule.name in own
        # every final option priced (DualPipeV needs M >= 2P), but one whose lower bound under its
        # own placement leaves no room to beat the pipeline's time (Chimera's two copies a rank)
        n = p.n_micro_batches(plan.train.micro_batch)
        skipped = {name for name in finals - set(tried) if not worth_pricing(book.bound(
            refs[name], *problem.cost.pipeline_pieces(plan, Pipeline(p.batch, p.stages, refs[name])), n),
            min(tried.values()))}
        assert set(tried) | skipped >= finals - {"dualpipe_v"}
        if p.schedule.name == "synth":  # built under the pipeline's own per-rank memory caps, as it
            # stood before synth chose its layout (under one of the schedules it records; a V layout
            # then moves the head to rank 0; the plan's fit check, est.fits above, holds the result)
            stood = [replace(plan, pipelines=plan.pipelines[:i] + (Pipeline(p.batch, p.stages, refs[name]),)
                             + plan.pipelines[i + 1:]) for name in tried if name != "synth"]
            assert any(list(p.schedule["memory"]) == list(memory_caps(problem.cost, s, s.pipelines[i]))
                       for s in stood)
        assert rebuilt_time(plan, p, problem.cost) == pytest.approx(tried[p.schedule.name], abs=1e-6)
    assert any(p.schedule.name in finals for p in plan.pipelines)
    again = evaluate(Plan.from_dict(json.loads(json.dumps(plan.to_dict()))), problem.cost.__class__(),
                     registry=Registry.default())[1]
    assert again.iteration_s == pytest.approx(est.iteration_s, abs=1e-9)


def test_memory_caps_are_the_largest_that_fit():
    plan, problem = solve(["schedule=auto", "schedule.final_options=[]"])
    cost, c, m, t = problem.cost, plan.cluster, plan.model, plan.train
    for pipe in plan.pipelines:
        n, last = pipe.n_micro_batches(t.micro_batch), len(pipe.stages) - 1
        for j, (s, cap) in enumerate(zip(pipe.stages, memory_caps(cost, plan, pipe))):
            def gb(x):
                return cost.stage_memory_gb(c, m, t, s.devices, s.n_layers, first=j == 0, last=j == last,
                                            in_flight=x, dp=len(plan.pipelines))
            limit = min(c.device(d).memory_gb for d in s.devices)
            assert gb(cap) <= limit and (cap >= n or gb(cap + 0.5) > limit)


def test_synth_plan_evaluates_to_the_printed_time(tmp_path, capsys):
    out, ev = tmp_path / "p.json", tmp_path / "e.json"
    assert run_cli(["plan", "schedule=synth", "solver.iterations=3", "solver.seeds=[]", "solver.use_all_devices=true",
                    f"out={out}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    sections = [p["schedule"] for p in data["pipelines"]]
    assert all(s["name"] == "synth" and "stage_times" in s and "hop_times" in s for s in sections)
    assert run_cli(["evaluate", f"plan_file={out}", f"out={ev}", f"hydra.run.dir={tmp_path / 'run2'}"]) == 0
    assert abs(json.loads(ev.read_text())["estimate"]["iteration_s"] - data["estimate"]["iteration_s"]) <= 1e-9
    plan = Plan.from_dict(data)
    problem = build_problem(config_from_overrides(["schedule=synth"]), Registry.default())
    for p, secs in zip(plan.pipelines, data["estimate"]["pipeline_s"]):
        assert rebuilt_time(plan, p, problem.cost) == pytest.approx(secs, abs=1e-9)


def test_bounds_hold_under_each_schedules_own_placement():
    """The bound the final pricing skips a schedule by (``ScheduleBook.bound`` of the stage times
    under that schedule's own placement) never exceeds its exactly resolved time, for every
    installed schedule on each pipeline of a heterogeneous plan — synth's included, whose bound
    is read on its unresolved (plain) placement and must hold for the V layout it may choose,
    which moves the head to rank 0."""
    from hexicore.planner.pricing import resolve_placed

    plan, problem = solve(["cluster=hetero1", "model=llama2_7b", "train.global_batch=48", "schedule=auto",
                           "train.zero=1", "schedule.final_options=[]"])
    cost, book = problem.cost, problem.pricing
    fast = {"synth": {"effort": "quick"}, "hanayo": {"waves": "auto", "max_waves": 3}}
    for pipe in {p.stages: p for p in plan.pipelines}.values():
        n = pipe.n_micro_batches(plan.train.micro_batch)
        for name in Registry.default().names("schedule"):
            ref = ScheduleRef(name, fast.get(name, {}))
            if not book.runs(ref, len(pipe.stages), n):
                continue
            mine = Pipeline(pipe.batch, pipe.stages, capped(book, cost, plan, pipe, ref))
            _, secs = resolve_placed(book, cost, plan, mine)
            assert book.bound(ref, *cost.pipeline_pieces(plan, mine), n) <= secs * (1 + 1e-9), name


def test_each_final_candidate_gets_the_final_options_right_after_its_exact_price(monkeypatch):
    """Depth first: ``finalize`` gives a candidate the final options right after pricing it
    exactly, in the search's order, while the budget allows (none begun that the longest so far
    would carry past it). With a budget for four steps of one second, the first two candidates
    get them; pricing all six first (as before) left none the time (on 24 GPUs of three types,
    GPT-Neo, the second candidate wins under ZB-H2: 5.426 s against 5.449)."""
    import types
    from collections import namedtuple

    from hexicore.planner.search import loop

    Train = namedtuple("Train", "zero_stage")  # hashable, as the training settings are
    now, tried = [0.0], []

    def step(result):
        now[0] += 1.0
        return result

    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(loop, "choose_exact", lambda book, cost, plan, options, deadline: step((plan, [])))
    monkeypatch.setattr(loop, "reschedule", lambda problem, plan, **_: step(tried.append(plan.name) or plan))
    context = types.SimpleNamespace(book=object(), auto=True, options=(), problem=None, exact_cost=types.SimpleNamespace(
        estimate=lambda plan: types.SimpleNamespace(fits=True, iteration_s=plan.seconds, pipeline_s=(plan.seconds,))))
    setting = types.SimpleNamespace(problem=types.SimpleNamespace(train=Train(zero_stage=0)))
    context.contexts = lambda: (setting,)  # one training setting: no other ZeRO stage to try

    def candidate(name, seconds):
        pipe = types.SimpleNamespace(batch=1, stages=(name,), schedule=ScheduleRef.from_mapping({"name": "1f1b"}))
        return types.SimpleNamespace(origin=name, plan=types.SimpleNamespace(
            name=name, seconds=seconds, pipelines=(pipe,), train=Train(zero_stage=0), solver={}))

    cands = [candidate(f"c{i}", 10.0 + i) for i in range(6)]
    # no synthesis among the options
    monkeypatch.setattr(loop, "costly_final_s", lambda problem, plan, within=float("inf"): 0.0)
    plan, info = loop.finalize(context, cands, deadline=4.5)
    assert tried == ["c0", "c1"] and plan.name == "c0" and info["origin"] == "c0"
    # the best so far's synthesis needs 2 s of the 2.5 left after its own options: the runner-up gets none
    now[0], tried[:] = 0.0, []
    monkeypatch.setattr(loop, "costly_final_s", lambda problem, plan, within=float("inf"): 2.0)
    plan, info = loop.finalize(context, cands, deadline=4.5)
    assert tried == ["c0"] and plan.name == "c0"


def test_past_the_budget_the_polished_candidates_are_priced_and_no_runner_up(monkeypatch):
    """Anytime: once a priced candidate fits and the budget is spent, ``finalize`` prices no
    further runner-up, but the first ``always`` candidates (the search's polished ones) are priced
    whatever the time (on 32 GPUs of four types at batch 4096 the runners-up took the search from
    4.7 to 5.4 s of a 4.5 s budget; the third polished one, 224.93 s, beat the first two)."""
    import types
    from collections import namedtuple

    from hexicore.planner.search import loop

    Train = namedtuple("Train", "zero_stage")
    now, priced = [0.0], []

    def price(plan):
        now[0] += 1.0
        priced.append(plan.name)
        return plan, []

    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(loop, "choose_exact", lambda book, cost, plan, options, deadline: price(plan))
    context = types.SimpleNamespace(book=object(), auto=False, options=(), problem=None, exact_cost=types.SimpleNamespace(
        estimate=lambda plan: types.SimpleNamespace(fits=True, iteration_s=plan.seconds, pipeline_s=(plan.seconds,))))
    monkeypatch.setattr(loop, "resolve_plan", lambda book, cost, plan: price(plan)[0])

    def candidate(name, seconds):
        pipe = types.SimpleNamespace(batch=1, stages=(name,), schedule=ScheduleRef.from_mapping({"name": "1f1b"}))
        return types.SimpleNamespace(origin=name, plan=types.SimpleNamespace(
            name=name, seconds=seconds, pipelines=(pipe,), train=Train(zero_stage=0), solver={}))

    cands = [candidate("c0", 12.0), candidate("c1", 11.0), candidate("c2", 10.0), candidate("c3", 9.0)]
    plan, _ = loop.finalize(context, cands, deadline=0.5, always=3)
    assert priced == ["c0", "c1", "c2"] and plan.name == "c2"
    now[0], priced[:] = 0.0, []
    plan, _ = loop.finalize(context, cands, deadline=10.0, always=3)  # in time: the runner-up too
    assert priced == ["c0", "c1", "c2", "c3"] and plan.name == "c3"


def test_a_final_option_held_back_by_memory_is_tried_under_the_next_zero_stage(monkeypatch):
    """``train.zero=auto``: where a final option priced faster for a pipeline was not taken (it did
    not fit: DualPipe-V keeps the embedding and the head on one device), the same layout is
    re-chosen under the next ZeRO stage the search allows, and kept where the whole plan is then
    faster (hetero3, Llama 30B, every option on: ZeRO-1 and ZB-H1 20.18 s, ZeRO-2 and DualPipe-V
    19.72 s). Nothing held back: no second try; a stage the settings do not allow: none."""
    import types
    from dataclasses import dataclass, field, replace as swap

    from hexicore.planner.search import loop

    @dataclass(frozen=True)
    class Train:
        zero: int

        @property
        def zero_stage(self) -> int:
            return self.zero

    @dataclass(frozen=True)
    class FakePlan:
        seconds: float
        train: Train
        pipelines: tuple = ("p",)
        solver: dict = field(default_factory=dict)

        def with_solver(self, info):
            return swap(self, solver=info)

    tried = []

    def reschedule(problem, plan, **_):  # DualPipe-V (9 s) fits only under ZeRO-2; ZB-H1 is 10 s
        tried.append(plan.train.zero)
        held = {"dualpipe_v": 9.0}
        return swap(plan, seconds=9.5 if plan.train.zero == 2 else plan.seconds, pipelines=("v",) if plan.train.zero == 2
                    else plan.pipelines, solver={"schedule_s": [held]})

    monkeypatch.setattr(loop, "reschedule", reschedule)

    def context(*zeros):
        settings = tuple(types.SimpleNamespace(problem=types.SimpleNamespace(train=Train(z))) for z in zeros)
        return types.SimpleNamespace(problem=None, book=None, contexts=lambda: settings, exact_cost=types.SimpleNamespace(
            estimate=lambda plan: types.SimpleNamespace(fits=True, iteration_s=plan.seconds,
                                                        pipeline_s=(9.0 if "v" in plan.pipelines else 10.0,))))

    plan = FakePlan(10.2, Train(1))
    got = loop.with_final_options(context(0, 1, 2), (10.2, 0, plan, "origin", None), deadline=float("inf"))
    assert tried == [1, 2] and got[0] == 9.5 and got[2].train.zero == 2 and got[2].pipelines == ("v",)
    tried.clear()
    got = loop.with_final_options(context(0, 1), (10.2, 0, plan, "origin", None), deadline=float("inf"))
    assert tried == [1] and got[2] is plan  # ZeRO-2 not among the settings
    monkeypatch.setattr(loop, "reschedule", lambda problem, plan, **_: tried.append(plan.train.zero) or swap(
        plan, solver={"schedule_s": [{"dualpipe_v": 10.5}]}))  # nothing faster held back
    tried.clear()
    loop.with_final_options(context(0, 1, 2), (10.2, 0, plan, "origin", None), deadline=float("inf"))
    assert tried == [1]
