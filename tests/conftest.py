"""Shared fixtures: preset clusters and models loaded from conf/, a fresh registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings

from hexicore.core.cluster import Cluster
from hexicore.core.model import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def cluster_preset(name: str) -> Cluster:
    return Cluster.load(CONF / "cluster" / f"{name}.yaml")


def model_preset(name: str) -> ModelSpec:
    return ModelSpec.load(CONF / "model" / f"{name}.yaml")


# Property tests draw the same examples on every run (CI must not flake on a new random draw);
# the example database is off so runs leave nothing behind.
settings.register_profile("hexicore", derandomize=True, database=None)
settings.load_profile("hexicore")


@pytest.fixture
def paper_case() -> Cluster:
    return cluster_preset("paper_case")


@pytest.fixture
def llama13b() -> ModelSpec:
    return model_preset("llama2_13b")


@pytest.fixture
def tiny() -> ModelSpec:
    return model_preset("tiny")


def _own_hydra_dirs() -> set:
    """Hydra's default run and sweep folders of this process under the working directory (their
    names end with the process id)."""
    import os

    return {p for top in ("outputs", "multirun") for p in Path(top).glob(f"*/*-{os.getpid()}")}


#: folders never compared: tools' caches, the virtual environment; at the repository's root also
#: Hydra's default folders, which the other test worker writes at the same time (this process's
#: own are checked by :func:`_own_hydra_dirs`)
_UNWATCHED = {".venv", ".git", ".hypothesis", "__pycache__", ".pytest_cache"}


def _entries(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its type and (for a regular file) size, stat'ed only."""
    import os
    import stat

    skip = _UNWATCHED | ({"outputs", "multirun"} if root.resolve() == ROOT else set())
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]  # pip's build metadata
        for name in dirs + files:
            p = os.path.join(folder, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            found[p] = (stat.S_IFMT(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return found


def _watched(argv) -> list[Path]:
    """The folders a refusal must leave as they were: the working directory, and the nearest
    existing folder of every path on the command line that lies in a test's own temporary
    folder (never a folder shared by several tests)."""
    import os
    import tempfile

    temp = Path(tempfile.gettempdir()).resolve()
    roots = {Path(".").resolve()}
    for arg in argv:
        value = str(arg).split("=", 1)[-1].strip("'\"")
        if not value.startswith("/"):
            continue
        p = Path(value)
        while not os.path.exists(p) and p != p.parent:  # False for a name too long, not an error
            p = p.parent
        try:
            parts = p.resolve().relative_to(temp).parts
        except (OSError, ValueError):
            continue
        if os.path.isdir(p) and len(parts) >= (3 if parts and parts[0].startswith("pytest-of-") else 1):
            roots.add(p.resolve())
    return sorted(roots)


#: the installation's state, said before any command runs (hexicore.app.commands.plugins
#: .warn_broken_plugins), not a line of the refusal
_BROKEN_PLUGIN = re.compile(r"warning: plugin '.*' \(.*\) skipped: .* \(see `hexicore plugins`\)$")


class _Tee:
    """A stream that keeps what is written to it and passes it on (to capsys, a redirect)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def write(self, text):
        self.seen.append(text)
        return self.inner.write(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run_cli(argv) -> int:
    """``hexicore.app.cli.main`` in-process; its exit status (errors inside the Hydra task leave
    through ``sys.exit``, so SystemExit's code is the status). Every refusal (status 2) in the
    suite is checked here: exactly one line on stderr, no traceback, and no new, removed or
    resized file or folder under the working directory (nor under the test's own temporary
    folders the command line names), Hydra's folders included."""
    import sys

    from hexicore.app.cli import main

    before = _own_hydra_dirs()
    roots = _watched(argv)
    tree = {root: _entries(root) for root in roots}
    tee = sys.stderr = _Tee(sys.stderr)
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stderr = tee.inner
    if code == 2:
        left = _own_hydra_dirs() - before
        assert not left, f"a refused command left {sorted(map(str, left))}"
        err = "".join(tee.seen)
        said = [ln for ln in err.strip().splitlines() if not _BROKEN_PLUGIN.match(ln)]
        assert len(said) == 1 and "Traceback" not in err, f"a refusal wrote to stderr: {err!r}"
        for root in roots:
            now = _entries(root)
            changed = sorted(k for k in now.keys() | tree[root].keys() if now.get(k) != tree[root].get(k))
            assert not changed, f"a refused command changed {changed[:5]}"
    return code


def pytest_collection_modifyitems(config, items):
    """Slow (multi-process) tests first, in their collected order: with ``-n 2`` a minute-long
    test collected last (the README tour) ran alone at the end while the other worker idled."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
