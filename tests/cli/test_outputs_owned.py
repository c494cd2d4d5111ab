"""Every command's outputs follow the ownership rule (hexicore.core.ownership): simulate's files,
evaluate's plan, train's metrics and checkpoints; a train directory holding another run's
checkpoints is refused unless resumed or cleared; leftovers of a killed save are cleaned."""

from __future__ import annotations

import json

import pytest

from hexicore.core.ownership import kind_of
from tests.conftest import run_cli

SIM = ["simulate", "schedule=1f1b", "pipeline.ranks=2", "pipeline.micro_batches=2"]
TRAIN = ["train", "model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=4",
         "runtime.progress=false", "parallel=none"]


def one_line_exit_2(code, capsys, *words):
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def test_simulate_outputs_are_marked_and_replaced_only_when_ours(tmp_path, capsys):
    out = tmp_path / "sim"
    assert run_cli([*SIM, f"out={out}"]) == 0
    kinds = {f: kind_of(out / f) for f in ("actions.json", "summary.json", "trace.json", "timeline.png")}
    assert kinds == {"actions.json": "hexicore.actions", "summary.json": "hexicore.summary",
                     "trace.json": "hexicore.trace", "timeline.png": "hexicore.png"}
    assert run_cli([*SIM, f"out={out}"]) == 0  # its own files: replaced
    (out / "trace.json").write_text('{"traceEvents": []}')  # another tool's trace
    one_line_exit_2(run_cli([*SIM, f"out={out}"]), capsys, "trace.json", "not a hexicore output")
    assert (out / "trace.json").read_text() == '{"traceEvents": []}'
    one_line_exit_2(run_cli([*SIM, f"out={out}", "overwrite=false"]), capsys, "overwrite=false")
    assert run_cli([*SIM, f"out={out}", "overwrite=true"]) == 0
    assert kind_of(out / "trace.json") == "hexicore.trace"
    capsys.readouterr()
    one_line_exit_2(run_cli([*SIM, f"out={out / 'summary.json'}"]), capsys, "is a file")
    assert list(out.glob(".*hexicore-tmp")) == []


def test_evaluate_out_refuses_a_foreign_file(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert run_cli(["plan", "model=tiny", f"out={plan}", f"hydra.run.dir={tmp_path / 'r'}"]) == 0
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"format": "other.tool/1"}))
    one_line_exit_2(run_cli(["evaluate", f"plan_file={plan}", f"out={mine}"]), capsys, "mine.json")
    assert json.loads(mine.read_text()) == {"format": "other.tool/1"}
    assert run_cli(["evaluate", f"plan_file={plan}", f"out={tmp_path / 'again.json'}"]) == 0
    assert kind_of(tmp_path / "again.json") == "hexicore.plan"


def test_train_refuses_a_foreign_metrics_file_before_training(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"accuracy": 0.9}')
    one_line_exit_2(run_cli([*TRAIN, "train.steps=1", f"out={out}"]), capsys, "metrics.json")
    assert (out / "metrics.json").read_text() == '{"accuracy": 0.9}' and not (out / "final.pt").exists()
    f = tmp_path / "file"
    f.write_text("x")
    one_line_exit_2(run_cli([*TRAIN, "train.steps=1", f"out={f}"]), capsys, "is a file")


def _steps(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))


def test_train_refuses_a_directory_of_another_runs_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    a = [*TRAIN, "train.steps=4", "train.checkpoint_every=1", "seed=0", f"out={out}"]
    assert run_cli(a) == 0, capsys.readouterr().err
    before = _steps(out)
    assert len(before) == 4 and json.loads((out / "metrics.json").read_text())["format"] == "hexicore.metrics/1"
    capsys.readouterr()
    b = [*TRAIN, "train.steps=4", "train.checkpoint_every=2", "seed=1", f"out={out}"]
    one_line_exit_2(run_cli(b), capsys, "another run's checkpoints", "resume=", "overwrite=true")
    assert _steps(out) == before and json.loads((out / "metrics.json").read_text())["seed"] == 0
    (out / "checkpoints" / "step_9.pt.tmp").write_bytes(b"")  # a killed save's leftover
    assert run_cli([*b, "overwrite=true"]) == 0, capsys.readouterr().err
    after = _steps(out)
    assert after == ["step_2", "step_4"]  # every second step and the end: none of the old run's odd steps
    assert json.loads((out / "metrics.json").read_text())["seed"] == 1
    assert not (out / "checkpoints" / "step_9.pt.tmp").exists()
    capsys.readouterr()
    # continuing this very run is allowed
    assert run_cli([*TRAIN, "train.steps=6", "train.checkpoint_every=2", "seed=1", f"out={out}",
                    f"resume={out}"]) == 0, capsys.readouterr().err


