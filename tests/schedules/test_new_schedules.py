"""The zero-bubble, V-shaped and breadth-first schedule plugins (zb_h2, zb_v, interleaved_zb,
dualpipe_v, looped_bfs): registration, hexicore's validator and torch's ``_validate_schedule`` on
the exported CSV, simulated bubbles against each docstring's closed form (1e-9), split-backward
timing per stage, and one launched job training each like one process."""

from __future__ import annotations

import csv

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.pipeline.schedule import ScheduleSpec
from hexicore.pipeline.simulate import simulate
from hexicore.pipeline.actions import save_torch_csv
from hexicore.pipeline.validate import validate_actions
from hexicore.registry import Registry
from hexicore_plugins.schedules.dualpipe_v import DualPipeV
from hexicore_plugins.schedules.interleaved_zb import InterleavedZeroBubble
from hexicore_plugins.schedules.looped_bfs import LoopedBFS
from hexicore_plugins.schedules.one_f_one_b import OneFOneB
from hexicore_plugins.schedules.zb_h1 import ZeroBubbleH1
from hexicore_plugins.schedules.zb_h2 import ZeroBubbleH2
from hexicore_plugins.schedules.zb_v import ZeroBubbleV

NEW = [ZeroBubbleH2(), ZeroBubbleV(), InterleavedZeroBubble(chunks=2), InterleavedZeroBubble(chunks=3),
       LoopedBFS(chunks=2), LoopedBFS(chunks=3), DualPipeV()]
GRID = [(P, M) for P in (2, 4, 8) for M in (P, 2 * P, 4 * P)]


def ids(s):
    return f"{s.name}{s.params() or ''}"


def fits(sched, P, M):
    return not (isinstance(sched, DualPipeV) and M < 2 * P)


def test_registered_with_their_configs():
    reg = Registry.default()
    assert {"zb_h2", "zb_v", "interleaved_zb", "dualpipe_v", "looped_bfs"} <= set(reg.names("schedule"))
    assert reg.create("schedule", "interleaved_zb", chunks=3).chunks == 3


@pytest.mark.parametrize("sched", NEW, ids=ids)
def test_grid_validates_here_and_in_torch(sched, tmp_path):
    sch = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not all(hasattr(sch, n) for n in ("_Action", "_validate_schedule")):
        pytest.skip("torch's private schedule checker changed")
    for P, M in GRID:
        if not fits(sched, P, M):
            continue
        spec = ScheduleSpec(P, M)
        validate_actions(sched.order(spec), comm=False)
        al = sched.actions(spec)
        validate_actions(al, comm=True)
        with open(save_torch_csv(al, tmp_path / "c.csv"), newline="") as f:
            order = {r: [sch._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(f))}
        s2r = sch._validate_schedule(order, P, al.stages, M)
        assert [s2r[s] for s in range(al.stages)] == list(al.stage_rank)


@pytest.mark.parametrize("sched", NEW, ids=ids)
def test_bubble_equals_closed_form(sched):
    """T_F = T_I = T_W = 1 (the spec's defaults), equal stages, free transfers: simulated bubble
    equals the docstring's formula, and ``closed_form`` (planner units) equals the makespan."""
    for P, M in GRID:
        if not fits(sched, P, M):
            continue
        spec = ScheduleSpec(P, M)
        assert spec.equal_split() == 1.0
        res = sched.simulate(spec)[1]
        want = sched.closed_bubble(spec, sched.template(P, M).schedule)
        assert want is not None and abs(res.bubble_ratio - want) <= 1e-9, (P, M, res.bubble_ratio, want)
        v = {"zb_h2": 1, "zb_v": 2, "dualpipe_v": 2}.get(sched.name, getattr(sched, "chunks", 1))
        lag = (P - 1) / v
        hand = lag / (M + lag) if sched.name == "looped_bfs" else lag / (3 * M + lag)
        assert want == pytest.approx(hand, abs=1e-12)
        assert sched.closed_form([3.0] * P, [0.0] * (P - 1), M) == pytest.approx(res.makespan, rel=1e-9)


