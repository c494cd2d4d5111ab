"""Whether a path can be written, known before any work: its nearest existing ancestor is a
folder, the folders still to make can be made there, no name is longer than the file system
allows. A command that would fail when it writes its result (after planning, simulating or
training) fails first, with one line naming the path and the field.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hexicore.core.errors import HexicoreError


def statable(p: Path, field: str | None, source: str | None = None) -> None:
    """Refuse a path the file system cannot even look up (a name longer than it allows:
    ENAMETOOLONG, which pathlib's ``exists`` raises rather than answering False)."""
    try:
        p.exists()
    except OSError as exc:
        raise HexicoreError(f"cannot create it: {exc.strerror}", source=source or str(p)[:200], field=field) from None


def special_kind(p: Path) -> str | None:
    """What ``p`` is when it exists and is neither a regular file nor a folder (links followed):
    "a character device", "a block device", "a FIFO", "a socket"; None otherwise."""
    try:
        mode = os.stat(p).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def refuse_special(p: Path, field: str | None, source: str | None = None) -> None:
    """Refuse a device, FIFO or socket (or a link to one) where hexicore would write: never
    replaced, appended to or read, ``overwrite=true`` included."""
    what = special_kind(p)
    if what is not None:
        raise HexicoreError(f"is {what}, not a regular file; hexicore never writes there (overwrite=true included)",
                            source=source or str(p)[:200], field=field)


def nearest_existing(p: Path, links: bool = True) -> Path | None:
    """``p`` or its nearest ancestor that exists (a dangling link counts where ``links``)."""
    return next((at for at in (p, *p.parents) if at.exists() or (links and at.is_symlink())), None)


def parent_is_a_folder(p: Path, field: str) -> None:
    """Refuse a new path under a file (``out=notes.txt/p.yaml``): its nearest existing ancestor
    must be a directory, known before any work rather than when the result is written; and the
    folders still to make must be makeable (:func:`makeable`)."""
    at = nearest_existing(p.parent, links=False)
    if at is not None and not at.is_dir():
        raise HexicoreError(f"{at} is a file, not a directory to write into", source=str(p), field=field)
    if at is not None:
        makeable(p, at, field)


def makeable(p: Path, at: Path, field: str | None, *, folder: bool = False, source: str | None = None) -> None:
    """``p`` (a file, or with ``folder`` a folder) can be made under ``at``, its nearest existing
    folder: every missing name within the file system's length limit, and ``at`` writable — by
    its permissions, and where folders are still to make, by making (and removing) one there
    (root passes every permission check; /proc and read-only mounts refuse only the real thing).
    Errors name ``source`` (default: the path) and ``field``."""
    where = source or str(p)[:200]
    try:
        limit = os.pathconf(at, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in p.relative_to(at).parts:
        if len(os.fsencode(part)) > limit:
            raise HexicoreError(f"a name in the path is longer than the file system's {limit} bytes ({part[:24]}...)",
                                source=where, field=field)
    if not os.access(at, os.W_OK | os.X_OK):
        raise HexicoreError(f"cannot create {p}: {at} is not writable", source=where, field=field)
    if at != (p if folder else p.parent):
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".hexicore-probe-", dir=at))
        except OSError as exc:
            raise HexicoreError(f"cannot create folders in {at}: {exc.strerror}", source=where, field=field) from None


def check_creatable_dir(value: str, *, source: str | None = None, field: str | None = None) -> None:
    """Refuse a directory path that cannot be made (a file there, or a file where one of its
    parents goes; a folder :func:`makeable` refuses): Hydra's ``mkdir`` of a run or sweep
    directory ended the command with a traceback. A value holding ``${`` is resolved later, not
    checked."""
    if "${" in value or not value:
        return
    d = Path(value)
    statable(d, field, source)
    at = nearest_existing(d)
    if at is not None and not at.is_dir():
        raise HexicoreError(f"{at} is a file, not a directory", source=source, field=field)
    if at is not None and at != d:
        makeable(d, at, field, folder=True, source=source)
