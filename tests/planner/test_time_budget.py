"""The anytime search: ``solver.time_budget`` stops a solve in time with the best plan found,
its FLOPs lower bound beside it; the budget rule by cluster size."""

import time

import pytest

from hexicore.app.compose import config_from_overrides, solve
from hexicore.core.errors import HexicoreError
from hexicore.planner.search.search_config import SearchConfig
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.registry import Registry


def test_the_automatic_budget_follows_the_cluster_size_targets():
    config = SearchConfig()
    assert config.budget(4) == config.budget(8) == 0.9 and config.budget(16) == config.budget(32) == 4.5
    assert config.budget(64) == 7.0 and config.budget(320) == 7.5 and config.budget(1024) == config.budget(4096) == 25.0
    assert config.budget(24) == 4.5 and config.budget(12) == pytest.approx(2.7) and config.budget(48) == 5.75
    assert config.budget(672) == pytest.approx(16.25)  # halfway from 320 to 1024
    sizes = range(1, 2000, 7)
    assert all(config.budget(a) <= config.budget(b) for a, b in zip(sizes, sizes[1:]))  # never less for more
    assert SearchConfig(time_budget=None).budget(1024) is None and SearchConfig(time_budget=2).budget(8) == 2.0
    for bad in (0, -1, "soon", True):
        with pytest.raises(HexicoreError) as e:
            SearchConfig(time_budget=bad)
        assert e.value.field == "solver.time_budget"


def test_a_short_budget_returns_a_plan_in_time_with_its_bound():
    """A 64-GPU cluster whose full search takes several seconds: with a one-second budget the
    solve returns within a few seconds more (the exact pricing of the plan found), and the plan
    fits, with a FLOPs bound below its time."""
    over = ["cluster=synthetic", "cluster.synthetic.gpus=64", "cluster.synthetic.per_machine=8", "model=llama2_7b",
            "train.global_batch=64", "solver.time_budget=1"]
    t0 = time.monotonic()
    plan, _ = solve(config_from_overrides(over), Registry.default())
    took = time.monotonic() - t0
    assert plan.estimate.fits and took < 15.0
    assert 0 < plan.solver["bound"] < plan.estimate.iteration_s


def test_free_parameters_are_chosen_on_a_few_periods_with_the_remainder_kept():
    """``ScheduleBook.choosing_micro_batches``: M itself up to four periods (P, or the fewest
    micro-batches the schedule runs with), above that M less whole periods — same remainder,
    never more than four periods — so choosing Hanayo's W costs the same at M = 4096 as at 4P."""
    from hexicore.planner.pricing import CHOOSE_PERIODS, ScheduleBook

    book = ScheduleBook(Registry.default())
    for ref, ranks, period in (({"name": "hanayo", "waves": "auto"}, 4, 4), ({"name": "dualpipe_v"}, 3, 6)):
        for n in range(1, 300):
            rep = book.choosing_micro_batches(ref, ranks, n)
            if n <= CHOOSE_PERIODS * period:
                assert rep == n
            else:
                assert rep % period == n % period and (CHOOSE_PERIODS - 1) * period < rep <= CHOOSE_PERIODS * period


