"""Bad checkpoints in: a truncated file, a lying ``meta.json`` or index, other tensors, bad
values. Each is one line naming the file and the field, exit status 2, before any worker starts
(non-finite values, found where the weights are read, too); nothing is written.

One small run (``model=tiny``, 2 steps, a checkpoint after each) provides the files to damage.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import run_cli  # noqa: E402

TRAIN = ["train", "model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=4",
         "runtime.progress=false", "parallel=none"]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck") / "ref"
    assert run_cli([*TRAIN, "train.steps=2", "train.checkpoint_every=1", f"out={out}"]) == 0
    return out


@pytest.fixture
def no_launch(monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))


def one_line_exit_2(code, capsys, *words):
    lines = capsys.readouterr().err.strip().splitlines()
    err = "\n".join(x for x in lines if "torch threads per rank" not in x)  # a launched run's note
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edited(src: Path, dst: Path, file: str, name: str, change) -> Path:
    """A copy of directory ``src`` at ``dst`` whose tensor ``name`` in ``file`` is ``change(tensor)``."""
    from safetensors.torch import load_file, save_file

    folder = copy(src, dst)
    state = load_file(folder / file)
    state[name] = change(state[name])
    save_file(state, str(folder / file))
    return folder


def test_the_last_step_is_checkpointed(ref):
    names = sorted(p.name for p in (ref / "checkpoints").iterdir())
    assert names == ["step_1", "step_2"]  # step_2 is the end of training, not a multiple skipped


def test_a_truncated_safetensors_file_is_refused_before_launch(ref, tmp_path, capsys, no_launch):
    ck = copy(ref / "checkpoints" / "step_1", tmp_path / "ck")
    with open(ck / "optim.safetensors", "r+b") as f:
        f.truncate((ck / "optim.safetensors").stat().st_size - 100)
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=3", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "optim.safetensors", "truncated")
    hf = copy(ref / "final", tmp_path / "hf")
    with open(hf / "model.safetensors", "r+b") as f:
        f.truncate((hf / "model.safetensors").stat().st_size - 100)
    code = run_cli([*TRAIN, "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "model.safetensors", "init_from", "truncated")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("edit, field", [
    ({"step": 7}, "losses"), ({"step": -1}, "step"), ({"step": "1"}, "step"), ({"adam_step": "nan"}, "adam_step"),
    ({"adam_step": -2}, "adam_step"), ({"losses": []}, "losses"), ({"step_s": [1.0, 2.0]}, "step_s"),
    ({"seed": None}, "seed"), ({"model": []}, "model"), ({"global_batch": 0}, "global_batch")])
def test_meta_json_fields_are_checked(ref, tmp_path, capsys, no_launch, edit, field):
    ck = copy(ref / "checkpoints" / "step_1", tmp_path / "ck")
    meta = json.loads((ck / "meta.json").read_text())
    (ck / "meta.json").write_text(json.dumps({**meta, **edit}))
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=3", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, f"{ck / 'meta.json'}: {field}:")


def test_meta_json_with_only_a_format_is_refused(ref, tmp_path, capsys, no_launch):
    ck = copy(ref / "checkpoints" / "step_1", tmp_path / "ck")
    (ck / "meta.json").write_text(json.dumps({"format": "hexicore.checkpoint/2", "step": "1"}))
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=3", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "meta.json: step:")


def test_resume_refuses_nothing_to_train_another_batch_or_seq_len(ref, tmp_path, capsys, no_launch):
    ck = ref / "checkpoints" / "step_2"
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=2", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "train.steps", "nothing to train")
    code = run_cli([*TRAIN, "train.steps=3", "train.global_batch=8", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "train.global_batch", "global_batch 4, this run has 8")
    seq = json.loads((ck / "meta.json").read_text())["seq_len"]
    code = run_cli([*TRAIN, "train.steps=3", f"train.seq_len={seq // 2}", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "train.seq_len")


def test_a_fault_before_the_resumed_step_is_refused(ref, tmp_path, capsys, no_launch):
    ck = ref / "checkpoints" / "step_1"  # the resumed run trains step 1 only (train.steps=2)
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=2", "runtime.fault={rank: 0, step: 0, kind: die}", f"resume={ck}",
                    f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "runtime.fault.step", "steps 1 to 1 (resumed at step 1)")
    assert not (tmp_path / "o").exists()


def test_model_difference_shows_every_field():
    from hexicore.core.errors import HexicoreError
    from hexicore_plugins.runtimes.torch.checkpoint.native import check_resume

    ck = {"dir": "ck", "step": 1, "seed": 0, "model": {"layers": 4, "hidden": 32}, "data": {}, "plan": "p"}
    with pytest.raises(HexicoreError) as e:
        check_resume(ck, model={"layers": 5, "hidden": 64}, seed=0, data={}, plan="p")
    assert "hidden: 32 there, 64 here" in str(e.value) and "layers: 4 there, 5 here" in str(e.value)


def test_resume_checks_tensor_names_and_shapes_before_launch(ref, tmp_path, capsys, no_launch):
    from safetensors.torch import load_file, save_file

    ck = copy(ref / "checkpoints" / "step_1", tmp_path / "ck")
    optim = load_file(ck / "optim.safetensors")
    name = "exp_avg.model.norm.weight"
    save_file({**optim, name: optim[name][:-1].contiguous()}, str(ck / "optim.safetensors"))
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=3", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "resume", name, "shape")
    model = load_file(ck / "model.safetensors")
    model["model.norm2.weight"] = model.pop("model.norm.weight")
    save_file(model, str(ck / "model.safetensors"))
    code = run_cli([*TRAIN, "train.steps=3", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "resume", "model.norm.weight", "missing")


def sharded(ref: Path, folder: Path) -> dict:
    """``ref/final`` as two shards and an index."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    state = load_file(ref / "final" / "model.safetensors")
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, ns in halves.items():
        save_file({n: state[n] for n in ns}, str(folder / f))
    shutil.copy(ref / "final" / "config.json", folder / "config.json")
    index = {"metadata": {}, "weight_map": {n: f for f, ns in halves.items() for n in ns}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def test_a_lying_index_is_refused_before_launch(ref, tmp_path, capsys, no_launch):
    hf = tmp_path / "hf"
    index = sharded(ref, hf)
    path = hf / "model.safetensors.index.json"
    dropped = dict(index["weight_map"])
    dropped.pop("model.norm.weight")
    run = [*TRAIN, "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"]
    capsys.readouterr()
    for wm, words in (
            (dropped, ["model.norm.weight", "missing"]),
            ([1, 2], [str(path), "init_from.weight_map", "mapping"]),
            ({**index["weight_map"], "model.norm.weight": "../ref/final/model.safetensors"},
             [str(path), "init_from.weight_map", "outside"]),
            ({**index["weight_map"], "model.norm.weight": str(ref / "final" / "model.safetensors")},
             ["outside"]),
            ({**index["weight_map"], "model.norm.weight": "model-00002-of-00002.safetensors"}
             if index["weight_map"]["model.norm.weight"] != "model-00002-of-00002.safetensors"
             else {**index["weight_map"], "model.norm.weight": "model-00001-of-00002.safetensors"},
             ["does not hold it"])):
        path.write_text(json.dumps({"weight_map": wm}))
        one_line_exit_2(run_cli(run), capsys, *words)
    assert not (tmp_path / "o").exists()


def test_init_from_refuses_integer_weights_before_launch(ref, tmp_path, capsys, no_launch):
    hf = edited(ref / "final", tmp_path / "hf", "model.safetensors", "model.norm.weight", lambda t: t.to(torch.int32))
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "model.norm.weight", "I32", "floating point")


