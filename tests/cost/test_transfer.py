"""The transfer formulas (alpha/beta of HexiScale App. A) that the analytic model prices TP
all-reduces and hops with, and that emulated links hold each transfer to."""

from __future__ import annotations

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.cost.transfer import allreduce_s, broadcast_s, ring_pass_s, send_s

CLUSTER = parse_cluster({"name": "t", "inter": {"bandwidth_gbs": 0.5, "latency_us": 100},
                         "machines": [{"name": "A", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 4.0,
                                       "latency_us": 10},
                                      {"name": "B", "gpu": "a100-80g", "count": 1}]}, "t.yaml")


def test_a_message_is_latency_plus_bytes_over_bandwidth():
    assert send_s(CLUSTER, "A.0", "A.1", 4e6) == pytest.approx(10e-6 + 4e6 / 4e9)
    assert send_s(CLUSTER, "A.0", "B.0", 1e6) == pytest.approx(100e-6 + 1e6 / 0.5e9)


def test_ring_pass_allreduce_and_broadcast_by_hand():
    """Three devices, 3 MB: each device's piece is 1 MB per peer; A.0 and A.1 pay one NVLink-ish
    term and one slow term, B.0 two slow terms (the worst)."""
    slow = 100e-6 + 1e6 / 0.5e9
    assert ring_pass_s(CLUSTER, ["A.0", "A.1", "B.0"], 3e6) == pytest.approx(2 * slow)
    assert allreduce_s(CLUSTER, ["A.0", "A.1", "B.0"], 3e6) == pytest.approx(4 * slow)
    assert allreduce_s(CLUSTER, ["A.0", "A.1"], 2e6) == pytest.approx(2 * (10e-6 + 1e6 / 4e9))
    assert broadcast_s(CLUSTER, "A.0", ["A.0", "A.1", "B.0"], 1e6) == pytest.approx(slow)
    assert ring_pass_s(CLUSTER, ["A.0"], 1e6) == broadcast_s(CLUSTER, "A.0", ["A.0"], 1e6) == 0.0


def test_the_sync_bytes_are_set_apart_from_the_memory_accounting():
    """``cost.state_bytes_per_param`` sets the state's memory and, unless
    ``cost.sync_bytes_per_param`` says otherwise, the bytes the DP sync moves (its gradient
    part); with both given, memory follows the first and the sync the second."""
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings
    from hexicore.cost.config import cost_model_from_config
    from tests.helpers import SAMPLE_MODEL

    t = TrainSettings(global_batch=8, micro_batch=1, seq_len=32)
    plan = Plan(SAMPLE_MODEL, CLUSTER, t, (Pipeline(4, (Stage(("A.0",), 1, (0, 4)),)),
                                           Pipeline(4, (Stage(("B.0",), 1, (0, 4)),))))
    recipe, paper = cost_model_from_config({}), cost_model_from_config({"state_bytes_per_param": 8})
    split = cost_model_from_config({"state_bytes_per_param": 8, "sync_bytes_per_param": 4})
    assert paper.dp_s(plan) < recipe.dp_s(plan)  # the paper's 2 B a parameter on the wire
    assert split.dp_s(plan) == pytest.approx(recipe.dp_s(plan))
    assert split.memory_gb(plan) == paper.memory_gb(plan) != recipe.memory_gb(plan)
