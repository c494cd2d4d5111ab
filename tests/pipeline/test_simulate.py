"""The event simulator and the planner's ``pipeline_time``."""

from __future__ import annotations

import random

import pytest

from hexicore.pipeline.actions import Action, ActionList
from hexicore.registry import Registry
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import Timing, shares, simulate
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1


def test_gpipe_heterogeneous_flow_shop():
    """GPipe with per-stage f_j, b_j and free transfers is two flow shops of identical jobs:
    ``sum f + (M-1) max f + sum b + (M-1) max b``."""
    rng = random.Random(7)
    for _ in range(20):
        P, M = rng.randint(2, 7), rng.randint(1, 12)
        f = [rng.uniform(0.2, 3.0) for _ in range(P)]
        b = [rng.uniform(0.2, 3.0) for _ in range(P)]
        al = GPipe().order(ScheduleSpec(P, M))
        r = simulate(al, Timing(tuple(f), tuple(b)))
        assert r.makespan == pytest.approx(sum(f) + (M - 1) * max(f) + sum(b) + (M - 1) * max(b))
        assert r.busy == pytest.approx([M * (f[j] + b[j]) for j in range(P)])


def test_uniform_comm_gpipe():
    """Equal stages with transfer C: ``(M+P-1)(F+B) + 2(P-1)C``; comm inserted or not."""
    P, M, C = 4, 6, 0.25
    sched = GPipe()
    al = sched.actions(ScheduleSpec(P, M))
    r = simulate(al, Timing.uniform(al, 1.0, 2.0, C))
    assert r.makespan == pytest.approx((M + P - 1) * 3 + 2 * (P - 1) * C)
    assert simulate(al.compute_only(), Timing.uniform(al, 1.0, 2.0, C)).makespan == pytest.approx(r.makespan)


def test_slow_stage_dominates_1f1b():
    P, M = 4, 16
    spec = ScheduleSpec(P, M, (1.0, 1.0, 2.0, 1.0), (2.0, 2.0, 4.0, 2.0))
    _, r = OneFOneB().simulate(spec)
    assert r.makespan >= M * 6.0  # the slow rank's own work
    assert r.busy[2] == pytest.approx(M * 6.0)


def test_shares_and_peak_units():
    al = Hanayo(waves=2).order(ScheduleSpec(4, 4))
    assert set(shares(al)) == {0.25}
    assert shares(Interleaved1F1B(chunks=3).order(ScheduleSpec(2, 2))) == (1 / 3,) * 6
    assert shares(Chimera().order(ScheduleSpec(4, 2))) == (1.0,) * 8
    _, r = OneFOneB().simulate(ScheduleSpec(5, 3))
    assert r.peak_activations == (3, 3, 3, 2, 1)


def test_links():
    t = Timing((1.0,) * 4, (2.0,) * 4, (0.1, 0.2, 0.3))
    assert (t.link(0, 1), t.link(2, 1), t.link(3, 0), t.link(2, 2)) == (0.1, 0.2, 0.3, 0.0)


def test_events_do_not_overlap_on_a_rank():
    sched = Hanayo(waves=2)
    al = sched.actions(ScheduleSpec(3, 5))
    r = simulate(al, Timing.uniform(al, 1.0, 2.0, 0.1), record=True)
    for rank in range(3):
        comp = sorted((e.start, e.end) for e in r.events if e.rank == rank and not e.action.is_comm)
        assert len(comp) == 2 * 5 * al.stages // 3
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(comp, comp[1:]))
    assert r.makespan == max(e.end for e in r.events if not e.action.is_comm)


def test_reduce_is_a_rendezvous():
    al = Chimera().actions(ScheduleSpec(4, 4))
    base = simulate(al, Timing.uniform(al)).makespan
    t = Timing.uniform(al)
    slow = simulate(al, Timing(t.forward, t.backward, t.hops, reduce=0.5)).makespan
    assert slow == pytest.approx(base + 1.0)  # two parts per rank, each one rendezvous


@pytest.mark.parametrize("sched", [GPipe(), OneFOneB(), Interleaved1F1B(chunks=2), Chimera(), Hanayo(waves=2),
                                   Hanayo(waves="auto", max_waves=3), ZeroBubbleH1()], ids=lambda s: s.name)
def test_pipeline_time_agrees_with_the_simulator(sched):
    rng = random.Random(3)
    for _ in range(4):
        P, M = rng.randint(2, 5), rng.randint(1, 9)
        st = [rng.uniform(0.5, 3.0) for _ in range(P)]
        hop = [rng.uniform(0.0, 0.4) for _ in range(P - 1)]
        spec = ScheduleSpec.from_pieces(st, hop, M)
        al = sched.actions(spec if sched.params().get("waves") == "auto" else ScheduleSpec(P, M))
        assert sched.pipeline_time(st, hop, M) == pytest.approx(simulate(al, spec.timing(al)).makespan)
    uniform = sched.pipeline_time([3.0] * 4, [0.0] * 3, 8)
    assert uniform == pytest.approx(simulate(sched.order(ScheduleSpec(4, 8))).makespan)


def test_pipeline_time_closed_form_and_cache():
    s = OneFOneB()
    assert s.pipeline_time([3.0] * 8, [0.0] * 7, 32) == pytest.approx(39 * 3.0)
    assert len(s._cache) == 1
    s.pipeline_time([3.0] * 8, [0.0] * 7, 32)
    assert len(s._cache) == 1


