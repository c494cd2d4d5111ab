"""Plans the planner writes are plans the runtime runs: a schedule running ``k`` chunks on a rank
cuts that rank's blocks among them, so every stage gets ``k`` layers at least (Hanayo's 2W, the
V schedules' two, interleaved chunks), and a pipeline too short for its schedule runs the
schedule's fallback, as priced (a one-rank Hanayo pipeline: 1F1B)."""

from __future__ import annotations

import pytest

import hexicore
from hexicore.planner.pricing import ScheduleBook
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout

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


FFN_100 = ("name: ffn100\nlayers: {layers}\nhidden: {hidden}\nheads: {heads}\nkv_heads: {heads}\nffn: 100\n"
           "vocab: 256\nseq_len: 32\n")


@pytest.mark.parametrize("solver, heads, gpus", [("megatron", 6, 3), ("metis_like", 6, 3), ("galvatron_like", 6, 3),
                                                 ("hexiscale", 8, 8)])
def test_tp_degrees_divide_the_ffn_width_as_the_runtime_needs(solver, heads, gpus, tmp_path):
    """TP 3 (of 6 heads) or 8 (of 8) does not divide the FFN width 100: the runtime refuses such a
    stage, so no solver may write one (with one micro-batch the symmetric solvers' only layout of
    3 devices and 2 layers was TP 3; hexiscale chose TP 8 for one layer on 8 GPUs; the solvers'
    TP menus checked the heads only)."""
    layers = 1 if solver == "hexiscale" else 2
    (tmp_path / "m.yaml").write_text(FFN_100.format(layers=layers, hidden=16 * heads, heads=heads))
    (tmp_path / "c.yaml").write_text(f"name: one\nmachines:\n  - {{name: A, gpu: h100-80g, count: {gpus}, "
                                     "bandwidth_gbs: 450, latency_us: 5}\n")
    extra = ["solver.use_all_devices=true"] if solver == "hexiscale" else []
    plan = hexicore.plan(solver=solver, model_file=tmp_path / "m.yaml", cluster_file=tmp_path / "c.yaml",
                         overrides=["train.global_batch=1", *extra])
    assert all(plan.model.ffn % s.tp == 0 for p in plan.pipelines for s in p.stages)
    plan_layout(plan, [dict(p.schedule) for p in plan.pipelines], registry=Registry.default(),
                seq_len=plan.train.seq_len)


def test_cpsat_tp_menu_divides_the_ffn_width():
    from hexicore.core.model import ModelSpec
    from hexicore_plugins.solvers.cpsat.tables import tp_degrees

    class Problem:  # tp_degrees reads only the model
        model = ModelSpec("m", 1, 128, 8, 8, 100, 256, 32)

    assert tp_degrees(Problem(), 8) == [1, 2, 4]


def test_a_schedule_with_more_chunks_than_the_model_has_blocks_is_named_not_memory(tmp_path):
    """Two blocks under looped BFS with three chunks a rank: no depth gives every chunk a block;
    the no-plan line says so instead of blaming the (tiny) training state."""
    from hexicore.core.errors import HexicoreError

    (tmp_path / "m.yaml").write_text("{name: two, layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 128, seq_len: 16}\n")
    with pytest.raises(HexicoreError) as e:
        hexicore.plan(cluster="tight8", model_file=tmp_path / "m.yaml",
                      overrides=["schedule=looped_bfs", "schedule.chunks=3", "train.global_batch=8"])
    assert "needs 3 blocks on its shortest pipeline, and the model has 2" in str(e.value)
    assert "training state" not in str(e.value)
    plan = hexicore.plan(cluster="tight8", model_file=tmp_path / "m.yaml",
                         overrides=["schedule=looped_bfs", "schedule.chunks=2", "train.global_batch=8"])
    assert all(s.n_layers >= 2 for p in plan.pipelines for s in p.stages)
