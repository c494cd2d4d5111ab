"""The HexiScale search: exact layer/batch allocation, the solver end to end (§4)."""

import itertools
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.planner.stage_layout.batch import affine_time, allocate_batch
from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.planner.stage_layout.layers import allocate_layers
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.planner.problem import Problem
from hexicore.registry import Registry
from hexicore.planner.stage_layout.tp_menus import tp_menus
from hexicore.planner.plan_check import validate_plan

from tests.conftest import CONF
from tests.conftest import run_cli

FAST = {"iterations": 12, "polish_rounds": 3, "time_budget": None}


def compositions(total, parts):
    for cut in itertools.combinations(range(1, total), parts - 1):
        b = (0,) + cut + (total,)
        yield tuple(b[i + 1] - b[i] for i in range(parts))


# ---------------------------------------------------------------- layer allocation
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.data())
def test_layer_allocation_is_exact(p, extra, data):
    L = p + extra - 1 if p + extra - 1 >= p else p
    rows = []
    for _ in range(p):
        a = data.draw(st.floats(0.1, 5.0))
        b = data.draw(st.floats(0.0, 3.0))
        rows.append([b + a * l for l in range(L + 1)])
    caps = [data.draw(st.integers(0, L)) for _ in range(p)]
    got = allocate_layers(rows, caps, L)
    feasible = [c for c in compositions(L, p) if all(x <= cap for x, cap in zip(c, caps))]
    if not feasible:
        assert got is None
        return
    assert got is not None and sum(got) == L and all(1 <= x <= c for x, c in zip(got, caps))
    best = min(max(rows[j][c[j]] for j in range(p)) for c in feasible)
    assert max(rows[j][got[j]] for j in range(p)) == pytest.approx(best)
    ties = [c for c in feasible if max(rows[j][c[j]] for j in range(p)) <= best + 1e-12]
    assert sum(rows[j][got[j]] for j in range(p)) == pytest.approx(min(sum(rows[j][c[j]] for j in range(p))
                                                                      for c in ties))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 12), st.data())
def test_layer_allocation_with_a_least_per_stage_is_exact(p, L, data):
    """With ``least`` (a schedule's chunks per rank) the allocation is the exact min-max among
    allocations giving stage j at least ``least_j`` layers (brute force)."""
    rows = []
    for _ in range(p):
        a, b = data.draw(st.floats(0.1, 5.0)), data.draw(st.floats(0.0, 3.0))
        rows.append([b + a * l for l in range(L + 1)])
    caps = [data.draw(st.integers(0, L)) for _ in range(p)]
    least = [data.draw(st.integers(1, 4)) for _ in range(p)]
    got = allocate_layers(rows, caps, L, least)
    feasible = [c for c in compositions(L, p) if L >= p and all(k <= x <= cap for x, cap, k in zip(c, caps, least))]
    if not feasible:
        assert got is None
        return
    assert got is not None and sum(got) == L and all(k <= x <= c for x, c, k in zip(got, caps, least))
    best = min(max(rows[j][c[j]] for j in range(p)) for c in feasible)
    assert max(rows[j][got[j]] for j in range(p)) == pytest.approx(best)


def test_layer_allocation_follows_speed():
    # stage 0 twice as fast as stage 1, 30 layers: 20 / 10
    rows = [[l * 1.0 for l in range(31)], [l * 2.0 for l in range(31)]]
    assert allocate_layers(rows, [30, 30], 30) == (20, 10)
    assert allocate_layers(rows, [15, 30], 30) == (15, 15)  # memory caps stage 0
    assert allocate_layers(rows, [10, 10], 30) is None


# ---------------------------------------------------------------- batch allocation
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 3.0)), min_size=1, max_size=3), st.integers(1, 10))
def test_batch_allocation_is_exact(pipes, m):
    fns = [affine_time(f, s) for f, s in pipes]
    got = allocate_batch(fns, m)
    if m < len(pipes):
        assert got is None
        return
    best = min(max(fns[i](c[i]) for i in range(len(pipes))) for c in compositions(m, len(pipes)))
    assert sum(got) == m and min(got) >= 1
    assert max(fns[i](got[i]) for i in range(len(pipes))) == pytest.approx(best)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 3.0), st.integers(1, 4)), min_size=1, max_size=3),
       st.integers(1, 10))