def test_coarse_to_fine_covers_the_range_at_every_prefix():
    """The side sweep's order: every value once; the ends first; after 2 + (2^k - 1) values no
    gap between neighbours is wider than (the span) / 2^k, rounded up."""
    from hexicore.planner.search.loop import coarse_to_fine

    assert coarse_to_fine([]) == [] and coarse_to_fine([5]) == [5] and coarse_to_fine([3, 4]) == [3, 4]
    assert coarse_to_fine(list(range(1, 10))) == [1, 9, 5, 3, 7, 2, 4, 6, 8]
    for lo, hi in ((1, 2), (2, 17), (6, 40), (1, 1024)):
        values = list(range(lo, hi + 1))
        order = coarse_to_fine(values)
        assert sorted(order) == values and order[:2] == [lo, hi]
        for k in range(1, 6):
            seen = sorted(order[:min(len(order), 2 + 2 ** k - 1)])
            assert max(b - a for a, b in zip(seen, seen[1:])) <= -(-(hi - lo) // 2 ** k)


def test_the_throughput_bound_is_the_bubble_free_split_of_the_batch():
    """``M / sum_i 1 / max_j STAGE_ij``: pipelines whose slowest stages take 2 s and 4 s pass
    0.5 + 0.25 micro-batches a second, so 30 micro-batches take 40 s at least; a 1F1B
    pipeline's modelled time is never below its share."""
    from hexicore.planner.search.candidate import throughput_bound
    from hexicore.planner.stage_layout.stage_table import StageLayout

    fast = StageLayout((("a",), ("b",)), (3, 1), (1.0, 2.0), (0.1,))
    slow = StageLayout((("c",),), (4,), (4.0,), ())
    assert throughput_bound([fast, slow], 30) == pytest.approx(40.0)
    assert throughput_bound([fast], 30) == pytest.approx(60.0)
    fill, step = fast.fill_step()  # App. A: 1F1B's time at n micro-batches is fill + (n - 1) step
    assert all(fill + (n - 1) * step >= throughput_bound([fast], n) for n in range(1, 100))


def paper_pipeline():
    """The paper case's plan under ``schedule=auto`` (a short search, no budget) with what the
    final re-pricing reads of its first pipeline (unpolished: its first layout leaves synth room to gain): ``(problem, plan, cost, book, pipeline,
    stage_s, hop_s, n)``."""
    from hexicore.app.compose import build_problem
    from hexicore.planner.final_schedules import _pricing

    registry = Registry.default()
    problem = build_problem(config_from_overrides(["cluster=paper_case", "model=llama2_13b", "train.global_batch=20",
                                                   "schedule=auto"]), registry)
    plan = registry.create("solver", "hexiscale", iterations=2, polish_rounds=0, time_budget=None,
                           use_all_devices=True).solve(problem, seed=0)
    cost, book = _pricing(problem)
    pipe = plan.pipelines[0]
    stage_s, hop_s = cost.pipeline_pieces(plan, pipe)
    return problem, plan, cost, book, pipe, stage_s, hop_s, pipe.n_micro_batches(plan.train.micro_batch)


def test_a_synthesis_that_would_end_past_the_budget_is_not_begun(monkeypatch):
    """``Pricing.simulations`` (synth: 200 at ``effort: quick``, the final options' own): with one
    simulation of the pipeline taking 1 s (as if measured) and 60 s left, the final re-pricing
    tries every named final option but not synth; without a budget synth is tried too."""
    from hexicore.planner import final_schedules
    from hexicore.planner.final_schedules import _choose, final_options

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    refs = final_options(problem.schedule)
    assert [r.get("effort") for r in refs if r.name == "synth"] == ["quick"]
    _, free, _ = _choose(book, cost, plan, pipe, refs, stage_s, hop_s, n)
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 1.0)
    _, tight, slowest = _choose(book, cost, plan, pipe, refs, stage_s, hop_s, n, time.monotonic() + 60.0, 1.0)
    assert "synth" in free and "synth" not in tight and set(tight) == set(free) - {"synth"} and slowest >= 1.0


def test_a_synthesis_declares_the_simulations_its_effort_makes(monkeypatch):
    """A quick synthesis simulates fewer orders than a full one, and says so: with one
    simulation taking 1 s (as if measured) and 300 s left, the quick one (200) is begun and
    the full one (900) is not."""
    from hexicore.planner import final_schedules
    from hexicore.planner.final_schedules import _choose

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    quick, full = ScheduleRef("synth", {"effort": "quick"}), ScheduleRef("synth")
    assert book.schedule(quick).pricing.simulations == 200 and book.schedule(full).pricing.simulations == 900
    assert book.schedule(full).pricing.memory_cap
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 1.0)
    for ref, begun in ((quick, True), (full, False)):
        _, seen, _ = _choose(book, cost, plan, pipe, (ref,), stage_s, hop_s, n, time.monotonic() + 300.0, 1.0)
        assert ("synth" in seen) == begun