@pytest.mark.parametrize("name,params", [("gpipe", {}), ("1f1b", {}), ("interleaved_1f1b", {"chunks": 2}),
                                         ("looped_bfs", {"chunks": 2}), ("zb_h2", {}), ("zb_v", {}),
                                         ("interleaved_zb", {"chunks": 2}), ("dualpipe_v", {})])
def test_closed_forms_hold_where_given(name, params):
    """Fewer micro-batches than ranks (and, chunked, between P and 2P): a schedule gives a closed
    bubble and makespan only where they equal the simulated ones (ZB-H2 at P = 4, M = 3 idles
    longer than ``(3M + P - 1) T``), else None."""
    for P in range(2, 7):
        for M in range(1, 2 * P + 2):
            sched = Registry.default().create("schedule", name, **params)
            spec = ScheduleSpec(P, M)
            try:
                res = sched.simulate(spec)[1]
            except HexicoreError:  # DualPipeV needs M >= 2P
                continue
            cb = sched.closed_bubble(spec, sched.order(spec).schedule)
            cf = sched.closed_form([3.0] * P, [0.0] * (P - 1), M)
            assert cb is None or cb == pytest.approx(res.bubble_ratio, abs=1e-9), (P, M, cb, res.bubble_ratio)
            assert cf is None or cf == pytest.approx(res.makespan, rel=1e-9), (P, M, cf, res.makespan)
    assert ZeroBubbleH2().closed_bubble(ScheduleSpec(4, 3), None) is None


def test_memory_as_documented():
    for P, M in GRID:
        assert max(ZeroBubbleV().peaks(P, M)) <= min(P, M) + 1e-9
        assert ZeroBubbleH2().peaks(P, M)[0] == pytest.approx(min(2 * P - 1, M))
        assert max(InterleavedZeroBubble().peaks(P, M)) <= 2 * P - 1
        assert LoopedBFS().peaks(P, M) == (float(M),) * P == LoopedBFS().peak_activations(ScheduleSpec(P, M))
        if M >= 2 * P:
            assert max(DualPipeV().peaks(P, M)) == pytest.approx(P + 0.5)


def test_dualpipe_v_refuses_too_few_micro_batches_and_beats_1f1b():
    with pytest.raises(HexicoreError, match="micro_batches >= 2 x ranks"):
        DualPipeV().order(ScheduleSpec(4, 7))
    for P, M in GRID:
        if M >= 2 * P:
            ours = DualPipeV().simulate(ScheduleSpec(P, M))[1].bubble_ratio
            assert ours < OneFOneB().simulate(ScheduleSpec(P, M))[1].bubble_ratio


def test_dualpipe_v_plans_pipelines_with_enough_micro_batches():
    """With 4 micro-batches, ``schedule=dualpipe_v`` plans pipelines of at most 2 ranks (M >= 2P)
    instead of stopping (the search and CP-SAT); a plan whose pipeline has fewer is refused
    naming ``pipelines[i].batch``."""
    from dataclasses import replace

    from hexicore.app import api
    from hexicore.core.errors import PlanError
    from hexicore.core.schedule_ref import ScheduleRef

    for solver in ("hexiscale", "cpsat"):
        plan = api.plan("paper_case", "llama2_7b", solver, schedule="dualpipe_v", overrides=["train.global_batch=4"])
        mb = plan.train.micro_batch
        assert all(p.schedule.name == "dualpipe_v" and p.n_micro_batches(mb) >= 2 * len(p.stages)
                   for p in plan.pipelines)
    deep = api.plan("paper_case", "llama2_7b", schedule="1f1b", overrides=["train.global_batch=4"])
    i = next(i for i, p in enumerate(deep.pipelines) if p.n_micro_batches(mb) < 2 * len(p.stages))
    pipes = list(deep.pipelines)
    pipes[i] = replace(pipes[i], schedule=ScheduleRef("dualpipe_v"))
    with pytest.raises(PlanError, match="needs at least") as err:
        api.evaluate(replace(deep, pipelines=tuple(pipes)))
    assert err.value.field == f"pipelines[{i}].batch"