def test_run_dir_rule_for_checkpoint_folders(tmp_path):
    """The folder form of checkpoints (safetensors + meta.json written last): a killed save's
    folder without meta.json is ours too; a step_* folder holding other files is never cleared."""
    from hexicore.core.errors import HexicoreError
    from hexicore.core.ownership import check_run_dir, clear_checkpoints

    ck = tmp_path / "checkpoints"
    (ck / "step_4").mkdir(parents=True)
    (ck / "step_4" / "meta.json").write_text(json.dumps({"format": "hexicore.checkpoint/2"}))
    (ck / "step_4" / "model.safetensors").write_bytes(b"x")
    (ck / "step_6").mkdir()
    (ck / "step_6" / "model.safetensors").write_bytes(b"x")  # killed before meta.json
    with pytest.raises(HexicoreError, match="step_4, step_6"):
        check_run_dir(tmp_path)
    assert check_run_dir(tmp_path, resume=str(ck / "step_4")) == []
    with pytest.raises(HexicoreError, match="exists and overwrite=false|another run"):
        check_run_dir(tmp_path, resume=str(ck / "step_4"), overwrite=False)
    clear_checkpoints(check_run_dir(tmp_path, overwrite=True))
    assert list(ck.iterdir()) == []
    (ck / "step_7").mkdir()
    (ck / "step_7" / "notes.txt").write_text("mine")
    with pytest.raises(HexicoreError, match="not a hexicore checkpoint"):
        check_run_dir(tmp_path, overwrite=True)
    assert (ck / "step_7" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("name, extra", [("final", []), ("checkpoints", ["train.checkpoint_every=1"]),
                                         ("reads", ["init_from={hf}"])])
def test_train_refuses_a_file_where_it_writes_a_folder_before_launch(tmp_path, capsys, name, extra):
    out, hf = tmp_path / "run", tmp_path / "hf"
    out.mkdir()
    hf.mkdir()
    (out / name).write_text("mine")
    code = run_cli([*TRAIN, "train.steps=1", f"out={out}", *(e.format(hf=hf) for e in extra)])
    err = one_line_exit_2(code, capsys, f"{name}", "is a file")
    assert "Traceback" not in err and (out / name).read_text() == "mine" and not (out / "metrics.json").exists()


def test_train_refuses_foreign_files_in_final_before_launch(tmp_path, capsys):
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"foreign": 1}')
    (final / "model.safetensors").write_text("x")
    (final / "README.md").write_text("kept")  # not a name train writes: never looked at
    one_line_exit_2(run_cli([*TRAIN, "train.steps=1", f"out={final.parent}"]), capsys, "config.json",
                    "not a hexicore output", "overwrite=true")
    (final / "config.json").unlink()
    one_line_exit_2(run_cli([*TRAIN, "train.steps=1", f"out={final.parent}"]), capsys, "model.safetensors")
    assert (final / "model.safetensors").read_text() == "x" and not (final / "config.json").exists()
    assert not (final.parent / "metrics.json").exists()


_LONG = "a" * 300  # longer than any common file system's name limit (255 bytes)


@pytest.mark.parametrize("argv", [
    [*SIM, f"out=PLACE/{_LONG}"],
    ["plan", "model=tiny", "cluster=tight8", "solver=megatron", "train.global_batch=8", f"out=PLACE/{_LONG}/p.json"],
    [*TRAIN, "train.steps=1", f"out=PLACE/{_LONG}"],
    [*SIM, "out=/proc/hexicore-cannot/sim"],  # mkdir refused by the file system even to root
    [*TRAIN, "train.steps=1", "out=/proc/hexicore-cannot/run"],
])
def test_an_output_path_that_cannot_be_made_is_refused_before_any_work(argv, tmp_path, capsys):
    """A name too long for the file system, or a folder where none can be made: the command
    ended with a traceback (train: after training, losing the run), now one line naming ``out``,
    exit 2, and nothing is left behind (no probe folder either)."""
    if any("/proc/" in a for a in argv) and not __import__("os").path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    argv = [a.replace("PLACE", str(tmp_path)) for a in argv]
    code = run_cli([*argv, f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_exit_2(code, capsys, ": out: ")
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["h"])


def test_a_path_the_file_system_refuses_mid_run_is_one_line(tmp_path, capsys, monkeypatch):
    """Disk full (or a folder removed) while writing: one line naming the file, exit 2, not a
    traceback."""
    import hexicore.app.commands.simulate as sim

    def full(*_a, **_k):
        raise OSError(28, "No space left on device", str(tmp_path / "sim" / "trace.json"))

    monkeypatch.setattr(sim, "run", full)
    code = run_cli([*SIM, f"out={tmp_path / 'sim'}", f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_exit_2(code, capsys, "trace.json: No space left on device")


@pytest.mark.parametrize("run_dir", [f"PLACE/{_LONG}", "/proc/hexicore-cannot/h"])
def test_a_run_directory_that_cannot_be_made_is_one_line(run_dir, tmp_path, capsys):
    """Hydra's own directory (hydra.run.dir), made before the command runs: refused on the
    command line like out= (Hydra's mkdir ended with a traceback)."""
    if run_dir.startswith("/proc/") and not __import__("os").path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    code = run_cli([*SIM, f"out={tmp_path / 'sim'}", f"hydra.run.dir={run_dir.replace('PLACE', str(tmp_path))}"])
    one_line_exit_2(code, capsys, "command line: hydra.run.dir: cannot create")
    assert not any(tmp_path.iterdir())


def test_a_run_never_writes_into_the_checkpoint_it_resumes_from(tmp_path, capsys):
    """``resume=.../step_2 out=.../step_2`` (or a folder inside it) wrote the run's outputs into
    the checkpoint it read: refused in one line, the checkpoint left as it was."""
    out = tmp_path / "run"
    assert run_cli([*TRAIN, "train.steps=2", "train.checkpoint_every=2", f"out={out}"]) == 0
    capsys.readouterr()
    step = out / "checkpoints" / "step_2"
    before = sorted(p.name for p in step.iterdir())
    for target in (step, step / "again"):
        one_line_exit_2(run_cli([*TRAIN, "train.steps=3", f"resume={step}", f"out={target}"]), capsys,
                        "inside the checkpoint it resumes from")
    assert sorted(p.name for p in step.iterdir()) == before

