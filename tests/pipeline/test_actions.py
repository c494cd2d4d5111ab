"""Action IR: comm insertion, the validator's defect reports, JSON round trip."""

from __future__ import annotations

import pytest

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.comm import insert_comm
from hexicore.core.errors import ScheduleError
from hexicore.pipeline.schedule import ScheduleSpec, wave_map
from hexicore.pipeline.validate import validate_actions
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.one_f_one_b import OneFOneB


def two_ranks(lists, micro_batches=2, **kw) -> ActionList:
    acts = tuple(tuple(Action(*a) if isinstance(a, tuple) else Action(a[:1], int(a[1]), int(a[2])) for a in lst)
                 for lst in lists)
    return ActionList({"name": "test"}, 2, 2, micro_batches, (0, 1), acts, **kw)


def ops(*codes):
    """"F00" = F of stage 0, micro-batch 0."""
    return [(c[0], int(c[1]), int(c[2])) for c in codes]


GOOD = [ops("F00", "F01", "B00", "B01"), ops("F10", "B10", "F11", "B11")]


def test_insert_comm_pairs_sends_and_receives():
    al = insert_comm(two_ranks(GOOD))
    r0 = [str(a) for a in al.actions[0]]
    r1 = [str(a) for a in al.actions[1]]
    assert r0 == ["0F0", "0SEND_F0->1", "0F1", "0SEND_F1->1", "0RECV_B0<-1", "0B0", "0RECV_B1<-1", "0B1"]
    assert r1 == ["1RECV_F0<-0", "1F0", "1B0", "1SEND_B0->0", "1RECV_F1<-0", "1F1", "1B1", "1SEND_B1->0"]
    validate_actions(al, comm=True)


def test_no_comm_between_stages_on_one_rank():
    al = Hanayo(waves=1).actions(ScheduleSpec(2, 2))  # stages 0,1,1,0 on ranks 0,1,1,0
    for r, acts in enumerate(al.actions):
        for a in acts:
            if a.is_comm:
                assert a.peer != r
                assert {al.stage_rank[a.stage], a.peer} == {0, 1}
    turn = {str(a) for a in al.actions[1] if a.is_comm}
    assert not {"1SEND_F0->1", "2RECV_F0<-1", "2SEND_B0->1", "1RECV_B0<-1"} & turn
    assert {"1RECV_F0<-0", "2SEND_F0->0", "2RECV_B0<-0", "1SEND_B0->0"} <= turn


def test_links_are_fifo():
    """Receives on a link follow the sender's send order (untagged P2P matches them)."""
    al = Hanayo(waves=2).actions(ScheduleSpec(4, 6))
    sends, recvs = {}, {}
    for r, acts in enumerate(al.actions):
        for a in acts:
            if a.op.startswith("SEND"):
                sends.setdefault((r, a.peer), []).append((a.op[-1], a.mb))
            elif a.op.startswith("RECV"):
                recvs.setdefault((a.peer, r), []).append((a.op[-1], a.mb))
    assert sends == recvs


def error(al, **kw) -> str:
    with pytest.raises(ScheduleError) as exc:
        validate_actions(al, **kw)
    return str(exc.value)


def test_backward_before_forward_is_named():
    bad = [ops("F00", "B01", "F01", "B00"), GOOD[1]]
    msg = error(two_ranks(bad))
    assert "rank 0, position 1, action 0B1" in msg and "before its forward 0F1" in msg


def test_missing_micro_batch_is_named():
    bad = [ops("F00", "B00"), ops("F10", "B10")]
    msg = error(two_ranks(bad))
    assert "rank 0" in msg and "0F1" in msg and "missing" in msg


def test_computed_twice():
    bad = [ops("F00", "F00", "F01", "B00", "B01"), GOOD[1]]
    assert "rank 0, position 1, action 0F0: computed twice" in error(two_ranks(bad))


def test_wrong_rank():
    bad = [ops("F00", "F01", "B00", "B01", "F10"), GOOD[1]]
    assert "stage 1 is held by rank 1" in error(two_ranks(bad))


