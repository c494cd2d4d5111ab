"""The comm pass (hexicore.pipeline.comm) against its rules written out plainly: every schedule,
shuffled compute orders (early receives) and damaged lists (missing inputs, repeated or moved
actions) give exactly the reference's lists or its error."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from hexicore.core.errors import ScheduleError
from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.comm import insert_comm
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore_plugins.schedules.chimera import Chimera
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1

SCHEDULES = [GPipe(), OneFOneB(), Interleaved1F1B(chunks=3), Chimera(), Hanayo(waves=1), Hanayo(waves=3),
             ZeroBubbleH1()]


def reference(al: ActionList) -> ActionList:
    """The module's rules, one action at a time: a SEND right after each F (B, I) whose next
    (previous) stage on the micro-batch's chain is on another rank; then, per receiver, before
    each consumer every message of its link up to the latest copy of the one it needs."""
    base = al.compute_only()
    s2r, nb = base.stage_rank, {}
    for c, chain in enumerate(base.chains):
        for i, s in enumerate(chain):
            nb["F", c, s] = chain[i + 1] if i + 1 < len(chain) else None  # where F's output goes
            nb["B", c, s] = chain[i - 1] if i else None  # where B's input gradient goes

    def kind(a: Action) -> str | None:
        ok = a.op in ("F", "B", "I") and a.mb is not None and 0 <= a.mb < base.micro_batches
        return None if not ok else "F" if a.op == "F" else "B"

    sent, with_sends = defaultdict(list), []
    for r, acts in enumerate(base.actions):
        row = []
        for a in acts:
            row.append(a)
            k = kind(a)
            to = nb.get((k, base.mb_chain[a.mb], a.stage)) if k else None
            if to is not None and s2r[to] != r:
                row.append(Action("SEND_" + k, a.stage, a.mb, s2r[to]))
                sent[r, s2r[to]].append((k, to, a.mb))
        with_sends.append(row)
    last = {link: {m: i for i, m in enumerate(msgs)} for link, msgs in sent.items()}
    taken, out = defaultdict(int), []
    for r, acts in enumerate(with_sends):
        row = []
        for a in acts:
            k = kind(a)
            src = nb.get(("B" if k == "F" else "F", base.mb_chain[a.mb], a.stage)) if k else None
            if src is not None and s2r[src] != r:
                link = (s2r[src], r)
                i = last.get(link, {}).get((k, a.stage, a.mb))
                if i is None:
                    raise ScheduleError(f"rank {r}, action {a}: rank {s2r[src]} never produces its input {src}{k}{a.mb}")
                while taken[link] <= i:
                    k2, st, mb = sent[link][taken[link]]
                    row.append(Action("RECV_" + k2, st, mb, link[0]))
                    taken[link] += 1
            row.append(a)
        out.append(tuple(row))
    return ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, tuple(out),
                      base.chains, base.mb_chain, dict(base.meta))


def outcome(fn, al: ActionList):
    try:
        return fn(al)
    except ScheduleError as exc:
        return f"error: {exc.message}"


def relist(al: ActionList, rows) -> ActionList:
    return ActionList(al.schedule, al.ranks, al.stages, al.micro_batches, al.stage_rank, tuple(map(tuple, rows)),
                      al.chains, al.mb_chain)


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_schedules_and_shuffled_orders(sched):
    rng = random.Random(11)
    for P in (2, 3, 5):
        for M in (1, 2, 7, 12):
            al = sched.order(ScheduleSpec(P, M))
            assert insert_comm(al) == reference(al), (P, M)
            for _ in range(3):  # any order of each rank's compute: early receives where needed
                rows = [list(acts) for acts in al.actions]
                for row in rows:
                    body = row[:-1]
                    rng.shuffle(body)
                    row[:-1] = body
                shuffled = relist(al, rows)
                assert outcome(insert_comm, shuffled) == outcome(reference, shuffled), (P, M)


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}{s.params()}")
def test_damaged_lists(sched):
    """Dropped, repeated, re-staged or re-batched actions: the same lists, or the same error."""
    rng = random.Random(5)
    errors = 0
    for P, M in ((2, 2), (3, 5), (4, 5)):
        al = sched.order(ScheduleSpec(P, M))
        for _ in range(30):
            rows = [list(acts) for acts in al.actions]
            for _ in range(rng.randint(1, 3)):
                row = rows[rng.randrange(P)]
                i = rng.randrange(len(row) - 1)
                a, how = row[i], rng.randrange(4)
                if how == 0:
                    del row[i]
                elif how == 1:
                    row.insert(rng.randrange(len(row)), a)
                elif how == 2 and a.mb is not None:
                    row[i] = Action(a.op, rng.randrange(al.stages), a.mb)
                elif how == 3 and a.mb is not None:
                    row[i] = Action(a.op, a.stage, rng.randrange(M))
            damaged = relist(al, rows)
            got, want = outcome(insert_comm, damaged), outcome(reference, damaged)
            assert got == want
            errors += isinstance(want, str)
    assert errors  # some damage leaves an input that no rank sends


def test_missing_input_names_the_consumer():
    al = ActionList({}, 2, 2, 1, (0, 1), ((Action("B", 0, 0),), (Action("F", 1, 0), Action("B", 1, 0))))
    with pytest.raises(ScheduleError, match=r"rank 1, action 1F0: rank 0 never produces its input 0F0"):
        insert_comm(al)


def test_result_sizes_follow_fast():
    big = Hanayo(waves=4).order(ScheduleSpec(8, 200))
    assert big.n_actions >= 20_000 and not insert_comm(big).has_objects()
    assert insert_comm(big, fast=False).has_objects()
    assert insert_comm(OneFOneB().order(ScheduleSpec(2, 2))).has_objects()
