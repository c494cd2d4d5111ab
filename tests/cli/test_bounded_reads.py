"""Every read is bounded: inputs are regular files under a size limit per kind (docs/formats.md,
"Limits"), a FIFO is never waited on and a device never read; text corpora stream and the
tokenizer gets bounded pieces, so one huge line neither exhausts memory nor aborts the process."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.cli.test_hydra_outputs import bounded, refused, tree
from tests.cli.test_prepare_data import make_tokenizer

TRAIN = ["train", "model=tiny", "train.dtype=fp32", "train.global_batch=2", "train.steps=1", "parallel=none",
         "runtime.progress=false"]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_a_fifo_or_device_is_never_read_as_an_input(fifo, tmp_path, monkeypatch, capsys):
    """Each would block for ever (a FIFO) or read gigabytes (``/dev/zero``); each is one line."""
    monkeypatch.chdir(tmp_path)
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    before = tree(tmp_path)
    for argv in (["plan", "model=tiny", f"cluster_file={fifo}"], ["plan", f"model_file={fifo}"],
                 ["evaluate", f"plan_file={fifo}"], ["plan", "model=tiny", f"warm_start={fifo}"],
                 ["evaluate", f"plan_file={zero}"]):
        refused(argv, capsys, "not a regular file")
    pytest.importorskip("torch")
    for path in (fifo, zero):
        refused([*TRAIN, "runtime.data=text", f"runtime.data_file={path}", f"out={tmp_path / 'run'}"], capsys,
                "runtime.data_file", "not a regular file")
    from hexicore.core.token_file import write_sidecar

    write_sidecar(fifo, {"dtype": "uint16", "vocab": 256})
    write_sidecar(zero, {"dtype": "uint16", "vocab": 256})
    before = tree(tmp_path)
    for path in (fifo, zero):
        refused([*TRAIN, "runtime.data=tokens", f"runtime.data_file={path}", f"out={tmp_path / 'run'}"], capsys,
                "runtime.data_file", "not a regular file")
    assert tree(tmp_path) == before


def test_a_file_above_its_limit_is_refused_unread(tmp_path, monkeypatch, capsys):
    """A 100 MB cluster file (sparse: nothing is written to disk) took minutes; refused at once."""
    monkeypatch.chdir(tmp_path)
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(100 << 20)
    with bounded(20):
        refused(["plan", "model=tiny", f"cluster_file={big}"], capsys, "limit of 67,108,864 bytes")


tokenizers = pytest.importorskip("tokenizers")


def test_long_documents_reach_the_tokenizer_in_bounded_pieces(tmp_path, monkeypatch, capsys):
    """A document far longer than one piece (a one-line text file, a JSON line) is encoded piece
    by piece, cut between words, to the same ids as the whole; a tokenizer file that is a FIFO is
    refused."""
    from hexicore.app.commands import prepare_data

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    words = "the quick brown fox jumps over a lazy dog while wizards hex pipelines".split()
    long_doc = " ".join(rng.choice(words, size=3000)) + "\nand a second line " * 3
    (tmp_path / "a.txt").write_text(long_doc)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": long_doc[::-1]}) + "\n" + json.dumps({"text": "short"}))
    tok = make_tokenizer(tmp_path / "tokenizer.json", [long_doc, long_doc[::-1], "short"])
    monkeypatch.setattr(prepare_data, "TOKENIZER_PIECE", 64)
    monkeypatch.setattr(prepare_data, "TOKENIZER_BATCH", 256)
    seen, batches = [], []
    original = prepare_data._batches

    def spy(parts, size):
        for batch, nbytes in original(parts, size):
            seen.extend(len(t) for t, _ in batch)
            batches.append(sum(len(t) for t, _ in batch))
            yield batch, nbytes

    monkeypatch.setattr(prepare_data, "_batches", spy)
    out = tmp_path / "x.bin"
    from tests.conftest import run_cli

    assert run_cli(["prepare-data", "input=[a.txt,b.jsonl]", "tokenizer=tokenizer.json", f"out={out}"]) == 0
    eos = tok.token_to_id("</s>")
    expected = [i for doc in (long_doc, long_doc[::-1], "short")
                for i in (*tok.encode(doc, add_special_tokens=False).ids, eos)]
    from hexicore.core.token_file import TokenFile

    assert TokenFile.open(out).array().tolist() == expected
    assert max(seen) <= 64 and len(seen) > 100 and max(batches) < 256 + 64  # whatever prepare.batch_docs says
    for text in (long_doc, "x" * 1000, "a\n" * 100):
        parts = list(prepare_data.pieces(text, 64))
        assert "".join(parts) == text and max(map(len, parts)) <= 64
    capsys.readouterr()
    fifo = tmp_path / "tok.json"
    os.mkfifo(fifo)
    refused(["prepare-data", "input=a.txt", f"tokenizer={fifo}", "out=y.bin"], capsys, "not a regular file")


def test_a_json_line_above_its_limit_is_refused_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from hexicore.app.commands import prepare_data

    monkeypatch.chdir(tmp_path)
    make_tokenizer(tmp_path / "tokenizer.json", ["some words here"])
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "some words"}) + "\n" + json.dumps({"text": "w " * 500}))
    monkeypatch.setattr(prepare_data, "JSONL_LINE_BYTES", 200)
    before = tree(tmp_path)
    refused(["prepare-data", "input=b.jsonl", "tokenizer=tokenizer.json", "out=x.bin", "prepare.batch_docs=1"],
            capsys, "line 2", "limit of 200 bytes")
    assert tree(tmp_path) == before


def test_sigterm_while_tokenizing_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The temporary token file is removed on every exit path: an error, Ctrl-C, and SIGTERM
    (which ended the process without running the clean-up). Run in a forked child, where the
    signal's default would end only the child."""
    import signal

    from hexicore.app.commands import prepare_data

    tok = make_tokenizer(tmp_path / "tokenizer.json", ["some words here"])

    def documents(files, text_key):
        yield "some words", 10, True
        os.kill(os.getpid(), signal.SIGTERM)
        yield "more words", 10, True

    monkeypatch.setattr(prepare_data, "documents", documents)
    pid = os.fork()
    if pid == 0:  # the child: tokenize, then leave at once with the exit status it got
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            prepare_data.tokenize([tmp_path / "a.txt"], tok, 1, tmp_path / "x.bin", text_key="text", batch_docs=1)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM, status
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]


