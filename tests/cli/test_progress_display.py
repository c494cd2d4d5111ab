"""Progress where stderr is no terminal (hexicore.app.progress_display): a plain line every
interval, repeated when nothing new came in, nothing for work shorter than one interval, the
ticker stopped however the work ends; on a terminal the rich bar and no lines. The interval is
shortened so that a "slow" solve takes about a second."""

import io
import re
import threading
import time

import pytest
from rich.console import Console

from hexicore.app import compose, progress_display
from hexicore.app.progress_display import ProgressLines, progress_line, shown_progress
from tests.conftest import run_cli

LINE = re.compile(r"^\[(plan(?: #\d+)?) (\d+\.\d) s, (\d+)%\] (.*)$")


class Stamped(io.StringIO):
    """A stream that records when each line was written (monotonic seconds)."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def write(self, text):
        self.times.append(time.monotonic())
        return super().write(text)


def _tickers():
    return [t for t in threading.enumerate() if t.name.endswith(" progress")]


def test_progress_line_is_plain_text():
    assert progress_line("plan", 12.34, "hexiscale: candidate 17/50 (D_dp=3, min_cut), best 4.210 s", 0.337) == \
        "[plan 12.3 s, 34%] hexiscale: candidate 17/50 (D_dp=3, min_cut), best 4.210 s"
    assert progress_line("plan #2", 0.0, "x", 1.7) == "[plan #2 0.0 s, 100%] x"  # fraction clamped


def test_lines_every_interval_with_heartbeat_and_a_final_line():
    interval, slack = 0.25, 0.2  # slack: a thread's wake-up on a loaded machine
    stream = Stamped()
    with ProgressLines("plan", "planning ...", stream, interval_s=interval) as progress:
        start = time.monotonic()
        progress("hexiscale: seeding with symmetric plans", 0.0)
        time.sleep(0.5)
        progress("hexiscale: candidate 1/3 (D_dp=2, min_cut), best 4.200 s", 0.25)
        time.sleep(0.9)  # nothing new: the same state is repeated with the time advancing
    assert not _tickers()
    lines = stream.getvalue().splitlines()
    parsed = [LINE.match(line).groups() for line in lines]
    assert all(label == "plan" for label, *_ in parsed)
    assert parsed[-1][2:] == ("100", "done") and parsed[-2][3].startswith("hexiscale: candidate 1/3")
    assert sum(m.startswith("hexiscale: candidate 1/3") for *_, m in parsed) >= 2  # heartbeats
    assert 4 <= len(lines) - 1 <= 7  # 1.4 s at one line per 0.25 s: 5, plus the final one
    ticks = stream.times[:-1]
    assert ticks[0] - start >= interval - 0.02  # nothing before the first interval
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) <= interval + slack and min(gaps) >= interval - slack, gaps
    elapsed = [float(e) for _, e, *_ in parsed]
    assert elapsed == sorted(elapsed) and elapsed[0] == pytest.approx(interval, abs=0.1)


def test_work_shorter_than_one_interval_prints_nothing():
    stream = io.StringIO()
    with ProgressLines("plan", "planning ...", stream, interval_s=0.5) as progress:
        progress("hexiscale: candidate 1/50", 0.02)
    assert stream.getvalue() == "" and not _tickers()


def test_a_failing_run_stops_the_ticker_without_a_done_line():
    stream = io.StringIO()
    with pytest.raises(RuntimeError, match="no plan fits"):
        with ProgressLines("plan", "planning ...", stream, interval_s=0.1) as progress:
            progress("hexiscale: candidate 1/50", 0.02)
            time.sleep(0.35)
            raise RuntimeError("no plan fits")
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.endswith("hexiscale: candidate 1/50") for line in lines)
    time.sleep(0.25)
    assert stream.getvalue().splitlines() == lines and not _tickers()


def test_a_closed_stream_ends_the_ticker_quietly():
    stream = io.StringIO()
    with ProgressLines("plan", "planning ...", stream, interval_s=0.05):
        stream.close()
        time.sleep(0.2)
        assert not _tickers()


def _slow_solve(real):
    """``compose.solve`` after ~1.2 s of fake search: news, then 0.7 s of none."""

    def solve(cfg, registry, progress):
        progress("hexiscale: seeding with symmetric plans", 0.0)
        time.sleep(0.5)
        progress("hexiscale: candidate 1/3 (D_dp=2, min_cut), best 4.200 s", 0.25)
        time.sleep(0.7)
        return real(cfg, registry, progress)

    return solve


def test_redirected_plan_prints_progress_lines_at_the_interval(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress_display, "INTERVAL_S", 0.2)
    monkeypatch.setattr(compose, "solve", _slow_solve(compose.solve))
    code = run_cli(["plan", "model=tiny", f"out={tmp_path / 'p.json'}", f"hydra.run.dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    assert code == 0 and "plan written to" in out and "[plan" not in out  # lines go to stderr only
    parsed = [LINE.match(line).groups() for line in err.splitlines() if line.startswith("[plan")]
    assert len(parsed) >= 6 and parsed[-1][2:] == ("100", "done")
    assert sum(m.startswith("hexiscale: candidate 1/3") for *_, m in parsed) >= 2
    elapsed = [float(e) for _, e, *_ in parsed[:-1]]  # the spacing itself: the test of ProgressLines above
    assert elapsed[0] >= 0.1 and all(0.05 <= b - a <= 2.0 for a, b in zip(elapsed, elapsed[1:])), elapsed
    assert not _tickers()


def test_sweep_jobs_label_their_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress_display, "INTERVAL_S", 0.2)
    monkeypatch.setattr(compose, "solve", _slow_solve(compose.solve))
    code = run_cli(["plan", "-m", "model=tiny", "train.global_batch=8,16", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    err = capsys.readouterr().err
    assert code in (0, None), err
    labels = {LINE.match(line).group(1) for line in err.splitlines() if line.startswith("[plan")}
    assert labels == {"plan #0", "plan #1"}


def test_on_a_terminal_the_bar_shows_and_no_lines(capsys, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(progress_display, "INTERVAL_S", 0.05)
    monkeypatch.setattr(progress_display, "console",
                        lambda stderr=False: Console(file=screen, force_terminal=True, width=100))
    with shown_progress("plan", "planning ...") as progress:
        assert not isinstance(progress, ProgressLines) and not _tickers()
        progress("hexiscale: candidate 1/3 (D_dp=2, min_cut), best 4.200 s", 0.25)
        time.sleep(0.3)
    assert "hexiscale: candidate 1/3" in screen.getvalue() and "\x1b[" in screen.getvalue()  # the live bar
    assert "[plan" not in screen.getvalue() and "[plan" not in capsys.readouterr().err


def test_redirected_prepare_data_prints_its_share_of_bytes(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tokenizers")
    from hexicore.app.commands import prepare_data
    from tests.cli.test_prepare_data import make_tokenizer

    def slow(*args, progress, **kwargs):  # ~0.1 s per batch of 7 documents: 9 batches
        return real(*args, progress=lambda nbytes: (progress(nbytes), time.sleep(0.1)), **kwargs)

    real = prepare_data.tokenize
    monkeypatch.setattr(prepare_data, "tokenize", slow)
    monkeypatch.setattr(progress_display, "INTERVAL_S", 0.2)
    d, docs = tmp_path, [f"document {i} of the quick brown fox" for i in range(60)]
    (d / "docs.jsonl").write_text("".join(f'{{"text": "{doc}"}}\n' for doc in docs))
    make_tokenizer(d / "tokenizer.json", docs)
    code = run_cli(["prepare-data", f"input={d / 'docs.jsonl'}", f"tokenizer={d / 'tokenizer.json'}",
                    f"out={d / 'c.bin'}", "prepare.batch_docs=7", f"hydra.run.dir={d / 'run'}"])
    err = capsys.readouterr().err
    assert code == 0, err
    parsed = [re.match(r"^\[prepare-data (\d+\.\d) s, (\d+)%\] (.*)$", line).groups() for line in err.splitlines()]
    assert len(parsed) >= 4 and parsed[-1][1:] == ("100", "done")
    shares = [int(p) for _, p, m in parsed[:-1]]
    assert all(m == "tokenizing" for *_, m in parsed[:-1]) and shares == sorted(shares) and 0 < shares[-1] <= 100
