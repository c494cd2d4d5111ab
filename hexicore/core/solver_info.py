"""The ``solver`` section of a plan JSON (docs/formats.md): who made the plan and what it found.

The section is informational: solvers write it, reports and pictures read it back. Solvers may
add fields of their own, so unknown fields are kept as they are; the fields the code reads
(``name``, ``status``, ``seconds``, ``bound``, ``params``, the rates, ``idle`` and the
mappings and lists replanning, allocation and ``schedule=auto`` record) are checked here when
a plan is read, so a bad one is a one-line error naming ``solver.<field>`` instead of a crash
in whatever prints it.
"""

from __future__ import annotations

from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown

#: fields that are a string or null
STRINGS = ("name", "status")
#: fields that are a number >= 0 or null
NUMBERS = ("seconds", "bound", "tokens_per_s", "usd_per_hour", "usd_per_mtok")
#: fields that are a mapping or null
MAPPINGS = ("params", "replan", "allocation", "zero_s")
#: fields that are a list of mappings or null
LISTS = ("idle", "schedule_s", "schedules")
#: the fields of an ``idle`` entry the reports read
IDLE_NUMBERS = ("iteration_s", "tokens_per_s", "usd_per_hour", "usd_per_mtok")


def _optional_number(value: Any, source: str | None, field: str) -> None:
    """Null or a finite number >= 0."""
    if value is not None:
        schema.number(value, source, field, allow_zero=True)


def _optional_string(value: Any, source: str | None, field: str) -> None:
    """Null or a string."""
    if value is not None and not isinstance(value, str):
        raise HexicoreError(f"expected a string or null, got {shown(value)}", source=source, field=field)


def _idle_entry(entry: Any, source: str | None, field: str) -> None:
    """One ``idle`` group: ``kind`` and ``name`` strings, ``devices`` a list of device names,
    the numbers of the best plan using it null or >= 0."""
    g = schema.as_mapping(entry, source, field)
    for key in ("kind", "name"):
        _optional_string(g.get(key), source, f"{field}.{key}")
    if g.get("devices") is not None:
        for dev in schema.as_list(g["devices"], source, f"{field}.devices"):
            schema.string(dev, source, f"{field}.devices")
    for key in IDLE_NUMBERS:
        _optional_number(g.get(key), source, f"{field}.{key}")


def parse_solver(data: Any, source: str | None = None, prefix: str = "solver") -> Mapping[str, Any] | None:
    """The section as read (null stays None), after checking the types of the fields the code
    reads (module docstring); anything else is a one-line :class:`HexicoreError`."""
    if data is None:
        return None
    d = schema.as_mapping(data, source, prefix)
    for key in STRINGS:
        _optional_string(d.get(key), source, f"{prefix}.{key}")
    for key in NUMBERS:
        _optional_number(d.get(key), source, f"{prefix}.{key}")
    for key in MAPPINGS:
        if d.get(key) is not None:
            schema.as_mapping(d[key], source, f"{prefix}.{key}")
    for key in LISTS:
        if d.get(key) is None:
            continue
        for i, item in enumerate(schema.as_list(d[key], source, f"{prefix}.{key}")):
            if key == "idle":
                _idle_entry(item, source, f"{prefix}.idle[{i}]")
            else:
                schema.as_mapping(item, source, f"{prefix}.{key}[{i}]")
    return d
