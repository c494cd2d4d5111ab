"""Array paths: array-backed action lists and the array engine of the simulator agree with the
object lists and the event loop; defects still get the event loop's located errors."""

from __future__ import annotations

import random

import pytest

from hexicore.pipeline.actions import OPS, Action, ActionList
from hexicore.pipeline.arrays import CODE, ActionArrays
from hexicore.pipeline.comm import insert_comm
from hexicore.core.errors import ScheduleError
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import Timing, makespan, simulate
from hexicore.pipeline.simulate_fast import simulate_arrays
from hexicore.pipeline.validate import validate_actions
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1

SCHEDULES = [GPipe(), OneFOneB(), Interleaved1F1B(chunks=3), Chimera(), Hanayo(waves=1), Hanayo(waves=3),
             ZeroBubbleH1()]
GRID = [(P, M) for P in (2, 3, 5) for M in (1, 2, 4, 7, 12)]


def arrays_backed(al: ActionList) -> ActionList:
    return ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank,
                      ActionArrays.from_lists(al.actions), al.chains, al.mb_chain, dict(al.meta))


def random_timing(rng, al, P):
    return Timing(tuple(rng.uniform(0.1, 3) for _ in range(al.stages)),
                  tuple(rng.uniform(0.1, 3) for _ in range(al.stages)),
                  tuple(rng.uniform(0, 1) for _ in range(P - 1)), reduce=rng.uniform(0, 1))


def test_array_codes_are_the_op_order():
    assert [CODE[op] for op in OPS] == list(range(len(OPS)))
    assert ActionArrays.from_lists([[Action(op, 0, 0) for op in OPS]]).op.tolist() == list(range(len(OPS)))


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_comm_pass_arrays_and_objects_are_the_same_lists(sched):
    """``fast`` only chooses how the result is held (tests/pipeline/test_comm.py checks the pass itself)."""
    for P, M in GRID:
        al = sched.order(ScheduleSpec(P, M))
        fast, objects = insert_comm(al, fast=True), insert_comm(al, fast=False)
        assert not fast.has_objects() and objects.has_objects()
        assert fast == objects, (P, M)
        assert insert_comm(arrays_backed(al), fast=False) == objects


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_array_simulator_equals_the_event_simulator(sched):
    """Makespan, busy time and peak activations, with and without comm, default and random times."""
    rng = random.Random(5)
    for P, M in GRID:
        al = sched.order(ScheduleSpec(P, M))
        for lists, comm in ((al, False), (insert_comm(al), True)):
            for t in (Timing.uniform(lists), random_timing(rng, lists, P)):
                want = simulate(lists, t, comm=comm, fast=False)
                got = simulate_arrays(arrays_backed(lists), t, comm)
                assert got is not None, (P, M, comm)
                assert got.makespan == pytest.approx(want.makespan, rel=1e-12, abs=1e-12), (P, M, comm)
                assert got.busy == pytest.approx(want.busy, rel=1e-12, abs=1e-12)
                assert got.peak_activations == want.peak_activations


