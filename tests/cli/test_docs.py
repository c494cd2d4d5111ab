"""The generated CLI reference and the concept pictures."""

from pathlib import Path

from hexicore.app.compose import config_from_overrides, load_cluster
from hexicore.app.cli import GROUPS, _group_options
from hexicore.app.docgen import main, render
from hexicore.app.picture import save_action_list_picture, save_cluster_picture


def test_cli_reference_is_docs_cli_md_and_lists_only_what_hexicore_ships():
    """docs/cli.md is docgen's output on every install: the options of conf/ and of the plugins
    hexicore ships, none of another package (examples/hexicore-annealing, installed by CI or not,
    or one already in Hydra's ConfigStore)."""
    from hydra.core.config_store import ConfigStore

    from hexicore.registry import Registry

    cs = ConfigStore.instance()
    cs.store(group="solver", name="zz_third_party", node={"name": "zz_third_party", "speed": 1})
    try:
        text = render()
    finally:
        cs.repo.get("solver", {}).pop("zz_third_party.yaml", None)
    assert text == (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8"), \
        "docs/cli.md is stale: python -m hexicore.app.docgen docs/cli.md"
    shipped = Registry.shipped()
    for g in GROUPS:
        for option in _group_options(g, shipped):
            assert f"`{option}`" in text
    assert "zz_third_party" not in text and "`annealing`" not in text and "solver.name=annealing" not in text
    assert "`train.global_batch=24`" in text and "`hexicore simulate`" in text


def test_docgen_help_prints_usage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import pytest

    monkeypatch.chdir(tmp_path)
    for flag in ("--help", "-h"):
        with pytest.raises(SystemExit) as e:
            main([flag])
        assert e.value.code == 0 and "usage: python -m hexicore.app.docgen" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--bogus"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    import hexicore.app.docgen as docgen  # the rendering itself: test_cli_reference_is_docs_cli_md_...

    monkeypatch.setattr(docgen, "render", lambda: "# CLI reference\n")
    assert main(["ref.md"]) == 0 and (tmp_path / "ref.md").read_text(encoding="utf-8").startswith("# CLI reference")


def test_concept_pictures(tmp_path):
    import hexicore

    c = save_cluster_picture(load_cluster(config_from_overrides(["exclude=[A.1]"])), tmp_path / "c.png")
    al = hexicore.simulate("1f1b", ranks=2, micro_batches=2).action_list
    a = save_action_list_picture(al, tmp_path / "a.png")
    for p in (c, a):
        assert p.read_bytes()[:4] == b"\x89PNG"


def test_a_name_the_font_cannot_draw_leaves_stderr_alone(tmp_path):
    """A cluster named with an emoji: the pictures draw a box for it, and matplotlib's warning
    per missing glyph (four lines of source path on every ``hexicore plan``) is not raised."""
    import warnings
    from dataclasses import replace

    import hexicore
    from hexicore.app.picture import save_plan_picture

    plan = hexicore.plan()
    plan = replace(plan, cluster=replace(plan.cluster, name="кла́стер 🚀"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = save_plan_picture(plan, tmp_path / "p.png")
        c = save_cluster_picture(plan.cluster, tmp_path / "c.png")
    assert p.read_bytes()[:4] == c.read_bytes()[:4] == b"\x89PNG"
