"""Shared fixtures: preset clusters and models loaded from conf/, a fresh registry."""

from __future__ import annotations

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
    from pathlib import Path

    return {p for top in ("outputs", "multirun") for p in Path(top).glob(f"*/*-{os.getpid()}")}


def run_cli(argv) -> int:
    """``hexicore.app.cli.main`` in-process; its exit status (errors inside the Hydra task leave
    through ``sys.exit``, so SystemExit's code is the status). A refusal (status 2) must leave no
    Hydra folder behind."""
    from hexicore.app.cli import main

    before = _own_hydra_dirs()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    if code == 2:
        left = _own_hydra_dirs() - before
        assert not left, f"a refused command left {sorted(map(str, left))}"
    return code


def pytest_collection_modifyitems(config, items):
    """Slow (multi-process) tests first, in their collected order: with ``-n 2`` a minute-long
    test collected last (the README tour) ran alone at the end while the other worker idled."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
