"""``hexicore profile``: the cluster's own devices measured through the torch runtime, emulated
slowdowns included, written as a ``hexicore.profile/2`` file that ``cost=profiled`` plans from."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from hexicore.core.cluster import Cluster
from hexicore.core.model import ModelSpec
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import Profile
from hexicore.cost.profiled import ProfiledCostModel

CLUSTER = """name: emu2
gpus:
  fastgpu: {tflops: 50, memory_gb: 16}
  slowgpu: {tflops: 50, memory_gb: 16}
inter: {bandwidth_gbs: 1.0, latency_us: 50}
machines:
  - {name: F, gpu: fastgpu, count: 1, bandwidth_gbs: 10.0}
  - {name: S, gpu: slowgpu, count: 1, bandwidth_gbs: 10.0, emulate: {slowdown: 3}}
"""
MODEL = "name: small\nlayers: 4\nhidden: 192\nheads: 4\nkv_heads: 2\nffn: 512\nvocab: 256\nseq_len: 64\n"


def test_link_fit_recovers_latency_and_bandwidth():
    from hexicore_plugins.runtimes.torch.profile.profiler import fit_link

    pts = [(b, 2e-5 + b / 3e9) for b in (4096, 65536, 1 << 20)]
    lat, bw = fit_link(pts)
    assert lat == pytest.approx(2e-5, rel=1e-6) and bw == pytest.approx(3.0, rel=1e-6)


def test_tasks_cover_types_tp_groups_links_and_allreduce():
    """One block per (type, TP, micro-batch) the cluster can form; a link per machine and pair."""
    from hexicore_plugins.runtimes.torch.profile.profiler import ProfileJob, tasks

    devs = (("A.0", "A", "x", 1.0), ("A.1", "A", "x", 1.0), ("B.0", "B", "y", 2.0))
    model = ModelSpec.from_dict(dict(name="m", layers=2, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=256, seq_len=32))
    job = ProfileJob(devs, model, (1, 2), (1, 2), 32, "fp32", False, 1, (64, 4096), (2, 4), 4096)
    got = tasks(job)
    blocks = {(t.subject, t.group, t.micro_batch): t.ranks for t in got if t.kind == "block"}
    assert blocks == {("A.0", 1, 1): (0,), ("A.0", 1, 2): (0,), ("A.0", 2, 1): (0, 1), ("A.0", 2, 2): (0, 1),
                      ("B.0", 1, 1): (2,), ("B.0", 1, 2): (2,)}  # type y has one device: no TP 2
    assert len({t.batch for t in got}) == len(got)  # one measurement at a time
    assert [(t.between, t.ranks) for t in got if t.kind == "p2p"] == [(("A", "A"), (0, 1)), (("A", "B"), (0, 2))]
    assert [(t.between, t.ranks) for t in got if t.kind == "allreduce"] == [(("A", "A"), (0, 1)), (("A", "B"), (0, 2))]
    every = tasks(ProfileJob(devs, model, (1,), (1,), 32, "fp32", True, 1, (64,), (2,), 64))
    assert {t.subject for t in every if t.kind == "head"} == {"A.0", "A.1", "B.0"}
    # concurrent: every device at once, per (TP, micro-batch), TP groups disjoint
    conc = tasks(ProfileJob(devs, model, (1,), (1, 2), 32, "fp32", False, 1, (64,), (2,), 64, concurrent=True))
    by_batch: dict = {}
    for t in conc:
        if t.kind in ("block", "head"):
            by_batch.setdefault(t.batch, []).append((t.kind, t.group, t.ranks))
    assert sorted(by_batch.values()) == [[("block", 1, (0,)), ("block", 1, (1,)), ("block", 1, (2,))],
                                         [("block", 2, (0, 1))],
                                         [("head", 0, (0,)), ("head", 0, (1,)), ("head", 0, (2,))]]


@pytest.mark.slow
def test_profile_an_emulated_cluster_then_plan_from_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "m.yaml").write_text(MODEL)
    out = tmp_path / "profile.yaml"
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                    "train.dtype=fp32", "profile.micro_batches=[1,2]", "profile.repeats=7",
                    "profile.statistic=min",
                    "profile.link_bytes=[4096,65536,1048576]", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    assert "forward ms" in capsys.readouterr().out
    prof = Profile.load(out)
    assert set(prof.devices) == {"fastgpu", "slowgpu"}
    assert prof.environment["dtype"] == "fp32" and prof.environment["backend"] == "gloo"
    total = {n: sum(b.forward_s + b.backward_s + b.recompute_s for b in d.blocks) for n, d in prof.devices.items()}
    assert total["slowgpu"] > 2 * total["fastgpu"], total  # slowdown 3, generous margin
    opt = {n: d.blocks[0].optimizer_s for n, d in prof.devices.items()}  # the optimizer step is stretched too
    assert opt["fastgpu"] > 0 and opt["slowgpu"] > 2 * opt["fastgpu"], opt
    for dev in prof.devices.values():
        assert [(b.micro_batch, b.tp) for b in dev.blocks] == [(1, 1), (2, 1)] and dev.head is not None
        assert dev.blocks[1].activation_bytes == pytest.approx(2 * dev.blocks[0].activation_bytes, rel=0.01)
    ln = prof.link("F", "S")
    assert ln is not None and ln.bandwidth_gbs > 0 and [a.group for a in prof.allreduce] == [2]
    # the profiled cost model prices the slowed device slower, though the catalog says they are equal
    cluster, model = Cluster.load(tmp_path / "c.yaml"), ModelSpec.load(tmp_path / "m.yaml")
    cost = ProfiledCostModel(profile=prof)
    train = TrainSettings(global_batch=4, micro_batch=1, seq_len=64, recompute=False)
    assert cost.compute_s(cluster, model, train, ["S.0"], 2) > 2 * cost.compute_s(cluster, model, train, ["F.0"], 2)
    # /2: heads and embeddings per micro-batch, link points per size, the per-step overhead, written
    # and read back; the cost model prices the ends and the hops from the file's own entries
    assert prof.step_overhead_s > 0 and out.read_text().startswith("format: hexicore.profile/2")
    for dev in prof.devices.values():
        assert [(h.micro_batch, h.tp) for h in dev.heads] == [(1, 1), (2, 1)] == \
            [(e.micro_batch, e.tp) for e in dev.embeddings]
        assert dev.heads[1].activation_bytes == pytest.approx(2 * dev.heads[0].activation_bytes, rel=0.01)
    assert [b for b, _ in ln.points] == [4096, 65536, 1048576]
    assert cost.message_s(cluster, "F.0", "S.0", 65536) == ln.points[1][1]
    head = prof.devices["fastgpu"].heads[0]
    assert cost.head_s(cluster, model, train, ["F.0"]) == pytest.approx(head.forward_s + head.backward_s)
    emb = prof.devices["fastgpu"].embeddings[0]
    assert cost.embedding_s(cluster, model, train, ["F.0"]) == pytest.approx(emb.forward_s + emb.backward_s)
    # and plans from the file; a second profile run may replace the file, a plan file may not be replaced
    code = run_cli(["plan", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                    "cost=profiled", f"cost.profile_file={out}", "train.global_batch=4", "train.dtype=fp32",
                    f"out={tmp_path / 'plan.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "plan.json").read_text())["format"].startswith("hexicore.plan")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                    f"out={tmp_path / 'plan.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 2 and "refusing" in capsys.readouterr().err


@pytest.mark.parametrize("override, field", [
    ("profile.repeats=100000000", "profile.repeats"),
    ("profile.link_bytes=[4096,100000000000000]", "profile.link_bytes[1]"),
    ("profile.micro_batches=[100000000000]", "profile.micro_batches[0]"),
    ("profile.allreduce_bytes=100000000000", "profile.allreduce_bytes"),
    # longer than the model's positions (plan, evaluate and train refuse it; profile timed it)
    ("profile.seq_len=64 +model.max_position=32", "profile.seq_len"),
    ("train.seq_len=64 +model.max_position=32", "train.seq_len"),
])
def test_absurd_profile_sizes_are_refused_before_any_process(tmp_path, capsys, override, field):
    (tmp_path / "c.yaml").write_text("name: c\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", *override.split(),
                    f"out={tmp_path / 'p.yaml'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{field}:" in err[0] and ("limit" in err[0] or "max_position" in err[0])
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("groups, field", [("[3]", "profile.allreduce_groups[0]"),
                                           ("[2,4]", "profile.allreduce_groups[1]")])
def test_allreduce_groups_larger_than_the_cluster_are_refused(tmp_path, capsys, groups, field):
    (tmp_path / "c.yaml").write_text("name: c\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", f"profile.allreduce_groups={groups}",
                    f"out={tmp_path / 'p.yaml'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{field}:" in err[0] and "at most 2 devices" in err[0], err
    assert not (tmp_path / "p.yaml").exists()


def test_default_allreduce_groups_are_trimmed_to_the_cluster(tmp_path):
    import hexicore
    from hexicore.app.commands.profile import request_from_config

    (tmp_path / "c.yaml").write_text("name: c\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\nmachines:\n"
                                     "  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n"
                                     "  - {name: B, gpu: rtx4090, count: 3, bandwidth_gbs: 32}\n")
    req = request_from_config(hexicore.compose(["model=tiny", f"cluster_file={tmp_path / 'c.yaml'}"]))
    assert req.allreduce_groups == (2, 4)  # 8 exceeds 4 (two machines' devices alternating)


@pytest.mark.parametrize("tp", ["[3]", "[4]"])  # 3 divides no head count of tiny; 4 fits on no machine
def test_tp_degrees_none_of_which_can_be_timed_are_refused_before_any_process(tmp_path, capsys, monkeypatch, tp):
    """This used to launch the workers, measure the links and only then say so (from the CLI two
    lines: the launcher's threads line and the error)."""
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    (tmp_path / "c.yaml").write_text("name: c\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n")
    code = run_cli(["profile", f"cluster_file={tmp_path / 'c.yaml'}", "model=tiny", f"profile.tp={tp}",
                    f"out={tmp_path / 'p.yaml'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "profile.tp: no TP degree" in err[0], err
    assert not (tmp_path / "p.yaml").exists()
