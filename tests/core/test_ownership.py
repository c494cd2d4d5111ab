"""Outputs never clobber what is not theirs (hexicore.core.ownership): a command refuses, before
any work, to replace a file that is not a hexicore output of the same kind."""

from __future__ import annotations

import json

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.ownership import check_writable, kind_of
from tests.conftest import model_preset, run_cli


def test_plan_refuses_a_foreign_file_and_its_sibling(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "important.txt").write_text("my notes")
    code = run_cli(["plan", "model=tiny", f"out={notes / 'important.txt'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 2 and "not a hexicore output" in err and len(err.strip().splitlines()) == 1
    assert (notes / "important.txt").read_text() == "my notes"
    (notes / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)  # someone else's picture
    code = run_cli(["plan", "model=tiny", f"out={notes / 'p.json'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert code == 2 and "p.png" in capsys.readouterr().err and not (notes / "p.json").exists()


def test_plan_replaces_its_own_outputs(tmp_path, capsys):
    out = tmp_path / "plan.json"
    for _ in range(2):
        assert run_cli(["plan", "model=tiny", f"out={out}", f"hydra.run.dir={tmp_path / 'r'}"]) == 0
    assert kind_of(out) == "hexicore.plan" and kind_of(tmp_path / "plan.png") == "hexicore.png"
    assert run_cli(["plan", "model=tiny", f"out={out}", "overwrite=false", f"hydra.run.dir={tmp_path / 'r'}"]) == 2
    capsys.readouterr()


def test_kinds_and_overwrite(tmp_path):
    actions = tmp_path / "a.json"
    actions.write_text(json.dumps({"format": "hexicore.actions/1"}))
    with pytest.raises(HexicoreError, match="is an actions file; refusing to replace it with a plan file "):
        check_writable(actions, "hexicore.plan")
    check_writable(actions, "hexicore.plan", overwrite=True)
    with pytest.raises(HexicoreError, match="is a directory"):
        check_writable(tmp_path, "hexicore.plan", overwrite=True)
    check_writable(tmp_path / "new.json", "hexicore.plan", overwrite=False)


@pytest.mark.parametrize("found,kind,words", [
    ("hexicore.plan", "hexicore.actions", "is a plan file; refusing to replace it with an actions file "),
    ("hexicore.summary", "hexicore.hf_index", "is a summary file; refusing to replace it with an hf_index file "),
    ("hexicore.metrics", "hexicore.trace", "is a metrics file; refusing to replace it with a trace file "),
])
def test_refusals_take_the_article_of_the_word(tmp_path, found, kind, words):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"format": f"{found}/1"}))
    with pytest.raises(HexicoreError) as e:
        check_writable(f, kind)
    assert words in str(e.value) and " a a" not in str(e.value)


def test_two_concurrent_plans_without_out_both_kept(tmp_path):
    """Two runs started together get their own run directories (sub-second time + process id)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "import sys; from hexicore.app.cli import main; sys.exit(main(sys.argv[1:]))",
           "plan", "model=tiny", "solver=megatron"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    assert all(p.wait(120) == 0 for p in procs), [p.stderr.read() for p in procs]
    plans = sorted(tmp_path.glob("outputs/*/*/plan.json"))
    assert len(plans) == 2 and plans[0].parent != plans[1].parent


def test_final_directory_files_are_ours_only_when_marked(tmp_path):
    """What train writes in out/final/ (config.json, safetensors, the shard index) carries its
    mark, so a later run replaces it; the same names without the mark are refused."""
    pytest.importorskip("torch")
    import torch

    from hexicore.core.hf_config import write_hf_config
    from hexicore.core.ownership import check_final_dir
    from hexicore_plugins.runtimes.torch.checkpoint import hugging_face as hf_io

    final = tmp_path / "final"
    write_hf_config(model_preset("tiny"), final)
    hf_io.save_tensors(final / "model.safetensors", {"w": torch.zeros(2)})
    hf_io.save_tensors(final / "model-00001-of-00002.safetensors", {"w": torch.zeros(2)})
    hf_io.write_index(final, {"w": "model-00001-of-00002.safetensors"}, 8)
    assert {kind_of(f) for f in final.iterdir()} == {"hexicore.hf_config", "hexicore.safetensors",
                                                     "hexicore.hf_index"}
    check_final_dir(final)
    with pytest.raises(HexicoreError, match="overwrite=false"):
        check_final_dir(final, overwrite=False)
    for name in ("model-00002-of-00002.safetensors", "model.safetensors.index.json"):
        (final / name).write_text('{"weight_map": {}}')
        with pytest.raises(HexicoreError, match="not a hexicore output") as exc:
            check_final_dir(final)
        assert exc.value.source == str(final / name)
        check_final_dir(final, overwrite=True)
        (final / name).unlink()
