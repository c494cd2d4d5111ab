"""Library API (docs/cli.md) and Hydra multirun summaries."""

import csv
import json
import subprocess
import sys

import pytest

import hexicore
from hexicore.app.cli import main
from hexicore.core.errors import HexicoreError
from tests.conftest import run_cli


def test_plan_round_trips_through_json(tmp_path):
    plan = hexicore.plan(cluster="paper_case", model="llama2_7b", solver="megatron",
                         overrides=["train.global_batch=32"])
    assert plan.train.global_batch == 32 and plan.estimate.iteration_s > 0
    assert isinstance(plan.estimate, hexicore.Estimate) and plan.estimate.fits
    assert plan.estimate.iteration_s == pytest.approx(max(plan.estimate.pipeline_s) + plan.estimate.dp_s)
    assert set(plan.estimate.memory_gb) == set(plan.devices)
    path = plan.save(tmp_path / "p.json")
    assert path.read_text() == plan.to_json() + "\n"
    again = hexicore.load_plan(path)
    assert again == plan and again.to_dict() == plan.to_dict()
    assert hexicore.Plan.from_json(plan.to_json()) == plan
    fresh = hexicore.evaluate(path)
    assert isinstance(fresh.estimate, hexicore.Estimate)
    assert fresh.estimate.iteration_s == pytest.approx(plan.estimate.iteration_s)
    assert callable(hexicore.plan)  # the function, not the hexicore.core.plan module


def test_api_matches_cli(tmp_path, capsys):
    # (no time budget: the plans depend on the seed alone, not on the machine's load)
    main(["plan", "model=tiny", "cluster=tight8", "solver.time_budget=null", f"out={tmp_path / 'cli.json'}",
          f"hydra.run.dir={tmp_path}"])
    capsys.readouterr()
    cli = hexicore.load_plan(tmp_path / "cli.json")
    lib = hexicore.plan(cluster="tight8", model="tiny", overrides=["solver.time_budget=null"])
    assert cli.pipelines == lib.pipelines


def test_api_bad_input_raises():
    with pytest.raises(HexicoreError, match="unknown solver 'zzz'"):
        hexicore.plan(solver="zzz")


def test_two_job_multirun_writes_summary(tmp_path, capsys):
    try:
        main(["plan", "-m", "model=tiny", "cluster=paper_case,tight8", f"hydra.sweep.dir={tmp_path}"])
    except SystemExit as e:
        assert not e.code
    capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["cluster"] for r in rows] == ["paper_case", "tight8"]
    assert all(float(r["iteration_s"]) > 0 and r["solver"] and r["model"] == "tiny" for r in rows)
    md = (tmp_path / "summary.md").read_text().splitlines()
    assert len(md) == 4 and "iteration_s" in md[0]


def test_simulate_api(tmp_path):
    s = hexicore.simulate("1f1b", ranks=4, micro_batches=8, out=tmp_path)
    assert isinstance(s, hexicore.SimulationResult)
    assert s.bubble_ratio == pytest.approx(3 / 11) and s.closed_form_bubble == pytest.approx(3 / 11)
    assert s.action_list.ranks == 4 and (tmp_path / "timeline.png").is_file()
    assert s.peak_activations == (4, 3, 2, 1) and s.idle[0] == pytest.approx(s.makespan - s.busy[0])
    assert json.dumps(s.to_dict(), indent=2) + "\n" == (tmp_path / "summary.json").read_text()
    w = hexicore.simulate("hanayo", ranks=4, micro_batches=4, overrides=["schedule.waves=2"])
    assert w.schedule["waves"] == 2 and w.bubble_ratio < s.bubble_ratio


