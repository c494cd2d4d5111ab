"""How a long command shows its progress on stderr: the rich bar on a terminal, plain timed
lines anywhere else (a file, a pipe, a CI log, a captured sweep job).

The command hands the work a :data:`hexicore.planner.problem.Progress` callback
``(message, fraction)``. On a terminal it moves the bar, as it always has. Elsewhere it only
records the latest state; a ticker thread prints that state every :data:`INTERVAL_S` seconds,
whether or not anything new came in (a heartbeat: a redirected run is never silent for longer),
as one plain line::

    [plan 12.3 s, 34%] hexiscale: candidate 17/50 (D_dp=3, min_cut), best 4.210 s

(``[plan #3 ...]`` in job 3 of a sweep). Work that ends within the first interval prints
nothing, so a quick run, and a quick failure with its one error line, reads as before; after at
least one line, a successful run ends with one more, ``[plan 41.7 s, 100%] done``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Iterator, TextIO

from rich.progress import Progress as Bar

from hexicore.app.report import console
from hexicore.app.sweep import job_number
from hexicore.planner.problem import Progress

#: seconds between two progress lines when stderr is not a terminal (the first comes after one)
INTERVAL_S = 5.0


def progress_line(label: str, elapsed_s: float, message: str, fraction: float) -> str:
    """``[label 12.3 s, 34%] message``: one plain progress line (no markup, no control codes)."""
    return f"[{label} {elapsed_s:.1f} s, {round(100 * min(max(fraction, 0.0), 1.0))}%] {message}"


class ProgressLines:
    """A :data:`~hexicore.planner.problem.Progress` callback that prints the latest
    ``(message, fraction)`` as a :func:`progress_line` to ``stream`` every ``interval_s``
    seconds while it is open (a context manager; a daemon ticker thread, stopped and joined when
    the block ends, normally or by an exception). Ticks are due at ``k * interval_s`` after the
    start, so lines do not drift apart under load; a tick that found nothing new repeats the last
    state with its new elapsed time."""

    def __init__(self, label: str, message: str, stream: TextIO, *, interval_s: float) -> None:
        self.label, self.stream, self.interval_s = label, stream, interval_s
        self.state = (message, 0.0)  # replaced whole by the callback: one atomic assignment
        self.lines = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._tick, name=f"hexicore {label} progress", daemon=True)
        self.start = 0.0

    def __call__(self, message: str, fraction: float) -> None:
        self.state = (message, fraction)

    def __enter__(self) -> "ProgressLines":
        self.start = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop.set()
        self.thread.join()
        if exc_type is None and self.lines:
            self.state = ("done", 1.0)
            self._print()  # after a run long enough to have shown progress: its end and total time

    def _tick(self) -> None:
        due = self.start + self.interval_s
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            if not self._print():
                return
            due += self.interval_s * (int((time.monotonic() - due) / self.interval_s) + 1)  # late ticks skipped

    def _print(self) -> bool:
        """Print the current state; False where the stream refuses it (closed, a broken pipe)."""
        state = self.state
        try:
            self.stream.write(progress_line(self.label, time.monotonic() - self.start, *state) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            return False
        self.lines += 1
        return True


def command_label(command: str) -> str:
    """``command``, or ``command #N`` in job N of a Hydra multirun sweep (its lines share one
    stderr with the other jobs')."""
    number = job_number()
    return command if number is None else f"{command} #{number}"


@contextlib.contextmanager
def shown_progress(command: str, description: str, *columns) -> Iterator[Progress]:
    """The progress callback of a ``command`` run, ``description`` its first message: a transient
    rich bar of ``columns`` (rich's default columns where none are given) when stderr is a
    terminal, :class:`ProgressLines` on stderr otherwise."""
    err = console(stderr=True)
    if not err.is_terminal:
        with ProgressLines(command_label(command), description, sys.stderr, interval_s=INTERVAL_S) as lines:
            yield lines
        return
    with Bar(*columns, console=err, transient=True) as bar:
        task = bar.add_task(description, total=1.0)

        def progress(message: str, fraction: float) -> None:
            bar.update(task, description=message, completed=max(0.0, min(1.0, fraction)))

        yield progress
