"""The chain rule (hexicore.pipeline.chains): previous / next stage of a stage on a chain."""

from __future__ import annotations

import pytest

from hexicore.core.errors import ScheduleError
from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.chains import ChainLinks


def test_neighbours_positions_and_tables():
    links = ChainLinks.of([(0, 1, 2, 3), (7, 6, 5, 4)], 8)  # Chimera-like: two directions
    assert links.next_stage(0, 1) == 2 and links.prev_stage(0, 1) == 0
    assert links.next_stage(0, 3) is None and links.prev_stage(0, 0) is None
    assert links.next_stage(1, 7) == 6 and links.prev_stage(1, 4) == 5
    assert links.next_stage(0, 5) is None and not links.on(0, 5) and links.on(1, 5)  # off the chain
    assert links.next_stage(0, 99) is None and links.prev_stage(0, -1) is None
    assert links.position(6) == links.position(1) == 1  # replicas sit at the same position
    prev, nxt = links.tables()
    assert prev.shape == (2, 8) and prev[1, 6] == 7 and nxt[0, 0] == 1 and nxt[1, 4] == -1
    p, n, c = links.per_stage()
    assert p.tolist() == [-1, 0, 1, 2, 5, 6, 7, -1] and n.tolist() == [1, 2, 3, -1, -1, 4, 5, 6]
    assert c.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ChainLinks.of([(0, 1)]).lists() == ([[None, 0]], [[1, None]])


def test_a_stage_on_two_chains_has_no_per_stage_view():
    links = ChainLinks.of([(0, 1), (1, 0)])
    assert links.per_stage() is None
    assert links.next_stage(0, 0) == 1 and links.next_stage(1, 0) is None


def test_out_of_range_chain_is_an_error():
    with pytest.raises(ScheduleError, match="chain 0: stage 5 is out of range"):
        ChainLinks.of([(0, 5)], 2)


def test_action_list_reads_the_rule():
    al = ActionList({}, 2, 4, 2, (0, 1, 1, 0), ((Action("STEP"),), (Action("STEP"),)), ((0, 1), (2, 3)), (0, 1))
    assert al.next_stage(0, 0) == 1 and al.prev_stage(1, 0) == 0
    assert al.next_stage(2, 1) == 3 and al.next_stage(3, 1) is None and al.prev_stage(2, 1) is None
