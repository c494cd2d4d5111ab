"""Hugging Face checkpoints in and out, tokenized data, pickle-free resume (CPU, gloo, fp32).

Small models are built locally by ``transformers`` (random init, nothing downloaded) and saved
with ``save_pretrained``; hexicore trains them from ``init_from`` under multi-process plans and
must match a plain PyTorch loop over ``transformers``' own model — same AdamW (lr 3e-4, betas
(0.9, 0.95), eps 1e-5, weight decay 0.1), same token rows, loss = mean cross-entropy over the
global batch — in losses (1e-5 relative) and final weights (``out/final/`` loaded by
``AutoModelForCausalLM.from_pretrained``, 1e-5). One launched 6-rank job runs every case.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hexicore.core.errors import HexicoreError  # noqa: E402
from hexicore.core.hf_config import load_hf_config  # noqa: E402
from hexicore.core.model import ModelSpec  # noqa: E402
from hexicore.core.plan import Plan  # noqa: E402
from hexicore.registry import Registry  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

SEQ, TOL, STEPS, WORLD = 16, 1e-5, 3, 6
LR, BETAS, EPS, WD = 3e-4, (0.9, 0.95), 1e-5, 0.1
CLUSTER = {"name": "cpu6", "inter": {"bandwidth_gbs": 0.7, "latency_us": 50},
           "machines": [{"name": "M", "gpu": "rtx4090", "count": WORLD, "bandwidth_gbs": 32, "latency_us": 10}]}
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}


def make_hf(folder: Path, kind: str, max_shard_size: str | None = None) -> ModelSpec:
    """A random ``transformers`` model of ``kind`` saved with ``save_pretrained`` (biases random
    too, so they matter); returns hexicore's spec of its config.json."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if kind == "llama":  # head_dim 16 != 32 / 4, attention_bias (q, k, v and o), rope_theta
        cfg, cls = LlamaConfig(**COMMON, attention_bias=True, rope_theta=50000.0), LlamaForCausalLM
    elif kind == "qwen2":  # q/k/v biases, tied embeddings
        cfg, cls = Qwen2Config(**COMMON, tie_word_embeddings=True), Qwen2ForCausalLM
    else:  # Llama 3 rope scaling
        cfg, cls = LlamaConfig(**COMMON, rope_parameters=dict(LLAMA3_ROPE)), LlamaForCausalLM
    torch.manual_seed({"llama": 1, "qwen2": 2}.get(kind, 3))
    model = cls(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kw)
    return load_hf_config(folder)


def plan_of(spec: ModelSpec, pipelines, global_batch: int) -> Plan:
    """A plan JSON by hand: ``(batch, schedule, [(tp, layers), ...])`` per pipeline, devices in order."""
    dev, out = 0, []
    for batch, sched, stages in pipelines:
        ss, lo = [], 0
        for tp, n in stages:
            ss.append({"devices": [f"M.{dev + i}" for i in range(tp)], "tp": tp, "layers": [lo, lo + n]})
            dev, lo = dev + tp, lo + n
        out.append({"batch": batch, "schedule": {"name": sched}, "stages": ss})
    return Plan.from_dict({"format": "hexicore.plan/1", "model": spec.to_dict(), "cluster": CLUSTER,
                           "train": {"global_batch": global_batch, "micro_batch": 1, "seq_len": SEQ,
                                     "dtype": "fp32", "recompute": False}, "pipelines": out}, source="test plan")


def layout_of(spec, pipelines, global_batch):
    import dataclasses

    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout

    plan = plan_of(spec, pipelines, global_batch)
    lay = plan_layout(plan, [p.schedule for p in plan.pipelines], registry=Registry.default(), seq_len=SEQ)
    return dataclasses.replace(lay, world=WORLD)