def test_pipeline_timer_hook_uses_each_pipelines_schedule():
    from hexicore.core.plan import Pipeline, Stage
    from hexicore.planner.pricing import ScheduleBook

    stages = tuple(Stage((f"A.{j}",), 1, (4 * j, 4 * j + 4)) for j in range(4))
    timer = ScheduleBook(Registry.default()).timer()
    one = timer(Pipeline(4, stages, {"name": "1f1b"}), [3.0] * 4, [0.0] * 3, 4)
    wave = timer(Pipeline(4, stages, {"name": "hanayo", "waves": 2}), [3.0] * 4, [0.0] * 3, 4)
    assert one == pytest.approx(21.0) and wave < one


def test_waves_auto_follows_the_links():
    """Hanayo (SC'23): more waves over fast links, fewer over slow ones; the choice is recorded."""
    fast = Hanayo(waves="auto", max_waves=4).order(ScheduleSpec(4, 8))
    slow = Hanayo(waves="auto", max_waves=4).order(ScheduleSpec(4, 8, hops=(1.0, 1.0, 1.0)))
    assert fast.schedule["waves"] > slow.schedule["waves"]
    assert set(fast.schedule["auto"]) == {"1", "2", "3", "4"}
    tight = Hanayo(waves="auto", max_waves=4, memory=2).order(ScheduleSpec(4, 8))
    assert max(simulate(tight).peak_activations) <= 2



def test_waves_auto_gives_no_rank_more_chunks_than_blocks():
    """W waves put 2W chunks on every rank: where the spec knows the blocks each rank holds, auto
    stays within the fewest (the runtime and the planner pass them); the order is unchanged else."""
    free = Hanayo(waves="auto", max_waves=4).order(ScheduleSpec(4, 8))
    assert free.schedule["waves"] == 4  # free links: the most waves win
    held = Hanayo(waves="auto", max_waves=4).order(ScheduleSpec(4, 8, rank_layers=(5, 4, 6, 6)))
    assert held.schedule["waves"] == 2 and set(held.schedule["auto"]) == {"1", "2"}
    assert Hanayo(waves="auto", max_waves=4).order(ScheduleSpec(4, 8, rank_layers=(1, 2, 2, 2))).schedule["waves"] == 1


def test_unknown_stage_in_list_is_rejected():
    al = ActionList({}, 2, 2, 1, (0, 1), ((Action("F", 5, 0),), ()))
    with pytest.raises(Exception, match="rank 0, position 0, action 5F0: stage must be in"):
        simulate(al)


def test_fast_makespan_equals_the_simulator():
    from hexicore.pipeline.simulate import makespan

    rng = random.Random(11)
    for sched in (OneFOneB(), Interleaved1F1B(chunks=3), Hanayo(waves=2), Chimera(), ZeroBubbleH1()):
        for _ in range(6):
            P, M = rng.randint(2, 6), rng.randint(1, 10)
            al = sched.order(ScheduleSpec(P, M))
            t = Timing(tuple(rng.uniform(0.1, 3) for _ in range(al.stages)),
                       tuple(rng.uniform(0.1, 3) for _ in range(al.stages)),
                       tuple(rng.uniform(0, 1) for _ in range(P - 1)))
            assert makespan(al, t) == pytest.approx(simulate(al, t).makespan, abs=1e-9)


@pytest.mark.parametrize("name,params", [("1f1b", {}), ("gpipe", {}), ("interleaved_1f1b", {"chunks": 3}),
                                         ("chimera", {}), ("zb_h1", {}), ("zb_h2", {}), ("zb_v", {}),
                                         ("interleaved_zb", {"chunks": 2}), ("dualpipe_v", {}),
                                         ("hanayo", {"waves": 2}), ("looped_bfs", {"chunks": 2})])
def test_held_peaks_are_the_simulators_peaks(name, params):
    """Peaks counted along each rank's list equal the simulated ones, uneven times included (a
    rank runs its list in order, so its in-flight count does not depend on when)."""
    from hexicore.pipeline.simulate import held_peaks

    sched = Registry.default().create("schedule", name, **params)
    rng = random.Random(name)
    for _ in range(4):
        P = rng.randint(2, 6)
        M = rng.randint(sched.pricing.min_micro_batches(P), 4 * P + 3)
        spec = ScheduleSpec.from_pieces([rng.uniform(0.5, 3.0) for _ in range(P)],
                                        [rng.uniform(0.0, 0.4) for _ in range(P - 1)], M)
        al = sched.ordered(spec)
        assert held_peaks(al) == pytest.approx(simulate(al, spec.timing(al)).peak_activations, abs=1e-12)
        assert sched.peak_activations(spec) == pytest.approx(simulate(al, spec.timing(al)).peak_activations)


@pytest.mark.parametrize("name,params", [("1f1b", {}), ("zb_h1", {}), ("zb_h2", {}), ("zb_v", {}), ("gpipe", {}),
                                         ("interleaved_1f1b", {"chunks": 2}), ("interleaved_1f1b", {"chunks": 3})])
def test_peak_rules_are_the_counted_peaks(name, params):
    """A schedule's closed peak rule is what its lists hold, counted along each rank's list, for
    P up to 12 and M from 1 to 5P + 1 (and at P = 24 for a few M)."""
    from hexicore.pipeline.simulate import held_peaks

    sched = Registry.default().create("schedule", name, **params)
    grid = [(P, M) for P in range(1, 13) for M in range(1, 5 * P + 2)] + [(24, M) for M in (1, 23, 24, 47, 100)]
    for P, M in grid:
        assert sched.peak_rule(P, M) == pytest.approx(held_peaks(sched.ordered(ScheduleSpec(P, M)))), (P, M)
