"""Small readers for untrusted mappings (YAML/JSON files, Hydra configs).

Each reader names the file and the dotted field in the :class:`HexicoreError` it raises, so a
bad value anywhere in a cluster, model or plan file becomes one precise line for the user.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from hexicore.core.errors import HexicoreError

_MISSING = object()


def as_mapping(obj: Any, source: str | None, field: str | None) -> Mapping[str, Any]:
    """``obj`` as a plain dict, or an error if it is not a mapping (e.g. a YAML list)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(obj, DictConfig):
            obj = OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    if not isinstance(obj, Mapping):
        kind = "nothing" if obj is None else type(obj).__name__
        raise HexicoreError(f"expected a mapping, got {kind}", source=source, field=field)
    return obj


def as_list(obj: Any, source: str | None, field: str) -> list:
    """``obj`` as a list (a YAML sequence), or an error."""
    try:
        from omegaconf import ListConfig, OmegaConf

        if isinstance(obj, ListConfig):
            obj = OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(obj, (list, tuple)):
        raise HexicoreError(f"expected a list, got {type(obj).__name__}", source=source, field=field)
    return list(obj)


def dotted(prefix: str | None, key: str) -> str:
    """The dotted field name ``prefix.key`` (``key`` alone at the top level)."""
    return f"{prefix}.{key}" if prefix else key


def get(d: Mapping[str, Any], key: str, source: str | None, prefix: str | None, default: Any = _MISSING) -> Any:
    """``d[key]`` or ``default``; a missing required key is an error naming the field."""
    field = f"{prefix}.{key}" if prefix else key
    if key not in d or d[key] is None:
        if default is _MISSING:
            raise HexicoreError("missing required field", source=source, field=field)
        return default
    return d[key]


def number(value: Any, source: str | None, field: str, *, positive: bool = True, allow_zero: bool = False) -> float:
    """A finite float; ``positive`` refuses negatives (and zero unless ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HexicoreError(f"expected a number, got {value!r}", source=source, field=field)
    value = float(value)
    if not math.isfinite(value):
        raise HexicoreError(f"expected a finite number, got {value!r}", source=source, field=field)
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        bound = ">= 0" if allow_zero else "> 0"
        raise HexicoreError(f"must be {bound}, got {value:g}", source=source, field=field)
    return value


def integer(value: Any, source: str | None, field: str, *, minimum: int | None = 1) -> int:
    """An int (a float with an integral value is accepted) that is at least ``minimum``."""
    if isinstance(value, bool):
        raise HexicoreError(f"expected an integer, got {value!r}", source=source, field=field)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise HexicoreError(f"expected an integer, got {value!r}", source=source, field=field)
    if minimum is not None and value < minimum:
        raise HexicoreError(f"must be >= {minimum}, got {value}", source=source, field=field)
    return value


def string(value: Any, source: str | None, field: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise HexicoreError(f"expected a non-empty string, got {value!r}", source=source, field=field)
    return value


def read_text(path: str | Path, what: str) -> str:
    """A file's non-empty text; a missing, unreadable or empty file is a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise HexicoreError(f"{what} file not found", source=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HexicoreError(f"cannot read {what} file: {exc}", source=str(path)) from None
    if not text.strip():
        raise HexicoreError(f"{what} file is empty", source=str(path))
    return text


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed into place (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def load_yaml(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a YAML mapping from ``path``; every failure is a one-line :class:`HexicoreError`."""
    import yaml

    text, source = read_text(path, what), str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise HexicoreError(f"malformed YAML{where}: {problem}", source=source) from None
    if data is None:
        raise HexicoreError(f"{what} file is empty", source=source)
    return as_mapping(data, source, None)


def load_json(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a JSON object from ``path``; every failure is a one-line :class:`HexicoreError`."""
    text, source = read_text(path, what), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HexicoreError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=source) from None
    return as_mapping(data, source, None)
