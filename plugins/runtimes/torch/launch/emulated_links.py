"""Emulated links on one host: the runtime side of a cluster file's ``emulate: {links: true}``
(:mod:`hexicore.core.emulation`, a test aid, never a default).

Every process of the job talks through the process-group backend :data:`BACKEND`, which wraps
gloo: each message and collective runs on gloo over loopback as before, then its request
(``Work``) holds the caller until the transfer has lasted what the cost model's formulas give
on the declared links (:mod:`hexicore.cost.transfer`), or until gloo is done if the host needs
longer. Every caller (pipeline hops, TP all-reduces and broadcasts, the DP sync and ZeRO's
reduce-scatters and all-gathers, the loss and norm all-reduces, ``hexicore profile``'s
ping-pong and all-reduces) is held alike without a line of its own: subgroups made by
``new_group`` are of the same backend.

When a transfer starts: on a real link, when its bytes can go. Each process only knows when
it asked, so the backend sends that moment along (the ranks share one host, hence one clock,
``time.monotonic``):

* a message: the sender's link to that peer carries one message at a time, so the message
  starts when the sender posts it or when its previous message to that peer has left
  (``bytes / bandwidth`` after that one started), whichever is later; the sender sends the
  start (an 8-byte message with the same tag, before the payload) and its request completes
  at ``start + latency + bytes / bandwidth``; the receiver's completes at that same moment
  (or at once if it asked later: the bytes were already there);
* a collective: it starts when the last member asks (a max all-reduce of the members' moments,
  posted with the collective) or when the group's previous collective ends, whichever is later
  (collectives of one group run one after the other, as on a real communicator), and lasts
  :func:`~hexicore.cost.transfer.allreduce_s`, :func:`~hexicore.cost.transfer.ring_pass_s`
  (reduce-scatter, all-gather, gather) or :func:`~hexicore.cost.transfer.broadcast_s`; a
  barrier is an all-reduce of nothing (the latencies).

A device's network port between machines is shared (:class:`Ports`): a collective whose members
are on more than one machine occupies every member's port while it lasts, so it runs in the
earliest stretch from its start in which no other such collective holds a member's port,
whichever group that was in (a device of a hybrid layout syncs with its groups one after the
other, as the cost model adds a device's DP syncs, App. A). The ports live in a small file every
process of the job maps; the first member to wait for a collective reserves the ports and leaves
its end in the group's store for the others, so every member holds to the same end.

The hold sleeps in ``wait()``: a request never waited for holds nothing, as a GPU's transfer
holds no one who does not wait for it. What it cannot do: make a link faster than the host's
loopback (gloo on a loaded 2-core host needs milliseconds per message, so a declared NVLink
runs at the host's speed); share a port between messages (each sender-peer pair is a link of
its own) or between collectives inside one machine; or move a collective already reserved when
one that could start earlier is first waited for later (it takes a gap before it where one is
long enough, else goes after it).
"""

from __future__ import annotations

import atexit
import fcntl
import mmap
import os
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from hexicore.core.emulation import EmulatedLinks
from hexicore.cost.transfer import allreduce_s, broadcast_s, ring_pass_s, send_s

#: the process-group backend's name (``dist.init_process_group(BACKEND)``)
BACKEND = "hexicore_links"
#: the last seconds of a hold are waited awake (a sleep ends late on a loaded host)
SPIN_S = 0.0005
#: the stretches each port keeps (the oldest gives way; a step's DP sync posts a few dozen)
KEPT = 256
_installed: dict[str, Any] = {}


def install(links: EmulatedLinks) -> str:
    """Make :data:`BACKEND` hold this process's transfers to ``links``; its name."""
    if not _installed:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    _installed["links"] = links
    return BACKEND


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> "LinkedGroup":
    if not dist.is_initialized():  # the default group: its members share the job's ports file
        if rank == 0:
            store.set("hexicore-links/ports", Ports.create(size))
        _installed["ports"] = Ports(store.get("hexicore-links/ports").decode(), size)
    return LinkedGroup(store, rank, size, timeout, _installed["links"])