def test_unmatched_send_is_named():
    al = insert_comm(two_ranks(GOOD))
    extra = list(al.actions[0]) + [Action("SEND_F", 0, 1, 1)]
    al = ActionList(al.schedule, 2, 2, 2, al.stage_rank, (tuple(extra), al.actions[1]))
    msg = error(al)
    assert "rank 0, position 8, action 0SEND_F1->1" in msg and "never received" in msg


def test_receive_out_of_link_order_is_named():
    al = insert_comm(two_ranks(GOOD))
    r1 = list(al.actions[1])
    r1[0], r1[4] = r1[4], r1[0]  # RECV_F1 first, RECV_F0 later
    al = ActionList(al.schedule, 2, 2, 2, al.stage_rank, (al.actions[0], tuple(r1)))
    msg = error(al)
    assert "rank 1, position 0, action 1RECV_F1<-0" in msg and "order they are sent" in msg


def test_deadlock_is_named():
    """A cyclic wait: rank 0 F0 B0 F1 B1, rank 1 F0 F1 B0 B1."""
    bad = [ops("F00", "B00", "F01", "B01"), ops("F10", "F11", "B10", "B11")]
    msg = error(two_ranks(bad))
    assert msg.startswith("actions: deadlock:") and "rank 0, position 1, action 0B0 waits" in msg
    assert "rank 1, position 1, action 1F1 waits" in msg
    with pytest.raises(ScheduleError, match="deadlock"):
        validate_actions(insert_comm(two_ranks(bad)), comm=True)


def test_runtime_lists_must_carry_comm():
    msg = error(two_ranks(GOOD), comm=True)
    assert "rank 0, position 2, action 0B0" in msg and "no RECV_B" in msg


def test_json_round_trip(tmp_path):
    for al in (OneFOneB().actions(ScheduleSpec(3, 5)), Hanayo(waves=2).actions(ScheduleSpec(3, 3))):
        again = ActionList.load(al.save(tmp_path / "a.json"))
        assert again == al
        assert again.to_dict()["format"] == "hexicore.actions/1"
    from hexicore_plugins.schedules.chimera import Chimera

    al = Chimera().actions(ScheduleSpec(4, 4))
    d = al.to_dict()
    assert d["chains"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and d["mb_chain"] == [0, 1, 0, 1]
    assert ActionList.from_dict(d) == al


def test_wave_map_matches_design_example():
    assert list(wave_map(4, 2))[:8] == [0, 1, 2, 3, 3, 2, 1, 0]


def _edited(al: ActionList, rank: int, lst) -> ActionList:
    acts = list(al.actions)
    acts[rank] = tuple(lst)
    return ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank, tuple(acts), al.chains,
                      al.mb_chain)


def test_the_step_is_once_per_rank_and_last():
    """A second STEP (the optimizer stepping twice) or a STEP before the last action is refused;
    a list without STEP is fine (the runtime steps after it)."""
    al = insert_comm(OneFOneB().actions(ScheduleSpec(2, 2)))
    r0 = list(al.actions[0])
    assert r0[-1].op == "STEP"
    validate_actions(_edited(al, 0, r0[:-1]), comm=True)
    with pytest.raises(ScheduleError, match="rank 0: 2 STEP actions; at most one"):
        validate_actions(_edited(al, 0, r0 + [r0[-1]]), comm=True)
    with pytest.raises(ScheduleError, match="rank 0: 1 STEP actions; at most one, as the list's last"):
        validate_actions(_edited(al, 0, [r0[-1], *r0[:-1]]), comm=True)


def test_every_replicated_stage_is_reduced_once():
    """Chimera's two model copies: a stage without its REDUCE would train apart from its replica
    (the lists still simulate, so only this rule catches it)."""
    from hexicore_plugins.schedules.chimera import Chimera

    al = insert_comm(Chimera().actions(ScheduleSpec(2, 4)))
    validate_actions(al, comm=True)
    for r in range(al.ranks):  # every REDUCE gone: the lists still simulate without deadlock
        al = _edited(al, r, [a for a in al.actions[r] if a.op != "REDUCE"])
    with pytest.raises(ScheduleError, match="stage 0 .*has 0 REDUCE actions; exactly one"):
        validate_actions(al, comm=True)