def test_batch_allocation_with_minimums_is_exact(pipes, m):
    """Each pipeline gets at least its schedule's minimum (DualPipeV: 2 per rank), else None."""
    fns, least = [affine_time(f, s) for f, s, _ in pipes], [lo for _, _, lo in pipes]
    got = allocate_batch(fns, m, least)
    if m < sum(least):
        assert got is None
        return
    ok = [c for c in compositions(m, len(pipes)) if all(x >= lo for x, lo in zip(c, least))]
    best = min(max(fns[i](c[i]) for i in range(len(pipes))) for c in ok)
    assert sum(got) == m and all(x >= lo for x, lo in zip(got, least))
    assert max(fns[i](got[i]) for i in range(len(pipes))) == pytest.approx(best)


def _greedy(times, m, least):
    """Water-filling one micro-batch at a time (the module docstring's greedy, as it was written)."""
    import heapq

    counts = list(least)
    heap = [(times[i](counts[i] + 1), i) for i in range(len(times))]
    heapq.heapify(heap)
    for _ in range(m - sum(counts)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (times[i](counts[i] + 1), i))
    return tuple(counts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["affine", "steady", "blocks", "rounded"]), st.floats(0.0, 5.0),
                          st.sampled_from([0.0, 0.01, 0.5, 1.0, 2.5]), st.integers(1, 8), st.integers(1, 3)),
                min_size=1, max_size=6), st.integers(1, 3000))
@example([("affine", 2.0, 0.0, 1, 1), ("steady", 1.1125369292536007e-308, 0.0, 3, 1)], 5)  # a slope's quotient
def test_batch_allocation_is_the_greedy_selection_at_any_batch(pipes, m):  # overflowed: OverflowError
    """The allocation that does not walk every micro-batch hands out exactly what greedy
    water-filling does (ties included: affine, exact-then-steady, blocks of P and rounded
    times), up to thousands of micro-batches."""
    import math

    shapes = {"affine": lambda a, s, p: lambda n: a + (n - 1) * s,
              "steady": lambda a, s, p: lambda n: a * n if n <= p else a * p + (n - p) * s,
              "blocks": lambda a, s, p: lambda n: (a + s) * math.ceil(n / p),
              "rounded": lambda a, s, p: lambda n: round(a + (n - 1) * s, 1)}
    fns = [shapes[kind](a, s, p) for kind, a, s, p, _ in pipes]
    least = [lo for *_, lo in pipes]
    if m < sum(least):
        assert allocate_batch(fns, m, least) is None
        return
    assert allocate_batch(fns, m, least) == _greedy(fns, m, least)


def test_tp_menus():
    menus = tp_menus(8, (1, 2, 4, 8))
    assert menus[0] == (8,) and (4, 4) in menus and (4, 2, 2) in menus and (1,) * 8 in menus
    assert all(sum(m) == 8 for m in menus)
    assert tp_menus(3, (1, 2)) == ((1, 1, 1), (2, 1))


def _all_splits(n, degrees):
    """Every non-increasing split of ``n`` into ``degrees``, by brute force (small ``n`` only)."""
    if n == 0:
        return [()]
    return [(d,) + rest for d in degrees if d <= n for rest in _all_splits(n - d, degrees) if not rest or rest[0] <= d]


@pytest.mark.parametrize("degrees", [(1, 2), (1, 2, 4, 8), (1, 2, 4, 5, 8), (1, 3, 6), tuple(range(1, 9))])
def test_tp_menus_are_the_first_splits_in_menu_order(degrees):
    for n in range(1, 19):
        ds = tuple(d for d in degrees if d <= n)
        every = sorted(_all_splits(n, ds), key=lambda s: (len(set(s)), -max(s), s))
        assert tp_menus(n, ds) == tuple(every[:16]), n
        assert tp_menus(n, ds, 3) == tuple(every[:3]), n


def test_tp_menus_of_a_machine_at_the_gpu_limit():
    """One machine of 4,096 GPUs (the documented limit) is cut without recursing per GPU or
    spelling out its hundreds of millions of splits."""
    menus = tp_menus(4096, (1, 2, 4, 8))
    assert menus[:4] == ((8,) * 512, (4,) * 1024, (2,) * 2048, (1,) * 4096)
    assert len(menus) == 16 and all(sum(m) == 4096 for m in menus)
    assert menus[4] == (8,) + (1,) * 4088  # then two degrees, the top one 8: in tuple order


# ------------------------------------------------------------------- the solver
def solve(problem, seed=0, **params):
    return Registry.default().create("solver", "hexiscale", **{**FAST, **params}).solve(
        problem, time_limit=None, seed=seed, progress=lambda m, f: None)


@pytest.fixture(scope="module")
def paper_problem():
    return build_problem(config_from_overrides(["cost.state_bytes_per_param=8"]), Registry.default())  # the paper's state size


