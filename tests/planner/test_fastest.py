"""Baselines price only the candidates that could win (hexicore/planner/fastest.py): the floor
holds under every schedule, the choice is the one pricing every candidate makes, and candidates
whose floor lies above the fastest fitting one are not priced."""

from __future__ import annotations

import importlib
import random

import pytest

from hexicore.app.compose import build_problem, config_from_overrides
from hexicore.planner.fastest import priced_where_it_could_win, work_bound_s
from hexicore.registry import Registry

megatron = importlib.import_module("hexicore_plugins.solvers.megatron")
SCHEDULES = ["1f1b", "gpipe", "interleaved_1f1b", "chimera", "hanayo", "zb_h1", "zb_h2", "zb_v", "dualpipe_v",
             "interleaved_zb", "looped_bfs"]


def problem(*overrides: str):
    return build_problem(config_from_overrides(["model=tiny", "train.global_batch=16", *overrides]), Registry.default())


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_floor_lies_below_every_layouts_estimate(schedule):
    """n_mb x the slowest rank's work per micro-batch <= the iteration time, on every legal
    symmetric layout of a mixed cluster (memory aside), under each schedule."""
    pb = problem(f"schedule={schedule}", "cluster=paper_case")
    layouts = megatron.MegatronSolver().layouts(pb)
    assert layouts
    for _, plan in layouts:
        floor, est = work_bound_s(pb, plan), pb.evaluate(plan)
        assert 0 < floor <= est.iteration_s * (1 + 1e-12), (schedule, floor, est.iteration_s)


class Counting:
    """A problem whose ``evaluate`` counts its calls."""

    def __init__(self, pb):
        self.pb, self.calls = pb, 0

    def __getattr__(self, name):
        return getattr(self.pb, name)

    def evaluate(self, plan):
        self.calls += 1
        return self.pb.evaluate(plan)


@pytest.mark.parametrize("seed", range(4))
def test_the_choice_is_the_one_pricing_every_candidate_makes(seed):
    """Random candidate subsets, shuffled: the fastest fitting candidate (first in the list on a
    tie) is the one of pricing all; the floor skips the rest without pricing them."""
    rng = random.Random(seed)
    pb = problem(f"schedule={rng.choice(['1f1b', 'zb_h1', 'interleaved_1f1b'])}", "cluster=paper_case",
                 "cost.state_bytes_per_param=8")
    layouts = megatron.MegatronSolver().layouts(pb)
    cands = rng.sample(layouts, k=rng.randint(2, len(layouts)))
    every = [(k, p, pb.evaluate(p)) for k, p in cands]
    fitting = [c for c in every if c[2].fits]
    counting = Counting(pb)
    got = priced_where_it_could_win(counting, cands)
    if fitting:
        want = min(fitting, key=lambda c: c[2].iteration_s)
        won = min(got.fitting, key=lambda c: c[2].iteration_s)
        assert won[0] == want[0] and won[2].iteration_s == want[2].iteration_s
    else:
        assert got.fitting == [] and sorted(got.unfit) == sorted(k for k, _ in cands)
    best = min((c[2].iteration_s for c in fitting), default=float("inf"))
    above = sum(work_bound_s(pb, p) > best for _, p in cands)
    assert counting.calls <= len(cands) - above
    assert got.priced == len(cands) - above


def test_a_slow_schedule_is_planned_without_pricing_every_layout():
    """megatron on paper_case: the layouts whose floor lies above the fastest are not priced; the
    plan is the fastest fitting layout all the same (``solver.priced`` of ``candidates``)."""
    pb = problem("cluster=paper_case", "cost.state_bytes_per_param=8", "model=llama2_13b", "train.global_batch=24")
    plan = megatron.MegatronSolver().solve(pb)
    every = [e for _, _, e in megatron.MegatronSolver().candidates(pb) if e.fits]
    assert pb.evaluate(plan).iteration_s == min(e.iteration_s for e in every)
    assert plan.solver["priced"] < plan.solver["candidates"]
