"""Using more than one core for independent pieces of a search.

:func:`fork_map` computes ``[fn(x) for x in items]`` with forked child processes: each child
inherits the caller's state (caches, closures, the registry's plugins — nothing needs to be
pickled on the way in), computes every ``workers``-th item and sends its results back pickled
through a pipe; the calling process computes its own share meanwhile. The result is the plain
loop's (the pieces must not depend on each other: each child's caches die with it). Where
``fork`` is missing, or with one worker or item, it is the plain loop.

:func:`fork_start` starts the same computation in forked children and returns at once: the
caller works meanwhile and collects the results later (:meth:`Forked.result`).

:func:`available_cores` is the number of cores this process may run on.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence


#: set in a forked worker (its own copy of this module): a worker runs its pieces in one process
_IN_WORKER = [False]


def available_cores() -> int:
    """Cores this process may use (its CPU affinity where the system reports one); 1 inside a
    :func:`fork_map` worker, which never forks again."""
    if _IN_WORKER[0]:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _child(fn: Callable[[Any], Any], items: Sequence[Any], mine: range, fd: int) -> None:
    """In the child: compute ``mine`` and write ``("ok", results)`` or ``("error", exc)``; never returns."""
    code = 0
    _IN_WORKER[0] = True
    try:
        try:
            msg: tuple = ("ok", [fn(items[i]) for i in mine])
        except BaseException as exc:  # handed to the parent, which raises it
            code = 1
            msg = ("error", exc, traceback.format_exc())
        try:
            data = pickle.dumps(msg)
        except Exception:  # an unpicklable result or exception: say what happened
            code = 1
            data = pickle.dumps(("error", RuntimeError(f"a worker's result could not be sent: {msg[1]!r}"), ""))
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    finally:
        os._exit(code)


def fork_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    """``[fn(x) for x in items]`` with up to ``workers`` processes (module docstring); an
    exception raised by ``fn`` in a child is raised here."""
    items = list(items)
    workers = 1 if _IN_WORKER[0] else min(workers, len(items))
    if workers <= 1 or not hasattr(os, "fork"):
        return [fn(x) for x in items]
    children = _spawn(fn, items, [range(w, len(items), workers) for w in range(1, workers)])
    out: list[Any] = [None] * len(items)
    error = None
    try:
        for i in range(0, len(items), workers):
            out[i] = fn(items[i])
    except BaseException as exc:
        error = exc
    lost = _collect(children, out)  # always wait for the children
    error = error or lost
    if error is not None:
        raise error
    return out


def _spawn(fn: Callable[[Any], Any], items: list, shares: Sequence[range]) -> list[tuple[range, int, int]]:
    """Fork one child per share of ``items`` (it computes ``fn`` of its share and sends the
    results down a pipe): ``(share, pid, read end)`` per child."""
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for share in shares:
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            _child(fn, items, share, wfd)
        os.close(wfd)
        children.append((share, pid, r))
    return children


def _collect(children: list[tuple[range, int, int]], out: list[Any]) -> BaseException | None:
    """Wait for every child and put its results into ``out`` at its share; the first error a
    child raised (or a child that died), if any."""
    error = None
    for share, pid, r in children:
        with os.fdopen(r, "rb") as src:
            data = src.read()
        os.waitpid(pid, 0)
        msg = pickle.loads(data) if data else ("error", RuntimeError("a worker process died"), "")
        if msg[0] != "ok":
            error = error or msg[1]
            continue
        for i, v in zip(share, msg[1]):
            out[i] = v
    return error


@dataclass
class Forked:
    """Children started by :func:`fork_start`: ``(share, pid, read end)`` per child; ``plain``:
    no child was started, :meth:`result` computes the loop itself."""

    fn: Callable[[Any], Any]
    items: list
    children: list
    plain: bool = False

    def result(self) -> list[Any]:
        """``[fn(x) for x in items]``, waiting for the children; raises what one raised."""
        if self.plain:
            return [self.fn(x) for x in self.items]
        out: list[Any] = [None] * len(self.items)
        error = _collect(self.children, out)
        self.children = []
        if error is not None:
            raise error
        return out

    def cancel(self) -> None:
        """Stop the children (their results are not wanted any more)."""
        for _, pid, r in self.children:
            os.close(r)
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        self.children = []


def fork_start(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> Forked:
    """Start ``[fn(x) for x in items]`` in up to ``workers`` forked children (every
    ``workers``-th item each) and return at once; the caller keeps its core meanwhile. Inside a
    worker, without ``fork``, or with no item: nothing starts, :meth:`Forked.result` is the loop."""
    items = list(items)
    workers = 0 if _IN_WORKER[0] or not hasattr(os, "fork") else min(workers, len(items))
    if workers < 1:
        return Forked(fn, items, [], plain=True)
    return Forked(fn, items, _spawn(fn, items, [range(w, len(items), workers) for w in range(workers)]))
