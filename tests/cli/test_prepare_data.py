"""``hexicore prepare-data`` and the token-file format (hexicore.core.token_file): ids equal the
tokenizer's own encoding with EOS between documents; windows are a pure function of (seed, step);
bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hexicore.core.errors import HexicoreError
from hexicore.core.token_file import TokenFile, window_starts, windows
from tests.conftest import run_cli

tokenizers = pytest.importorskip("tokenizers")

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex the pipeline".split()


def make_tokenizer(path, texts):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"]))
    tok.save(str(path))
    return tok


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))) for _ in range(60)]
    (tmp_path / "a.txt").write_text(docs[0])
    with (tmp_path / "b.jsonl").open("w") as fh:
        for d in docs[1:]:
            fh.write(json.dumps({"text": d, "id": 1}) + "\n")
    tok = make_tokenizer(tmp_path / "tokenizer.json", docs)
    return tmp_path, docs, tok


def test_prepare_data_matches_the_tokenizer(corpus, capsys):
    d, docs, tok = corpus
    out = d / "out" / "corpus.bin"
    # b.jsonl named by the glob and by its path is read once (before: its documents twice)
    code = run_cli(["prepare-data", f"input=[{d / 'a.txt'},{d / '*.jsonl'},{d / 'b.jsonl'}]",
                    f"tokenizer={d / 'tokenizer.json'}",
                    f"out={out}", "prepare.batch_docs=7", f"hydra.run.dir={d / 'run'}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "tokens/s" in printed.out
    tf = TokenFile.open(out)
    eos = tok.token_to_id("</s>")
    expected = [i for doc in docs for i in (*tok.encode(doc, add_special_tokens=False).ids, eos)]
    assert tf.dtype == "uint16" and tf.documents == 60 and tf.eos == eos
    assert tf.array().tolist() == expected
    assert not list(out.parent.glob(".*tmp"))


def test_windows_are_a_pure_function_of_seed_and_step():
    a = window_starts(3, 17, 8, 10_000, 33)
    assert np.array_equal(a, window_starts(3, 17, 8, 10_000, 33))
    assert not np.array_equal(a, window_starts(3, 18, 8, 10_000, 33))
    assert not np.array_equal(a, window_starts(4, 17, 8, 10_000, 33))
    assert a.min() >= 0 and a.max() <= 10_000 - 33
    data = np.arange(10_000, dtype=np.uint16)
    rows = windows(data, a, 33)
    assert rows.shape == (8, 33) and (np.diff(rows, axis=1) == 1).all()


def test_token_file_refusals(tmp_path):
    from hexicore.core.token_file import write_sidecar

    path = tmp_path / "t.bin"
    np.array([1, 2, 300, 4] * 20, dtype=np.uint16).tofile(path)
    with pytest.raises(HexicoreError, match="sidecar"):
        TokenFile.open(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 301, "tokens": 80})
    tf = TokenFile.open(path)
    with pytest.raises(HexicoreError, match="token id 300 is outside"):
        tf.check(model_vocab=256, seq_len=8)
    tf.check(model_vocab=301, seq_len=8)
    write_sidecar(path, {"dtype": "uint16", "vocab": 301, "tokens": 81})
    with pytest.raises(HexicoreError, match="says 81 tokens"):
        TokenFile.open(path)
    write_sidecar(path, {"dtype": "int8", "vocab": 301})
    with pytest.raises(HexicoreError) as exc:
        TokenFile.open(path)
    assert exc.value.field == "dtype"


def test_empty_documents_are_skipped_and_no_text_at_all_is_refused(corpus, capsys):
    """An empty or blank .txt file, or an empty ``text``, has no tokens: it is skipped (a lone
    end-of-text id is no document; before, each became one) and said so; input with no tokens
    at all is one line, exit 2, and writes nothing."""
    d, docs, tok = corpus
    (d / "empty.txt").write_text("")
    (d / "blank.txt").write_text("  \n\n")
    (d / "some.jsonl").write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": docs[0]}) + "\n")
    out, hydra = d / "e.bin", f"hydra.run.dir={d / 'run'}"
    code = run_cli(["prepare-data", f"input=[{d / 'empty.txt'},{d / 'some.jsonl'},{d / 'blank.txt'}]",
                    f"tokenizer={d / 'tokenizer.json'}", f"out={out}", hydra])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "skipped 3 empty documents" in printed.out
    tf, eos = TokenFile.open(out), tok.token_to_id("</s>")
    assert tf.documents == 1 and tf.array().tolist() == [*tok.encode(docs[0], add_special_tokens=False).ids, eos]
    code = run_cli(["prepare-data", f"input=[{d / 'empty.txt'},{d / 'blank.txt'}]", f"tokenizer={d / 'tokenizer.json'}",
                    f"out={d / 'none.bin'}", hydra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no document has any text (2 empty)" in err[0], err
    assert not (d / "none.bin").exists() and not list(d.glob(".*tmp"))


@pytest.mark.parametrize("args, field", [
    (["input=/nonexistent/*.txt"], "input"),
    (["tokenizer=/nonexistent/tokenizer.json"], "tokenizer"),
    (["prepare.eos=<nope>"], "prepare.eos"),
    (["input=null"], "input: needs at least one input file"),
    (["prepare.eos=[SEP]"], "prepare.eos: expected a token or an id, got list"),  # Hydra's list, not "[SEP]"  # no input= at all ("no such input file: ")
])
def test_prepare_data_bad_input_is_one_line(corpus, capsys, args, field):
    d, _, _ = corpus
    base = {"input": f"input={d / 'a.txt'}", "tokenizer": f"tokenizer={d / 'tokenizer.json'}"}
    for a in args:
        base[a.split("=")[0].split(".")[0]] = a
    code = run_cli(["prepare-data", *base.values(), f"out={d / 'x.bin'}", f"hydra.run.dir={d / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1
    assert not (d / "x.bin").exists()


def test_sidecar_max_id_is_trusted_only_while_its_stamp_matches(tmp_path):
    from hexicore.core.token_file import file_stamp, write_sidecar

    path = tmp_path / "t.bin"
    np.array([1, 2, 3, 4] * 20, dtype=np.uint16).tofile(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 5, "tokens": 80, "max_id": 4, "stamp": file_stamp(path)})
    assert TokenFile.open(path).max_id == 4
    TokenFile.open(path).check(model_vocab=256, seq_len=8)
    np.array([1, 2, 300, 4] * 20, dtype=np.uint16).tofile(path)  # rewritten; the sidecar understates vocab
    tf = TokenFile.open(path)
    assert tf.max_id is None
    with pytest.raises(HexicoreError, match="token id 300 is outside"):
        tf.check(model_vocab=256, seq_len=8)


@pytest.mark.parametrize("eos", ["300", "-1", "70001"])
def test_prepare_data_eos_outside_the_vocabulary_is_one_line(corpus, capsys, eos):
    d, _, _ = corpus
    code = run_cli(["prepare-data", f"input={d / 'a.txt'}", f"tokenizer={d / 'tokenizer.json'}", f"prepare.eos={eos}",
                    f"out={d / 'x.bin'}", f"hydra.run.dir={d / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "prepare.eos" in err and "vocabulary" in err and len(err.strip().splitlines()) == 1
    assert not (d / "x.bin").exists()


@pytest.mark.parametrize("case", ["input", "foreign_bin", "foreign_sidecar", "parent_is_file"])
def test_prepare_data_owns_its_outputs(corpus, capsys, case):
    d, _, _ = corpus
    (d / "f.bin").write_text("foreign")
    (d / "g.bin.json").write_text('{"foreign": 1}')
    out = {"input": d / "a.txt", "foreign_bin": d / "f.bin", "foreign_sidecar": d / "g.bin",
           "parent_is_file": d / "a.txt" / "x.bin"}[case]
    before = {p: p.read_bytes() for p in (d / "a.txt", d / "f.bin", d / "g.bin.json")}
    code = run_cli(["prepare-data", f"input={d / 'a.txt'}", f"tokenizer={d / 'tokenizer.json'}", f"out={out}",
                    f"hydra.run.dir={d / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "out" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before
    assert not (d / "a.txt.json").exists() and not (d / "g.bin").exists()


def test_prepare_data_replaces_its_own_token_file(corpus, capsys):
    d, _, _ = corpus
    (d / "f.bin").write_text("foreign")
    args = [f"input={d / 'a.txt'}", f"tokenizer={d / 'tokenizer.json'}", f"hydra.run.dir={d / 'run'}"]
    assert run_cli(["prepare-data", *args, f"out={d / 'x.bin'}"]) == 0
    assert run_cli(["prepare-data", *args, f"out={d / 'x.bin'}"]) == 0  # its own: replaced
    assert run_cli(["prepare-data", *args, f"out={d / 'f.bin'}", "overwrite=true"]) == 0
    assert run_cli(["prepare-data", *args, f"out={d / 'x.bin'}", "overwrite=false"]) == 2
    assert run_cli(["prepare-data", *args, f"out={d / 'a.txt'}", "overwrite=true"]) == 2  # never the input
    capsys.readouterr()
    tf = TokenFile.open(d / "f.bin")
    assert tf.max_id == int(tf.array().max())


def test_only_the_launcher_scans_a_token_file_without_a_valid_max_id(tmp_path, monkeypatch):
    """``prepare`` (the launching process) scans the ids once and tells its workers so: a worker
    opening the file does not scan it again, and a spec made without that check still does."""
    pytest.importorskip("torch")
    from hexicore.core.token_file import write_sidecar
    from hexicore_plugins.runtimes.torch.train.data_source import make_source

    path = tmp_path / "t.bin"
    np.array([1, 2, 3, 4] * 20, dtype=np.uint16).tofile(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 5, "tokens": 80})  # no max_id: ids must be scanned
    scans = []
    monkeypatch.setattr(TokenFile, "scan_max", lambda self: scans.append(1) or 4)
    common = dict(vocab=256, seq_len=8, global_batch=2, seed=0, path=str(path))
    make_source("tokens", **common)
    assert len(scans) == 1
    src = make_source("tokens", **common, check_ids=False)
    assert len(scans) == 1 and src.batch(0).shape == (2, 9)
    import hexicore_plugins.runtimes.torch.launch.launcher as launch_mod

    jobs = []
    monkeypatch.setattr(launch_mod, "launch", lambda specs, *a, **k: jobs.extend(specs) or [None])
    run_cli(["train", "model=tiny", "parallel=none", "train.steps=1", "train.global_batch=2", "train.seq_len=8",
             "runtime.data=tokens", f"runtime.data_file={path}", "runtime.progress=false",
             f"out={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'h'}"])
    assert len(scans) == 2 and len(jobs) == 1 and jobs[0].data_checked  # the launcher scanned; its workers will not


def test_byte_order_marks_and_crlf_are_no_text(corpus, capsys):
    """A UTF-8 byte-order mark (Windows editors write one) and CRLF line ends give the same ids
    as the plain file: before, a .txt file's mark became a token of its own (the tokenizer's
    unknown id) and a .jsonl file's first line was refused as not JSON."""
    d, docs, tok = corpus
    text = docs[0] + "\n" + docs[1] + "\n"
    (d / "plain.txt").write_bytes(text.encode())
    (d / "marked.txt").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    line = json.dumps({"text": docs[0]}).encode()
    (d / "plain.jsonl").write_bytes(line + b"\n")
    (d / "marked.jsonl").write_bytes(b"\xef\xbb\xbf" + line + b"\r\n")
    ids = {}
    for name in ("plain.txt", "marked.txt", "plain.jsonl", "marked.jsonl"):
        code = run_cli(["prepare-data", f"input={d / name}", f"tokenizer={d / 'tokenizer.json'}",
                        f"out={d / (name + '.bin')}", f"hydra.run.dir={d / 'run'}"])
        assert code == 0, capsys.readouterr().err
        ids[name] = TokenFile.open(d / (name + ".bin")).array().tolist()
    assert ids["marked.txt"] == ids["plain.txt"] and ids["marked.jsonl"] == ids["plain.jsonl"]
    assert ids["plain.jsonl"] == [*tok.encode(docs[0], add_special_tokens=False).ids, tok.token_to_id("</s>")]


