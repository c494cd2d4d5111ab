"""Small readers for untrusted mappings (YAML/JSON files, Hydra configs).

Each reader names the file and the dotted field in the :class:`HexicoreError` it raises, so a
bad value anywhere in a cluster, model or plan file becomes one precise line for the user.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import uuid
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from hexicore.core.errors import HexicoreError, shown
from hexicore.core.input_size import file_bytes

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


def optional_mapping(d: Mapping[str, Any], key: str, source: str | None, field: str | None) -> Mapping[str, Any]:
    """``d[key]`` as a mapping, ``{}`` when absent or null; any other value (``0``, ``false``,
    ``""``, a list) is an error, never taken for "absent"."""
    return {} if d.get(key) is None else as_mapping(d[key], source, field)


def optional_list(d: Mapping[str, Any], key: str, source: str | None, field: str) -> list:
    """``d[key]`` as a list, ``[]`` when absent or null; any other value is an error."""
    return [] if d.get(key) is None else as_list(d[key], source, field)


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


def known_keys(d: Mapping[str, Any], allowed: Any, source: str | None, prefix: str | None) -> None:
    """Refuse a key of ``d`` outside ``allowed`` (a typo'd section is an error, never ignored)."""
    extra = [str(k) for k in d if str(k) not in allowed]
    if extra:
        raise HexicoreError(f"unknown field; fields here are: {', '.join(sorted(allowed))}", source=source,
                            field=dotted(prefix, extra[0]))


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


#: a float in scientific notation, which YAML 1.1 (PyYAML) reads as text unless it has both a dot
#: and a signed exponent (``1e300`` and ``1.0e300`` are strings, ``1.0e+300`` a float)
_SCIENTIFIC = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def number(value: Any, source: str | None, field: str, *, positive: bool = True, allow_zero: bool = False) -> float:
    """A finite float; ``positive`` refuses negatives (and zero unless ``allow_zero``). A string
    in scientific notation (``'1e3'``, what YAML makes of ``1e3``) is read as its number."""
    if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HexicoreError(f"expected a number, got {shown(value)}{_yaml11(value)}", source=source, field=field)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond every float (a few hundred digits)
        value = math.inf
    if not math.isfinite(value):
        raise HexicoreError(f"expected a finite number, got {shown(value)}", source=source, field=field)
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        bound = ">= 0" if allow_zero else "> 0"
        raise HexicoreError(f"must be {bound}, got {value:g}", source=source, field=field)
    return value


def integer(value: Any, source: str | None, field: str, *, minimum: int | None = 1) -> int:
    """An int (a float with an integral value is accepted, and so is scientific notation with
    an integral value, ``'2e3'``, as :func:`number` reads it) that is at least ``minimum``."""
    if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool):
        raise HexicoreError(f"expected an integer, got {shown(value)}", source=source, field=field)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise HexicoreError(f"expected an integer, got {shown(value)}{_yaml11(value)}", source=source, field=field)
    if minimum is not None and value < minimum:
        raise HexicoreError(f"must be >= {minimum}, got {value}", source=source, field=field)
    return value


def _yaml11(value: Any) -> str:
    """For text that YAML 1.1 would read as a number (``'1:30'``, ``'017'``): why it is text here."""
    from hexicore.core.yaml_core import yaml11_reading

    old = yaml11_reading(value) if isinstance(value, str) else None
    if old is None or isinstance(old, bool):
        return ""
    return f" (YAML 1.1 would read {old!r}; hexicore reads YAML 1.2: write the number itself)"


