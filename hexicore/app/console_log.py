"""The terminal's view of the ``hexicore`` logger (conf/hydra/job_logging/hexicore.yaml).

Every warning hexicore prints on stderr reads ``warning: ...`` (a command's own warnings, those
of the cost model or a solver through the logger alike), each message once (:class:`Once`: a
command may build its cost model twice, for the search and for the memory table); the job's log
file keeps the full ``[time][logger][LEVEL]`` lines.
"""

from __future__ import annotations

import logging


class ConsoleFormatter(logging.Formatter):
    """``warning: message`` / ``error: message``: the level in lower case, then the message (and a
    traceback where the record carries one)."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)  # the file handler still sees the record as it is
        shown.levelname = record.levelname.lower()
        return super().format(shown)


class Once(logging.Filter):
    """Passes each ``(level, message)`` once per handler (per command run)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True
