"""Objectives: throughput, cost per token, budgets and throughput floors (hexicore.planner.allocation.objective)."""

import pytest

from hexicore.app.api import plan as make_plan
from hexicore.app.report import summary_lines
from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.gpus import GPU_CATALOG
from hexicore.planner.allocation.objective import Objective, rate

from tests.conftest import run_cli

BASE = ["train.global_batch=64", "solver.iterations=8", "solver.polish_rounds=3"]


def plan(*extra):
    return make_plan("mixed_price", "llama2_7b", overrides=BASE + list(extra))


@pytest.fixture(scope="module")
def both():
    return plan(), plan("objective=cost")


def test_cost_objective_picks_a_cheaper_per_token_plan(both):
    fast, cheap = both
    rf, rc = rate(fast), rate(cheap)
    assert sorted(fast.devices) != sorted(cheap.devices)
    assert rc["usd_per_mtok"] < rf["usd_per_mtok"] and fast.estimate.iteration_s < cheap.estimate.iteration_s
    # $/M tokens from the prices of the devices used (idle ones are not paid)
    usd = sum(cheap.cluster.device(d).gpu.price_per_hour for d in cheap.devices)
    assert rc["usd_per_hour"] == pytest.approx(usd)
    assert rc["usd_per_mtok"] == pytest.approx(usd / 3600 / cheap.estimate.tokens_per_s * 1e6)
    assert cheap.solver["usd_per_mtok"] == pytest.approx(rc["usd_per_mtok"])
    lines = "\n".join(summary_lines(cheap))
    assert "tokens/s" in lines and "$/hour" in lines and "$/M tokens" in lines and "idle GPU type" in lines
    alloc = cheap.solver["allocation"]  # each sub-cluster a solve of its own: the line says how many
    assert f"sub-clusters solved {alloc['solved']} of {alloc['considered']} ({alloc['mode']})" in lines


def test_floor_and_budget(both):
    fast, cheap = both
    floor = (rate(fast)["tokens_per_s"] + rate(cheap)["tokens_per_s"]) / 2
    got = plan("objective=cost", f"min_tokens_per_s={floor}")
    assert rate(got)["tokens_per_s"] >= floor
    budget = (rate(fast)["usd_per_hour"] + rate(cheap)["usd_per_hour"]) / 2
    got = plan(f"budget_per_hour={budget}")
    assert rate(got)["usd_per_hour"] <= budget * (1 + 1e-12)  # a sum of prices: rounding aside
    with pytest.raises(HexicoreError, match="budget_per_hour"):
        plan("budget_per_hour=1")


@pytest.mark.parametrize("solver", ["megatron", "metis_like", "galvatron_like", "fsdp"])
def test_baselines_meet_the_objective_on_the_devices_they_choose(solver):
    """A baseline lays out every device it is given; under objective=cost or a budget it is given
    sub-clusters too, so its plan is no dearer per token than on every device and within the
    budget (before, it planned on all 24 GPUs, over any budget, without a word); under the
    default objective it still takes every device."""
    base = ["train.global_batch=24", f"solver={solver}"]
    every = make_plan("mixed_price", "llama2_13b", overrides=base)
    assert len(every.devices) == len(every.cluster.devices)
    cheap = make_plan("mixed_price", "llama2_13b", overrides=[*base, "objective=cost"])
    assert rate(cheap)["usd_per_mtok"] < rate(every)["usd_per_mtok"] and len(cheap.devices) < len(every.devices)
    assert cheap.solver["allocation"]["objective"]["kind"] == "cost"
    budget = rate(every)["usd_per_hour"] / 2
    held = make_plan("mixed_price", "llama2_13b", overrides=[*base, f"budget_per_hour={budget}"])
    assert rate(held)["usd_per_hour"] <= budget * (1 + 1e-12)


def test_prices_come_from_the_catalog_or_the_cluster_file():
    assert all(g.price_per_hour and g.price_source for g in GPU_CATALOG.values())
    d = {"name": "p", "inter": {"bandwidth_gbs": 1}, "machines": [
        {"name": "A", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32},
        {"name": "B", "gpu": "mine", "count": 2, "bandwidth_gbs": 32}],
         "gpus": {"rtx4090": {"price_per_hour": 0.25}, "mine": {"tflops": 100, "memory_gb": 32}}}
    c = parse_cluster(d, "t")
    assert c.device("A.0").gpu.price_per_hour == 0.25 and c.device("B.0").gpu.price_per_hour is None
    again = parse_cluster(c.to_dict(), "t")
    assert again.device("A.0").gpu.price_per_hour == 0.25
    with pytest.raises(HexicoreError, match="price_per_hour for GPU type\\(s\\) mine"):
        Objective("cost").check_prices(c)
    Objective("throughput").check_prices(c)  # throughput needs no prices


@pytest.mark.parametrize("spec, field, words", [
    ({"tflops": 100, "memory_gb": 32, "price_source": "quote"}, "gpus.mine.price_source", "does not give"),
    ({"price_source": "quote"}, "gpus.rtx4090.price_source", "does not give"),  # would keep the catalog's
    ({"tflops": 100, "memory_gb": 32, "source": 5}, "gpus.mine.source", "expected a non-empty string"),
    ({"tflops": 100, "memory_gb": 32, "price_per_hour": 1, "price_source": ["x"]}, "gpus.mine.price_source",
     "expected a non-empty string"),
])
def test_provenance_notes_are_text_and_a_price_source_needs_its_price(spec, field, words):
    """Neither note is dropped or turned into other text on its way into the plan."""
    name = field.split(".")[1]
    d = {"name": "p", "machines": [{"name": "A", "gpu": name, "count": 2, "bandwidth_gbs": 32}],
         "gpus": {name: spec}}
    with pytest.raises(HexicoreError, match=words) as e:
        parse_cluster(d, "c.yaml")
    assert (e.value.source, e.value.field) == ("c.yaml", field)


def test_provenance_notes_read_back_from_a_plan():
    d = {"name": "p", "machines": [{"name": "A", "gpu": "mine", "count": 2, "bandwidth_gbs": 32}],
         "gpus": {"mine": {"tflops": 100, "memory_gb": 32, "source": "spec sheet", "price_per_hour": 1.5,
                           "price_source": "quote"}}}
    g = parse_cluster(parse_cluster(d, "t").to_dict(), "t").device("A.0").gpu
    assert (g.source, g.price_per_hour, g.price_source) == ("spec sheet", 1.5, "quote")


def test_bad_objectives_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(HexicoreError, match="unknown objective"):
        Objective("speed")
    with pytest.raises(HexicoreError, match="budget_per_hour"):
        Objective(budget_per_hour=-1.0)
    assert run_cli(["plan", "cluster=paper_case", "model=tiny", "objective=speed",
                    f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    assert "unknown objective" in capsys.readouterr().err
