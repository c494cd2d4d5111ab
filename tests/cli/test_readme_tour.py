"""The README's tour runs as written, in order, from a fresh directory (with the repository's
``conf/`` beside it, as "from the repository root" says): every ``hexicore`` command exits 0,
the cluster-file example plans, and the library example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def tour() -> tuple[list[str], str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A short tour"):]
    section = section[: section.index("\n## ", 5)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    commands = [ln.split("  #")[0].strip() for lang, body in blocks if lang == "bash"
                for ln in body.splitlines() if ln.strip().startswith("hexicore ")]
    yaml_block = next(body for lang, body in blocks if lang == "yaml")
    python_block = next(body for lang, body in blocks if lang == "python")
    return commands, yaml_block, python_block


@pytest.mark.slow
def test_readme_tour_runs_in_order(tmp_path, monkeypatch, capsys):
    commands, cluster_yaml, library = tour()
    assert len(commands) >= 15
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    (tmp_path / "my_cluster.yaml").write_text(cluster_yaml)
    for cmd in commands:
        argv = shlex.split(cmd)[1:]
        code = run_cli(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{cmd}: {err}"
    assert (tmp_path / "runs" / "plan" / "metrics.json").is_file()
    exec(compile(library, "README.md (library example)", "exec"), {})
