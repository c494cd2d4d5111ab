"""The ``cpsat`` exact solver: brute-force optimum on tiny clusters, fidelity to the
cost model, valid bounds, fix_groups, bad input, the CLI.

The brute force enumerates every plan of the solver's plan space (stages inside one machine,
power-of-two TP dividing the heads, any number of pipelines, idle devices allowed, every block
and batch split) and scores each with the cost model's own ``estimate``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from tests.conftest import cluster_preset, model_preset, run_cli
from hexicore.cost import AnalyticCostModel
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore_plugins.solvers.cpsat import CpSatSolver
from hexicore_plugins.solvers.cpsat.tables import tp_degrees
from tests.helpers import (CPSAT_WORKERS as WORKERS, cpsat_cluster as cluster, cpsat_problem as problem,
                           cpsat_small_llama as small_llama, cpsat_solve as solve)



# ----------------------------------------------------------------------------- brute force
def compositions(total, parts):
    """Every way to write ``total`` as ``parts`` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = (0, *cuts, total)
        yield tuple(b[i + 1] - b[i] for i in range(parts))


def stage_groups(p, free):
    """Non-empty device groups inside one machine, of an allowed TP size, from ``free``."""
    by_machine = {}
    for d in sorted(free):
        by_machine.setdefault(p.cluster.device(d).machine, []).append(d)
    for devs in by_machine.values():
        for t in tp_degrees(p, len(devs)):
            yield from itertools.combinations(devs, t)


def pipelines_of(p, free, max_stages):
    """Ordered stage sequences over ``free`` devices (each a pipeline's device groups)."""
    if max_stages == 0:
        return
    for g in stage_groups(p, free):
        yield (g,)
        for rest in pipelines_of(p, free - set(g), max_stages - 1):
            yield (g, *rest)


def layouts(p, free, max_pipes, first_min=()):
    """Sets of pipelines (canonical order: by their device tuple) over ``free`` devices."""
    for pipe in pipelines_of(p, free, p.model.layers):
        key = tuple(d for g in pipe for d in g)
        if key <= first_min:
            continue
        yield (pipe,)
        if max_pipes > 1:
            for rest in layouts(p, free - set(key), max_pipes - 1, key):
                yield (pipe, *rest)


def plans_for(p, layout):
    L, n_mb = p.model.layers, p.train.global_batch // p.train.micro_batch
    if len(layout) > n_mb:
        return
    splits = [list(compositions(L, len(pipe))) for pipe in layout]
    for batches in compositions(n_mb, len(layout)):
        for choice in itertools.product(*splits):
            pipes = []
            for pipe, counts, n in zip(layout, choice, batches):
                lo, stages = 0, []
                for g, c in zip(pipe, counts):
                    stages.append(Stage(tuple(g), len(g), (lo, lo + c)))
                    lo += c
                pipes.append(Pipeline(n * p.train.micro_batch, tuple(stages), dict(p.schedule)))
            yield Plan(p.model, p.cluster, p.train, tuple(pipes))


def brute_force(p, layouts_iter=None):
    """The least estimated iteration time over every fitting plan (inf if none fits)."""
    best = float("inf")
    devs = {d.id for d in p.cluster.devices}
    n_mb = p.train.global_batch // p.train.micro_batch
    for layout in (layouts_iter if layouts_iter is not None else layouts(p, devs, min(len(devs), n_mb))):
        for plan in plans_for(p, layout):
            est = p.cost.estimate(plan)
            if est.fits:
                best = min(best, est.iteration_s)
    return best


# ------------------------------------------------------------------------------ clusters
def narrow_llama(layers, hidden, heads):
    return replace(small_llama(layers, 2048), hidden=hidden, ffn=int(hidden * 2.75), heads=heads, kv_heads=heads)


