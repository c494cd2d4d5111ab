"""torch runtime on real processes (gloo, CPU, fp32, tiny model): every schedule trains exactly
like ``parallel=none``; checkpoints resume across layouts; a dead or hung rank fails the run fast.

Each launch costs ~5 s (mostly importing torch per process), so one launched job runs every
schedule configuration in sequence on one 3-rank process group (ranks a configuration does not
use sit idle)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hexicore.pipeline.actions import Action, ActionList  # noqa: E402
from hexicore_plugins.runtimes.torch.launch.launcher import LaunchError, launch  # noqa: E402
from hexicore_plugins.runtimes.torch.parallel.assignment import (StageGroup, build_layout, reference_layout,  # noqa: E402
                                                    )
from safetensors.torch import load_file  # noqa: E402
from tests.conftest import run_cli
from tests.helpers import _max_abs as max_abs, _max_rel as max_rel, tiny, worker_spec
from tests.helpers import (DIST_GB as GB, DIST_SEQ as SEQ, DIST_WORLD as WORLD, DIST_TOL as TOL, dist_spec as spec,
                           dist_pipeline as pipeline, dist_equal_stages as equal_stages)


pytestmark = pytest.mark.slow

CONF = Path(__file__).resolve().parents[2] / "conf"



def out_of_order_gpipe(M: int) -> ActionList:
    """GPipe on 2 ranks whose rank 1 posts its receives last-micro-batch first (gloo matches by tag)."""
    r0 = [x for m in range(M) for x in (Action("F", 0, m), Action("SEND_F", 0, m, 1))]
    r0 += [x for m in range(M) for x in (Action("RECV_B", 0, m, 1), Action("B", 0, m))] + [Action("STEP")]
    r1 = [Action("RECV_F", 1, m, 0) for m in reversed(range(M))]
    r1 += [x for m in range(M) for x in (Action("F", 1, m), Action("B", 1, m), Action("SEND_B", 1, m, 0))]
    return ActionList({"name": "hand"}, 2, 2, M, (0, 1), (tuple(r0), tuple(r1) + (Action("STEP"),)))


CASES = {
    "gpipe P=2": ({"name": "gpipe"}, 2),
    "1f1b P=3": ({"name": "1f1b"}, 3),
    "interleaved_1f1b P=2 v=2": ({"name": "interleaved_1f1b", "chunks": 2}, 2),
    "chimera P=2": ({"name": "chimera"}, 2),
    "chimera P=3": ({"name": "chimera"}, 3),
    "hanayo P=3 W=1": ({"name": "hanayo", "waves": 1}, 3),
    "hanayo P=2 W=2": ({"name": "hanayo", "waves": 2}, 2),
    "zb_h1 P=3 (I/W split)": ({"name": "zb_h1"}, 3),
}




def test_every_schedule_tp_dp_and_resume_match_single_process(tmp_path):
    """One 3-rank job: each schedule, TP inside a stage, DP over 3 pipelines, and a checkpoint
    written under interleaved 1F1B resumed under Chimera — all equal to ``parallel=none``."""
    m = tiny()
    ref_layout = reference_layout(m, global_batch=GB, micro_batch=1, seq_len=SEQ)
    ref, ref4 = launch([spec(ref_layout), spec(ref_layout, steps=4)], 1)
    names, specs = [], []
    for name, (schedule, ranks) in CASES.items():
        layout = build_layout(m, [pipeline(schedule, equal_stages(ranks))], global_batch=GB, micro_batch=1,
                              seq_len=SEQ, world=WORLD)
        names.append(name)
        specs.append(spec(layout))
    names.append("1f1b P=2, stage 0 with tp=2")
    specs.append(spec(build_layout(m, [pipeline({"name": "1f1b"}, [StageGroup((0, 1), 4), StageGroup((2,), 4)])],
                                   global_batch=GB, micro_batch=1, seq_len=SEQ)))
    names.append("hanayo P=2 W=1, tp=2 stage, recompute")
    specs.append(spec(build_layout(m, [pipeline({"name": "hanayo", "waves": 1},
                                                [StageGroup((2,), 5), StageGroup((0, 1), 3)])],
                                   global_batch=GB, micro_batch=1, seq_len=SEQ), recompute=True))
    names.append("dp=3 pipelines x 1 stage")
    specs.append(spec(build_layout(m, [pipeline({"name": "1f1b"}, [StageGroup((i,), 8)], batch=2) for i in range(3)],
                                   global_batch=GB, micro_batch=1, seq_len=SEQ)))
    names.append("hand-written, receives out of order (tags)")
    specs.append(spec(build_layout(m, [(GB, equal_stages(2), out_of_order_gpipe(GB))], global_batch=GB, micro_batch=1,
                                   seq_len=SEQ, world=WORLD)))
    a, b = tmp_path / "a", tmp_path / "b"
    inter = build_layout(m, [pipeline({"name": "interleaved_1f1b", "chunks": 2}, equal_stages(3))],
                         global_batch=GB, micro_batch=1, seq_len=SEQ)
    chim = build_layout(m, [pipeline({"name": "chimera"}, equal_stages(2))], global_batch=GB, micro_batch=1,
                        seq_len=SEQ, world=WORLD)
    specs.append(spec(inter, steps=4, checkpoint_every=2, out=str(a)))
    specs.append(spec(chim, steps=4, out=str(b), resume=str(a / "checkpoints" / "step_2")))
    results = launch(specs, WORLD)
    report = []
    for name, got in zip(names + ["interleaved P=3 v=2, 4 steps", "chimera P=2 resumed after step 2"], results):
        r = ref4 if got["metrics"]["losses"].__len__() == 4 else ref
        rel = max_rel(got["metrics"]["losses"], r["metrics"]["losses"])
        w = max_abs(got["state"], r["state"])
        report.append(f"{name:44s} loss rel {rel:.1e}  weights abs {w:.1e}")
        assert rel <= TOL and w <= TOL, report[-1]
    print("\n".join(report))
    assert json.loads((b / "metrics.json").read_text())["losses"][:2] == results[-2]["metrics"]["losses"][:2]
    assert load_file(b / "final" / "model.safetensors").keys() == ref4["state"].keys()


def cli(args, capsys):
    return run_cli(["train", *args]), capsys.readouterr()


TRAIN = ["model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=4", "train.steps=4",
         "seed=2", "runtime.progress=false"]


def test_cli_under_torchrun_then_parallel_none_resumes_its_checkpoint(tmp_path, capsys):
    """The ``hexicore train`` entry point run by torchrun (as on several machines: each rank is a
    worker, no second launch) writes metrics.json, final/ and a checkpoint; the single-process
    reference resumed from that checkpoint ends where the pipeline ended. (``hexicore train`` launching its
    own workers through ``elastic_launch`` is the path of every other test here.)"""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    script = Path(sys.executable).with_name("hexicore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), "train",
           *TRAIN, "schedule=hanayo", "schedule.waves=1", "pipeline.ranks=2", "train.checkpoint_every=2", f"out={a}",
           f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "trained 4 steps (hanayo, 2 ranks)" in run.stdout
    assert sorted(x.name for x in (a / "checkpoints").iterdir()) == ["step_2", "step_4"]  # the last step too
    code, io = cli([*TRAIN, "parallel=none", f"out={b}", f"resume={a / 'checkpoints' / 'step_2'}"], capsys)
    assert code == 0, io.err
    code, io = cli([*TRAIN, "parallel=none", f"out={c}"], capsys)
    assert code == 0, io.err
    la, lb, lc = (json.loads((d / "metrics.json").read_text()) for d in (a, b, c))
    assert la["ranks"] == 2 and la["schedule"] == "hanayo" and la["plan"] is None and lc["ranks"] == 1
    assert max_rel(la["losses"], lc["losses"]) <= TOL and max_rel(lb["losses"], lc["losses"]) <= TOL
    fa, fb, fc = (load_file(d / "final" / "model.safetensors") for d in (a, b, c))
    assert max_abs(fa, fc) <= TOL and max_abs(fb, fc) <= TOL


@pytest.mark.parametrize("kind", ["die", "hang"])
def test_dead_or_hung_rank_stops_every_rank_within_the_timeout(kind):
    m = tiny()
    layout = build_layout(m, [pipeline({"name": "1f1b"}, equal_stages(2), batch=4)], global_batch=4, micro_batch=1,
                          seq_len=SEQ)
    t0 = time.perf_counter()
    with pytest.raises(LaunchError) as err:
        launch([worker_spec(layout, steps=3, dtype="fp32", recompute=False, progress=False, timeout_s=2,
                            fault={"rank": 1, "step": 1, "kind": kind})], 2)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2 + 60, elapsed  # start-up of two ranks alone takes ~20 s on a loaded 2-core host
    if kind == "die":
        assert "rank 1 exited with code 13" in str(err.value)
    else:  # rank 0 gives up waiting for the hung rank 1 and says so
        assert "rank 0:" in str(err.value) and "timed out after 2 s" in str(err.value) and "rank 1" in str(err.value)


@pytest.mark.slow
def test_forkserver_workers_report_to_their_own_launch_launch_after_launch():
    """``runtime.start_method=forkserver`` forks every worker from one server, started with the
    first launch: a later launch's workers report to that launch's errors folder (the rank that
    died is named; before, every worker of the second launch failed writing to the first
    launch's folder, removed since, and the line named no cause)."""
    m = tiny()
    layout = build_layout(m, [pipeline({"name": "1f1b"}, equal_stages(2), batch=4)], global_batch=4, micro_batch=1,
                          seq_len=SEQ)
    first = launch([worker_spec(layout, steps=1, dtype="fp32", recompute=False, progress=False,
                                start_method="forkserver")], 2)
    assert first and first[0] is not None
    with pytest.raises(LaunchError) as err:
        launch([worker_spec(layout, steps=3, dtype="fp32", recompute=False, progress=False, timeout_s=2,
                            start_method="forkserver", fault={"rank": 1, "step": 1, "kind": "die"})], 2)
    line = str(err.value)  # whichever rank's end the server reports first: rank 1's exit, or rank 0 losing it
    assert "rank 1 exited with code 13" in line or "from rank 1 (did that rank die?)" in line, line
