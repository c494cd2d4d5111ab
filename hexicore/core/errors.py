"""The project's exception type (docs/design.md, "Errors").

Every error a user can cause (a bad file, an unknown name, an impossible plan) is raised as a
:class:`HexicoreError` that carries the file and the field it is about. The CLI turns it into one
line on stderr and exit status 2; library users catch it like any exception.
"""

from __future__ import annotations

from typing import Any


class HexicoreError(Exception):
    """A user-facing error: ``source`` is a file (or config group), ``field`` a dotted key."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.source = source
        self.field = field

    def __str__(self) -> str:
        # a name with a line break or other control character (a key of a hostile file) is quoted,
        # so the error stays one line
        where = ": ".join(p if p.isprintable() else repr(p) for p in (self.source, self.field) if p)
        return f"{where}: {self.message}" if where else self.message

    def located(self, source: str | None = None, field_prefix: str | None = None) -> "HexicoreError":
        """The same error with a file name filled in and/or a field prefix prepended."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return HexicoreError(self.message, source=self.source or source, field=field)


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error message shows it: its ``repr``, bounded to about ``limit``
    characters; a long list or mapping shows its first items and its length, an integer of more
    than 60 digits its number of digits (never converted: Python refuses beyond 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(shown(v, limit // 2) for v in value[:4])
        more = f", ... ({len(value)} items)" if len(value) > 4 else ""
        text = f"[{inner}{more}]" if isinstance(value, list) else f"({inner}{more})"
    elif isinstance(value, dict):
        inner = ", ".join(f"{shown(k, limit // 4)}: {shown(v, limit // 2)}" for k, v in list(value.items())[:4])
        text = "{" + inner + (f", ... ({len(value)} keys)" if len(value) > 4 else "") + "}"
    elif isinstance(value, str):
        text = repr(value[:limit + 1])
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class PlanError(HexicoreError):
    """A plan that cannot be executed or estimated (the plan invariants of docs/formats.md)."""


class ScheduleError(HexicoreError):
    """An action list that is malformed, out of order or deadlocks (docs/formats.md, action lists)."""


class RunError(HexicoreError):
    """A run that started and then failed (a worker raised, died or hung): the CLI prints the
    one line and exits 1, not 2, because the input was accepted."""