class Ports:
    """Every device's port between machines, shared by the job's processes: per global rank, the
    last :data:`KEPT` stretches of ``time.monotonic`` its port is reserved for, in a file each
    process maps. :meth:`reserve` runs under the file's lock."""

    def __init__(self, path: str, world: int):
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 16 * KEPT * world)
        self.spans = memoryview(self.map).cast("d")  # rank r's k-th stretch: [2 (r KEPT + k)], [... + 1]

    @staticmethod
    def create(world: int) -> str:
        """A new ports file of ``world`` free ports (removed when this process ends); its path."""
        fd, path = tempfile.mkstemp(prefix="hexicore-links-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.write(fd, bytes(16 * KEPT * world))
        os.close(fd)
        atexit.register(lambda: os.path.exists(path) and os.unlink(path))
        return path

    def earliest(self, ranks: tuple[int, ...], start: float, seconds: float) -> float:
        """The first moment from ``start`` at which every port of ``ranks`` is free for
        ``seconds``: a collective takes the earliest gap its members' ports share, so two
        collectives are ordered by when they can start, not by which was waited for first."""
        at, moved = start, True
        while moved:
            moved = False
            for r in ranks:
                base = 2 * r * KEPT
                for k in range(base, base + 2 * KEPT, 2):
                    begin, end = self.spans[k], self.spans[k + 1]
                    if begin < at + seconds and at < end:
                        at, moved = end, True
        return at

    def reserve(self, store: Any, key: str, ranks: tuple[int, ...], start: float, seconds: float) -> float:
        """The end of the collective ``key`` of the group whose store is ``store``, among the
        global ``ranks``: the first member to ask reserves every member's port from
        :meth:`earliest` for ``seconds`` (in place of each port's oldest stretch) and leaves the
        end in the store; the others read it (the last of them removes it)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            if store.check([key]):
                end = float(store.get(key))
            else:
                begin = self.earliest(ranks, start, seconds)
                end = begin + seconds
                for r in ranks:
                    base = 2 * r * KEPT
                    oldest = min(range(base, base + 2 * KEPT, 2), key=lambda k: self.spans[k + 1])
                    self.spans[oldest], self.spans[oldest + 1] = begin, end
                store.set(key, repr(end))
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        if store.add(key + "/read", 1) == len(ranks):
            store.delete_key(key)
            store.delete_key(key + "/read")
        return end


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class HeldWork(dist.Work):
    """gloo's requests ``works``, complete once all are done and the clock has passed
    ``end(after)``, a moment of ``time.monotonic`` asked once the requests are done (it may
    read their values); ``after`` is the end of ``previous`` (the group's collective before
    this one; 0 without one). ``keep``: tensors gloo sends from, kept alive until then."""

    def __init__(self, works: list[Any], end: Callable[[float], float], previous: "HeldWork | None" = None,
                 keep: Any = None):
        super().__init__()
        self.works, self._end, self.previous, self.keep = works, end, previous, keep
        self._until: float | None = None
        self._settled = False

    def _settle(self, timeout: timedelta = timedelta(0)) -> None:
        """Wait for gloo's requests, once (a second wait on a gloo request hangs)."""
        if not self._settled:
            for w in self.works:
                w.wait(timeout)
            self._settled = True

    def until(self) -> float:
        """The moment the transfer ends; the chain of earlier collectives not yet asked is
        resolved oldest first (a loop: many may be posted before one is waited for)."""
        chain, w = [], self
        while w is not None and w._until is None:
            chain.append(w)
            w = w.previous
        after = w._until if w is not None else 0.0
        for w in reversed(chain):
            w._settle()
            w._until = after = w._end(after)
            w._end, w.previous = None, None  # resolved: let the chain go
        return self._until

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._settle(timeout)
        until = self.until()
        left = until - time.monotonic()  # read once: the clock moves between two reads
        if left > SPIN_S:
            time.sleep(left - SPIN_S)
        while time.monotonic() < until:  # the last stretch awake: a sleeping process wakes late on a busy host
            pass
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works) and time.monotonic() >= self.until()

    def is_success(self) -> bool:
        return all(w.is_success() for w in self.works)