def test_paper_case_beats_megatron_by_1_5x(paper_problem):
    seen = []
    plan = Registry.default().create("solver", "hexiscale").solve(
        paper_problem, time_limit=None, seed=0, progress=lambda m, f: seen.append(f))
    est, _ = validate_plan(plan, paper_problem.cost)
    mega = paper_problem.evaluate(Registry.default().create("solver", "megatron").solve(paper_problem))
    assert est.fits and mega.iteration_s / est.iteration_s >= 1.5
    assert plan.solver["status"] == "HEURISTIC" and plan.solver["params"]["partitioner"] == "metis"
    assert seen and all(0.0 <= f <= 1.0 for f in seen) and seen[-1] == 1.0
    assert all(s.tp == 1 or len({paper_problem.cluster.device(d).machine for d in s.devices}) == 1
               for p in plan.pipelines for s in p.stages)  # hexiscale keeps TP inside a machine


def test_deterministic_for_a_seed(paper_problem):
    a, b = solve(paper_problem, seed=3), solve(paper_problem, seed=3)
    assert [p.to_dict() for p in a.pipelines] == [p.to_dict() for p in b.pipelines]


GPUS = ["rtx4090", "rtx3090", "a100-80g", "rtx3080ti", "v100-32g"]


@st.composite
def clusters(draw):
    machines = []
    for i in range(draw(st.integers(2, 6))):
        gpu = draw(st.sampled_from(GPUS))
        machines.append({"name": f"m{i}", "gpu": gpu, "count": draw(st.integers(1, 4)),
                         "bandwidth_gbs": draw(st.sampled_from([16.0, 32.0, 200.0])), "latency_us": 5})
    inter = draw(st.sampled_from([0.7, 1.0, 10.0]))
    return parse_cluster({"name": "h", "inter": {"bandwidth_gbs": inter, "latency_us": 50},
                          "machines": machines}, "hypothesis")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.sampled_from([8, 16]))
def test_never_worse_than_megatron_on_random_clusters(cluster, batch):
    reg = Registry.default()
    model = ModelSpec.load(CONF / "model" / "gpt3_1.3b.yaml")
    train = TrainSettings(global_batch=batch, micro_batch=1, seq_len=2048)
    problem = Problem(cluster, model, train, reg.create("cost_model", "analytic"), {"name": "1f1b"}, reg)
    plan = solve(problem)
    est, _ = validate_plan(plan, problem.cost)
    assert est.fits
    try:
        mega = reg.create("solver", "megatron").solve(problem)
    except HexicoreError:
        return
    assert est.iteration_s <= problem.evaluate(mega).iteration_s + 1e-9


@pytest.mark.parametrize("overrides", [["cluster=hetero1", "model=llama2_7b"], ["cluster=homo_a800_16", "model=llama2_7b"],
                                       ["cluster=synthetic", "cluster.synthetic.gpus=24", "cluster.synthetic.seed=5"]])
def test_never_worse_than_megatron_on_presets(overrides):
    reg = Registry.default()
    problem = build_problem(config_from_overrides(overrides), reg)
    plan = solve(problem, iterations=8)
    est, _ = validate_plan(plan, problem.cost)
    mega = problem.evaluate(reg.create("solver", "megatron").solve(problem))
    assert est.iteration_s <= mega.iteration_s + 1e-9


def test_bad_options(paper_problem):
    reg = Registry.default()
    for params in ({"tau": 0}, {"iterations": "many"}, {"max_balance": 0.5}, {"nonsense": 1},
                   {"seeds": "megatron"}):
        with pytest.raises(HexicoreError):
            reg.create("solver", "hexiscale", **params)
    with pytest.raises(HexicoreError, match="dp_max"):
        solve(paper_problem, dp_max=9)
    with pytest.raises(HexicoreError):
        reg.create("solver", "hexiscale").solve(paper_problem, time_limit=-1, seed=0, progress=lambda m, f: None)


def test_nothing_fits_names_the_memory():
    problem = build_problem(config_from_overrides(["model=llama2_70b"]), Registry.default())
    with pytest.raises(HexicoreError, match="GB"):
        solve(problem)


def test_time_limit_still_returns_a_plan(paper_problem):
    plan = Registry.default().create("solver", "hexiscale", iterations=10_000).solve(
        paper_problem, time_limit=0.5, seed=0, progress=lambda m, f: None)
    assert validate_plan(plan, paper_problem.cost)[0].fits


def test_random_partitioner_and_no_refiner_work(paper_problem):
    plan = solve(paper_problem, partitioner="random", refiner=None)
    assert validate_plan(plan, paper_problem.cost)[0].fits