def test_simulate_api_equals_the_command_files(tmp_path):
    """hexicore.simulate(...).to_dict() is the command's summary.json, byte for byte (waves=auto
    included: its choice table has integer keys in memory)."""
    run_cli(["simulate", "schedule=hanayo", "schedule.waves=auto", "pipeline.ranks=4", "pipeline.micro_batches=4",
             "timing.comm=0.1", f"out={tmp_path / 'cli'}", f"hydra.run.dir={tmp_path}"])
    lib = hexicore.simulate("hanayo", ranks=4, micro_batches=4, comm=0.1, out=tmp_path / "lib",
                            overrides=["schedule.waves=auto"])
    text = (tmp_path / "cli" / "summary.json").read_text()
    assert json.dumps(lib.to_dict(), indent=2) + "\n" == text == (tmp_path / "lib" / "summary.json").read_text()
    assert (tmp_path / "cli" / "actions.json").read_text() == (tmp_path / "lib" / "actions.json").read_text()
    assert lib.n_actions == sum(len(a) for a in lib.action_list.actions) and lib.comm == 0.1


def test_simulate_multirun_summary(tmp_path, capsys):
    try:
        main(["simulate", "-m", "schedule=gpipe,1f1b", "pipeline.ranks=4", "pipeline.micro_batches=4",
              f"hydra.sweep.dir={tmp_path}"])
    except SystemExit as e:
        assert not e.code
    capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["schedule"] for r in rows] == ["gpipe", "1f1b"]
    assert all(float(r["bubble_ratio"]) == pytest.approx(3 / 7) for r in rows)


