"""``AutoTokenizer.from_pretrained(out/final)`` encodes held-out text to exactly the ids
``prepare-data`` wrote, for Llama, Mistral and Qwen2 checkpoints made by transformers,
and for a Qwen2 model beside a tokenizer of the user's own, whose pipeline transformers would
rebuild otherwise."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex the pipeline Über café "
         "naïve 1234 56789 don't it's 日本 Привет").split()


def documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) + rng.choice(["", ".", "!\n", "  ok", " 2024"])
            for _ in range(n)]


def byte_level_bpe(texts: list[str]) -> Tokenizer:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return bpe


def made_by_transformers(folder: Path, kind: str, bpe: Tokenizer) -> None:
    """A tiny checkpoint and its tokenizer, both saved by transformers' own classes."""
    d = json.loads(bpe.to_str())
    vocab = d["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in d["model"]["merges"]]
    tok = (transformers.Qwen2Tokenizer(vocab=vocab, merges=merges) if kind == "qwen2"
           else transformers.LlamaTokenizer(vocab=vocab, merges=merges))
    model_config(kind, len(tok)).save_pretrained(folder)
    transformers.AutoModelForCausalLM.from_config(model_config(kind, len(tok))).save_pretrained(folder)
    tok.save_pretrained(folder)


def model_config(kind: str, vocab: int):
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}[kind]
    return cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)


def prepared(tmp_path: Path, name: str, texts: list[str], tokenizer: Path) -> Path:
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert run_cli(["prepare-data", f"input={tmp_path / (name + '.jsonl')}", f"tokenizer={tokenizer}",
                    f"out={tmp_path / (name + '.bin')}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    return tmp_path / f"{name}.bin"


def per_document(path: Path) -> list[list[int]]:
    side = json.loads(Path(f"{path}.json").read_text())
    docs, cur = [], []
    for i in np.fromfile(path, dtype=side["dtype"]).tolist():
        if i == side["eos"]:
            docs.append(cur)
            cur = []
        else:
            cur.append(i)
    return docs


def train(tmp_path: Path, src: Path, data: Path) -> int:
    return run_cli(["train", "parallel=none", f"model_file={src}", "train.steps=1", "train.global_batch=2",
                    "train.seq_len=16", "train.dtype=fp32", "runtime.progress=false", f"runtime.data_file={data}",
                    f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}"])


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_final_tokenizer_encodes_held_out_text_to_the_token_files_ids(tmp_path, capsys, kind):
    texts = documents(140, seed=1)
    src = tmp_path / "src"
    made_by_transformers(src, kind, byte_level_bpe(texts[:100]))
    prepared(tmp_path, "train", texts[:100], src)
    held = prepared(tmp_path, "held", texts[100:], src / "tokenizer.json")
    assert train(tmp_path, src, tmp_path / "train.bin") == 0
    assert "AutoTokenizer" not in capsys.readouterr().err
    final = transformers.AutoTokenizer.from_pretrained(tmp_path / "out" / "final")
    assert [final(t, add_special_tokens=False)["input_ids"] for t in texts[100:]] == per_document(held)


@pytest.mark.parametrize("saved", ["tokenizers", "transformers"])
def test_a_users_own_tokenizer_beside_a_qwen2_model_comes_back_from_final(tmp_path, capsys, saved):
    """transformers builds a Qwen2Tokenizer (its own normalizer and pre-tokenizer) for a Qwen2
    model whatever the tokenizer files say; final/ keeps the user's pipeline all the same."""
    texts = documents(140, seed=2)
    own = tmp_path / "own"
    bpe = byte_level_bpe(texts[:100])  # GPT-2's pre-tokenizer, no normalizer
    if saved == "tokenizers":
        own.mkdir()
        bpe.save(str(own / "tokenizer.json"))
    else:  # with the tokenizer_config.json transformers writes
        transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(own)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(model_config("qwen2", 400)).save_pretrained(src)
    data = prepared(tmp_path, "train", texts[:100], own / "tokenizer.json")
    held = prepared(tmp_path, "held", texts[100:], own / "tokenizer.json")
    assert train(tmp_path, src, data) == 0
    assert "AutoTokenizer" not in capsys.readouterr().err
    final = transformers.AutoTokenizer.from_pretrained(tmp_path / "out" / "final")
    assert [final(t, add_special_tokens=False)["input_ids"] for t in texts[100:]] == per_document(held)
    assert final.eos_token == "<|endoftext|>"
