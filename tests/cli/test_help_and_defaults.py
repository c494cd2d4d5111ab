"""``hexicore COMMAND --help`` lists the keys that command reads, each with what it is;
CP-SAT's workers default to the cores available; a device or pipe given as a file is named so."""

from __future__ import annotations

from tests.conftest import run_cli


def test_help_lists_the_commands_keys_with_descriptions(capsys):
    assert run_cli(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hexicore plan")
    assert "objective=throughput" in out and "least $ per million tokens" in out
    assert "train.global_batch=24" in out and "sequences per iteration" in out
    assert "prepare.text_key" not in out and "profile.repeats" not in out and "init_from" not in out
    assert "solver " in out and "hexiscale" in out
    assert run_cli(["prepare-data", "-h"]) == 0
    out = capsys.readouterr().out
    assert "prepare.text_key=text" in out and "objective" not in out


def test_cpsat_uses_the_cores_there_are():
    from hexicore.planner.search.workers import available_cores
    from hexicore_plugins.solvers.cpsat import CpSatSolver

    assert CpSatSolver().workers == available_cores()
    assert CpSatSolver(workers=3).workers == 3


def test_a_device_given_as_a_plan_file_is_named_so(capsys):
    assert run_cli(["evaluate", "plan_file=/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" not in err and "not a regular file" in err
