"""Export to torch.distributed.pipelining's CSV and pass torch's own checker.

torch's helpers are private (torch 2.13: ``_validate_schedule``, ``_add_send_recv``,
``_simulate_comms_compute``): the test pins nothing but skips if they are gone."""

from __future__ import annotations

import pytest

from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.actions import load_torch_csv, save_torch_csv
from hexicore.pipeline.validate import validate_actions
from hexicore_plugins.schedules.gpipe import GPipe
from hexicore_plugins.schedules.hanayo import Hanayo
from hexicore_plugins.schedules.interleaved import Interleaved1F1B
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1

SINGLE_CHAIN = [GPipe(), OneFOneB(), Interleaved1F1B(chunks=2), Hanayo(waves=1), Hanayo(waves=2), ZeroBubbleH1()]


@pytest.mark.parametrize("sched", SINGLE_CHAIN, ids=lambda s: f"{s.name}{s.params()}")
def test_round_trip(sched, tmp_path):
    al = sched.actions(ScheduleSpec(3, 4))
    for comms in (False, True):
        back = load_torch_csv(save_torch_csv(al, tmp_path / "o.csv", comms=comms))
        assert back.stage_rank == al.stage_rank and back.micro_batches == 4
        want = [[a for a in acts if a.op != "STEP" and (comms or not a.is_comm)] for acts in al.actions]
        assert [list(x) for x in back.actions] == want
        validate_actions(back)
        assert simulate(back).makespan == pytest.approx(simulate(al).makespan)


@pytest.mark.parametrize("sched", SINGLE_CHAIN, ids=lambda s: f"{s.name}{s.params()}")
def test_torch_accepts_our_schedules(sched, tmp_path):
    sch = pytest.importorskip("torch.distributed.pipelining.schedules")
    need = ("_Action", "_validate_schedule", "_add_send_recv", "_simulate_comms_compute")
    if not all(hasattr(sch, n) for n in need):
        pytest.skip("torch's private schedule checker changed")
    import csv

    for P, M in ((2, 3), (4, 4), (4, 8)):
        al = sched.actions(ScheduleSpec(P, M))
        path = save_torch_csv(al, tmp_path / "c.csv")
        with open(path, newline="") as f:
            order = {r: [sch._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(f))}
        s2r = sch._validate_schedule(order, P, al.stages, M)
        assert [s2r[s] for s in range(al.stages)] == list(al.stage_rank)
        comms = sch._add_send_recv({r: list(a) for r, a in order.items()}, lambda s: al.stage_rank[s], al.stages)
        sch._simulate_comms_compute(comms, lambda s: al.stage_rank[s], al.stages)
