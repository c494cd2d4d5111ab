"""The planner's scale machinery changes no plan: matrix-backed device graph, exact vectorised
DP sync, memoised link terms, parallel pieces (same plan with one or two processes), and the
large-cluster path (machine graph, layouts shared by part signature) yields valid layouts."""

import random

import networkx as nx
import numpy as np
import pytest

from hexicore.app import compose as app
from hexicore.core.cluster import parse_cluster, synthetic_fleet
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Stage
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost import dp_ring
from hexicore.planner.stage_layout.layers import allocate_layers
from hexicore.planner.search.workers import fork_map, fork_start
from hexicore.planner.partition.cut import ordered_subgraph, weight_matrix
from hexicore.planner.stage_layout.stage_table import layout_pipeline
from hexicore.registry import Registry


def fleet(n=48, links=True):
    d = synthetic_fleet(n, {"rtx4090": 2, "rtx3090": 1, "a100-80g": 1}, seed=1)
    d["machines"][-1]["count"] = 5  # a machine of another size
    if links:
        d["links"] = [{"between": ["m0", "m1"], "bandwidth_gbs": 3.3, "latency_us": 7.0}]
    d["excluded"] = ["m2.3"]
    return parse_cluster(d, "test")


def test_device_graph_matches_the_networkx_graph():
    c = fleet()
    g, dg = c.graph(), c.device_graph()
    nodes = list(g.nodes)
    assert list(dg.nodes) == nodes and dg.number_of_edges() == g.number_of_edges()
    for attr in ("bandwidth", "latency_us"):
        assert np.array_equal(dg.matrix(attr), nx.to_numpy_array(g, nodelist=nodes, weight=attr, nonedge=0.0))
    rng = random.Random(0)
    for size in (3, len(nodes) // 2, len(nodes) - 2):  # both node-order rules of the views
        part = rng.sample(nodes, size)
        a, b = ordered_subgraph(g, part), ordered_subgraph(dg, part)
        assert list(a.nodes) == list(b.nodes)
        assert np.array_equal(weight_matrix(a, list(a.nodes)), weight_matrix(b, list(b.nodes)))
    assert dg.nodes["m0.0"]["tflops"] == g.nodes["m0.0"]["tflops"]


def test_dp_ring_is_the_loop_to_the_last_bit(monkeypatch):
    c = fleet(96)
    cost, rng = AnalyticCostModel(), random.Random(3)
    ids = [d.id for d in c.devices]
    for _ in range(40):
        rng.shuffle(ids)
        holders, left = [], list(ids)
        for _ in range(rng.randint(2, 12)):
            tp = rng.choice([1, 1, 2, 4])
            holders.append(Stage(tuple(left[:tp]), tp, (0, 1)))
            left = left[tp:]
        fast = dp_ring.ring_layer_s(c, holders, 1.7e8, 2)
        monkeypatch.setattr("hexicore.cost.analytic.MIN_TERMS", 10**12)  # the plain loop
        assert cost.dp_layer_s(c, holders, 1.7e8, 2) == fast
        monkeypatch.setattr("hexicore.cost.analytic.MIN_TERMS", dp_ring.MIN_TERMS)


def test_memoised_link_terms_equal_fresh_ones():
    c, cost = fleet(), AnalyticCostModel()
    m = app.build_problem(app.config_from_overrides(["model=tiny"]), Registry.default()).model
    t = app.build_problem(app.config_from_overrides([]), Registry.default()).train
    groups = [("m0.0", "m0.1"), ("m1.0",), ("m1.1", "m1.2", "m1.3"), ("m3.0", "m4.0"), ("m2.0", "m2.1")]
    for a in groups:
        fresh = parse_cluster(c.to_dict(), "again")
        assert cost.tp_comm_s(c, m, t, a, 3) == cost.tp_comm_s(fresh, m, t, a, 3)
        for b in groups:
            if a != b:
                assert cost.hop_s(c, m, t, a, b) == cost.hop_s(parse_cluster(c.to_dict(), "x"), m, t, a, b)
    assert c.memo  # the cluster kept them
    with pytest.raises(HexicoreError, match="unknown device"):
        cost.tp_comm_s(c, m, t, ("m2.3", "m2.0"), 1)  # excluded: still one clear error


def test_memoised_layer_sync_equals_a_fresh_cluster():
    """COMM-DP per layer is memoised on the cluster across plans: a plan priced after others
    (memo warm) costs what it costs on a fresh copy of the cluster."""
    from dataclasses import replace

    base = ["cluster=synthetic", "cluster.synthetic.gpus=24", "cluster.synthetic.per_machine=4", "model=tiny",
            "train.global_batch=16", "solver.iterations=6", "solver.dp_min=3", "solver.workers=1"]
    plan = solve(base + ["solver.use_all_devices=true"])
    cost = AnalyticCostModel()
    other = solve(base + ["solver.use_all_devices=true", "solver.dp_min=2", "solver.dp_max=2"])
    cost.estimate(other)  # warms the memo with another plan's holder sets
    warm = cost.estimate(plan)
    fresh = cost.estimate(replace(plan, cluster=parse_cluster(plan.cluster.to_dict(), "fresh")))
    assert len(plan.pipelines) >= 3 and warm.dp_s > 0 and warm.dp_s == fresh.dp_s
    assert warm.iteration_s == fresh.iteration_s
    assert any(isinstance(k, tuple) and k[0] == "layer_sync" for k in plan.cluster.memo)


def test_layer_allocation_is_the_brute_force_optimum():
    rng = np.random.default_rng(5)
    import itertools
    for _ in range(200):
        p, L = int(rng.integers(1, 4)), int(rng.integers(3, 8))
        rows = np.cumsum(rng.random((p, L + 1)), axis=1)
        caps = rng.integers(1, L + 1, size=p)
        got = allocate_layers(rows, caps, L)
        best = min(((max(rows[j][a[j]] for j in range(p)), sum(rows[j][a[j]] for j in range(p)), a)
                    for a in itertools.product(range(1, L + 1), repeat=p)
                    if sum(a) == L and all(a[j] <= caps[j] for j in range(p))), default=None)
        if best is None:
            assert got is None
        else:
            assert max(rows[j][got[j]] for j in range(p)) == best[0]
            assert sum(rows[j][got[j]] for j in range(p)) == pytest.approx(best[1])


def test_fork_map_is_the_loop_and_raises_what_a_worker_raises():
    state = {"k": 7}  # inherited by the children, never pickled on the way in
    assert fork_map(lambda x: x * state["k"], list(range(11)), 3) == [x * 7 for x in range(11)]

    def bad(x):
        if x == 4:
            raise HexicoreError("four", field="x")
        return x

    with pytest.raises(HexicoreError, match="four"):
        fork_map(bad, list(range(6)), 2)


def test_fork_start_returns_the_loop_later_and_cancels():
    import os

    state = {"k": 3}
    job = fork_start(lambda x: x * state["k"], list(range(7)), 2)
    assert len(job.children) == 2 and job.result() == [x * 3 for x in range(7)]
    assert fork_start(lambda x: x, [], 2).result() == []  # nothing to start: the plain loop

    def bad(x):
        if x == 2:
            raise HexicoreError("two", field="x")
        return x

    with pytest.raises(HexicoreError, match="two"):
        fork_start(bad, list(range(4)), 1).result()
    slow = fork_start(lambda x: __import__("time").sleep(60), [1], 1)
    pid = slow.children[0][1]
    slow.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped: no process left behind


def solve(overrides):
    plan, _ = app.solve(app.config_from_overrides(overrides), Registry.default())
    return plan


@pytest.mark.slow
def test_two_processes_plan_what_one_plans(monkeypatch):
    """The sweep's phase 2 ahead in a second process, the walk guessed and laid out ahead, and
    the allocation's screens in parallel (all forced on a small fleet) give the one-process
    plan, to the device."""
    import hexicore.planner.search.loop as search

    monkeypatch.setattr(search, "WALK_AHEAD_FROM", 1)
    guessed = []
    real = search.walk_ahead
    monkeypatch.setattr(search, "walk_ahead", lambda *a: guessed.append(real(*a)) or guessed[-1])
    base = ["cluster=synthetic", "cluster.synthetic.gpus=24", "cluster.synthetic.per_machine=4", "model=tiny",
            "train.global_batch=16", "solver.iterations=12", "solver.dp_max=4", "solver.allocation_exhaustive=1",
            "solver.allocation_screen_above=1"]
    one = solve(base + ["solver.workers=1"])
    two = solve(base + ["solver.workers=2"])
    a, b = one.to_dict(), two.to_dict()
    assert a["pipelines"] == b["pipelines"] and a["estimate"] == b["estimate"]
    drop = ("seconds", "params")
    assert {k: v for k, v in a["solver"].items() if k not in drop} == \
        {k: v for k, v in b["solver"].items() if k not in drop}
    assert two.solver["allocation"]["screened"] > 0
    assert sum(guessed) > 0  # layouts were computed ahead (and the plan did not change)


def test_large_cluster_path_gives_valid_renamed_layouts():
    """machine_graph_above below the fleet: whole machines per pipeline, one layout per part
    signature renamed for the others — each renamed layout is what laying out its own stages
    with the same layers gives."""
    from hexicore.planner.search.candidate import two_phase
    from hexicore.planner.search.context import make_context
    from hexicore.planner.search.search_config import SearchConfig

    problem = app.build_problem(app.config_from_overrides(
        ["cluster=synthetic", "cluster.synthetic.gpus=32", "cluster.synthetic.per_machine=4", "model=tiny",
         "train.global_batch=16"]), Registry.default())
    ctx = make_context(problem, SearchConfig(machine_graph_above=8, workers=1))
    cand = two_phase(ctx, 4, "min_cut", (0,), 1)
    assert cand.plan is not None
    for lay in cand.layouts:
        machines = {problem.cluster.device(d).machine for g in lay.stages for d in g}
        assert all(len([d for d in problem.cluster.devices if d.machine == m])
                   == sum(1 for g in lay.stages for d in g if problem.cluster.device(d).machine == m)
                   for m in machines)  # whole machines
        again = layout_pipeline(ctx.table, lay.stages, ctx.micro_batches - 3, lay.layers)
        assert again == lay
    assert any(k[0] == "shared" for k in ctx.phase2_cache)


def test_the_largest_fitting_layer_count_is_the_brute_force_one():
    """``largest_fitting`` (a stage's memory cap) equals the scan over every l, for memories
    growing with l that are affine from one block on (its quick path), jump at l = 1, bend, or
    never fit."""
    from hexicore.planner.stage_layout.stage_table import largest_fitting

    rng = random.Random(7)
    for _ in range(3000):
        layers = rng.randrange(0, 40)
        base, per, jump = rng.uniform(0, 30), rng.uniform(0, 4), rng.choice((0.0, 0.0, rng.uniform(0, 5)))
        bend = rng.choice((0.0, 0.0, rng.uniform(0, 0.3)))
        limit = rng.uniform(0, 80)

        def memory(l: int) -> float:
            return base + per * l + (jump if l >= 1 else 0.0) + bend * l * l

        def fits(l: int) -> bool:
            return memory(l) <= limit

        want = max((l for l in range(layers + 1) if memory(l) <= limit), default=-1)
        assert largest_fitting(fits, memory, limit, layers) == want
