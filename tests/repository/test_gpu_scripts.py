"""The prepared GPU session (bench/gpu_calibrate.py, which runs bench/gpu_loop.py twice) on CPU,
its documented smoke test: the calibration row, then profile -> plan cost=profiled -> train at
micro-batch 1 (eager, then each block compiled), and again from the same profile at micro-batch 2
with recomputation, each with predicted and measured step time and peak memory. A GPU session
gets one try at it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_gpu_calibrate_runs_both_loops_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("gpu_calibrate", "gpu_loop"):  # imported afresh, and dropped again after the test
        monkeypatch.delitem(sys.modules, name, raising=False)
    cal = importlib.import_module("gpu_calibrate")
    monkeypatch.setattr(cal, "OUT", tmp_path)
    code = cal.main(["--device", "cpu", "--model", "tiny", "--layers", "2", "--steps", "2", "--seq-len", "64",
                     "--out", str(tmp_path / "cal")])
    assert code == 0, capsys.readouterr()
    (row,) = json.loads((tmp_path / "cal.json").read_text())
    assert row["attention"] == "sdpa" and row["achieved_tflops"] > 0
    for name, mb, recompute in (("gpu_loop", 1, False), ("gpu_loop_mb2_recompute", 2, True)):
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert not rec.get("errors"), rec.get("errors")
        assert (rec["micro_batch"], rec["recompute"], rec["planned_with"]) == (mb, recompute, "cost=profiled")
        for side in ("predicted", "measured"):
            assert rec[side]["step_s"] > 0 and rec[side]["peak_memory_gb"][0] > 0
        assert rec["analytic"]["iteration_s"] > 0 and rec["profiled"]["iteration_s"] > 0
        # the first loop trains once more with each block compiled (tokens/s, MFU eager and compiled)
        assert (rec.get("compiled", {}).get("measured_step_s", 0) > 0) == (name == "gpu_loop")
    assert not (tmp_path / "gpu_loop_mb2_recompute" / "profile.yaml").exists()  # the first loop's profile, reused