def test_the_synthesis_gate_times_a_fresh_simulation_where_prices_were_cached(monkeypatch):
    """The pipeline's own price was cached by the search (it takes no time now), so before a
    costly option the gate times one simulation afresh (:func:`fresh_simulation_s`): made to
    take 1 s here, synth (200 of them) is not begun with 60 s left, and that second is reported
    as the slowest simulation; the fresh simulation is a real, timed one."""
    from hexicore.planner import final_schedules
    from hexicore.planner.final_schedules import _choose, final_options, fresh_simulation_s

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    assert fresh_simulation_s(book, pipe.schedule, stage_s, hop_s, n) > 0.0
    book.exact(pipe.schedule, stage_s, hop_s, n)  # cached from here on
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 1.0)
    _, tight, slowest = _choose(book, cost, plan, pipe, final_options(problem.schedule), stage_s, hop_s, n,
                                time.monotonic() + 60.0, 0.0)
    assert "synth" not in tight and slowest == 1.0


def test_a_share_of_the_budget_is_kept_for_the_exact_pricing(monkeypatch):
    """Under ``solver.time_budget`` the searches get ``1 - FINAL_SHARE`` of it; their exact
    pricing (and the final options after them) run to the whole budget. A schedule whose time is
    the cost model's own formula (1F1B) has nothing to price after the search: the searches get
    the whole budget."""
    from hexicore.planner import hexiscale
    from hexicore.planner.hexiscale import FINAL_SHARE

    asked = []
    real = hexiscale.search

    def recorded(problem, config, **kwargs):
        asked.append((kwargs["time_limit"], kwargs["prices_until"] - time.monotonic()))
        return real(problem, config, **kwargs)

    monkeypatch.setattr(hexiscale, "search", recorded)
    over = ["cluster=paper_case", "model=llama2_13b", "train.global_batch=20", "solver.time_budget=40"]
    assert 0 < FINAL_SHARE < 1
    for schedule, kept in (("zb_h1", FINAL_SHARE), ("1f1b", 0.0)):
        asked.clear()
        solve(config_from_overrides(over + [f"schedule={schedule}"]), Registry.default())
        limit, pricing = asked[0]  # the whole cluster's search, begun at once
        assert limit == pytest.approx(40 * (1 - kept), abs=1.0) and pricing == pytest.approx(40, abs=1.0)
        assert all(lim <= 40 * (1 - kept) + 1e-9 for lim, _ in asked)


def test_a_synthesis_built_for_the_same_times_and_cap_is_tried_past_the_deadline():
    """The plan's pipelines share a synthesis where their times and caps are the same (the
    schedule caches its lists per times): once built for one pipeline it costs nothing, so the
    next pipeline tries it even past the deadline; a synthesis never built is not begun then."""
    from hexicore.planner.final_schedules import _choose

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    quick = (ScheduleRef("synth", {"effort": "quick"}),)
    built: set = set()
    _, first, _ = _choose(book, cost, plan, pipe, quick, stage_s, hop_s, n, None, 0.0, built)
    assert "synth" in first and len(built) == 1
    past = time.monotonic() - 1.0
    _, again, _ = _choose(book, cost, plan, pipe, quick, stage_s, hop_s, n, past, 1.0, built)
    _, never, _ = _choose(book, cost, plan, pipe, quick, stage_s, hop_s, n, past, 1.0, set())
    assert again == first and "synth" not in never


def test_the_exact_pricing_keeps_the_winners_synthesis_time_where_it_fits(monkeypatch):
    """``finalize`` ends the runners-up's final options where the best so far's synthesis needs
    the rest of the budget (:func:`synthesis_reserve`): its estimate where it fits the time left,
    else nothing (it would not begin), and nothing without a budget."""
    from hexicore.planner.search import loop
    from hexicore.planner.final_schedules import costly_final_s

    problem, plan, *_ = paper_pipeline()
    assert costly_final_s(problem, plan) > 0.0  # (synth is among the final options)
    context = type("Context", (), {"problem": problem})()
    monkeypatch.setattr(loop, "costly_final_s", lambda problem, plan, within=float("inf"): 0.5)
    assert loop.synthesis_reserve(context, plan, time.monotonic() + 2.0) == 0.5
    assert loop.synthesis_reserve(context, plan, time.monotonic() + 0.3) == 0.0
    assert loop.synthesis_reserve(context, plan, float("inf")) == 0.0


