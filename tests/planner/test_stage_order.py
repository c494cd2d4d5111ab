"""The stage-order polish (hexicore.planner.search.candidate.reorder): machine runs moved to other
positions, layers re-allocated, kept where the search's estimate improves."""

import itertools

import pytest

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.planner.search.candidate import assemble, machine_runs, moved, reorder
from hexicore.planner.search.context import INF, make_context
from hexicore.planner.search.search_config import SearchConfig
from hexicore.planner.stage_layout.stage_table import layout_pipeline
from hexicore.registry import Registry


@pytest.fixture(scope="module")
def context():
    problem = build_problem(config_from_overrides(["cluster=hetero1", "model=llama2_7b", "train.global_batch=32"]),
                            Registry.default())
    return make_context(problem, SearchConfig(workers=1))


def _pipeline(context, order):
    """One pipeline of two-GPU TP stages, one machine after another in ``order``."""
    machines = {m.name: [d.id for d in context.problem.cluster.devices if d.machine == m.name][:2]
                for m in context.problem.cluster.machines}
    return [tuple(machines[m]) for m in order]


def _candidate(context, stages):
    n_mb_max = context.micro_batches
    context.at_pipelines(1)
    layout = layout_pipeline(context.table, stages, n_mb_max)
    return assemble(context, [layout], "test", {"d_dp": 1}) if layout is not None else None


def test_machine_runs_keep_a_machines_stages_together(context):
    cluster = context.problem.cluster
    t0 = [d.id for d in cluster.devices if d.machine == "T0"]
    f0 = [d.id for d in cluster.devices if d.machine == "F0"]
    stages = [(t0[0],), (t0[1],), (f0[0], f0[1]), (t0[2],)]
    assert machine_runs(context.table, stages) == [(0, 2), (2, 3), (3, 4)]
    assert moved(stages, machine_runs(context.table, stages), 0, 2) == ((f0[0], f0[1]), (t0[2],), (t0[0],), (t0[1],))


def test_reorder_is_never_worse_and_ends_where_no_move_helps(context):
    """From every starting order of four machines: the result is a permutation of the machines,
    no slower than the start, and no single move (a machine taken out and put back elsewhere)
    improves it further (hill climbing to a local optimum, with no budget or deadline in the way)."""
    names = ["T0", "R0", "F0", "F1"]
    best_seen, improved = INF, 0
    for order in itertools.permutations(names):
        start = _candidate(context, _pipeline(context, order))
        if start is None or start.score == INF:
            continue
        best_seen = min(best_seen, start.score)
        got = reorder(context, start, context.micro_batches, INF, context.evaluated + 10_000)
        assert got.score <= start.score
        improved += got.score < start.score - 1e-9
        stages = got.layouts[0].stages
        assert sorted(stages) == sorted(start.layouts[0].stages)
        runs = machine_runs(context.table, stages)
        for source, target in itertools.product(range(len(runs)), repeat=2):
            if source != target:
                trial = _candidate(context, list(moved(stages, runs, source, target)))
                assert trial is None or trial.score >= got.score - 1e-9
    assert best_seen < INF and improved  # (the order matters on this cluster: memory and speed differ)