def test_init_from_refuses_non_finite_weights_where_they_are_read(ref, tmp_path, capsys):
    def nan_at_3(t):
        t[3] = float("nan")
        return t

    hf = edited(ref / "final", tmp_path / "hf", "model.safetensors", "model.norm.weight", nan_at_3)
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"])
    err = one_line_exit_2(code, capsys, "model.norm.weight", "NaN", str(hf / "model.safetensors"))
    assert "init_from" in err and not (tmp_path / "o" / "metrics.json").exists()


def test_non_finite_moments_name_the_resume_field(ref, tmp_path, capsys):
    """A NaN in ``optim.safetensors`` is one line naming the file, the tensor and ``resume``
    (before, the moments' reader named ``init_from``, a key the run did not set)."""
    def inf_at_0(t):
        t[0] = float("inf")
        return t

    ck = edited(ref / "checkpoints" / "step_1", tmp_path / "ck", "optim.safetensors", "exp_avg.model.norm.weight",
                inf_at_0)
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=2", f"resume={ck}", f"out={tmp_path / 'o'}"])
    err = one_line_exit_2(code, capsys, "exp_avg.model.norm.weight", "NaN", str(ck / "optim.safetensors"))
    assert ": resume: " in err and "init_from" not in err, err
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_init_from_refuses_a_config_of_another_model(ref, tmp_path, capsys, no_launch):
    """``init_from`` a directory whose config.json gives another rope base and norm epsilon
    (same tensors): one line naming both, before launch (before, the weights trained silently
    as the command line's model, not the network transformers builds from the directory)."""
    hf = copy(ref / "final", tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(rope_theta=500.0, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    (hf / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    code = run_cli([*TRAIN, "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, str(hf / "config.json"), "init_from", "rope_theta: 500.0 there, 10000.0 here",
                    "norm_eps")
    assert not (tmp_path / "o").exists()


def test_init_from_its_own_config_and_a_foreign_config_pass_the_check(ref, tmp_path):
    """The run's own final/ passes; a config the runtime does not read leaves the tensors to decide."""
    from hexicore.core.hf_config import load_hf_config
    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import check_config

    model = load_hf_config(ref / "final")
    check_config(ref / "final", model)
    hf = copy(ref / "final", tmp_path / "hf")
    (hf / "config.json").write_text(json.dumps({"model_type": "gemma"}))
    check_config(hf, model)


def test_resume_refuses_another_token_file_of_the_same_name_and_size(tmp_path, capsys):
    """A checkpoint records a digest of its data file: resuming on a shuffled file of the same
    name and size is one line naming ``runtime.data`` (before, it trained on, silently reading
    other windows than the uninterrupted run); a copy of the same file resumes."""
    import numpy as np

    from hexicore.core.token_file import write_sidecar

    def corpus(folder, ids):
        folder.mkdir()
        ids.astype("<u2").tofile(folder / "x.bin")
        write_sidecar(folder / "x.bin", {"dtype": "uint16", "vocab": 256, "tokens": len(ids)})
        return folder / "x.bin"

    ids = np.random.default_rng(0).integers(0, 256, 300_000)
    data = ["runtime.data=tokens", f"runtime.data_file={corpus(tmp_path / 'a', ids)}"]
    assert run_cli([*TRAIN, *data, "train.steps=1", "train.checkpoint_every=1", f"out={tmp_path / 'r'}"]) == 0
    ck = tmp_path / "r" / "checkpoints" / "step_1"
    assert json.loads((ck / "meta.json").read_text())["data"]["digest"]
    other = ["runtime.data=tokens", f"runtime.data_file={corpus(tmp_path / 'b', ids[::-1].copy())}"]
    capsys.readouterr()
    code = run_cli([*TRAIN, *other, "train.steps=2", f"resume={ck}", f"out={tmp_path / 'o'}"])
    one_line_exit_2(code, capsys, "runtime.data", str(ck))
    same = ["runtime.data=tokens", f"runtime.data_file={corpus(tmp_path / 'c', ids)}"]
    assert run_cli([*TRAIN, *same, "train.steps=2", f"resume={ck}", f"out={tmp_path / 'o'}"]) == 0


def test_a_checkpoint_without_a_data_digest_resumes():
    """Checkpoints written before digests were recorded compare kind, file and size only."""
    from hexicore_plugins.runtimes.torch.checkpoint.native import check_resume

    ck = {"dir": "ck", "seed": 0, "model": {}, "step": 1, "plan": "p",
          "data": {"kind": "tokens", "file": "x.bin", "size": 9}}
    now = {"kind": "tokens", "file": "x.bin", "size": 9, "digest": "ab"}
    assert check_resume(ck, model={}, seed=0, data=now, plan="p", steps=2) is None
    with pytest.raises(Exception, match="trained on data"):
        check_resume({**ck, "data": {**ck["data"], "digest": "cd"}}, model={}, seed=0, data=now, plan="p", steps=2)


def test_resumed_throughput_skips_the_first_step_of_the_process(ref, tmp_path, capsys):
    ck = ref / "checkpoints" / "step_1"
    out = tmp_path / "o"
    assert run_cli([*TRAIN, "train.steps=3", "train.checkpoint_every=2", f"resume={ck}", f"out={out}"]) == 0, \
        capsys.readouterr().err
    m = json.loads((out / "metrics.json").read_text())
    seq = json.loads((ck / "meta.json").read_text())["seq_len"]
    assert m["tokens_per_s"] == pytest.approx(4 * seq / m["step_s"][2], rel=1e-9)  # step 2 only: step 1 was warm-up
    assert m["measured"]["steps"] == 1 and m["measured"]["step_s"] == pytest.approx(m["step_s"][2])
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2", "step_3"]  # and the end


def test_one_step_measures_nothing_steady():
    from hexicore_plugins.runtimes.torch.profile.measure import measured

    summary = {"pipeline": 0, "stage": 0, "schedule_s": None, "sync_steps": [], "forward_s": None,
               "backward_s": None, "peak_memory_gb": 1.0}
    got = measured([summary], [0.5], [1], "rss")
    assert got["step_s"] is None and got["steps"] == 0


@pytest.mark.slow
def test_a_worker_that_reads_non_finite_weights_exits_2(ref, tmp_path, capsys):
    """Two ranks: the worker's one-line input error is the run's, exit status 2 (not a crash)."""
    from safetensors.torch import load_file, save_file

    hf = copy(ref / "final", tmp_path / "hf")
    state = load_file(hf / "model.safetensors")
    state["model.embed_tokens.weight"][0, 0] = float("inf")
    save_file(state, str(hf / "model.safetensors"))
    capsys.readouterr()
    run = [x for x in TRAIN if x != "parallel=none"]
    code = run_cli([*run, "pipeline.ranks=2", "train.steps=1", f"init_from={hf}", f"out={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "model.embed_tokens.weight" in err and "NaN or infinite" in err, err
