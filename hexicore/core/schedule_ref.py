"""Typed schedule references: which pipeline schedule runs, with which parameters.

A :class:`ScheduleRef` is the ``schedule`` section of a pipeline in the plan format
(``hexicore.plan/1``) and of an action list (``hexicore.actions/1``), docs/formats.md, as a
frozen, hashable value::

    {"name": "hanayo", "waves": 2}  <->  ScheduleRef("hanayo", {"waves": 2})

It reads like that section too (a read-only ``Mapping``: ``ref["name"]``, ``ref.get("waves")``,
``dict(ref)``), so code written against the plain sections keeps working, and
:meth:`ScheduleRef.to_dict` writes it back unchanged (keys in their original order): plan and
action-list JSON are byte-identical to the sections they were read from. Equality and hashing
ignore the order of the parameters, so a reference keys caches directly.

Nested parameter values (``schedule=auto``'s ``options`` list, Hanayo's recorded ``auto``
table) are stored frozen (mappings as :class:`FrozenMap`, lists as tuples) and handed out as
fresh plain ``dict``/``list`` copies.

The core names no schedule but one: :data:`DEFAULT_SCHEDULE`, the plan format's default for a
pipeline whose section has no ``name`` (docs/formats.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from hexicore.core import limits
from hexicore.core.errors import HexicoreError, shown

#: The plan format's default schedule (``hexicore.plan/1``): a pipeline section without a
#: ``schedule`` name runs this one. The only schedule name the core knows.
DEFAULT_SCHEDULE = "1f1b"


def freeze(value: Any) -> Any:
    """A hashable copy: mappings become :class:`FrozenMap`, lists and tuples tuples."""
    if isinstance(value, FrozenMap):
        return value
    if isinstance(value, Mapping):
        return FrozenMap(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The plain copy of a frozen value: :class:`FrozenMap` -> dict, tuple -> list."""
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


class FrozenMap(Mapping):
    """A read-only, insertion-ordered mapping with frozen values; hashed and compared
    regardless of key order (like ``dict`` equality)."""

    __slots__ = ("_items", "_data", "_hash")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        data = {k: freeze(v) for k, v in pairs}
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_items", tuple(data.items()))
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is read-only")

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(sorted(self._items, key=lambda kv: str(kv[0])))))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._data == other._data
        return isinstance(other, Mapping) and self._data == dict(other)

    def __reduce__(self) -> tuple:
        return (FrozenMap, (self._items,))

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._items)!r})"


@dataclass(frozen=True, eq=False, repr=False)
class ScheduleRef(Mapping):
    """A schedule by registry name with its parameters (``schedule.*`` config keys but ``name``).

    ``ScheduleRef("interleaved_1f1b", {"chunks": 2})``; ``name == ""`` is an unnamed section
    (an action list may carry ``"schedule": {}``). As a mapping its keys are ``"name"`` (unless
    unnamed) followed by the parameters: exactly the JSON section.
    """

    name: str
    params: FrozenMap = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise HexicoreError(f"a schedule name must be a string, got {shown(self.name)}", field="schedule.name")
        params = self.params if isinstance(self.params, FrozenMap) else FrozenMap(self.params)
        if "name" in params:
            raise HexicoreError("'name' is the schedule's name, not a parameter", field="schedule.name")
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "_hash", hash((self.name, params)))  # per process: pickling rebuilds it

    # ------------------------------------------------------------ building
    @classmethod
    def default(cls) -> "ScheduleRef":
        """The plan format's default schedule, :data:`DEFAULT_SCHEDULE`, without parameters."""
        return cls(DEFAULT_SCHEDULE)

    @classmethod
    def from_mapping(cls, section: Any, *, default: str = DEFAULT_SCHEDULE, source: str | None = None,
                     field: str = "schedule") -> "ScheduleRef":
        """A ``{"name": ..., **params}`` section (or a bare name, or a ``ScheduleRef``) as a
        reference; a missing or empty section, or one without ``name``, gets ``default``.
        Anything else is a one-line :class:`HexicoreError` naming ``source`` and ``field``."""
        if isinstance(section, ScheduleRef):
            return section
        if section is None:
            return cls(default)
        if isinstance(section, str):
            if default and not section.strip():
                raise HexicoreError("a schedule name must not be empty", source=source, field=field)
            return cls(section)
        if not isinstance(section, Mapping):
            raise HexicoreError(f"expected a mapping with a schedule name, got {shown(section)}", source=source,
                                field=field)
        name = section.get("name", default)
        if name is None:
            name = default
        if not isinstance(name, str):
            raise HexicoreError(f"a schedule name must be a string, got {shown(name)}", source=source, field=f"{field}.name")
        for key in ("waves", "chunks"):
            limits.check(section.get(key), limits.MAX_WAVES, key, source=source, field=f"{field}.{key}")
        return cls(name, FrozenMap((k, v) for k, v in section.items() if k != "name"))

    @classmethod
    def from_section(cls, section: Any, source: str | None, field: str) -> "ScheduleRef":
        """A file's explicit ``schedule`` section (a plan pipeline's): an object with a non-empty
        ``name``, as hexicore writes it. A bare name, ``{}``, ``null`` or parameters without a
        name are refused naming ``field``, never read as the default (only an absent section is)."""
        if not isinstance(section, Mapping):
            given = "null" if section is None else f"{type(section).__name__} {shown(section)}"
            raise HexicoreError(f"expected an object with the schedule's name ({{\"name\": \"1f1b\", ...}}), got "
                                f"{given}; leave the field out for the default, {DEFAULT_SCHEDULE}", source=source,
                                field=field)
        name = section.get("name")
        if name is None:
            raise HexicoreError("missing required field", source=source, field=f"{field}.name")
        if not isinstance(name, str) or not name.strip():
            raise HexicoreError(f"expected a non-empty string, got {shown(name)}", source=source, field=f"{field}.name")
        return cls.from_mapping(section, source=source, field=field)

    def with_params(self, **changes: Any) -> "ScheduleRef":
        """The same schedule with some parameters set (appended in order when new)."""
        return ScheduleRef(self.name, FrozenMap({**self.params, **changes}))

    # ------------------------------------------------------------- reading
    def kwargs(self) -> dict[str, Any]:
        """The parameters as plain keyword arguments for the schedule's factory."""
        return {k: thaw(v) for k, v in self.params.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON section: ``{"name": name, **params}`` (plain values, original key order)."""
        return ({"name": self.name} if self.name else {}) | self.kwargs()

    def __getitem__(self, key: str) -> Any:
        if key == "name" and self.name:
            return self.name
        if key == "name":
            raise KeyError(key)
        return thaw(self.params[key])

    def __iter__(self) -> Iterator[str]:
        if self.name:
            yield "name"
        yield from self.params

    def __len__(self) -> int:
        return len(self.params) + (1 if self.name else 0)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ScheduleRef):
            return self is other or (self._hash == other._hash and self.name == other.name
                                     and self.params == other.params)
        return isinstance(other, Mapping) and self.to_dict() == dict(other)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (ScheduleRef, (self.name, self.params))

    def __repr__(self) -> str:
        return f"ScheduleRef({self.name!r}, {self.kwargs()!r})" if self.params else f"ScheduleRef({self.name!r})"

    def __str__(self) -> str:
        """``hanayo (waves=2)``: the name and its parameters, as reports print a schedule."""
        extra = ", ".join(f"{k}={v}" for k, v in self.kwargs().items())
        return f"{self.name or '?'}{f' ({extra})' if extra else ''}"
