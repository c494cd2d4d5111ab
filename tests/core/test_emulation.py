"""``emulate: {tflops: X}``: a device of a fixed speed on a CPU host (a test aid). Its compute
lasts the FLOPs torch counts as it runs over X TFLOP/s, however fast or loaded the host is."""

from __future__ import annotations

import time

import pytest
import torch

from hexicore.core.cluster import parse_cluster
from hexicore.core.emulation import Emulation
from hexicore.core.errors import HexicoreError
from hexicore_plugins.runtimes.torch.launch import emulated_device as emulate

CPU = torch.device("cpu")


def test_tflops_in_a_cluster_file_round_trips_and_bad_values_are_refused():
    base = {"name": "e", "inter": {"bandwidth_gbs": 1.0},
            "machines": [{"name": "A", "gpu": "a100-80g", "count": 1, "bandwidth_gbs": 100.0},
                         {"name": "B", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100.0,
                          "emulate": {"tflops": 0.004}}]}
    c = parse_cluster(base, "c.yaml")
    assert [c.emulation(d.id) for d in c.devices] == [Emulation(), Emulation(tflops=0.004), Emulation(tflops=0.004)]
    assert [c.slowdown(d.id) for d in c.devices] == [1.0, 1.0, 1.0]
    assert c.to_dict()["machines"][1]["emulate"] == {"tflops": 0.004}
    assert parse_cluster(c.to_dict(), "plan.json", "cluster") == c
    bad_values = (({"tflops": 0}, "emulate.tflops"), ({"tflops": 1e5}, "emulate.tflops"),
                  ({"tflops": 1e-9}, "emulate.tflops"), ({"tflops": "fast"}, "emulate.tflops"),
                  ({"tflops": 1, "slowdown": 2}, "emulate"), ({}, "emulate"))
    for bad, field in bad_values:
        base["machines"][1]["emulate"] = bad
        with pytest.raises(HexicoreError) as e:
            parse_cluster(base, "c.yaml")
        assert e.value.field == f"machines[1].{field}", (bad, e.value)


def test_flops_are_counted_as_torch_counts_them_backward_and_cpu_attention_included():
    a = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)
    with emulate.FlopCount() as fwd:
        y = a @ w
    assert fwd.flops == 2 * 64 * 32 * 16
    with emulate.FlopCount() as bwd:
        y.sum().backward()
    assert bwd.flops == 2 * fwd.flops  # the gradients of both operands
    q, k, v = (torch.randn(2, 4, 32, 8, requires_grad=True) for _ in range(3))
    with emulate.FlopCount() as att:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert att.flops == 4 * 2 * 4 * 32 * 32 * 8  # two batched products of the scores, causal or not
    with emulate.FlopCount() as att_b:
        o.sum().backward()
    assert att_b.flops >= 2 * att.flops


def test_an_emulated_action_lasts_its_flops_over_the_rate_whatever_the_host_does():
    x, w = torch.randn(128, 128), torch.randn(128, 128)
    flops = 2 * 128 ** 3
    rate = flops / 0.15 / 1e12  # TFLOP/s at which one product takes 0.15 s
    for extra in (0.0, 0.05):  # a busier host (here: a wait inside the action) changes nothing
        t0 = time.perf_counter()
        with emulate.emulated(Emulation(tflops=rate), CPU):
            x @ w
            time.sleep(extra)
        assert time.perf_counter() - t0 == pytest.approx(0.15, abs=0.03)
    t0 = time.perf_counter()
    with emulate.emulated(Emulation(tflops=rate), CPU):
        time.sleep(0.25)  # longer than the emulated time: never cut short, nothing added
    assert 0.25 <= time.perf_counter() - t0 < 0.3
    t0 = time.perf_counter()
    with emulate.emulated(Emulation(), CPU):  # not emulated: nothing added
        x @ w
    assert time.perf_counter() - t0 < 0.1


def test_emulated_links_round_trip_through_the_plan_json_and_name_every_rank_device():
    """``emulate: {links: true}`` (top level) reads back from a plan's cluster, a synthetic
    fleet keeps it, and the links a job is held to name each rank's device in rank order."""
    from hexicore.core.emulation import EmulatedLinks

    doc = {"name": "l", "emulate": {"links": True}, "inter": {"bandwidth_gbs": 0.5, "latency_us": 200},
           "machines": [{"name": "A", "gpu": "a100-80g", "count": 2}, {"name": "B", "gpu": "a100-80g", "count": 1}]}
    c = parse_cluster(doc, "c.yaml")
    assert c.emulate_links and c.to_dict()["emulate"] == {"links": True}
    assert parse_cluster(c.to_dict(), "plan.json", "cluster") == c
    assert c.emulated_links(["B.0", "A.1"]) == EmulatedLinks(c, ("B.0", "A.1"))
    off = parse_cluster({**doc, "emulate": {"links": False}}, "c.yaml")
    assert not off.emulate_links and "emulate" not in off.to_dict() and off.emulated_links(["A.0"]) is None
    fleet = parse_cluster({"synthetic": {"gpus": 4, "mix": {"a100-80g": 1}}, "emulate": {"links": True}}, "f.yaml")
    assert fleet.emulate_links
    with pytest.raises(HexicoreError) as e:
        parse_cluster({**doc, "emulate": None}, "c.yaml")
    assert e.value.field == "emulate"
