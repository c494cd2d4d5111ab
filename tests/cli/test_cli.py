"""The Hydra CLI (docs/cli.md): plan/evaluate/plugins end to end, and bad input -> one line,
exit status 2, no traceback (one test per case)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import run_cli


def run(args, capsys):
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    code = run_cli(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def hydra_dir(tmp_path):
    return [f"hydra.run.dir={tmp_path / 'run'}"]


def test_bare_plan_prints_and_writes_valid_plan(tmp_path, capsys, hydra_dir):
    code, out, err = run(["plan", f"out={tmp_path / 'p.json'}", *hydra_dir], capsys)
    assert code == 0, err
    assert "predicted iteration time" in out and "MFU" in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["format"] == "hexicore.plan/1" and data["model"]["name"] == "llama2_13b"
    assert data["cluster"]["name"] == "paper_case" and data["train"]["global_batch"] == 24
    assert data["estimate"]["iteration_s"] > 0 and data["solver"]["name"]
    png = (tmp_path / "p.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000  # plan.png beside the JSON


def test_plan_without_out_writes_into_hydra_dir(tmp_path, capsys, hydra_dir):
    code, out, _ = run(["plan", "model=tiny", *hydra_dir], capsys)
    assert code == 0 and (tmp_path / "run" / "plan.json").is_file()


def test_evaluate_round_trip(tmp_path, capsys, hydra_dir):
    assert run(["plan", "model=llama2_7b", f"out={tmp_path / 'p.json'}", *hydra_dir], capsys)[0] == 0
    code, out, err = run(["evaluate", f"plan_file={tmp_path / 'p.json'}", f"out={tmp_path / 'e.json'}",
                          *hydra_dir], capsys)
    assert code == 0, err
    a = json.loads((tmp_path / "p.json").read_text())
    b = json.loads((tmp_path / "e.json").read_text())
    assert a["estimate"]["iteration_s"] == pytest.approx(b["estimate"]["iteration_s"])


def test_cluster_and_model_files_from_anywhere(tmp_path, capsys, hydra_dir):
    (tmp_path / "c.yaml").write_text("name: two\ninter: {bandwidth_gbs: 2}\nmachines:\n"
                                     "  - {name: X, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n"
                                     "  - {name: Y, gpu: a100-80g, count: 2, bandwidth_gbs: 300}\n")
    (tmp_path / "m.yaml").write_text("name: small\nlayers: 6\nhidden: 512\nheads: 8\nkv_heads: 4\nffn: 1408\n"
                                     "vocab: 1000\nseq_len: 256\n")
    code, out, err = run(["plan", f"cluster_file={tmp_path / 'c.yaml'}", f"model_file={tmp_path / 'm.yaml'}",
                          "train.global_batch=8", f"out={tmp_path / 'p.json'}", *hydra_dir], capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["cluster"]["name"] == "two" and data["model"]["layers"] == 6 and data["train"]["seq_len"] == 256


def test_plugins_lists_analytic_and_megatron(capsys):
    code, out, _ = run(["plugins"], capsys)
    assert code == 0 and "analytic" in out and "megatron" in out and "cost_model" in out
    code, out, _ = run(["plugins", "--help"], capsys)  # its usage, not the table
    assert code == 0 and out.startswith("usage: hexicore plugins") and "megatron" not in out
    code, out, err = run(["plugins", "solver=cpsat"], capsys)  # an argument it would ignore
    assert code == 2 and "takes no arguments" in err and len(err.strip().splitlines()) == 1 and not out


def test_help_is_quick_and_lists_commands(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and all(c in out for c in ("plan", "evaluate", "simulate", "train", "plugins"))


BAD_CLUSTERS = {
    "malformed": ("name: x\nmachines: [\n", "malformed YAML"),
    "empty": ("", "empty"),
    "list": ("- a\n- b\n", "expected a mapping, got list"),
    "gpu": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: gtx9999, count: 2, bandwidth_gbs: 10}\n",
            "machines[0].gpu: unknown GPU type 'gtx9999'"),
    "zero_bw": ("inter: {bandwidth_gbs: 0}\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 10}\n",
                "inter.bandwidth_gbs: must be > 0"),
    "neg_bw": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: -3}\n",
               "machines[0].bandwidth_gbs: must be > 0"),
    "text_bw": ("inter: {bandwidth_gbs: fast}\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 1}\n",
                "inter.bandwidth_gbs: expected a number"),
    "zero_count": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: rtx4090, count: 0, bandwidth_gbs: 1}\n",
                   "machines[0].count: must be >= 1"),
    "text_count": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: rtx4090, count: two, bandwidth_gbs: 1}\n",
                   "machines[0].count: expected an integer"),
    "dup_machine": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: rtx4090, count: 1, bandwidth_gbs: 1}\n"
                    "  - {name: A, gpu: rtx3090, count: 1, bandwidth_gbs: 1}\n", "machines[1].name: duplicate machine"),
    "bad_link": ("inter: {bandwidth_gbs: 1}\nmachines:\n  - {name: A, gpu: rtx4090, count: 1, bandwidth_gbs: 1}\n"
                 "links:\n  - {between: [A, Q], bandwidth_gbs: 3}\n", "links[0].between: link names unknown machine 'Q'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_bad_cluster_file_one_line_exit_2(case, tmp_path, capsys, hydra_dir):
    text, words = BAD_CLUSTERS[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    code, out, err = run(["plan", f"cluster_file={path}", *hydra_dir], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(path) in err and words in err
    assert not (tmp_path / "run" / "plan.json").exists()


def test_model_that_fits_nowhere(capsys, hydra_dir, tmp_path):
    code, _, err = run(["plan", "model=llama2_70b", f"out={tmp_path / 'p.json'}", *hydra_dir], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "model=llama2_70b" in err and "fits on no" in err and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args, words", [
    (["plan", "solver=nope"], "unknown solver 'nope'; choose one of:"),
    (["plan", "cluster=nope"], "unknown cluster 'nope'; choose one of:"),
    (["plan", "colour=red"], "colour: unknown key"),
    (["plan", "+train.global_bach=8"], "train.global_bach: unknown key"),
    (["plan", "seed=abc"], "seed: Value 'abc' of type 'str' could not be converted to Integer"),
    (["plan", "train.dtype=fp8"], "train.dtype: must be one of bf16, fp16, fp32"),
    (["plan", "train.global_batch=7", "train.micro_batch=2"], "train.global_batch"),
    (["plan", "exclude=[Z.1]"], "exclude: unknown device 'Z.1'"),
    (["evaluate"], "plan_file"),
    (["plan", "model=tiny", "schedule=hanayo", "schedule.waves=0"], "command line: schedule.waves: schedule 'hanayo'"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["plan", "-m", "--info"], "--info and -m cannot be combined"),  # Hydra's ValueError, a traceback
    (["simulate", "-m", "--cfg", "job", "pipeline.ranks=2,4"], "--cfg and -m cannot be combined"),
])
def test_bad_command_lines(args, words, capsys, hydra_dir):
    code, _, err = run([*args, *hydra_dir], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_bad_plan_file(tmp_path, capsys, hydra_dir):
    (tmp_path / "p.json").write_text('{"format": "hexicore.plan/1", "pipelines": []')
    code, _, err = run(["evaluate", f"plan_file={tmp_path / 'p.json'}", *hydra_dir], capsys)
    assert code == 2 and "malformed JSON" in err and len(err.strip().splitlines()) == 1


def test_console_script_exit_status(tmp_path):
    """The installed script itself: exit 2, one line, no traceback."""
    (tmp_path / "c.yaml").write_text("- not a mapping\n")
    proc = subprocess.run([sys.executable, "-m", "hexicore.app.cli", "plan", f"cluster_file={tmp_path / 'c.yaml'}",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]  # no run folder, nothing written


def test_train_without_torch_is_one_line(monkeypatch, capsys, hydra_dir):
    """Planning needs no torch; training without it says how to install it (exit 2)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    code, _, err = run(["train", "parallel=none", "model=tiny", *hydra_dir], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "hexicore[torch]" in err


def test_plan_and_evaluate_run_where_torch_cannot_be_imported(tmp_path):
    """The README's first command installs no torch: plan and evaluate (and their runtime check
    of a ZeRO-3 plan, which once imported the torch runtime's ZeRO kernels) must not need it."""
    import subprocess
    import sys

    plan = tmp_path / "z.json"
    script = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
              "from hexicore.app.cli import main\n"
              f"args = ['model=tiny', 'cluster=tight8', 'train.global_batch=8', 'train.zero=3', "
              f"'hydra.run.dir={tmp_path / 'h'}']\n"
              f"code = main(['plan', *args, 'out={plan}']) or main(['evaluate', 'plan_file={plan}', *args[4:]])\n"
              "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "predicted iteration time" in proc.stdout and plan.is_file()


def test_hydra_flags_pass_through(capsys, hydra_dir):
    """`--cfg job` (a flag with a value) is Hydra's, not an override; group errors still one line."""
    code, out, _ = run(["plan", "--cfg", "job", "model=tiny", *hydra_dir], capsys)
    assert code == 0 and "name: tiny" in out and "cluster:" in out
    code, _, err = run(["plan", "--cfg", "job", "solver=nope", *hydra_dir], capsys)
    assert code == 2 and "unknown solver 'nope'" in err


@pytest.mark.parametrize("flags", [["--info"], ["-i"], ["--info", "model=tiny"], ["--info", "defaults"]])
def test_bare_info_shows_hydra_s_information(flags, capsys, hydra_dir):
    """A bare ``--info`` read the job name the CLI appends (or the next override) as its topic
    and stopped with argparse's usage and exit 2."""
    code, out, err = run(["plan", *flags, *hydra_dir], capsys)
    assert code == 0 and ("Defaults List" in out or "Hydra" in out) and "invalid choice" not in err, err


def test_shell_completion_candidates():
    from hexicore.app.cli import complete_line

    assert complete_line("hexicore pl") == ["plan", "plugins"]
    assert complete_line("hexicore plan solver=m") == ["megatron", "metis_like"]
    assert "train.global_batch=" in complete_line("hexicore plan train.g")
    assert "hetero1" in complete_line("hexicore plan cluster=")


def test_job_log_is_written_under_the_command_name(tmp_path, capsys):
    code = run_cli(["plan", "model=tiny", f"out={tmp_path / 'p.json'}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0
    log = (tmp_path / "run" / "plan.log").read_text()
    assert "hexicore plan" in log and "finished with exit status 0" in log


def test_flags_after_the_overrides(tmp_path, capsys):
    """``hexicore plan solver=x --cfg job`` (as docs/plugins.md writes it) and ``a=1,2 -m b=3``
    were argparse errors ("unrecognized arguments: hydra.job.name=plan"), exit 2."""
    code, out, err = run(["plan", "solver=megatron", "model=tiny", "--cfg", "job"], capsys)
    assert code == 0 and "name: megatron" in out and "name: tiny" in out, err
    code, out, err = run(["simulate", "schedule=gpipe,1f1b", "pipeline.ranks=2", "-m",
                          f"hydra.sweep.dir={tmp_path}", "pipeline.micro_batches=3"], capsys)
    assert code == 0, err
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert len(rows) == 3 and all("pipeline.micro_batches=3" in r for r in rows[1:])