def test_split_backward_priced_per_stage():
    """T_I and T_W are the spec's per rank (not half of T_B): a slow W on one rank costs time,
    and ZB-H2's extra memory pays where T_W is short (its paper's setting) over ZB-H1."""
    P, M = 4, 8
    base = ScheduleSpec(P, M)
    slow_w = ScheduleSpec(P, M, weight_grad=(1.0, 1.0, 3.0, 1.0))
    al = ZeroBubbleH1().order(base)
    t0 = simulate(al, base.timing(al), comm=False).makespan
    t1 = simulate(al, slow_w.timing(al), comm=False).makespan
    assert t1 >= t0 + 2 * M - 1e-9  # rank 2 does M more W-time units of 2
    short_w = ScheduleSpec(P, M, forward=(1.0,) * P, backward=(2.0,) * P, input_grad=(1.5,) * P,
                           weight_grad=(0.5,) * P)
    h1 = ZeroBubbleH1().simulate(short_w)[1].makespan
    h2 = ZeroBubbleH2().simulate(short_w)[1].makespan
    assert h2 <= h1 + 1e-9


@pytest.mark.slow
def test_runtime_trains_each_new_schedule_like_one_process():
    """One launched 3-rank job (gloo, fp32): each new schedule on 2 ranks, ZB-V with a tp=2 stage,
    DualPipeV, interleaved ZB and synth (lists for recorded uneven times) on an asymmetric plan — losses and weights equal
    ``parallel=none``'s within 1e-5."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, build_layout, reference_layout
    from tests.helpers import (DIST_GB as GB, DIST_SEQ as SEQ, DIST_TOL as TOL, DIST_WORLD as WORLD,
                               _max_abs as max_abs, _max_rel as max_rel, dist_equal_stages as equal_stages,
                               dist_pipeline as pipeline, dist_spec as spec, tiny)

    m = tiny()
    (ref,) = launch([spec(reference_layout(m, global_batch=GB, micro_batch=1, seq_len=SEQ))], 1)
    cases = [(n, {"name": n, **kw}, equal_stages(2)) for n, kw in
             (("zb_h2", {}), ("zb_v", {}), ("interleaved_zb", {"chunks": 2}), ("dualpipe_v", {}),
              ("looped_bfs", {"chunks": 2}))]
    half = m.layers // 2
    cases.append(("zb_v, stage 0 with tp=2", {"name": "zb_v"}, [StageGroup((0, 1), half), StageGroup((2,), half)]))
    asym = [StageGroup((2,), m.layers - 3), StageGroup((0,), 3)]
    cases.append(("dualpipe_v asymmetric", {"name": "dualpipe_v"}, asym))
    cases.append(("interleaved_zb asymmetric", {"name": "interleaved_zb", "chunks": 2}, asym))
    cases.append(("synth for uneven times, asymmetric", {"name": "synth", "stage_times": [2.0, 0.9], "hop_times": [0.1]},
                  asym))
    specs = [spec(build_layout(m, [pipeline(s, groups)], global_batch=GB, micro_batch=1, seq_len=SEQ, world=WORLD))
             for _, s, groups in cases]
    report = []
    for (name, _, _), got in zip(cases, launch(specs, WORLD)):
        rel = max_rel(got["metrics"]["losses"], ref["metrics"]["losses"])
        w = max_abs(got["state"], ref["state"])
        report.append(f"{name:30s} loss rel {rel:.1e}  weights abs {w:.1e}")
        assert rel <= TOL and w <= TOL, report[-1]
    print("\n".join(report))
