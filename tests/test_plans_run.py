"""Plans the planner writes are plans the runtime runs: a schedule running ``k`` chunks on a rank
cuts that rank's blocks among them, so every stage gets ``k`` layers at least (Hanayo's 2W, the
V schedules' two, interleaved chunks), and a pipeline too short for its schedule runs the
schedule's fallback, as priced (a one-rank Hanayo pipeline: 1F1B)."""

from __future__ import annotations

import pytest

import hexicore
from hexicore.planner.pricing import ScheduleBook
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.layout import plan_layout

CLUSTER = """name: uneven
inter: {bandwidth_gbs: 1.5, latency_us: 60}
machines:
  - {name: A, gpu: rtx3090, count: 1, bandwidth_gbs: 16, latency_us: 10}
  - {name: B, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}
  - {name: C, gpu: slow, count: 1, bandwidth_gbs: 8, latency_us: 10}
gpus: {slow: {tflops: 50, memory_gb: 12}}
"""


@pytest.mark.parametrize("solver, schedule", [("hexiscale", "hanayo"), ("hexiscale", "zb_v"),
                                              ("megatron", "interleaved_1f1b"), ("metis_like", "hanayo"),
                                              ("galvatron_like", "zb_v")])
def test_every_stage_holds_a_layer_per_chunk_and_the_runtime_takes_the_plan(solver, schedule, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CLUSTER)
    plan = hexicore.plan(model="tiny", solver=solver, overrides=[f"cluster_file={f}", f"schedule={schedule}",
                                                                 "train.global_batch=8", "solver.use_all_devices=true"]
                         if solver == "hexiscale" else [f"cluster_file={f}", f"schedule={schedule}",
                                                        "train.global_batch=8"])
    reg = Registry.default()
    book = ScheduleBook(reg)
    for p in plan.pipelines:
        least = book.least(p.schedule, len(p.stages))
        assert all(s.n_layers >= k for s, k in zip(p.stages, least)), (p.schedule, [s.layers for s in p.stages])
    layout = plan_layout(plan, [dict(p.schedule) for p in plan.pipelines], registry=reg, seq_len=plan.train.seq_len)
    assert layout.world == len(plan.devices)
