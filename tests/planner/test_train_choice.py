"""Training settings the planner chooses (``train.zero=auto``, ``train.micro_batch=auto``):
the settings listed, one search pricing them all, the recorded seconds, the CLI's values."""

import pytest

from hexicore.app.compose import config_from_overrides, solve
from hexicore.core.errors import HexicoreError
from hexicore.core.settings import TrainSettings
from hexicore.planner.train_choice import MICRO_BATCH_SIZES, STAGES, choice_seconds, train_choices
from hexicore.registry import Registry

from tests.conftest import run_cli


def test_choices_are_the_product_smallest_size_and_least_traffic_first():
    assert train_choices(TrainSettings(global_batch=24)) == (TrainSettings(global_batch=24),)
    both = train_choices(TrainSettings(global_batch=24, zero="auto", micro_batch="auto"))
    assert [(t.micro_batch, t.zero) for t in both] == [(b, z) for b in (1, 2, 4, 8) for z in STAGES]
    odd = train_choices(TrainSettings(global_batch=6, micro_batch="auto"))  # sizes dividing the batch only
    assert [t.micro_batch for t in odd] == [1, 2] and all(t.zero == 0 for t in odd)
    assert set(MICRO_BATCH_SIZES) == {1, 2, 4, 8}


def test_recorded_seconds_are_per_value_the_best_over_the_other_dimension():
    asked = TrainSettings(global_batch=8, zero="auto", micro_batch="auto")
    found = [(TrainSettings(global_batch=8, zero=0, micro_batch=1), 5.0),
             (TrainSettings(global_batch=8, zero=1, micro_batch=1), 4.0),
             (TrainSettings(global_batch=8, zero=0, micro_batch=2), None),
             (TrainSettings(global_batch=8, zero=1, micro_batch=2), 4.5)]
    assert choice_seconds(asked, found) == {"zero_s": {"0": 5.0, "1": 4.0}, "micro_batch_s": {"1": 4.0, "2": 4.5}}
    assert choice_seconds(TrainSettings(global_batch=8), found) == {}


def test_micro_batch_auto_reads_from_the_command_line_and_refuses_bad_values(capsys):
    assert TrainSettings.from_dict({"micro_batch": "auto"}).micro_batch == "auto"
    assert TrainSettings.from_dict({"micro_batch": "4"}).micro_batch == 4
    for bad in ("abc", "0", 0, 1.5, True):
        with pytest.raises(HexicoreError) as e:
            TrainSettings.from_dict({"micro_batch": bad})
        assert e.value.field == "train.micro_batch"
    capsys.readouterr()
    assert run_cli(["plan", "train.micro_batch=abc"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "train.micro_batch" in err


def _plan(*overrides):
    plan, _ = solve(config_from_overrides(["cluster=tight8", "model=llama2_7b", "train.global_batch=16",
                                           "solver.iterations=6", "solver.time_budget=null", *overrides]),
                    Registry.default())
    return plan


def test_one_search_chooses_the_micro_batch_and_records_every_size():
    """Every size dividing the batch is priced in the one search; the plan's own is the least
    of the recorded seconds and is priced exactly; it is never slower than micro-batch 1 alone
    searched the same way (micro-batch 1, ZeRO 0 leads the search)."""
    auto = _plan("train.micro_batch=auto")
    seen = auto.solver["micro_batch_s"]
    assert set(seen) == {"1", "2", "4", "8"} and auto.train.micro_batch in (1, 2, 4, 8)
    assert seen[str(auto.train.micro_batch)] == pytest.approx(auto.estimate.iteration_s, abs=1e-6)
    assert "train_s" not in auto.solver and "zero_s" not in auto.solver
    assert auto.estimate.fits and auto.train.global_batch % auto.train.micro_batch == 0
    one = _plan("train.micro_batch=1")
    assert auto.estimate.iteration_s <= one.estimate.iteration_s * 1.001


def test_a_run_refuses_micro_batch_auto_in_one_line(capsys, tmp_path):
    """``auto`` is the planner's: ``hexicore train`` without a plan says so, exit 2, no run."""
    code = run_cli(["train", "parallel=none", "model=tiny", "train.micro_batch=auto", "train.global_batch=8",
                    "train.steps=1", f"out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "train.micro_batch" in err
    assert not (tmp_path / "run").exists()