def test_hanayo_declares_the_simulations_its_waves_make(monkeypatch):
    """Hanayo builds a greedy, double-justified order per W (every W up to ``max_waves`` under
    ``waves=auto``): about 12 simulations of the pipeline a wave, declared so, so that under a
    budget it is begun only with that time left (it was declared one simulation, and on 32 GPUs
    of four types its orders took 0.45 s of a 4.5 s budget, the runners-up's final options'
    time, which DualPipe-V's price on the best layout needed)."""
    from hexicore.planner import final_schedules
    from hexicore.planner.final_schedules import _choose

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 1.0)
    auto, two = ScheduleRef("hanayo", {"waves": "auto", "max_waves": 4}), ScheduleRef("hanayo", {"waves": 2})
    assert book.schedule(auto).pricing.simulations == 48 and book.schedule(two).pricing.simulations == 24
    for left, begun in ((60.0, True), (30.0, False)):
        _, seen, _ = _choose(book, cost, plan, pipe, (auto,), stage_s, hop_s, n, time.monotonic() + left, 1.0)
        assert ("hanayo" in seen) == begun


def test_the_costly_final_options_estimate_keeps_those_that_fit(monkeypatch):
    """``costly_final_s``: per costly option (twice its declared simulations, resolved again under
    its own placement) times one simulation of each pipeline shape, the options in their listed
    order, one that would not end within the time given left out as ``_choose`` leaves it out
    (so synth, listed first, is kept for the winner before Hanayo)."""
    from hexicore.planner import final_schedules

    problem, plan, *_ = paper_pipeline()
    names = [r.name for r in final_schedules.final_options(problem.schedule)]
    assert names.index("synth") < names.index("hanayo")
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 0.01)  # one shape: 10 ms
    ones = 0.01 * (len(names) - 2)  # the one-simulation options
    assert final_schedules.costly_final_s(problem, plan) == pytest.approx(ones + 4.0 + 0.96)
    assert final_schedules.costly_final_s(problem, plan, 4.5) == pytest.approx(ones + 4.0)  # Hanayo left out
    assert final_schedules.costly_final_s(problem, plan, 1.5) == pytest.approx(ones + 0.96)  # synth left out


def test_a_costly_options_gate_counts_simulations_of_the_pipelines_own_schedule(monkeypatch):
    """``Pricing.simulations`` were measured against one simulation of the pipeline's own
    schedule, and :func:`costly_final_s` reserves by it: the gate of a costly option multiplies
    that (timed afresh), not the slowest one-simulation option seen before it (DualPipe-V's greedy
    build is 2-3 of them, and a synthesis reserved for was then not begun). Here the earlier
    options count 1 s a simulation and a fresh one 0.1 s: with 30 s left synth (200) is begun."""
    from hexicore.planner import final_schedules
    from hexicore.planner.final_schedules import _choose, final_options

    problem, plan, cost, book, pipe, stage_s, hop_s, n = paper_pipeline()
    monkeypatch.setattr(final_schedules, "fresh_simulation_s", lambda *args: 0.1)
    synth = tuple(r for r in final_options(problem.schedule) if r.name == "synth")
    _, seen, slowest = _choose(book, cost, plan, pipe, synth, stage_s, hop_s, n, time.monotonic() + 30.0, 1.0)
    assert "synth" in seen and slowest == 1.0
    _, seen, _ = _choose(book, cost, plan, pipe, synth, stage_s, hop_s, n, time.monotonic() + 15.0, 1.0)
    assert "synth" not in seen  # 200 x 0.1 s would end past 15 s