def string(value: Any, source: str | None, field: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise HexicoreError(f"expected a non-empty string, got {shown(value)}", source=source, field=field)
    return value


def path_arg(value: Any, field: str) -> Path:
    """A library argument that names a file: a non-empty ``str`` or path-like, else one line
    naming the argument ``field``."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise HexicoreError(f"expected a file path, got {type(value).__name__} {shown(value)}", field=field)
    return Path(value)


def open_regular(path: Path) -> Any:
    """``path`` opened for binary reading when it is a regular file (links followed), else None:
    a FIFO is never waited on, a device never read (the check runs on the opened file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")
    except OSError:
        os.close(fd)
        return None


def map_regular(path: str | Path, what: str, field: str | None = None, dtype: Any = "uint8",
                count: int | None = None) -> Any:
    """A regular file's contents as a read-only numpy array of ``dtype`` (its first ``count``
    items; all of them by default), memory-mapped: the pages a reader touches are read, never the
    whole file, so memory stays bounded whatever its size; a directory, a device, FIFO or socket,
    a missing or empty file is a one-line error (the check runs on the file that is mapped)."""
    import numpy as np

    path = Path(path)
    fh = None if path.is_dir() else open_regular(path)
    if fh is None:
        raise HexicoreError(f"a directory, not a {what} file" if path.is_dir() else
                            f"not a regular file; a {what} file is read from a regular file" if path.exists() else
                            f"{what} file not found", source=str(path), field=field)
    with fh:
        if not os.fstat(fh.fileno()).st_size:
            raise HexicoreError(f"the {what} file is empty", source=str(path), field=field)
        try:
            return np.memmap(fh, dtype=dtype, mode="r", shape=None if count is None else (count,))
        except (OSError, ValueError) as exc:
            raise HexicoreError(f"cannot map {what} file: {exc}", source=str(path), field=field) from None


def read_bytes(path: str | Path, what: str, field: str | None = None) -> bytes:
    """A regular file's bytes, at most the size limit of a ``what`` file
    (:func:`hexicore.core.input_size.file_bytes`); a directory, a device, FIFO or socket, a missing
    or larger file is a one-line error, and nothing beyond the limit is read."""
    path = Path(path)
    if path.is_dir():
        raise HexicoreError(f"a directory, not a {what} file", source=str(path), field=field)
    fh = open_regular(path)
    if fh is None:
        found = path.exists()
        raise HexicoreError(f"not a regular file; a {what} file is read from a regular file" if found else
                            f"{what} file not found", source=str(path), field=field)
    limit = file_bytes(what)
    try:
        with fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise HexicoreError(f"cannot read {what} file: {exc.strerror}", source=str(path), field=field) from None
    if len(data) > limit:
        raise HexicoreError(f"is larger than hexicore's limit of {limit:,} bytes for a {what} file "
                            "(docs/formats.md, Limits)", source=str(path), field=field)
    return data


def read_text(path: str | Path, what: str) -> str:
    """A file's non-empty text (:func:`read_bytes`: regular, bounded); a missing, unreadable or
    empty file is a one-line error."""
    try:
        text = read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HexicoreError(f"cannot read {what} file: {exc}", source=str(path)) from None
    if not text.strip():
        raise HexicoreError(f"{what} file is empty", source=str(path))
    return text


#: every temporary name ends so; leftovers of a killed writer are recognised and removed
TMP_SUFFIX = ".hexicore-tmp"


def temp_path(path: str | Path) -> Path:
    """A temporary name for ``path`` in the same directory that no other writer uses (process id
    and a random part): two writers of the same path never share or delete each other's file."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def publish(tmp: Path, path: Path) -> Path:
    """fsync ``tmp``, rename it over ``path`` (atomic on POSIX) and fsync the directory, so a
    reader sees the old file or the new one, never part of either."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _sync_folder(path.parent)
    return path


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unnamed_file(folder: Path) -> int | None:
    """A file opened for writing in ``folder`` that has no name (Linux ``O_TMPFILE``: the kernel
    frees it when its writer ends, however it ends), while it can later be given one through
    ``/proc/self/fd`` (``linkat``); None where either is not supported."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_RDWR, 0o666)
    except OSError:  # a file system or kernel without it (EOPNOTSUPP, EISDIR, EINVAL)
        return None


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Any]:
    """A binary file to write ``path`` through, renamed over it when the block ends normally
    (fsynced first, then the folder: a reader sees the old file or the new one), discarded when
    the block raises. No writer leaves a file behind, however it ends: the file has no name while
    it is written (:func:`_unnamed_file`) and is named (a :func:`temp_path`) only for the rename;
    where the system cannot do that, it is written under a :func:`temp_path` name, removed on
    every exit Python sees, and a killed writer's is removed by the next writer into that folder
    (:func:`clean_stale_temps`)."""
    path = Path(path)
    clean_stale_temps(path.parent)
    fd = _unnamed_file(path.parent)
    tmp = None if fd is not None else temp_path(path)
    if fd is None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
            if tmp is None:  # named for the rename only: linkat cannot replace an existing file
                tmp = temp_path(path)
                _link(fh.fileno(), tmp)
        os.replace(tmp, path)
        _sync_folder(path.parent)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _link(fd: int, name: Path) -> None:
    """Give the unnamed file ``fd`` the name ``name``: ``linkat`` following ``/proc/self/fd`` (a
    folder descriptor makes Python call ``linkat`` with ``AT_SYMLINK_FOLLOW``, not ``link``);
    where that is refused (a sandbox), its bytes are copied to ``name`` and synced."""
    import shutil

    folder = os.open(name.parent, os.O_RDONLY)
    try:
        os.link(f"/proc/self/fd/{fd}", name.name, dst_dir_fd=folder, follow_symlinks=True)
        return
    except OSError:
        pass
    finally:
        os.close(folder)
    with open(fd, "rb", closefd=False) as source, open(name, "xb") as copy:
        source.seek(0)
        shutil.copyfileobj(source, copy, 1 << 20)
        copy.flush()
        os.fsync(copy.fileno())


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, through :func:`atomic_output`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as fh:
        fh.write(data)
    return path


def write_with(path: str | Path, writer: Any) -> Path:
    """Atomic write through ``writer(tmp_path)`` (e.g. ``fig.savefig(tmp, format="png")``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        writer(tmp)
        return publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def clean_stale_temps(folder: str | Path, older_than_s: float = 0.0) -> int:
    """Remove temporary files of killed writers in ``folder`` (names from :func:`temp_path`
    whose process is gone, or older than ``older_than_s``); the number removed."""
    import time

    n = 0
    for f in Path(folder).glob(f".*{TMP_SUFFIX}"):
        parts = f.name.split(".")
        pid = int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else -1
        alive = pid > 0 and _pid_alive(pid)
        try:
            old = older_than_s > 0 and time.time() - f.stat().st_mtime > older_than_s
        except OSError:
            continue
        if not alive or old:
            f.unlink(missing_ok=True)
            n += 1
    return n


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_yaml(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a YAML mapping from ``path``; every failure is a one-line :class:`HexicoreError`."""
    import yaml

    text, source = read_text(path, what), str(path)
    try:
        data = _load_yaml_text(text, source)
    except RecursionError:
        raise HexicoreError(f"YAML nested deeper than {MAX_DEPTH} levels", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise HexicoreError(f"malformed YAML{where}: {problem}", source=source) from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise HexicoreError(f"malformed YAML: {value_error(exc)}", source=source) from None
    if data is None:
        raise HexicoreError(f"{what} file is empty", source=source)
    return as_mapping(data, source, None)


def value_error(exc: ValueError) -> str:
    """A parser's ValueError in one short line (Python's integer-digits limit names a fix that is
    not the user's: ``use sys.set_int_max_str_digits()``)."""
    return str(exc).split("; use sys.", 1)[0].strip() or type(exc).__name__


def load_json(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a JSON object from ``path``; every failure is a one-line :class:`HexicoreError`."""
    text, source = read_text(path, what), str(path)
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, source))
    except json.JSONDecodeError as exc:
        raise HexicoreError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=source) from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise HexicoreError(f"malformed JSON: {value_error(exc)}", source=source) from None
    except RecursionError:
        raise HexicoreError(f"JSON nested deeper than {MAX_DEPTH} levels", source=source) from None
    check_depth(data, source)
    return as_mapping(data, source, None)


#: no file format of hexicore nests deeper than this
MAX_DEPTH = 32
#: a YAML document may expand (aliases counted at every use) to at most this many nodes
MAX_YAML_NODES = 200_000


def _unique_keys(pairs: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise HexicoreError("duplicate key", source=source, field=str(k))
        out[k] = v
    return out


def check_depth(data: Any, source: str, limit: int = MAX_DEPTH) -> None:
    """Refuse data nested deeper than ``limit`` (iteratively: no recursion on hostile input)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise HexicoreError(f"nested deeper than {limit} levels", source=source)
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]


def _yaml_expanded_size(node: Any, source: str) -> int:
    """Nodes of the document with every alias expanded (memoised per node: linear time)."""
    import yaml

    memo: dict[int, int] = {}
    order, stack = [], [(node, 1)]
    while stack:  # iterative post-order with a depth check
        n, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise HexicoreError(f"YAML nested deeper than {MAX_DEPTH} levels", source=source)
        if id(n) in memo:
            continue
        memo[id(n)] = -1
        order.append(n)
        kids = [c for kv in n.value for c in kv] if isinstance(n, yaml.MappingNode) else \
            list(n.value) if isinstance(n, yaml.SequenceNode) else []
        stack += [(c, depth + 1) for c in kids]
    for n in reversed(order):
        kids = [c for kv in n.value for c in kv] if isinstance(n, yaml.MappingNode) else \
            list(n.value) if isinstance(n, yaml.SequenceNode) else []
        memo[id(n)] = min(1 + sum(memo[id(c)] for c in kids), MAX_YAML_NODES + 1)
    return memo[id(node)]


def _load_yaml_text(text: str, source: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2's plain scalars (:mod:`hexicore.core.yaml_core`: ``1:30``
    and ``on`` are text) that refuses duplicate keys, alias bombs and deep nesting."""
    import yaml

    from hexicore.core.yaml_core import CoreLoader

    class Loader(CoreLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> dict:
        seen: set = set()
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(k, deep=deep)
            if key in seen:
                raise HexicoreError(f"duplicate key at line {k.start_mark.line + 1}", source=source, field=str(key))
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _yaml_expanded_size(node, source) > MAX_YAML_NODES:
            raise HexicoreError(f"YAML aliases expand to more than {MAX_YAML_NODES} nodes", source=source)
        return loader.construct_document(node)
    finally:
        loader.dispose()
