"""Every path a command or Hydra writes follows one ownership rule: a device, FIFO or socket is
never replaced, appended to or read (``overwrite=true`` included), Hydra's run and sweep folders
never replace or append to a user's files, and a refused command leaves no new file or folder
anywhere (Hydra's ``outputs/<date>/<time>/`` included); every refusal is one stderr line."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
from pathlib import Path

import pytest

from tests.conftest import run_cli

PLAN = ["plan", "model=tiny", "solver=megatron"]
SIM = ["simulate", "schedule=1f1b", "pipeline.ranks=2", "pipeline.micro_batches=2"]


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: its type, and for a regular file its size and content hash
    (special files are stat'ed, never opened)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
            found[str(p.relative_to(root))] = (st.st_mode, st.st_ino, st.st_size if digest else 0, digest,
                                               os.readlink(p) if p.is_symlink() else None)
    return found


@contextlib.contextmanager
def bounded(seconds: int = 60):
    """Fail (instead of hanging for ever) when a command blocks on a FIFO."""
    def stop(*_):
        raise TimeoutError("the command blocked (it opened a FIFO)")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(argv, capsys, *words) -> str:
    with bounded():
        code = run_cli(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def special(kind: str, path: Path) -> Path:
    """A FIFO, a listening socket's file, or a link to the character device /dev/null, at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    else:
        path.symlink_to("/dev/null")
    return path