CASES = {
    # optimum: one heterogeneous pipeline, 4090 pair (TP 2) then A800 pair (TP 2), 1 + 3 blocks
    "pipeline-a800x2+4090x2": (lambda: cluster([("X", "a800-80g-nvlink", 2, 200), ("Y", "rtx4090", 2, 32)], 10.0),
                               lambda: small_llama(4, 512), 4),
    # optimum: two asymmetric pipelines (one per machine), batches 4 and 2
    "dp-a800x2+4090x2": (lambda: cluster([("X", "a800-80g-nvlink", 2, 200), ("Y", "rtx4090", 2, 32)], 50.0),
                         lambda: narrow_llama(2, 1024, 8), 6),
    # replicas with TP 2 and TP 1 of the same blocks: the chunked DP sync
    "mixed-tp-a100x3": (lambda: cluster([("A", "a100-80g", 3, 300)]), lambda: small_llama(3, 512), 3),
    # 8 GB cards: a 4-block Llama-7B-width model must be split or TP-sharded to fit
    "memory-4090x2+3090x2": (lambda: cluster([("F", "small4090", 2, 32), ("R", "rtx3090", 2, 16)], 5.0,
                                             {"small4090": {"tflops": 165.2, "memory_gb": 8}}),
                             lambda: small_llama(4, 1024), 2),
    # a fast pair and a slow card behind a slow link, tiny model (latency-bound)
    "tiny-a800x2+3090": (lambda: cluster([("X", "a800-80g-nvlink", 2, 200), ("Y", "rtx3090", 1, 16)], 1.0),
                         lambda: replace(model_preset("tiny"), layers=4, seq_len=256), 3),
    # tied embeddings: every rank of every embedding and head stage joins one ring of vocab x hidden;
    # the ring's members are the first and last stages (one pipeline's too): the model without it
    # chose a plan 5% slower than this optimum
    "tied-4090x2+3090": (lambda: cluster([("X", "rtx4090", 2, 32), ("Y", "rtx3090", 1, 16)], 1.0),
                         lambda: replace(small_llama(4, 512), tied_embeddings=True, vocab=128000), 4),
    "tied-tp-a100x3": (lambda: cluster([("A", "a100-80g", 3, 300)]),
                       lambda: replace(small_llama(3, 512), tied_embeddings=True), 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_brute_force(case):
    mk_cluster, mk_model, gb = CASES[case]
    p = problem(mk_cluster(), mk_model(), gb)
    best = brute_force(p)
    plan = solve(p)
    est = p.cost.estimate(plan)
    assert plan.solver["status"] == "OPTIMAL"
    assert est.fits
    assert best <= est.iteration_s <= best * (1 + 1e-3)  # the optimum, up to the model's time unit
    assert plan.solver["bound"] <= best
    assert plan.solver["objective"] == pytest.approx(est.iteration_s, rel=1e-3)
    assert plan.solver["objective"] == pytest.approx(plan.solver["bound"], rel=1e-9)  # model value = solver's


def test_gpipe_memory_matches_brute_force():
    """GPipe keeps every micro-batch's activations (in_flight = n_mb, the schedule's own peaks
    injected as the cost model's ``activation``): the element-table path."""
    from hexicore.planner.pricing import ScheduleBook
    from hexicore.registry import Registry

    mk_cluster, mk_model, gb = CASES["memory-4090x2+3090x2"]
    cost = AnalyticCostModel(activation=ScheduleBook(Registry.default()).activation())
    p = problem(mk_cluster(), replace(mk_model(), seq_len=4096), 4, schedule={"name": "gpipe"}, cost=cost)
    assert [p.cost.in_flight(Pipeline(4, (Stage(("x",), 1, (0, 1)),) * 2, p.schedule), j, 4) for j in (0, 1)] == [4, 4]
    best = brute_force(p)
    plan = solve(p)
    est = p.cost.estimate(plan)
    assert plan.solver["status"] == "OPTIMAL" and est.fits
    assert best <= est.iteration_s <= best * (1 + 1e-3)
    assert all(q.schedule["name"] == "gpipe" for q in plan.pipelines)


def test_other_pipeline_timer_gets_no_bound():
    """A cost model pricing another schedule: the plan is returned as FEASIBLE, bound null."""
    timer = lambda pipe, stages, hops, n_mb: 1.5 * AnalyticCostModel().pipeline_s(stages, hops, n_mb)  # noqa: E731
    mk_cluster, mk_model, gb = CASES["pipeline-a800x2+4090x2"]
    p = problem(mk_cluster(), mk_model(), gb, cost=AnalyticCostModel(pipeline_timer=timer))
    plan = solve(p)
    assert plan.solver["status"] == "FEASIBLE" and plan.solver["bound"] is None


def test_a_schedule_timer_pricing_below_the_model_still_finds_the_plans():
    """A schedule's own timer (zero-bubble's) prices plans below the model's 1F1B closed form.
    Before, the start plan's estimate capped the model's tables, which then held no plan:
    INFEASIBLE, reported as "no layout satisfies every device's memory" on 4 GPUs where
    megatron's 2 x 2 plan fits at two thirds of their memory."""
    cheaper = lambda pipe, stages, hops, n_mb: 0.6 * AnalyticCostModel().pipeline_s(stages, hops, n_mb)  # noqa: E731
    cl = cluster([("M", "a800-80g-nvlink", 4, 32)])
    p = problem(cl, small_llama(8), 8, cost=AnalyticCostModel(pipeline_timer=cheaper))
    plan = solve(p)
    assert plan.solver["status"] == "FEASIBLE" and plan.solver["bound"] is None
    assert p.cost.estimate(plan).fits


FIDELITY = [
    ("paper_case", "llama2_13b", 24),
    ("paper_case", "tiny", 8),
    ("hetero2-cut", "llama2_7b", 16),
]


@pytest.mark.parametrize("cl,mo,gb", FIDELITY)
def test_objective_matches_estimate_and_bound_is_below(cl, mo, gb):
    if cl == "hetero2-cut":  # 2 x 2 GPUs of hetero2's A800 and 4090 machines
        c = cluster([("A0", "a800-80g-nvlink", 2, 200), ("F0", "rtx4090", 2, 32)], 0.7)
    else:
        c = cluster_preset(cl)
    p = problem(c, model_preset(mo), gb)
    plan = solve(p, time_limit=5.0, use_all_devices=True)  # one model: its objective is the plan's
    est = p.cost.estimate(plan)
    assert est.fits
    assert plan.solver["status"] in ("OPTIMAL", "FEASIBLE")
    assert plan.solver["objective"] == pytest.approx(est.iteration_s, rel=0.01)
    assert plan.solver["bound"] <= est.iteration_s


def _mixed_tp_warm_start(p):
    """Two pipelines whose replicas of a block differ in TP (2 vs 1): the chunked DP case."""
    pipes = (Pipeline(2, (Stage(("X.0", "X.1"), 2, (0, 2)), Stage(("Y.0",), 1, (2, 4)))),
             Pipeline(2, (Stage(("X.2",), 1, (0, 3)), Stage(("Y.1",), 1, (3, 4)))))
    return Plan(p.model, p.cluster, p.train, pipes)


def test_fix_groups_keeps_groups_and_is_exact():
    c = cluster([("X", "a800-80g-nvlink", 3, 200), ("Y", "rtx3090", 2, 16)], 0.5)
    p = problem(c, small_llama(4, 512), 4)
    warm = _mixed_tp_warm_start(p)
    p = replace(p, warm_start=warm)
    plan = solve(p, fix_groups=True)
    groups = [[s.devices for s in q.stages] for q in plan.pipelines]
    assert groups == [[s.devices for s in q.stages] for q in warm.pipelines]
    est = p.cost.estimate(plan)
    layout = [tuple(tuple(s.devices) for s in q.stages) for q in warm.pipelines]
    best = brute_force(p, [tuple(layout)])
    assert plan.solver["status"] == "OPTIMAL"
    assert best <= est.iteration_s <= best * (1 + 1e-3)
    assert est.iteration_s <= p.cost.estimate(warm).iteration_s
    # mixed TP degrees: the model under-prices the DP chunk latencies, never over
    assert plan.solver["objective"] <= est.iteration_s
    assert plan.solver["bound"] <= best


def test_warm_start_of_another_model_is_ignored():
    mk_cluster, mk_model, gb = CASES["pipeline-a800x2+4090x2"]
    p = problem(mk_cluster(), mk_model(), gb)
    other = problem(p.cluster, small_llama(2, 512), gb)
    warm = Plan(other.model, p.cluster, p.train, (Pipeline(gb, (Stage(("Y.0",), 1, (0, 2)),)),))
    plan = solve(replace(p, warm_start=warm))
    assert plan.solver["model"]["hint"] != "warm_start"
    assert p.cost.estimate(plan).iteration_s == pytest.approx(brute_force(p), rel=1e-3)


def test_fix_groups_needs_a_warm_start():
    p = problem(cluster([("A", "a100-80g", 2, 300)]), model_preset("tiny"), 2)
    with pytest.raises(HexicoreError, match="warm_start"):
        solve(p, fix_groups=True)


def test_nothing_fits_is_an_error():
    c = cluster([("S", "tiny-gpu", 2, 32)], gpus={"tiny-gpu": {"tflops": 100, "memory_gb": 2}})
    p = problem(c, small_llama(4), 2)
    with pytest.raises(HexicoreError, match="no plan fits"):
        solve(p, time_limit=10)


def _no_greedy_problem():
    """A fast 5 GB card and a slow 7 GB card: the speed-proportional greedy start overloads the
    fast one, so no start plan exists, yet 1 + 3 blocks fit."""
    c = cluster([("F", "fastsmall", 1, 32), ("S", "slowsmall", 1, 32)], 10.0,
                {"fastsmall": {"tflops": 1000, "memory_gb": 5}, "slowsmall": {"tflops": 50, "memory_gb": 7}})
    return problem(c, small_llama(4, 1024), 2)


def test_time_limit_without_a_plan_is_an_error():
    p = _no_greedy_problem()
    assert brute_force(p) < float("inf")
    with pytest.raises(HexicoreError, match="time limit"):
        solve(p, time_limit=0.001)


def test_time_limit_with_a_start_plan_returns_it():
    p = problem(cluster_preset("paper_case"), model_preset("llama2_13b"), 24)
    plan = solve(p, time_limit=0.001)
    est = p.cost.estimate(plan)
    assert plan.solver["status"] == "FEASIBLE" and est.fits
    assert plan.solver["bound"] <= est.iteration_s
    assert plan.solver["objective"] == pytest.approx(est.iteration_s, rel=0.01)


def test_time_limit_covers_the_whole_solve(monkeypatch):
    """Sub-clusters share ``time_limit`` (CP-SAT's search time for the whole solve): each run
    (one per sub-cluster solved, with or without a plan) gets a part of what is left, the first
    less than all of it, and the runs together search about the limit; the plan records the
    limit asked for."""
    from hexicore.planner.allocation.sub_clusters import TimeShares

    asked = []
    seconds = TimeShares.seconds

    def spy(self):
        asked.append((self, self.used, seconds(self)))
        return asked[-1][2]

    monkeypatch.setattr(TimeShares, "seconds", spy)
    p = problem(cluster_preset("paper_case"), model_preset("llama2_13b"), 24)
    plan = solve(p, time_limit=2.0)
    assert len(asked) == plan.solver["allocation"]["solved"] >= 2
    assert asked[0][1] == 0 and asked[0][2] < 2.0 * 0.9  # a part, not the whole
    assert all(share <= 2.0 - used + 1e-9 for _, used, share in asked)
    assert asked[-1][0].used <= 2.0 * 1.5  # CP-SAT may overrun a share a little
    assert plan.solver["params"]["time_limit"] == 2.0


def test_allocation_exhaustive_takes_zero_like_hexiscale_and_refuses_negatives():
    assert CpSatSolver(allocation_exhaustive=0).allocation_exhaustive == 0  # always the greedy descent
    for bad in (-1, "abc", True):
        with pytest.raises(HexicoreError) as exc:
            CpSatSolver(allocation_exhaustive=bad)
        assert exc.value.field == "solver.allocation_exhaustive"


def _cli(args, capsys):
    code = run_cli(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_plan_writes_status_and_bound(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, text, err = _cli(["plan", "solver=cpsat", "model=tiny", "solver.time_limit=20",
                            f"solver.workers={WORKERS}", "train.global_batch=4", f"out={out}",
                            f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["solver"]["name"] == "cpsat"
    assert data["solver"]["status"] == "OPTIMAL"
    assert data["solver"]["bound"] <= data["estimate"]["iteration_s"]
    assert "OPTIMAL" in text and "bound" in text and "gap" in text


def test_cli_nothing_fits_exits_2(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("name: small\ninter: {bandwidth_gbs: 1, latency_us: 50}\n"
                 "machines:\n  - {name: S, gpu: tiny-gpu, count: 2, bandwidth_gbs: 32, latency_us: 10}\n"
                 "gpus:\n  tiny-gpu: {tflops: 100, memory_gb: 2}\n")
    code, _, err = _cli(["plan", "solver=cpsat", f"cluster_file={f}", "model=llama2_7b", "solver.time_limit=10",
                         f"solver.workers={WORKERS}", "train.global_batch=2", f"out={tmp_path / 'p.json'}",
                         f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "no plan fits" in err
    assert not (tmp_path / "p.json").exists()


def _tied_plans():
    """Layouts whose tied-embedding groups differ: one stage, one pipeline across machines, TP
    stages at both ends, single-stage pipelines, three pipelines of mixed depth."""
    def pipe(n, *stages):
        return Pipeline(n, tuple(Stage(tuple(devs), len(devs), rng) for devs, rng in stages))

    return [
        (pipe(4, (["A.0"], (0, 4))),),
        (pipe(4, (["A.0"], (0, 2)), (["B.0"], (2, 4))),),
        (pipe(4, (["A.0", "A.1"], (0, 1)), (["B.0"], (1, 3)), (["A.2", "A.3"], (3, 4))),),
        (pipe(2, (["A.0"], (0, 4))), pipe(2, (["B.0"], (0, 4)))),
        (pipe(2, (["A.0", "A.1"], (0, 3)), (["B.0"], (3, 4))), pipe(1, (["A.2"], (0, 4))),
         pipe(1, (["B.1"], (0, 2)), (["A.3"], (2, 4)))),
    ]


def test_model_value_prices_the_tied_embedding_group_like_the_cost_model():
    """The model's value of a plan (:mod:`...cpsat.objective_value`, the objective CP-SAT minimises) is
    the cost model's estimate up to the tables' rounding, whoever holds the tied copies."""
    from hexicore_plugins.solvers.cpsat.objective_value import model_value
    from hexicore_plugins.solvers.cpsat.hint import plan_rows
    from hexicore_plugins.solvers.cpsat.tables import build_tables, stage_options

    c = cluster([("A", "a800-80g-nvlink", 4, 200), ("B", "rtx4090", 2, 32)], 1.0)
    p = problem(c, replace(small_llama(4, 512), tied_embeddings=True, vocab=128000), 4)
    options = stage_options(p)
    tab = build_tables(p, options, 3, 4)
    for pipes in _tied_plans():
        plan = Plan(p.model, p.cluster, p.train, pipes)
        est = p.cost.estimate(plan)
        value = model_value(tab, {"A": 4, "B": 2}, 4, plan_rows(p, plan, options)) * tab.unit
        assert est.iteration_s * (1 - 1e-3) <= value <= est.iteration_s, [s.devices for q in pipes for s in q.stages]


def test_devices_a_cost_model_prices_differently_give_a_valid_bound_not_optimal():
    """A per-device profile with one machine's devices at different speeds: the model prices
    each option at the machine's fastest devices (a valid bound; those devices handed out first)
    and does not call its plan OPTIMAL, since it cannot tell the machine's devices apart."""
    from hexicore.core.profile import parse_profile
    from hexicore.cost.profiled import ProfiledCostModel

    def entry(k):
        return {"blocks": [{"micro_batch": 1, "tp": 1, "seq_len": 32, "hidden": 64, "ffn": 176, "heads": 4,
                            "kv_heads": 2, "forward_s": 0.01 * k, "backward_s": 0.02 * k}]}

    c = cluster([("M", "rtx4090", 3, 32)])
    prof = parse_profile({"format": "hexicore.profile/1", "devices": {"M.0": entry(5), "M.1": entry(1), "M.2": entry(1)},
                          "links": [{"between": ["M", "M"], "latency_s": 1e-5, "bandwidth_gbs": 20.0}]}, "p.yaml")
    p = problem(c, replace(model_preset("tiny"), layers=4), 4, cost=ProfiledCostModel(profile=prof))
    best = brute_force(p)
    plan = solve(p)
    assert plan.solver["status"] == "FEASIBLE"
    assert plan.solver["bound"] <= best <= p.cost.estimate(plan).iteration_s
    if len(plan.devices) < 3:  # a device left idle is the slow one
        assert "M.0" not in plan.devices


def test_vocabulary_parallelism_proves_nothing_the_tables_do_not_price():
    """The tables keep the embedding and head whole per TP rank: with ``train.vocab_parallel``
    the plan is the model's best, FEASIBLE, without a bound."""
    mk_cluster, mk_model, gb = CASES["pipeline-a800x2+4090x2"]
    p = problem(mk_cluster(), mk_model(), gb)
    p = replace(p, train=replace(p.train, vocab_parallel=True))
    plan = solve(p)
    assert plan.solver["status"] == "FEASIBLE" and plan.solver["bound"] is None
    assert plan.train.vocab_parallel
