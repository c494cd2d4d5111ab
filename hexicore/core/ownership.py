"""Which files a command may replace: only its own kind of hexicore output.

Every file hexicore writes carries a mark of its kind: JSON files a ``format`` field
(``hexicore.plan/1``, ``hexicore.actions/1``, ``hexicore.summary/1``, ``hexicore.metrics/1``,
...), Chrome traces ``otherData.generator == "hexicore"``, PNG pictures a ``Software`` text chunk
starting with ``hexicore``. Before any work, a command checks each path it will write:

* a path that does not exist, or a file of the same kind: fine;
* anything else (a text file, another tool's JSON, a directory where a file goes, a different
  hexicore kind): refused with one line naming the path — unless ``overwrite=true``;
* with ``overwrite=false`` every existing file is refused.

:func:`check_writable` is the one rule; commands call it for the file and its documented
siblings (the plan's picture, the simulator's trace and timeline).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable

from hexicore.core.errors import HexicoreError

#: the Software text written into every PNG hexicore draws
PNG_SOFTWARE = "hexicore"
#: bytes read to recognise a file (a plan or metrics file is identified by its first keys)
_HEAD = 1 << 20


def png_metadata(what: str) -> dict[str, str]:
    """``savefig(..., metadata=png_metadata("plan"))`` marks a picture as ours."""
    return {"Software": f"{PNG_SOFTWARE} {what}"}


def png_software(path: Path) -> str | None:
    """The ``Software`` tEXt chunk of a PNG (None if absent or not a PNG); reads chunk headers only."""
    try:
        with path.open("rb") as fh:
            if fh.read(8) != b"\x89PNG\r\n\x1a\n":
                return None
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT" or kind == b"IEND":
                    return None
                body = fh.read(length)
                fh.seek(4, 1)  # CRC
                if kind == b"tEXt" and b"\x00" in body:
                    key, _, value = body.partition(b"\x00")
                    if key == b"Software":
                        return value.decode("latin-1")
    except OSError:
        return None


def json_kind(path: Path) -> str | None:
    """A hexicore JSON file's kind (its ``format``, or ``trace`` for our Chrome traces)."""
    try:
        with path.open("rb") as fh:
            data: Any = json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    fmt = data.get("format")
    if isinstance(fmt, str) and fmt.startswith("hexicore."):
        return fmt.split("/")[0]
    other = data.get("otherData")
    if isinstance(other, dict) and other.get("generator") == "hexicore":
        return "hexicore.trace"
    return None


def kind_of(path: Path) -> str | None:
    """``hexicore.<kind>`` of an existing hexicore output, else None."""
    if path.suffix.lower() == ".png":
        sw = png_software(path)
        return "hexicore.png" if sw and sw.startswith(PNG_SOFTWARE) else None
    return json_kind(path)


def check_writable(path: str | Path, kind: str, *, overwrite: bool | None = None,
                   field: str = "out") -> Path:
    """Refuse (one line) to replace ``path`` unless it is absent or a hexicore ``kind`` output
    (``hexicore.plan``, ``hexicore.png``, ...); ``overwrite`` True allows any file, False none."""
    p = Path(path)
    if p.is_dir():
        raise HexicoreError("is a directory; a file goes here", source=str(p), field=field)
    if not p.exists() and not p.is_symlink():
        return p
    if overwrite is True:
        return p
    if overwrite is False:
        raise HexicoreError("exists and overwrite=false", source=str(p), field=field)
    found = kind_of(p)
    if found != kind:
        what = f"a {found.split('.', 1)[1]} file" if found else "not a hexicore output"
        raise HexicoreError(f"exists and is {what}; refusing to replace it with a {kind.split('.', 1)[1]} "
                            "(choose another path, or overwrite=true)", source=str(p), field=field)
    return p


def check_all(items: Iterable[tuple[str | Path, str]], *, overwrite: bool | None = None, field: str = "out") -> None:
    """:func:`check_writable` for every ``(path, kind)`` before anything is written."""
    for path, kind in items:
        check_writable(path, kind, overwrite=overwrite, field=field)