def test_cli_writes_a_valid_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert run_cli(["plan", "solver=hexiscale", "solver.iterations=6", f"out={out}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    plan = Plan.load(out)
    assert json.loads(out.read_text())["solver"]["name"] == "hexiscale"
    problem = build_problem(config_from_overrides([]), Registry.default())
    assert validate_plan(plan, problem.cost)[0].fits


def test_cli_exit_2_on_impossible_options(tmp_path, capsys):
    assert run_cli(["plan", "solver=hexiscale", "solver.tau=0", f"out={tmp_path / 'x.json'}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    assert "tau" in capsys.readouterr().err
    assert run_cli(["plan", "solver=hexiscale", "model=llama2_70b", f"out={tmp_path / 'y.json'}",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "GB" in err and len(err.strip().splitlines()) == 1


def test_warm_start_after_a_failure(paper_problem):
    """exclude=[A.1] + warm_start: the previous plan (minus the lost device) seeds the search."""
    from dataclasses import replace

    before = solve(paper_problem)
    after = replace(paper_problem, cluster=paper_problem.cluster.exclude(["A.1"]), warm_start=before)
    plan = solve(after, seeds=[])
    est, _ = validate_plan(plan, after.cost)
    assert est.fits and "A.1" not in plan.devices


def test_the_pool_keeps_one_plan_per_layout_up_to_devices_swapped_inside_a_machine():
    """Devices of one machine share its GPU type and links, so two plans that differ only by
    which of them a stage uses price alike: the pool of the final pricing's runners-up
    (``SearchContext.keep``) keeps the better of the two, not both (on 24 GPUs of three types two
    of a setting's three kept plans were one layout); a stage moved to another machine is another
    layout."""
    import dataclasses
    import types

    from hexicore.planner.search.context import Candidate, SearchContext, layout_key

    d = {"name": "two", "inter": {"bandwidth_gbs": 10, "latency_us": 10},
         "machines": [{"name": m, "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 300, "latency_us": 5}
                      for m in ("A", "B")]}
    from hexicore.core.plan import Pipeline, Stage

    from tests.conftest import model_preset

    model = model_preset("tiny")
    train = TrainSettings(global_batch=8, micro_batch=1, seq_len=model.seq_len)
    stages = (Stage(("A.0",), 1, (0, 2)), Stage(("B.0",), 1, (2, model.layers)))
    plan = Plan(model, parse_cluster(d, "test"), train, (Pipeline(8, stages),))

    def moved(plan, device):
        first = dataclasses.replace(plan.pipelines[0].stages[0], devices=(device,))
        pipe = dataclasses.replace(plan.pipelines[0], stages=(first,) + plan.pipelines[0].stages[1:])
        return dataclasses.replace(plan, pipelines=(pipe,))

    swapped, elsewhere = moved(plan, "A.1"), moved(plan, "B.1")
    assert layout_key(swapped) == layout_key(plan) != layout_key(elsewhere)
    pool = types.SimpleNamespace(pool=[])
    for score, p in ((2.0, plan), (1.5, swapped), (3.0, elsewhere), (2.5, plan)):
        SearchContext.keep(pool, Candidate(score, p, None, "test"))
    assert [(c.score, c.plan) for c in pool.pool] == [(1.5, swapped), (3.0, elsewhere)]


def test_a_cut_that_fits_nowhere_gives_way_to_the_other(monkeypatch):
    """``two_phase`` takes the other cut where the chosen one's parts hold no layout that fits
    (the moving averages choose the cut by communication, not memory: on 32 GPUs of four types at
    batch 4096 the max-cut parts of 27-31 pipelines never fit under ZeRO-2, the min-cut ones of 28
    gave the best plan); not for the side sweep (it takes both cuts), nor past the deadline, nor
    again at a number of pipelines where neither cut fitted."""
    import types

    from hexicore.planner.search import candidate
    from hexicore.planner.search.context import INF, Candidate

    fitting = {"min_cut": 5.0, "max_cut": INF}
    calls = []

    def one_cut(context, d_dp, objective, k_shift, seed, side=False, deadline=INF):
        calls.append(objective)
        return Candidate(fitting[objective], None, None, f"search D_dp={d_dp} {objective}")

    monkeypatch.setattr(candidate, "one_cut", one_cut)
    context = types.SimpleNamespace(cut_misses=set())
    got = candidate.two_phase(context, 4, "max_cut", (0,), 0)
    assert got.score == 5.0 and calls == ["max_cut", "min_cut"]
    calls.clear()
    assert candidate.two_phase(context, 4, "min_cut", (0,), 0).score == 5.0 and calls == ["min_cut"]
    calls.clear()
    assert candidate.two_phase(context, 4, "max_cut", (0,), 0, side=True).score == INF
    assert candidate.two_phase(context, 4, "max_cut", (0,), 0, deadline=-1.0).score == INF
    assert calls == ["max_cut", "max_cut"]
    fitting["min_cut"] = INF  # neither fits: the chosen cut's candidate, and no second try there again
    calls.clear()
    assert candidate.two_phase(context, 6, "max_cut", (0,), 0).origin.endswith("max_cut")
    assert calls == ["max_cut", "min_cut"] and context.cut_misses == {6}
    calls.clear()
    assert candidate.two_phase(context, 6, "max_cut", (0,), 0).score == INF and calls == ["max_cut"]


def _focus(micro_batch, zero, best, choice):
    """A stand-in for an other training setting's context in the side walk."""
    import types

    from hexicore.planner.search.context import Candidate

    train = types.SimpleNamespace(micro_batch=micro_batch, zero_stage=zero)
    return types.SimpleNamespace(problem=types.SimpleNamespace(train=train), best_score=best, choice=choice,
                                 best_found=Candidate(best, None, None, "x", {"d_dp": 1}), name=f"z{zero}",
                                 config=types.SimpleNamespace(k_shifts=(-1, 0, 1)),
                                 choose_objective=lambda rng: rng.choice(("min_cut", "max_cut")))


def test_the_side_walk_steps_the_fastest_setting_first_and_lets_the_other_in_every_third_step(monkeypatch):
    """Best first: the focus whose plan is fastest takes the step, except that one the others
    have taken ``SIDE_LEAD_STEPS`` (2) steps past goes next; a step that finds a faster plan
    moves the lead; each focus draws from its own stream, so its steps do not depend on the
    draws the sweep or the other focus took."""
    import random
    import types

    from hexicore.planner.search import loop
    from hexicore.planner.search.context import Candidate

    a, b = _focus(1, 1, 30.0, 1), _focus(1, 2, 30.0, 2)
    found = {("z2", 3): 10.0}  # z2's third step finds the fastest plan
    taken = []

    def two_phase(focus, d_dp, objective, shifts, seed, deadline):
        taken.append((focus.name, d_dp, objective, seed))
        n = sum(1 for t in taken if t[0] == focus.name)
        focus.best_score = min(focus.best_score, found.get((focus.name, n), 25.0 if focus is a else 28.0))
        return Candidate(focus.best_score, None, None, "x")

    monkeypatch.setattr(loop, "two_phase", two_phase)
    monkeypatch.setattr(loop, "lead_pipeline_counts", lambda focus: [1, 2, 3])
    lead = types.SimpleNamespace(others=(a, b), config=types.SimpleNamespace(iterations=12),
                                 track_side=lambda cands: None)

    def walked(rng_draws: int) -> list:
        taken.clear()
        a.best_score = b.best_score = 30.0
        rng = random.Random(5)
        for _ in range(rng_draws):
            rng.random()
        loop.SideWalk(lead, [1], [1, 2, 3], rng, float("inf"), seed=6).walk()
        return list(taken)

    first = walked(0)
    names = [t[0] for t in first]
    # a leads (choice breaks the tie, then 25 < 28), b every third step, until b's third step
    # finds 10.0: then b leads and a comes in every third step
    assert names[:9] == ["z1", "z1", "z2", "z1", "z1", "z2", "z1", "z1", "z2"]
    assert names[9:14] == ["z2", "z1", "z2", "z2", "z1"]
    assert len(first) == 24  # each focus walks its 12 steps
    assert walked(7) == first  # the sweep's draws do not move the walks


def test_the_side_sweep_leaves_out_settings_that_never_fit_or_trail_far(monkeypatch):
    """A setting that lost ``SETTING_LOSSES`` times in a row is still priced by the side sweep
    (``every``) unless it is hopeless: it never fitted, or its best is more than ``HOPELESS``
    times the best of all settings."""
    import types

    from hexicore.planner.search import candidate
    from hexicore.planner.search.context import INF

    lead = types.SimpleNamespace(best_score=20.0)
    close, far, never = (types.SimpleNamespace(best_score=s) for s in (39.0, 41.0, INF))
    lead.contexts = lambda: (lead, close, far, never)
    assert candidate.HOPELESS == 2.0
    assert not candidate.hopeless(lead, close)
    assert candidate.hopeless(lead, far) and candidate.hopeless(lead, never)
