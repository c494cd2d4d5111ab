"""The anytime search: ``solver.time_budget`` stops a solve in time with the best plan found,
its FLOPs lower bound beside it; the budget rule by cluster size."""

import time

import pytest

from hexicore.app.compose import config_from_overrides, solve
from hexicore.core.errors import HexicoreError
from hexicore.planner.search.search_config import SearchConfig
from hexicore.registry import Registry


def test_the_automatic_budget_follows_the_cluster_size_targets():
    config = SearchConfig()
    assert config.budget(4) == config.budget(8) == 2.0 and config.budget(16) == config.budget(32) == 4.5
    assert config.budget(64) == 7.0 and config.budget(320) == 7.5 and config.budget(1024) == config.budget(4096) == 25.0
    assert config.budget(24) == 4.5 and config.budget(12) == pytest.approx(3.25) and config.budget(48) == 5.75
    assert config.budget(672) == pytest.approx(16.25)  # halfway from 320 to 1024
    sizes = range(1, 2000, 7)
    assert all(config.budget(a) <= config.budget(b) for a, b in zip(sizes, sizes[1:]))  # never less for more
    assert SearchConfig(time_budget=None).budget(1024) is None and SearchConfig(time_budget=2).budget(8) == 2.0
    for bad in (0, -1, "soon", True):
        with pytest.raises(HexicoreError) as e:
            SearchConfig(time_budget=bad)
        assert e.value.field == "solver.time_budget"


def test_a_short_budget_returns_a_plan_in_time_with_its_bound():
    """A 64-GPU cluster whose full search takes several seconds: with a one-second budget the
    solve returns within a few seconds more (the exact pricing of the plan found), and the plan
    fits, with a FLOPs bound below its time."""
    over = ["cluster=synthetic", "cluster.synthetic.gpus=64", "cluster.synthetic.per_machine=8", "model=llama2_7b",
            "train.global_batch=64", "solver.time_budget=1"]
    t0 = time.monotonic()
    plan, _ = solve(config_from_overrides(over), Registry.default())
    took = time.monotonic() - t0
    assert plan.estimate.fits and took < 15.0
    assert 0 < plan.solver["bound"] < plan.estimate.iteration_s


def test_free_parameters_are_chosen_on_a_few_periods_with_the_remainder_kept():
    """``ScheduleBook.choosing_micro_batches``: M itself up to four periods (P, or the fewest
    micro-batches the schedule runs with), above that M less whole periods — same remainder,
    never more than four periods — so choosing Hanayo's W costs the same at M = 4096 as at 4P."""
    from hexicore.planner.pricing import CHOOSE_PERIODS, ScheduleBook

    book = ScheduleBook(Registry.default())
    for ref, ranks, period in (({"name": "hanayo", "waves": "auto"}, 4, 4), ({"name": "dualpipe_v"}, 3, 6)):
        for n in range(1, 300):
            rep = book.choosing_micro_batches(ref, ranks, n)
            if n <= CHOOSE_PERIODS * period:
                assert rep == n
            else:
                assert rep % period == n % period and (CHOOSE_PERIODS - 1) * period < rep <= CHOOSE_PERIODS * period
