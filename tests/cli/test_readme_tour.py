"""The README's tour runs as written, in order, from a fresh directory (with the repository's
``conf/`` beside it, as "from the repository root" says): every ``hexicore`` command exits 0,
the cluster-file example plans, and the library example runs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def tour() -> tuple[list[tuple[str, str]], str]:
    """The tour's steps in the README's order: ``("write", FILE + "\n" + YAML)`` for a YAML block
    the text before it tells to save as a file, ``("run", COMMAND)`` for each ``hexicore`` line
    of a bash block; and the library example."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A short tour"):]
    section = section[: section.index("\n## ", 5)]
    steps: list[tuple[str, str]] = []
    at = 0
    for found in re.finditer(r"```(\w+)\n(.*?)```", section, flags=re.S):
        lang, body = found.groups()
        before = section[at:found.start()]
        at = found.end()
        if lang == "yaml":
            named = re.findall(r"save\s+this\s+one\s+as\s+`([^`]+)`", before)
            if named:
                steps.append(("write", f"{named[-1]}\n{body}"))
        elif lang == "bash":
            steps += [("run", ln.split("  #")[0].strip()) for ln in body.splitlines()
                      if ln.strip().startswith("hexicore ")]
    python_block = next(body for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
                        if lang == "python")
    return steps, python_block


#: the keys whose value is a file or directory the command reads
READS = ("cluster_file", "model_file", "plan_file", "warm_start", "init_from", "resume", "tokenizer", "input",
         "runtime.data_file", "cost.profile_file")


@pytest.mark.slow
def test_readme_tour_runs_in_order(tmp_path, monkeypatch, capsys):
    """In a fresh git directory with the repository's .gitignore: every file a command reads
    exists when the README reaches it (the README shows it first), every command exits 0, and
    nothing the tour writes is left untracked."""
    steps, library = tour()
    assert sum(kind == "run" for kind, _ in steps) >= 15
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    (tmp_path / ".gitignore").write_text((ROOT / ".gitignore").read_text() + "/conf\n/.gitignore\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for kind, what in steps:
        if kind == "write":
            name, body = what.split("\n", 1)
            (tmp_path / name).write_text(body)
            continue
        argv = shlex.split(what)[1:]
        for arg in argv:
            key, _, value = arg.partition("=")
            if key in READS and value:
                assert (tmp_path / value).exists(), f"{what}: {value} is used before the README shows or makes it"
        code = run_cli(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{what}: {err}"
    assert (tmp_path / "runs" / "plan" / "metrics.json").is_file()
    exec(compile(library, "README.md (library example)", "exec"), {})
    left = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True,
                          check=True).stdout.split("\n")
    assert [ln for ln in left if ln] == [], "the tour leaves untracked files: " + ", ".join(left[:10])