def device_unchanged(before: os.stat_result) -> None:
    now = os.stat("/dev/null")
    assert (now.st_mode, now.st_rdev, now.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("overwrite", [[], ["overwrite=true"]])
def test_out_and_its_siblings_never_replace_a_special_file(kind, overwrite, tmp_path, monkeypatch, capsys):
    """``out=`` a device, FIFO or socket (or its ``.png`` sibling, or a file inside simulate's
    folder) is refused before any work, with or without overwrite=true, and left as it was."""
    monkeypatch.chdir(tmp_path)
    null = os.stat("/dev/null")
    target = special(kind, tmp_path / "p.json")
    (tmp_path / "sim").mkdir()
    special(kind, tmp_path / "sim" / "summary.json")
    special(kind, tmp_path / "q.png")
    before = tree(tmp_path)
    what = {"fifo": "a FIFO", "socket": "a socket", "device": "a character device"}[kind]
    refused([*PLAN, f"out={target}", *overwrite], capsys, "p.json", what)
    refused([*PLAN, f"out={tmp_path / 'q.json'}", *overwrite], capsys, "q.png", what)
    refused([*SIM, f"out={tmp_path / 'sim'}", *overwrite], capsys, "summary.json", what)
    refused([*PLAN, f"hydra.run.dir={target}"], capsys, "hydra.run.dir")
    assert tree(tmp_path) == before
    device_unchanged(null)


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_hydra_never_writes_its_log_or_config_into_a_special_file(kind, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    null = os.stat("/dev/null")
    (tmp_path / "r" / ".hydra").mkdir(parents=True)
    special(kind, tmp_path / "r" / "plan.log")
    (tmp_path / "s" / ".hydra").mkdir(parents=True)
    special(kind, tmp_path / "s" / ".hydra" / "config.yaml")
    before = tree(tmp_path)
    refused([*PLAN, "hydra.run.dir=r", "overwrite=true"], capsys, "plan.log")
    refused([*PLAN, "hydra.run.dir=s", "overwrite=true"], capsys, "config.yaml")
    assert tree(tmp_path) == before
    device_unchanged(null)


def test_hydra_folders_never_replace_or_append_to_a_users_files(tmp_path, monkeypatch, capsys):
    """``hydra.run.dir`` onto a user's folder with a ``plan.log`` of theirs, ``hydra.output_subdir``
    out of the run's folder, ``hydra.sweep.dir`` onto a folder with the user's ``summary.csv``,
    a sweep's job folder holding a user's log, a run folder of ``''``: each refused, nothing
    changed or added."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "plan.log").write_text("my notes\n")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "theirs" / "summary.csv").write_text("x,y\n1,2\n")
    (tmp_path / "jobs" / "0").mkdir(parents=True)
    (tmp_path / "jobs" / "0" / "simulate.log").write_text("mine\n")
    (tmp_path / "other" / ".hydra").mkdir(parents=True)
    (tmp_path / "other" / ".hydra" / "hydra.yaml").write_text("hydra:\n  help:\n    app_name: someone_else\n")
    before = tree(tmp_path)
    refused([*PLAN, "hydra.run.dir=mine"], capsys, "plan.log", "not a hexicore job log")
    refused([*PLAN, "hydra.run.dir=mine", "overwrite=true"], capsys, "plan.log")
    refused([*PLAN, "hydra.run.dir=run", "hydra.output_subdir=../theirs"], capsys, "hydra.output_subdir")
    refused([*PLAN, "hydra.run.dir=other"], capsys, "another program")
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=theirs"], capsys, "summary.csv")
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=jobs"], capsys, "simulate.log")
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=sw", "hydra.sweep.subdir=../x${hydra.job.num}"], capsys,
            "hydra.sweep.subdir")
    refused([*PLAN, "hydra.run.dir=''"], capsys, "hydra.run.dir", "empty")
    assert tree(tmp_path) == before


def test_every_jobs_folder_is_checked_before_a_sweep_runs(tmp_path, monkeypatch, capsys):
    """Job folders named by what only the job knows (its overrides, a value it sweeps): the
    second job's folder holds a user's log, so the sweep is refused before its first job runs."""
    monkeypatch.chdir(tmp_path)
    for folder in ("a/pipeline.micro_batches=2,pipeline.ranks=2,schedule=1f1b,seed=2", "b/s2_gpipe", "c/seed-2"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "simulate.log").write_text("mine\n")
    before = tree(tmp_path)
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=a", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
            capsys, "seed=2/simulate.log", "not a hexicore job log")
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=c", "hydra.sweep.subdir=${hydra.job.override_dirname}",
             "hydra.job.config.override_dirname.kv_sep=-",
             "hydra.job.config.override_dirname.exclude_keys=[schedule,pipeline.ranks,pipeline.micro_batches]"],
            capsys, "seed-2/simulate.log")
    refused([*SIM, "-m", "seed=1,2", "schedule=1f1b,gpipe", "hydra.sweep.dir=b",
             "hydra.sweep.subdir=s${seed}_${schedule.name}"], capsys, "s2_gpipe/simulate.log")
    refused([*SIM, "-m", "seed=1,2", "hydra.sweep.dir=d", "hydra.sweep.subdir=x/${hydra.job.override_dirname}/../../.."],
            capsys, "hydra.sweep.subdir")
    assert tree(tmp_path) == before


def test_a_refused_command_leaves_no_file_or_folder(tmp_path, monkeypatch, capsys):
    """Refusals found inside the Hydra job (a missing plan file, a foreign out=, a bad value
    read by the command) leave no ``outputs/<date>/<time>/`` behind, nor any other file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "foreign.json").write_text('{"format": "other.tool/1"}')
    before = tree(tmp_path)
    refused(["evaluate", "plan_file=missing.json"], capsys, "missing.json")
    refused([*PLAN, "out=foreign.json"], capsys, "foreign.json")
    refused([*SIM, "out=foreign.json/x"], capsys, "foreign.json")
    refused(["train", "plan_file=missing.json"], capsys, "missing.json")
    refused(["prepare-data", "input=missing.txt", "tokenizer=missing.json", "out=x.bin"], capsys)
    assert tree(tmp_path) == before


def test_a_refusal_in_a_used_run_folder_restores_it(tmp_path, monkeypatch, capsys):
    """A run folder an earlier command wrote is hexicore's (accepted again); a command refused
    there leaves its log and .hydra/ files exactly as they were."""
    monkeypatch.chdir(tmp_path)
    assert run_cli([*PLAN, "out=p.json", "hydra.run.dir=run"]) == 0
    assert run_cli([*PLAN, "out=p.json", "hydra.run.dir=run"]) == 0  # its own folder: accepted
    capsys.readouterr()
    before = tree(tmp_path)
    refused(["evaluate", "plan_file=missing.json", "hydra.run.dir=run"], capsys, "missing.json")
    refused([*PLAN, "out=p.json", "overwrite=false", "hydra.run.dir=run"], capsys, "overwrite=false")
    assert tree(tmp_path) == before


def test_command_line_mistakes_are_one_line(tmp_path, monkeypatch, capsys):
    """argparse (an unknown flag, a bad --cfg choice), OmegaConf (an interpolation of itself) and
    Python's digit limit (a 5000-digit number) each give one line, exit 2, no file."""
    monkeypatch.chdir(tmp_path)
    refused([*PLAN, "--evil-flag"], capsys, "--evil-flag")
    refused([*PLAN, "--cfg", "everything"], capsys, "--cfg")
    refused([*PLAN, "train.global_batch=${train.global_batch}"], capsys, "train.global_batch")
    err = refused([*PLAN, "train.global_batch=" + "9" * 5000], capsys, "digits")
    assert len(err) < 400
    assert tree(tmp_path) == {}


def test_a_refused_job_that_changed_directory_leaves_nothing(tmp_path, monkeypatch, capsys):
    """``hydra.job.chdir=true`` moves the job into its run folder: the clean-up after a refusal
    still finds the folder it made."""
    monkeypatch.chdir(tmp_path)
    refused(["evaluate", "plan_file=missing.json", "hydra.job.chdir=true", "hydra.run.dir=r/s"], capsys, "missing.json")
    os.chdir(tmp_path)
    assert tree(tmp_path) == {}


def test_every_refusal_in_the_suite_is_held_to_one_line_and_no_new_file(tmp_path, monkeypatch, capsys):
    """``run_cli`` (every in-process command of the suite) fails a refusal that writes a file,
    or says more than one line."""
    import sys

    from hexicore.app.commands import simulate
    from hexicore.core.errors import HexicoreError

    def writes_then_refuses(cfg):
        (tmp_path / "left.txt").write_text("x")
        raise HexicoreError("refused", source="command line")

    def talks_then_refuses(cfg):
        print("warning: something", file=sys.stderr)
        raise HexicoreError("refused", source="command line")

    monkeypatch.chdir(tmp_path)
    for run, words in ((writes_then_refuses, "changed"), (talks_then_refuses, "stderr")):
        monkeypatch.setattr(simulate, "run", run)
        with pytest.raises(AssertionError, match=words):
            run_cli([*SIM, f"hydra.run.dir={tmp_path / 'r'}"])
        capsys.readouterr()