class LinkedGroup(dist.ProcessGroup):
    """A gloo group whose transfers last what the declared links give (module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, links: EmulatedLinks):
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.links, self.store = links, store
        self.ranks = _members(store, rank, size)
        self.devices = tuple(links.devices[r] for r in self.ranks)
        machines = {links.cluster.device(d).machine for d in self.devices}
        self.ports: Ports | None = _installed["ports"] if len(machines) > 1 else None  # crosses machines
        self.link_free: dict[int, float] = {}  # per peer (group rank): when the link to it is free
        self.last: HeldWork | None = None  # the group's latest collective
        self.posted = 0  # collectives posted (the key of each one's end in the store)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # ------------------------------------------------------------- messages
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> HeldWork:
        nbytes = _nbytes(tensors)
        cluster, a, b = self.links.cluster, self.devices[self.rank()], self.devices[dst]
        start = max(time.monotonic(), self.link_free.get(dst, 0.0))
        self.link_free[dst] = start + nbytes / cluster.beta(a, b)
        stamp = torch.tensor([start], dtype=torch.float64)
        works = [self.inner.send([stamp], dst, tag), self.inner.send(tensors, dst, tag)]
        took = send_s(cluster, a, b, nbytes)
        return HeldWork(works, lambda _: start + took, keep=stamp)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> HeldWork:
        took = send_s(self.links.cluster, self.devices[src], self.devices[self.rank()], _nbytes(tensors))
        stamp = torch.zeros(1, dtype=torch.float64)
        works = [self.inner.recv([stamp], src, tag), self.inner.recv(tensors, src, tag)]
        return HeldWork(works, lambda _: float(stamp[0]) + took)

    # ---------------------------------------------------------- collectives
    def _held(self, post: Callable[[], Any], seconds: float) -> HeldWork:
        """Post the members' moment (max all-reduce), then the collective ``post()``; the
        request ends ``seconds`` after the later of the last member's moment and the end of the
        group's previous collective (one member: no hold) and, where the group crosses machines,
        of every member's port (:class:`Ports`)."""
        if self.size() == 1:
            return HeldWork([post()], lambda _: 0.0)
        stamp = torch.tensor([time.monotonic()], dtype=torch.float64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        works = [self.inner.allreduce([stamp], opts), post()]
        if self.ports is None:
            end = lambda after: max(float(stamp[0]), after) + seconds  # noqa: E731
        else:  # across machines: every member's port (module docstring)
            key, ports, ranks = f"hexicore-links/end/{self.posted}", self.ports, self.ranks
            end = lambda after: ports.reserve(self.store, key, ranks, max(float(stamp[0]), after), seconds)  # noqa: E731
        self.posted += 1
        self.last = HeldWork(works, end, self.last)
        return self.last

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> HeldWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._held(lambda: self.inner.allreduce(tensors, opts),
                          allreduce_s(self.links.cluster, self.devices, _nbytes(tensors)))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> HeldWork:
        seconds = broadcast_s(self.links.cluster, self.devices[opts.rootRank], self.devices, _nbytes(tensors))
        return self._held(lambda: self.inner.broadcast(tensors, opts), seconds)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> HeldWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        seconds = ring_pass_s(self.links.cluster, self.devices, sum(_nbytes(o) for o in outputs))
        return self._held(lambda: self.inner.allgather(outputs, inputs, opts), seconds)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HeldWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._held(lambda: self.inner._allgather_base(output, input, opts),
                          ring_pass_s(self.links.cluster, self.devices, _nbytes([output])))

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HeldWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._held(lambda: self.inner._reduce_scatter_base(output, input, opts),
                          ring_pass_s(self.links.cluster, self.devices, _nbytes([input])))

    _reduce_scatter_base = reduce_scatter_single

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> HeldWork:
        seconds = ring_pass_s(self.links.cluster, self.devices, _nbytes(inputs) * self.size())
        return self._held(lambda: self.inner.gather(outputs, inputs, opts), seconds)

    def barrier(self, opts: Any = None) -> HeldWork:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._held(lambda: self.inner.barrier(opts), allreduce_s(self.links.cluster, self.devices, 0))


def _members(store: Any, rank: int, size: int) -> tuple[int, ...]:
    """The global ranks of a group's members, in group-rank order: the default group's are its
    own; a subgroup's members tell each other through the group's store."""
    if not dist.is_initialized():
        return tuple(range(size))
    store.set(f"hexicore-links/member/{rank}", str(dist.get_rank()))
    return tuple(int(store.get(f"hexicore-links/member/{i}")) for i in range(size))
