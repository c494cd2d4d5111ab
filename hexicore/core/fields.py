"""Typed-field rules: how hexicore checks a value it was given, written once.

A rule is a function ``check(value, name)`` that raises a one-line
:class:`~hexicore.core.errors.HexicoreError` naming ``name`` (a config key such as
``train.global_batch``). Settings classes declare a rule per field with :func:`rule` and run them
all with :func:`check_fields` in ``__post_init__``; other code calls a rule, or the predicates
:func:`is_whole` / :func:`is_real`, where it checks a value (``True`` is an ``int`` to Python,
never a count or a number here).
"""

from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any, Callable

from hexicore.core.errors import HexicoreError, shown

Check = Callable[[Any, str], None]


def is_whole(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` that is not a ``bool`` (infinities and NaN included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def whole(minimum: int | None = 1, maximum: int | None = None) -> Check:
    """An integer in ``[minimum, maximum]`` (``None``: unbounded)."""
    def check(value: Any, name: str) -> None:
        if not is_whole(value) or (minimum is not None and value < minimum) \
                or (maximum is not None and value > maximum):
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, "an integer") \
                if maximum is None else f"an integer in [{minimum}, {maximum}]"
            raise HexicoreError(f"must be {what}, got {shown(value)}", field=name)
    return check


def real(*, minimum: float | None = None, above: float | None = None, maximum: float | None = None,
         optional: bool = False) -> Check:
    """A finite number ``>= minimum`` / ``> above`` / ``<= maximum``; ``optional``: None passes."""
    def check(value: Any, name: str) -> None:
        if optional and value is None:
            return
        bad = not is_real(value) or (minimum is not None and value < minimum) \
            or (above is not None and value <= above) or (maximum is not None and value > maximum)
        if bad:
            bounds = [b for b in (f">= {minimum:g}" if minimum is not None else None,
                                  f"> {above:g}" if above is not None else None,
                                  f"<= {maximum:g}" if maximum is not None else None) if b]
            raise HexicoreError(f"must be a finite number {' and '.join(bounds)}".rstrip() + f", got {shown(value)}",
                                field=name)
    return check


def one_of(choices: tuple, noun: str = "") -> Check:
    """One of ``choices`` (compared as values: ``True`` is not ``1`` here)."""
    def check(value: Any, name: str) -> None:
        if isinstance(value, bool) and not any(isinstance(c, bool) for c in choices) or value not in choices:
            label = f"{noun} " if noun else ""
            raise HexicoreError(f"unknown {label}{value!r}; choose one of: {', '.join(str(c) for c in choices)}",
                                field=name)
    return check


def flag(value: Any, name: str) -> None:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise HexicoreError(f"expected true or false, got {shown(value)}", field=name)


def text(*, optional: bool = True) -> Check:
    """A non-empty string (``optional``: or None)."""
    def check(value: Any, name: str) -> None:
        if optional and value is None:
            return
        if not isinstance(value, str) or not value.strip():
            raise HexicoreError(f"expected a non-empty string, got {shown(value)}", field=name)
    return check


def rule(default: Any, check: Check | None, key: str | None = None) -> Any:
    """A dataclass field with ``default`` (:data:`~dataclasses.MISSING`: required) whose value
    :func:`check_fields` checks with ``check``; ``key`` is its config key when that is not
    ``<section>.<field name>``."""
    return field(default=default, metadata={"check": check, "key": key})


def field_of(cls: type, name: str) -> Any:
    """Field ``name`` of settings class ``cls`` again, its default and rule included, for a
    section that holds that one field of another class (``runtime.shard_mb`` of
    :class:`~hexicore.core.settings.CheckpointSettings`) rather than the whole class."""
    found = {f.name: f for f in fields(cls)}[name]
    return field(default=found.default, metadata=found.metadata)


def check_fields(obj: Any, section: str) -> None:
    """Run every field's declared check; errors name the config key (``train.global_batch``;
    with an empty ``section``, the field's own name)."""
    for f in fields(obj):
        check = f.metadata.get("check")
        if check is not None:
            check(getattr(obj, f.name), f.metadata.get("key") or (f"{section}.{f.name}" if section else f.name))