def reference(folder: Path, rows, steps: int):
    """transformers' own model trained by a plain loop: losses and final state_dict."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []
    for step in range(steps):
        batch = rows(step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def loaded(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def max_abs(a, b):
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def expected_reads(layout) -> dict[int, tuple[set[str], int]]:
    """Per rank: the tensors of its own chunks and the bytes of its TP slices of them."""
    from hexicore_plugins.runtimes.torch.parallel.data.sync import _held, full_shapes
    from hexicore_plugins.runtimes.torch.parallel.tensor import shard_dim

    shapes = full_shapes(layout.model)
    out: dict[int, tuple[set[str], int]] = {}
    for part in layout.pipelines:
        for s in range(part.actions.stages):
            g = part.groups[part.actions.stage_rank[s]]
            lo, hi = part.chunk_layers[s]
            names = {n for n in shapes if _held(n, lo, hi, part.first_of_chain(s), part.last_of_chain(s))}
            nbytes = sum(4 * math.prod(shapes[n]) // (g.tp if shard_dim(n) is not None else 1) for n in names)
            for r in g.ranks:
                old = out.get(r, (set(), 0))
                out[r] = (old[0] | names, old[1] + nbytes)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few hundred KB of generated text, a BPE tokenizer trained on it, ``prepare-data``'s X.bin."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("corpus")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex the pipeline".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, size=int(rng.integers(5, 60)))) for _ in range(400)]
    (d / "docs.txt").write_text("\n".join(docs))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "</s>"]))
    tok.save(str(d / "tokenizer.json"))
    code = run_cli(["prepare-data", f"input={d / 'docs.txt'}", f"tokenizer={d / 'tokenizer.json'}",
                    f"out={d / 'x.bin'}", f"hydra.run.dir={d / 'run'}"])
    assert code == 0
    return d / "x.bin"


def test_init_from_refuses_a_mismatched_checkpoint_before_launch(tmp_path, corpus, capsys, monkeypatch):
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod
    from safetensors.torch import load_file, save_file

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    src = tmp_path / "hf"
    make_hf(src, "llama")
    state = load_file(src / "model.safetensors")
    state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"][:, :-1].contiguous()
    save_file(state, str(src / "model.safetensors"))
    capsys.readouterr()
    base = ["train", "parallel=none", f"model_file={src}", "train.steps=1", "train.global_batch=2",
            f"train.seq_len={SEQ}", "runtime.progress=false", f"out={tmp_path / 'o'}"]
    code = run_cli([*base, f"init_from={src}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "model.layers.1.mlp.up_proj.weight" in err
    from hexicore.core.token_file import write_sidecar

    ids = np.arange(1000, dtype=np.uint16) % 120  # ids up to 119, the model embeds 96
    ids.tofile(tmp_path / "big.bin")
    write_sidecar(tmp_path / "big.bin", {"dtype": "uint16", "vocab": 120, "tokens": 1000})
    make_hf(src, "llama")
    capsys.readouterr()
    code = run_cli([*base, "runtime.data=tokens", f"runtime.data_file={tmp_path / 'big.bin'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "token id 119 is outside the model's vocabulary of 96" in err and "big.bin" in err


@pytest.mark.slow
def test_hf_models_train_like_transformers_and_come_back_as_hf_directories(tmp_path, corpus):
    from hexicore_plugins.runtimes.torch.train.data_source import SyntheticTokens, TokenData
    from hexicore_plugins.runtimes.torch.launch.launcher import launch
    from tests.helpers import worker_spec
    specs, cases = [], []

    def add(name, folder, lay, rows, **kw):
        specs.append(worker_spec(lay, steps=kw.pop("steps", STEPS), seed=kw.pop("seed", 0), dtype="fp32",
                                 recompute=False, progress=False, init_from=str(folder), out=str(tmp_path / name),
                                 **kw))
        cases.append((name, folder, lay, rows))

    # Llama (head_dim != hidden/heads, attention_bias, rope_theta) from a *sharded* HF checkpoint,
    # under an asymmetric plan: tp=2 stage + tp=1 stage (1f1b, b=5) | three tp=1 stages (gpipe, b=3)
    llama = make_hf(tmp_path / "llama", "llama", max_shard_size="40KB")
    assert (tmp_path / "llama" / "model.safetensors.index.json").is_file()
    lay = layout_of(llama, [(5, "1f1b", [(2, 3), (1, 1)]), (3, "gpipe", [(1, 1), (1, 2), (1, 1)])], 8)
    add("llama", tmp_path / "llama", lay, SyntheticTokens(96, SEQ, 8, 0).batch, shard_mb=2**-20)  # 1 byte
    # Qwen2 (q/k/v biases, tied embeddings; embedding and head on different ranks and pipelines)
    qwen = make_hf(tmp_path / "qwen2", "qwen2")
    lay = layout_of(qwen, [(4, "1f1b", [(1, 2), (1, 2)]), (2, "gpipe", [(2, 4)])], 6)
    add("qwen2", tmp_path / "qwen2", lay, SyntheticTokens(96, SEQ, 6, 0).batch)
    # Llama 3 rope scaling
    l3 = make_hf(tmp_path / "llama3", "llama3")
    assert dict(l3.rope_scaling)["rope_type"] == "llama3"
    lay = layout_of(l3, [(4, "1f1b", [(1, 3), (2, 1)])], 4)
    add("llama3", tmp_path / "llama3", lay, SyntheticTokens(96, SEQ, 4, 0).batch)
    # tokenized data: 4 steps with a checkpoint after 2, then a resume from it
    tok_lay = layout_of(qwen, [(2, "1f1b", [(1, 1), (1, 3)]), (2, "gpipe", [(1, 4)])], 4)
    data = dict(data="tokens", data_file=str(corpus), data_id={"kind": "tokens", "file": "x.bin"})
    add("tokens", tmp_path / "qwen2", tok_lay, TokenData(corpus, 96, SEQ, 4, 7).batch, steps=4, seed=7,
        checkpoint_every=2, **data)
    specs.append(worker_spec(tok_lay, steps=4, seed=7, dtype="fp32", recompute=False, progress=False,
                             out=str(tmp_path / "resumed"), resume=str(tmp_path / "tokens" / "checkpoints" / "step_2"),
                             **data))

    results = launch(specs, WORLD)

    report = []
    for (name, folder, lay, rows), got in zip(cases, results):
        losses, state = reference(folder, rows, len(got["metrics"]["losses"]))
        rel = max_rel(got["metrics"]["losses"], losses)
        w = max_abs(loaded(tmp_path / name / "final"), state)
        report.append(f"{name:8s} loss rel {rel:.1e}  final weights abs {w:.1e}")
        assert rel <= TOL and w <= TOL, report[-1]
    print("\n".join(report))
    # the resumed run continues exactly (same rows, same optimizer state, no pickles)
    assert results[-1]["metrics"]["losses"] == results[-2]["metrics"]["losses"]
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin.tmp"))
    # out/final sharded (tiny threshold): one shard per stage of pipeline 0, the index from rank 0
    final = tmp_path / "llama" / "final"
    index = json.loads((final / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    assert index["weight_map"]["model.layers.0.self_attn.o_proj.bias"] == "model-00001-of-00002.safetensors"
    assert index["weight_map"]["lm_head.weight"] == "model-00002-of-00002.safetensors"
    # tied: the head is not stored
    assert "lm_head.weight" not in loaded_names(tmp_path / "qwen2" / "final")
    # every rank read exactly its own chunks' tensors, and only its TP slices of them
    want = expected_reads(cases[0][2])
    for r in range(WORLD):
        doc = json.loads((tmp_path / "llama" / "reads" / f"rank_{r}.json").read_text())
        assert set(doc["tensors"]) == want[r][0] and len(doc["tensors"]) == len(want[r][0]), r
        assert doc["bytes"] == want[r][1], r
    whole = sum(4 * p.numel() for p in loaded(final).values())
    tp_rank = json.loads((tmp_path / "llama" / "reads" / "rank_1.json").read_text())
    assert tp_rank["bytes"] < whole / 2


def loaded_names(folder: Path) -> set[str]:
    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import checkpoint_shapes

    return set(checkpoint_shapes(folder))


def test_header_check_names_the_tensor(tmp_path):
    from hexicore_plugins.runtimes.torch.parallel.data.sync import full_shapes
    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import check_shapes

    spec = make_hf(tmp_path, "qwen2")
    check_shapes(full_shapes(spec), tmp_path, tied=True)
    shapes = full_shapes(spec)
    shapes["model.layers.3.self_attn.k_proj.bias"] = (99,)
    with pytest.raises(HexicoreError, match=r"k_proj.bias.*\[32\].*\[99\]"):
        check_shapes(shapes, tmp_path, tied=True)
    shapes.pop("model.layers.3.self_attn.k_proj.bias")
    with pytest.raises(HexicoreError, match="k_proj.bias' in the checkpoint is not a parameter"):
        check_shapes(shapes, tmp_path, tied=True)


@pytest.mark.parametrize("entry, says", [
    ({"shape": None}, "has shape None"),
    ({"shape": ["4"]}, "has shape ['4']"),
    ({"data_offsets": [0]}, "not [begin, end]"),
    ({"dtype": 4}, "not a name"),
    ({"data_offsets": [0, 12], "shape": [4]}, "spans 12 bytes, its dtype and shape need 16"),
])
def test_a_malformed_header_entry_is_refused_before_any_worker(tmp_path, entry, says):
    """Header entries that safetensors itself would reject when a worker opens the file (before:
    a TypeError traceback in the launcher, or safetensors' error inside a worker) are one line
    naming the file and the tensor; the total size still matches, so only the entry tells."""
    from safetensors.torch import save_file

    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import checkpoint_shapes

    save_file({"a": torch.zeros(4), "b": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    raw = (tmp_path / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8: 8 + n])
    head["a"].update(entry)
    if entry.get("data_offsets") == [0, 12]:  # shift b down so the file's size still adds up
        head["b"]["data_offsets"] = [12, 20]
        raw = raw[: 8 + n] + raw[8 + n: 8 + n + 12] + raw[8 + n + 16:]
    text = json.dumps(head).encode()
    (tmp_path / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    with pytest.raises(HexicoreError) as exc:
        checkpoint_shapes(tmp_path)
    assert exc.value.source == str(tmp_path / "model.safetensors") and exc.value.field == "init_from"
    assert "tensor 'a'" in str(exc.value) and says in str(exc.value)


def test_gaps_and_bad_metadata_are_refused_before_and_in_a_worker(tmp_path):
    """safetensors wants the tensors back to back from byte 0 and ``__metadata__`` of strings;
    before, such files passed the launcher's check and failed in the worker's ``safe_open`` with
    a traceback. Now the header check names them, and a worker's read (the file replaced after
    the check) is one line naming the file and the tensor too."""
    from safetensors.torch import save_file

    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import SafeTensors, checkpoint_shapes

    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(2)}, str(path), metadata={"format": "pt"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head, data = json.loads(raw[8: 8 + n]), raw[8 + n:]

    def write(h, d):
        text = json.dumps(h).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + d)

    last = max((k for k in head if k != "__metadata__"), key=lambda k: head[k]["data_offsets"][1])
    lo, hi = head[last]["data_offsets"]
    write({**head, last: {**head[last], "data_offsets": [lo + 4, hi + 4]}}, data[:lo] + bytes(4) + data[lo:])
    with pytest.raises(HexicoreError, match=f"tensor '{last}' starts at byte {lo + 4}, the previous data ends at {lo}"):
        checkpoint_shapes(tmp_path)
    with pytest.raises(HexicoreError, match=f"tensor '{last}' cannot be read") as exc:
        SafeTensors({last: path}).read(last, tuple(head[last]["shape"]), None, 0, 1)
    assert exc.value.source == str(path)
    write({**head, "__metadata__": {"format": 1}}, data)
    with pytest.raises(HexicoreError, match="__metadata__ must map names to strings"):
        checkpoint_shapes(tmp_path)


def test_final_holds_one_layout_only(tmp_path, capsys):
    """A run into an ``out`` whose ``final/`` a sharded run wrote: before, the new
    ``model.safetensors`` joined the old index and shards, so transformers (which reads
    ``model.safetensors`` first) and hexicore's ``init_from`` (the index) loaded different runs."""
    from transformers import AutoModelForCausalLM

    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import INDEX, save_tensors, shard_name, write_index

    final = tmp_path / "out" / "final"
    final.mkdir(parents=True)
    for k in range(2):
        save_tensors(final / shard_name(k, 2), {f"old.{k}": torch.zeros(2)})
    write_index(final, {f"old.{k}": shard_name(k, 2) for k in range(2)}, 16)
    code = run_cli(["train", "parallel=none", "model=tiny", "model.layers=2", "train.steps=1", "train.global_batch=2",
                    "train.seq_len=16", "train.dtype=fp32", "runtime.progress=false", f"out={tmp_path / 'out'}",
                    f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert not (final / INDEX).exists()
    AutoModelForCausalLM.from_pretrained(final)


def test_a_directory_with_both_layouts_is_read_as_transformers_reads_it(tmp_path):
    """A third-party directory holding ``model.safetensors`` and an index with shards: before,
    hexicore read the index and transformers the single file, so ``init_from`` and
    ``from_pretrained`` started from different weights."""
    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import SINGLE, save_tensors, shard_name, weight_files, write_index

    save_tensors(tmp_path / SINGLE, {"w": torch.ones(2)})
    save_tensors(tmp_path / shard_name(0, 1), {"w": torch.zeros(2), "old": torch.zeros(1)})
    write_index(tmp_path, {"w": shard_name(0, 1), "old": shard_name(0, 1)}, 12)
    assert weight_files(tmp_path) == {"w": tmp_path / SINGLE}
    (tmp_path / SINGLE).unlink()
    assert weight_files(tmp_path) == {"w": tmp_path / shard_name(0, 1), "old": tmp_path / shard_name(0, 1)}


def test_resume_refuses_another_seed_model_or_data_and_states_another_plan():
    from hexicore_plugins.runtimes.torch.checkpoint.native import check_resume

    model = {"name": "m", "layers": 4}
    ck = {"dir": "ck/step_2", "step": 2, "seed": 1, "model": model, "data": {"kind": "tokens", "file": "x.bin",
                                                                            "size": 10}, "plan": "aaaa"}
    same = dict(model=model, seed=1, data=ck["data"], plan="aaaa")
    assert check_resume(ck, **same) is None
    assert "another plan" in check_resume(ck, **{**same, "plan": "bbbb"})
    with pytest.raises(HexicoreError, match="seed 1, this run has seed 2"):
        check_resume(ck, **{**same, "seed": 2})
    with pytest.raises(HexicoreError, match="model differs in layers"):
        check_resume(ck, **{**same, "model": {"name": "m", "layers": 5}})
    with pytest.raises(HexicoreError, match="trained on data"):
        check_resume(ck, **{**same, "data": {"kind": "synthetic"}})
