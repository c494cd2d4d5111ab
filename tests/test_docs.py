"""The generated CLI reference and the concept pictures."""

from hexicore.app.compose import config_from_overrides, load_cluster
from hexicore.app.cli import GROUPS, _group_options
from hexicore.app.docgen import render
from hexicore.app.picture import save_action_list_picture, save_cluster_picture


def test_cli_reference_lists_every_group_option_and_key():
    text = render()
    for g in GROUPS:
        for option in _group_options(g):
            assert f"`{option}`" in text
    assert "`train.global_batch=24`" in text and "`hexicore simulate`" in text


def test_concept_pictures(tmp_path):
    import hexicore

    c = save_cluster_picture(load_cluster(config_from_overrides(["exclude=[A.1]"])), tmp_path / "c.png")
    al = hexicore.simulate("1f1b", ranks=2, micro_batches=2).action_list
    a = save_action_list_picture(al, tmp_path / "a.png")
    for p in (c, a):
        assert p.read_bytes()[:4] == b"\x89PNG"