def test_a_lone_surrogate_in_jsonl_text_is_one_line(corpus, capsys):
    """JSON may escape half of a surrogate pair (``"\\ud800"``): no UTF-8 text, which the
    tokenizer cannot encode (before: a TypeError traceback from inside tokenizers)."""
    d, docs, _ = corpus
    (d / "s.jsonl").write_text(json.dumps({"text": docs[0]}) + "\n" + '{"text": "a\\ud800b"}\n')
    code = run_cli(["prepare-data", f"input={d / 's.jsonl'}", f"tokenizer={d / 'tokenizer.json'}",
                    f"out={d / 's.bin'}", f"hydra.run.dir={d / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "s.jsonl: line 2:" in err[0] and "surrogate" in err[0], err
    assert not (d / "s.bin").exists()


def test_a_file_of_exactly_one_window_is_enough(tmp_path):
    """``seq_len + 1`` ids are one window (offset 0); one id fewer is refused, and the message
    states both numbers truthfully (before: 17 ids were refused as "fewer than a sequence of 17")."""
    from hexicore.core.token_file import write_sidecar

    path = tmp_path / "w.bin"
    np.arange(17, dtype=np.uint16).tofile(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 17, "tokens": 17})
    tf = TokenFile.open(path)
    tf.check(model_vocab=17, seq_len=16)
    starts = window_starts(0, 3, 4, tf.tokens, 17)
    assert windows(tf.array(), starts, 17).tolist() == [list(range(17))] * 4
    with pytest.raises(HexicoreError, match="holds 17 tokens, fewer than one window of 18"):
        tf.check(model_vocab=17, seq_len=17)


@pytest.mark.parametrize("change, field", [
    ({"documents": "x"}, "documents"),  # before: ValueError from int()
    ({"documents": -1}, "documents"),
    ({"dtype": ["uint16"]}, "dtype"),  # before: TypeError (unhashable list)
    ({"eos": 1000000}, "eos"),  # before: trained, and final/ silently had no eos token
])
def test_a_malformed_sidecar_is_one_error_naming_the_field(tmp_path, change, field):
    from hexicore.core.token_file import write_sidecar

    path = tmp_path / "t.bin"
    np.arange(40, dtype=np.uint16).tofile(path)
    write_sidecar(path, {"dtype": "uint16", "vocab": 40, "tokens": 40, **change})
    with pytest.raises(HexicoreError) as exc:
        TokenFile.open(path)
    assert exc.value.field == field and exc.value.source == str(tmp_path / "t.bin.json")


def test_a_directory_is_no_token_file(tmp_path):
    """Before: its directory entry's size was read as the data ("the sidecar says 40 tokens, the
    file holds 2048")."""
    from hexicore.core.token_file import write_sidecar

    (tmp_path / "t.bin").mkdir()
    write_sidecar(tmp_path / "t.bin", {"dtype": "uint16", "vocab": 40, "tokens": 40})
    with pytest.raises(HexicoreError, match="is a directory") as exc:
        TokenFile.open(tmp_path / "t.bin")
    assert exc.value.field == "runtime.data_file"


def test_a_refused_run_leaves_no_folder_it_made(corpus, capsys):
    """``out`` in folders that do not exist yet: they are made before tokenizing (so a bad path
    fails early) and removed again when nothing is written (before: left behind, empty)."""
    d, _, _ = corpus
    (d / "empty.txt").write_text("")
    code = run_cli(["prepare-data", f"input={d / 'empty.txt'}", f"tokenizer={d / 'tokenizer.json'}",
                    f"out={d / 'new' / 'deeper' / 'x.bin'}", f"hydra.run.dir={d / 'run'}"])
    assert code == 2 and "no document has any text" in capsys.readouterr().err
    assert not (d / "new").exists()


def test_blank_documents_are_skipped_with_a_byte_level_tokenizer(tmp_path, capsys):
    """A byte-level tokenizer (GPT-2, Llama 3, Qwen style) has tokens for whitespace: a blank
    .txt file or ``text`` is still no document (before, each was written as whitespace ids and
    an end-of-text id, and counted)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox"] * 5, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    assert tok.encode(" \n\n", add_special_tokens=False).ids  # whitespace has tokens here
    (tmp_path / "blank.txt").write_text(" \n\n")
    (tmp_path / "a.txt").write_text("the fox")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "\t \n"}) + "\n")
    out = tmp_path / "x.bin"
    code = run_cli(["prepare-data", f"input=[{tmp_path / 'blank.txt'},{tmp_path / 'a.txt'},{tmp_path / 'b.jsonl'}]",
                    f"tokenizer={tmp_path / 'tokenizer.json'}", f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "skipped 2 empty documents" in printed.out
    tf, eos = TokenFile.open(out), tok.token_to_id("<|endoftext|>")
    assert tf.documents == 1 and tf.array().tolist() == [*tok.encode("the fox", add_special_tokens=False).ids, eos]


def test_window_starts_differ_for_every_seed():
    """Seeds that agree in their low 32 bits (5, 2**32 + 5; -1, 2**32 - 1) draw different
    windows: before, the seed was cut to 32 bits and such runs read the same data."""
    starts = {s: window_starts(s, 0, 8, 1_000_000, 33).tolist() for s in (5, 2**32 + 5, 2**64 + 5, -1, 2**32 - 1)}
    assert len({tuple(v) for v in starts.values()}) == len(starts), starts
    assert starts[5] == window_starts(5, 0, 8, 1_000_000, 33).tolist()


def test_an_upper_case_jsonl_suffix_is_read_as_json_lines(corpus):
    """``B.JSONL`` holds one document per line, as ``b.jsonl`` does (before, the whole file was
    tokenized as one text document, JSON syntax included)."""
    d, docs, tok = corpus
    (d / "b.jsonl").rename(d / "B.JSONL")
    out = d / "up.bin"
    assert run_cli(["prepare-data", f"input={d / 'B.JSONL'}", f"tokenizer={d / 'tokenizer.json'}", f"out={out}",
                    f"hydra.run.dir={d / 'run'}"]) == 0
    eos = tok.token_to_id("</s>")
    want = [i for doc in docs[1:] for i in (*tok.encode(doc, add_special_tokens=False).ids, eos)]
    tf = TokenFile.open(out)
    assert tf.documents == len(docs) - 1 and tf.array().tolist() == want