def _resident_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def test_byte_level_text_is_memory_mapped_whatever_its_size(tmp_path):
    """A 3 GiB text file (sparse: nothing written to disk) was refused above 1 GiB, and below it
    read whole into every rank; now a step reads its windows only, the same rows as before."""
    torch = pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.train.data_source import ByteText, demo_text_path

    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.write(b"hexicore " * 100)
        fh.truncate(3 << 30)
    before = _resident_bytes()
    source = ByteText(big, 256, 64, 8, seed=0)
    rows = [source.batch(step) for step in range(20)]
    assert len(source.data) == 3 << 30 and all(r.shape == (8, 65) and r.dtype == torch.int64 for r in rows)
    assert _resident_bytes() - before < 64 << 20
    text = torch.frombuffer(bytearray(demo_text_path().read_bytes()), dtype=torch.uint8)
    demo = ByteText(None, 256, 32, 4, seed=3)
    for step in range(3):  # the windows the whole-file reader took
        g = torch.Generator().manual_seed((3 * 1_000_033 + step * 7_919 + 12_345) % (2**63))
        starts = torch.randint(0, len(text) - 33, (4,), generator=g)
        assert demo.batch(step, 1, 3).equal(torch.stack([text[s: s + 33] for s in starts.tolist()[1:3]]).long())


def _writing(pid: int, folder) -> bool:
    """Whether process ``pid`` holds its output open in ``folder``: an unnamed file (shown as
    ``folder/#inode (deleted)``) or a temporary name there."""
    try:
        held = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(h.startswith(str(folder)) and (h.endswith("(deleted)") or h.endswith(".hexicore-tmp")) for h in held)


@pytest.mark.slow
def test_sigkill_during_prepare_data_leaves_no_file(tmp_path):
    """SIGKILL runs no clean-up at all: the output is an unnamed file until it is complete."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    make_tokenizer(tmp_path / "tokenizer.json", ["some words here and there"])
    (tmp_path / "big.txt").write_text("some words here and there\n" * 400_000)
    data = tmp_path / "data"
    data.mkdir()
    before = tree(data)
    proc = subprocess.Popen([str(Path(sys.executable).with_name("hexicore")), "prepare-data", "input=big.txt",
                             "tokenizer=tokenizer.json", f"out={data / 'x.bin'}", f"hydra.run.dir={tmp_path / 'h'}",
                             "hydra.output_subdir=null"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    end = time.monotonic() + 120
    while not _writing(proc.pid, data) and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.005)
    assert proc.poll() is None, "prepare-data ended before it was killed: give it more text"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert tree(data) == before


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_killed_writers_temporary_file_is_gone_or_reclaimed(tmp_path, monkeypatch, unnamed):
    """Where the system has no unnamed files, a killed writer's temporary name is removed by the
    next writer into that folder (its process is gone); and where the unnamed file cannot be
    linked to its name (a sandbox), its bytes are copied there."""
    import signal

    from hexicore.app.commands import prepare_data
    from hexicore.core import schema

    if not unnamed:
        monkeypatch.setattr(schema, "_unnamed_file", lambda folder: None)
    tok = make_tokenizer(tmp_path / "tokenizer.json", ["some words here"])
    (tmp_path / "a.txt").write_text("some words here")

    def documents(files, text_key):
        yield "some words", 10, True
        os.kill(os.getpid(), signal.SIGKILL)

    real = prepare_data.documents
    monkeypatch.setattr(prepare_data, "documents", documents)
    pid = os.fork()
    if pid == 0:
        prepare_data.tokenize([tmp_path / "a.txt"], tok, 1, tmp_path / "x.bin", text_key="text", batch_docs=1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["a.txt", "tokenizer.json"] if unnamed else len(left) == 3
    monkeypatch.setattr(prepare_data, "documents", real)
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(PermissionError(1, "no linkat here")))
    stats, _ = prepare_data.tokenize([tmp_path / "a.txt"], tok, 1, tmp_path / "x.bin", text_key="text",
                                     batch_docs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "tokenizer.json", "x.bin"]
    assert np.fromfile(tmp_path / "x.bin", dtype=stats["dtype"]).tolist()[-1] == 1