def test_a_failing_job_does_not_end_the_sweep(tmp_path, capsys):
    from tests.conftest import run_cli

    code = run_cli(["plan", "-m", "model=llama2_70b,tiny", "cluster=paper_case", "out=plan.json",
                    f"hydra.sweep.dir={tmp_path}"])
    assert code == 1
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["outcome"] for r in rows] == ["failed", "ok"]
    assert "fits" in rows[0]["error"] or "memory" in rows[0]["error"]
    assert (tmp_path / "1" / "plan.json").is_file() and not (tmp_path / "0" / "plan.json").exists()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("command,out,words", [
    (["plan", "model=tiny", "solver=megatron,hexiscale"], "same.json", "every job of the sweep would write to the same "),
    (["simulate", "schedule=1f1b,gpipe"], "sim", "every job of the sweep would write to the same "),
    (["plan", "model=tiny"], "a.json,{d}/b.json", "an absolute out= ("),
    # a relative out= that climbs out of the job's directory is shared by the jobs too
    (["simulate", "schedule=1f1b,gpipe"], "../sim", "every job of the sweep would write to the same ../sim"),
    (["plan", "model=tiny"], "a.json,sub/../../b.json",
     "an out= that leaves the job's directory (a.json,sub/../../b.json)"),
])
def test_absolute_out_in_a_sweep_is_refused_before_any_job(tmp_path, capsys, command, out, words):
    from tests.conftest import run_cli

    value = out if out.startswith(("../", "a.json,sub")) else f"{tmp_path}/{out.format(d=tmp_path)}"
    code = run_cli([command[0], "-m", *command[1:], f"out={value}",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"hexicore: error: command line: out: {words}"), err
    assert "give a relative path (resolved under each job's directory)" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no job ran: no sweep directory, nothing written
def test_the_promised_one_liner_and_typed_exports():
    p = hexicore.plan(cluster="paper_case", model="llama2_13b")
    assert p.estimate.iteration_s > 0 and json.loads(p.to_json())["format"] == "hexicore.plan/1"
    assert hexicore.Plan is type(p) and hexicore.Estimate is type(p.estimate)
    assert {"Plan", "Estimate", "SimulationResult", "Registry", "HexicoreError"} <= set(hexicore.__all__)
    assert set(hexicore.__all__) == set(hexicore._EXPORTS) and all(getattr(hexicore, n) for n in hexicore.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        hexicore.nothing  # noqa: B018


def test_import_hexicore_stays_light():
    """``import hexicore`` reads none of the plan code or the heavy libraries (they load on use)."""
    code = ("import sys, hexicore; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'ortools', 'matplotlib', 'hydra', 'omegaconf', 'numpy', 'pluggy', 'rich')"
            " or m.startswith('hexicore.')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_train_sweep_records_ok_and_failed_jobs(tmp_path, capsys):
    code = run_cli(["train", "-m", "parallel=none", "model=tiny", "train.steps=2", "train.dtype=fp32",
                    "runtime.progress=false", "train.micro_batch=2", "train.global_batch=2,3",
                    f"hydra.sweep.dir={tmp_path}"])
    assert code == 1 and "1 of 2 jobs failed" in capsys.readouterr().err
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["outcome"] for r in rows] == ["ok", "failed"]
    assert rows[0]["steps"] == "2" and float(rows[0]["final_loss"]) > 0 and float(rows[0]["tokens_per_s"]) > 0
    assert float(rows[0]["step_s"]) > 0 and rows[0]["out"] == str(tmp_path / "0")
    # the row's step_s is metrics.json's measured.step_s: the median after the first (warm-up) step
    metrics = json.loads((tmp_path / "0" / "metrics.json").read_text())
    row = float(rows[0]["step_s"])  # the row keeps 6 significant digits
    assert row == pytest.approx(metrics["measured"]["step_s"], rel=1e-5)
    assert row == pytest.approx(metrics["step_s"][1], rel=1e-5)  # two steps: the second one
    assert "multiple of micro-batch" in rows[1]["error"] and (tmp_path / "summary.md").is_file()


def test_train_row_step_s_skips_the_first_step():
    """A sweep row's step_s is the statistic of measured.step_s (null for one step), not the median of all steps."""
    from types import SimpleNamespace

    from hexicore.app.commands.train import result_row

    spec = SimpleNamespace(model=SimpleNamespace(name="tiny"), train=SimpleNamespace(global_batch=4, micro_batch=1))
    m = {"losses": [3.0, 2.0, 1.0], "step_s": [9.0, 1.0, 2.0], "measured": {"step_s": 1.5}}
    assert result_row(m, spec, "o")["step_s"] == 1.5
    assert result_row({**m, "measured": {"step_s": None}}, spec, "o")["step_s"] is None  # one step
    assert result_row({"losses": [3.0, 2.0, 1.0], "step_s": [9.0, 1.0, 2.0]}, spec, "o")["step_s"] == 1.5
    assert result_row({"losses": [3.0], "step_s": [9.0]}, spec, "o")["step_s"] is None
    row = result_row({**m, "lr": [1e-4, 3e-4, 2e-4], "predicted": {"step_s": 1.2}}, spec, "o")
    assert (row["lr"], row["predicted_step_s"]) == (3e-4, 1.2)  # the peak lr, the prediction beside the measure
    assert result_row(m, spec, "o")["lr"] is None and result_row(m, spec, "o")["predicted_step_s"] is None


@pytest.fixture(scope="module")
def tiny_plan():
    return hexicore.plan(cluster="paper_case", model="tiny")


BAD_CALLS = {
    "int override": (lambda p, d: hexicore.plan(model="tiny", overrides=[5]), "overrides[0]"),
    "compose int": (lambda p, d: hexicore.compose([1]), "overrides[0]"),
    "override mapping": (lambda p, d: hexicore.plan(model="tiny", overrides={"a": 1}), "overrides"),
    "group sweep": (lambda p, d: hexicore.plan(cluster="hetero1,hetero2"), "several values"),
    "group not a name": (lambda p, d: hexicore.plan(cluster=5), "cluster"),
    "simulate out is a file": (lambda p, d: hexicore.simulate(out=d / "x.txt"), "is a file"),
    "simulate out int": (lambda p, d: hexicore.simulate(out=5), "out"),
    "simulate ranks str": (lambda p, d: hexicore.simulate(ranks="4"), "ranks"),
    "load_plan None": (lambda p, d: hexicore.load_plan(None), "path"),
    "load_plan int": (lambda p, d: hexicore.load_plan(3), "path"),
    "evaluate dict": (lambda p, d: hexicore.evaluate({}), "Plan.from_dict"),
    "evaluate None": (lambda p, d: hexicore.evaluate(None), "plan_or_path"),
    "evaluate int": (lambda p, d: hexicore.evaluate(5), "plan_or_path"),
    "save int": (lambda p, d: p.save(5), "path"),
    "save directory": (lambda p, d: p.save(d), "is a directory"),
    "save foreign file": (lambda p, d: p.save(d / "x.txt"), "not a hexicore output"),
    "save unwritable": (lambda p, d: p.save(d / "x.txt" / "p.json"), "is a file, not a directory to write into"),
    "from_json int": (lambda p, d: hexicore.Plan.from_json(5), "text"),
    "overrides with -m": (lambda p, d: hexicore.plan(model="tiny", overrides=["-m", "seed=1,2"]), "command-line flag"),
    "overrides with --cfg": (lambda p, d: hexicore.simulate(overrides=["--cfg", "job"]), "overrides[0]"),
    "overrides remove a group": (lambda p, d: hexicore.plan(model="tiny", overrides=["~solver"]), "solver"),
    "overrides remove a section": (lambda p, d: hexicore.simulate(overrides=["~pipeline"]), "pipeline"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_api_bad_arguments_are_one_line_hexicore_errors(name, tiny_plan, tmp_path):
    call, text = BAD_CALLS[name]
    (tmp_path / "x.txt").write_text("not ours")
    with pytest.raises(HexicoreError) as info:
        call(tiny_plan, tmp_path)
    assert text in str(info.value) and len(str(info.value).splitlines()) == 1
    assert (tmp_path / "x.txt").read_text() == "not ours"


def test_api_overrides_a_string_or_none(tiny_plan, tmp_path):
    assert hexicore.plan(cluster="paper_case", model="tiny", overrides="train.global_batch=8").train.global_batch == 8
    none = hexicore.plan(cluster="paper_case", model="tiny", overrides=None)  # the defaults, as with no overrides
    assert (none.train, none.model, none.cluster) == (tiny_plan.train, tiny_plan.model, tiny_plan.cluster)
    path = tiny_plan.save(tmp_path / "p.json")
    assert tiny_plan.save(path) == path  # another plan file is replaced
    (tmp_path / "x.txt").write_text("not ours")
    assert tiny_plan.save(tmp_path / "x.txt", overwrite=True).read_text() == tiny_plan.to_json() + "\n"


def test_an_in_process_cli_run_leaves_no_hydra_job_behind(capsys):
    """Library calls after ``main`` returns are no Hydra job. ``--cfg job`` used to leave Hydra's
    config set without an output directory, and a later library ``train`` failed on it."""
    from hydra.core.hydra_config import HydraConfig

    from hexicore.app.sweep import record

    assert run_cli(["plan", "--cfg", "job", "model=tiny"]) == 0
    assert record({"step_s": 1.0}) is None
    with pytest.raises(ValueError):
        HydraConfig.get()


@pytest.mark.parametrize("name", ["a,b.yaml", "it's.yaml", "a=b c.yaml", "${seed}.yaml", "[x]\\'.yaml"])
def test_a_file_path_is_read_as_written(name, tmp_path):
    """A path is a path, not override syntax: a comma was a sweep, ``=`` a parse error, ``${...}``
    an interpolation."""
    from tests.conftest import CONF

    path = tmp_path / name
    path.write_text((CONF / "cluster" / "hetero2.yaml").read_text())
    plan = hexicore.plan(cluster_file=path, model_file=str(CONF / "model" / "tiny.yaml"), solver="megatron")
    assert plan.cluster.name == "hetero2"


def test_the_library_inside_a_hydra_app_of_the_caller():
    """A caller's own Hydra app (or a plugin called inside ``hexicore plan``) holds Hydra's global
    state; composing hexicore's config refused with 'GlobalHydra is already initialized'."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_module(config_module="hexicore.conf", version_base="1.3"):
        outer = GlobalHydra.instance().hydra
        assert hexicore.plan(cluster="hetero2", model="tiny", solver="megatron").cluster.name == "hetero2"
        assert GlobalHydra.instance().hydra is outer