def delayed_sends(al: ActionList) -> ActionList:
    """Each SEND moved after the compute that follows it (valid, not what the comm pass emits)."""
    out = []
    for acts in al.actions:
        acts = list(acts)
        for k in range(len(acts) - 1):
            if acts[k].op.startswith("SEND") and acts[k + 1].is_compute:
                acts[k], acts[k + 1] = acts[k + 1], acts[k]
        out.append(tuple(acts))
    return ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank, tuple(out),
                      al.chains, al.mb_chain)


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_in_order_evaluation_equals_the_event_simulator(sched, monkeypatch):
    """With no sweeps allowed the array simulator evaluates in dependency order: same results."""
    import hexicore.pipeline.simulate_fast as sf

    monkeypatch.setattr(sf, "SWEEPS", 0)
    rng = random.Random(7)
    for P, M in GRID:
        al = sched.order(ScheduleSpec(P, M))
        for lists, comm in ((al, False), (delayed_sends(insert_comm(al)), True)):
            t = random_timing(rng, lists, P)
            want = simulate(lists, t, comm=comm, fast=False)
            got = simulate_arrays(arrays_backed(lists), t, comm)
            assert got is not None and got.makespan == pytest.approx(want.makespan, rel=1e-12), (P, M, comm)
            assert got.peak_activations == want.peak_activations


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_array_simulator_on_hand_placed_comm(sched):
    """Lists whose SEND/RECV are not the comm pass's: the array path's receive edges."""
    rng = random.Random(9)
    for P, M in GRID:
        lists = delayed_sends(insert_comm(sched.order(ScheduleSpec(P, M))))
        t = random_timing(rng, lists, P)
        want = simulate(lists, t, comm=True, fast=False)
        got = simulate_arrays(arrays_backed(lists), t, True)
        assert got is not None and got.makespan == pytest.approx(want.makespan, rel=1e-12), (P, M)
        assert got.busy == pytest.approx(want.busy, rel=1e-12) and got.peak_activations == want.peak_activations


def test_big_hanayo_stays_arrays_and_matches():
    """A list above the size threshold: built, comm-inserted, validated and simulated as arrays,
    with the same result as the event simulator."""
    al = Hanayo(waves=4).order(ScheduleSpec(8, 200))
    full = insert_comm(al)
    res = validate_actions(full, comm=True)
    assert not full.has_objects() and al.n_actions >= 20_000
    want = simulate(full, comm=True, fast=False)
    assert res.makespan == pytest.approx(want.makespan, rel=1e-12)
    assert res.peak_activations == want.peak_activations
    rng = random.Random(3)  # uneven times: the sweeps give way to the in-order evaluation
    t = random_timing(rng, al, 8)
    assert simulate(al, t, comm=False).makespan == pytest.approx(simulate(al, t, comm=False, fast=False).makespan)
    assert makespan(al, t) == pytest.approx(simulate(al, t, comm=False, fast=False).makespan)


def test_array_backed_lists_are_the_same_lists(tmp_path):
    al = Hanayo(waves=2).actions(ScheduleSpec(3, 4))
    arr = arrays_backed(al)
    assert not arr.has_objects() and arr.n_actions == al.n_actions
    assert arr.compute_only() == al.compute_only()
    assert arr == al and arr.has_objects()
    assert ActionList.load(arrays_backed(al).save(tmp_path / "a.json")) == al


def test_defects_fall_back_to_the_located_error():
    """The array path proves nothing about a bad list; the object path names the defect."""
    good = [[Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 0), Action("B", 0, 1)],
            [Action("F", 1, 0), Action("B", 1, 0), Action("F", 1, 1), Action("B", 1, 1)]]
    deadlock = [good[0][:1] + good[0][2:3] + good[0][1:2] + good[0][3:],
                [good[1][0], good[1][2], good[1][1], good[1][3]]]
    al = ActionList({}, 2, 2, 2, (0, 1), ActionArrays.from_lists(deadlock))
    assert simulate_arrays(al, Timing.uniform(al), False) is None
    with pytest.raises(ScheduleError, match="deadlock: rank 0, position 1, action 0B0 waits"):
        validate_actions(al, fast=True)
    twice = ActionList({}, 2, 2, 2, (0, 1), ActionArrays.from_lists([good[0][:1] + good[0], good[1]]))
    with pytest.raises(ScheduleError, match="rank 0, position 1, action 0F0: computed twice"):
        validate_actions(twice, fast=True)
    full = insert_comm(ActionList({}, 2, 2, 2, (0, 1), tuple(map(tuple, good))))
    r1 = list(full.actions[1])
    r1[0], r1[4] = r1[4], r1[0]
    swapped = ActionList({}, 2, 2, 2, (0, 1), ActionArrays.from_lists([full.actions[0], r1]))
    with pytest.raises(ScheduleError, match="rank 1, position 0, action 1RECV_F1<-0"):
        validate_actions(swapped, comm=True, fast=True)
