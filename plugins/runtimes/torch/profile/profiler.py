"""``hexicore profile`` on torch.distributed: time the model's blocks and the cluster's links.

One worker per device of the cluster (launched as ``train`` launches: :mod:`..launch.launcher`, local
processes or the ranks torchrun started). Every rank walks the same list of measurements
(:func:`tasks`); one measurement runs at a time (the others wait at a barrier), so devices
sharing a host do not disturb each other. Each rank is its device: rank ``r`` is
``cluster.devices[r]``, and compute on a machine with ``emulate:`` goes through
:func:`..launch.emulated_device.emulated` exactly as the executor's compute actions do, so every second
recorded is a wall second as training will see it.

* **block** (per GPU type, or per device): :class:`..model.llama.Block` — the runtime's own block —
  at each micro-batch x TP degree: forward, backward, and recompute (what recomputation adds to
  the backward of the block under ``torch.utils.checkpoint``, as the runtime runs it: the
  checkpointed backward minus the plain one, :func:`.samplers.block_samples`); the median (or minimum) of
  ``repeats`` samples after one warm-up, the repeats interleaved across measurements
  (:func:`run_worker`). TP > 1 runs on that many devices of the type on one machine (the TP
  all-reduces are inside the times, as inside a compute action); a TP degree the cluster cannot
  form is skipped. Activation bytes: CUDA allocator growth across the forward; on CPU the bytes
  of the distinct tensors autograd saves (``saved_tensors_hooks``), parameters excluded.
* **head** and **embedding** (per GPU type, or per device), at each micro-batch: the token
  embedding alone, and the final norm + output projection + loss alone
  (:class:`..model.llama.LlamaChunk` without blocks, first or last), forward, backward and the
  bytes each forward keeps for backward (:func:`.samplers.ends_samples`). The runtime keeps both
  whole on every TP rank, so one rank's time is the time at any TP degree: recorded at TP 1.
* **links**: per machine (devices 0 and 1) and per machine pair (device 0 of each), ping-pong
  of each size in ``link_bytes``; one-way time = half the round trip, kept per size
  (``points``) and fitted as ``t = latency + bytes / bandwidth`` by least squares (:func:`fit_link`).
* **all-reduce**: per group size and machine pair (devices alternating between the two
  machines; the same machine twice: inside it), bus bandwidth ``2 (g - 1) / g * bytes / t``
  (NCCL's convention) at ``allreduce_bytes``.
* **step**: every rank at once, the trainer's per-step loss and gradient-norm all-reduces (a
  scalar each), the profile's ``step_overhead_s``.

Emulated links (``emulate: {links: true}``) are measured as real ones: every message and
collective goes through the job's process group, which holds it to the declared link
(:mod:`..launch.emulated_links`).
"""

from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

import torch
import torch.distributed as dist

from hexicore.core.emulation import EmulatedLinks, Emulation
from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.profile import (AllReduceTiming, BlockTiming, DeviceProfile, EmbeddingTiming, HeadTiming,
                                   LinkTiming, Profile)
from hexicore.core.settings import OutputSettings

from ..launch.settings import LaunchSettings, check_links
from .samplers import allreduce_samples, block_samples, ends_samples, p2p_samples, step_samples


@dataclass(frozen=True)
class Task:
    """One measurement: ``kind`` block | head | p2p | allreduce | step on global ``ranks``."""

    kind: str
    ranks: tuple[int, ...]
    subject: str = ""          # block/head: GPU type or device id
    micro_batch: int = 0
    between: tuple[str, str] = ("", "")
    group: int = 0
    batch: int = 0             # tasks of one batch run at the same time (:func:`tasks`)


@dataclass(frozen=True)
class ProfileJob:
    """What every worker needs (picklable; :func:`..launch.launcher.worker_main` calls :meth:`execute`)."""

    devices: tuple[tuple[str, str, str, Emulation], ...]  # (id, machine, gpu type, emulate) per rank
    model: ModelSpec
    micro_batches: tuple[int, ...]
    tp: tuple[int, ...]
    seq_len: int
    dtype: str
    all_devices: bool
    repeats: int
    link_bytes: tuple[int, ...]
    allreduce_groups: tuple[int, ...]
    allreduce_bytes: int
    seed: int = 0
    statistic: str = "median"
    concurrent: bool = False
    launch: LaunchSettings = LaunchSettings()
    links: EmulatedLinks | None = None  # the cluster's emulated links (None: the host's own)
    output: OutputSettings = OutputSettings()  # no out: no checkpoints (what the launcher's stop line looks for)

    @property
    def world(self) -> int:
        return len(self.devices)

    def execute(self, rank: int, world: int, device: torch.device) -> dict[str, Any] | None:
        return run_worker(self, rank, world, device)


def tasks(job: ProfileJob) -> list[Task]:
    """Every measurement, in the order all ranks walk them (pure: the same on every rank).
    Block and head tasks name their leading device (``subject``); tasks with the same ``batch``
    run at the same time (``concurrent``: every device of the cluster at once, TP groups
    disjoint), each other batch alone."""
    out: list[Task] = []
    by_machine: dict[str, list[int]] = {}
    for r, (_, m, _, _) in enumerate(job.devices):
        by_machine.setdefault(m, []).append(r)
    first = {}
    for r, (_, _, gpu, _) in enumerate(job.devices):
        first.setdefault(gpu, r)
    leaders = list(range(job.world)) if job.all_devices or job.concurrent else list(first.values())
    fits = [tp for tp in job.tp if not (job.model.heads % tp or job.model.kv_heads % tp or job.model.ffn % tp)]
    combo = 1
    for tp in fits:
        for mb in job.micro_batches:
            combo += 1  # concurrent: one batch per (TP, micro-batch), numbered below zero
            for ranks in _tp_groups(job, by_machine, leaders, tp):
                batch = len(out) if not job.concurrent else -combo
                out.append(Task("block", ranks, job.devices[ranks[0]][0], micro_batch=mb, group=tp, batch=batch))
    for mb in job.micro_batches:
        for r in leaders:
            out.append(Task("head", (r,), job.devices[r][0], micro_batch=mb,
                            batch=-combo - mb if job.concurrent else len(out)))  # below every block batch
    names = list(by_machine)
    for i, a in enumerate(names):
        for b in names[i:]:
            pair = (by_machine[a][0], by_machine[a][1]) if a == b and len(by_machine[a]) > 1 else (
                (by_machine[a][0], by_machine[b][0]) if a != b else None)
            if pair:
                out.append(Task("p2p", pair, between=(a, b), batch=len(out)))
            pool = by_machine[a] if a == b else [r for p in zip(by_machine[a], by_machine[b]) for r in p]
            for g in job.allreduce_groups:
                if 1 < g <= len(pool):
                    out.append(Task("allreduce", tuple(sorted(pool[:g])), between=(a, b), group=g, batch=len(out)))
    if job.world > 1:
        out.append(Task("step", tuple(range(job.world)), batch=len(out)))
    return out


def _tp_groups(job: ProfileJob, by_machine: dict[str, list[int]], leaders: list[int], tp: int) -> list[tuple[int, ...]]:
    """TP groups of ``tp`` devices of one type on one machine: one per leader (its mates from it
    on, wrapping), or — concurrent — every disjoint group of the cluster."""
    def mates(r: int) -> list[int]:
        same = [q for q in by_machine[job.devices[r][1]] if job.devices[q][2] == job.devices[r][2]]
        return same[same.index(r):] + same[:same.index(r)]

    if not job.concurrent:
        return [(r, *sorted(mates(r)[1:tp])) for r in leaders if tp <= len(mates(r))]
    groups, taken = [], set()
    for r in leaders:
        if r not in taken:
            same = [q for q in mates(r) if q not in taken][:tp]
            if len(same) == tp:
                groups.append(tuple(same))
            taken.update(same)
    return groups


def run_worker(job: ProfileJob, rank: int, world: int, device: torch.device) -> dict[str, Any] | None:
    """One rank's share of :func:`tasks`; rank 0 returns every result (``{"tasks", "results", "env"}``).

    Repeats are interleaved: round ``k`` takes the ``k``-th sample of every measurement in turn
    (round 0 warms up and is dropped), so a burst of other work on the host spoils one sample of
    many measurements instead of every sample of one."""
    todo = tasks(job)
    handles: dict[tuple[int, ...], Any] = {}
    for t in todo:  # new_group is collective: every rank creates every group, in order
        if len(t.ranks) > 1 and t.ranks not in handles and t.kind not in ("p2p", "step"):
            handles[t.ranks] = dist.new_group(list(t.ranks)) if world > 1 else None
    gens = {i: _sampler(job, t, rank, device, handles.get(t.ranks)) for i, t in enumerate(todo) if rank in t.ranks}
    samples: dict[int, list[Any]] = {i: [] for i in gens}
    for rnd in range(job.repeats + 1):
        for i, t in enumerate(todo):
            if i in gens:
                got = next(gens[i])
                if rnd:
                    samples[i].append(got)
            if world > 1 and (i + 1 == len(todo) or todo[i + 1].batch != t.batch):
                dist.barrier()
    mine = [summarize(job, t, samples[i]) if i in gens else None for i, t in enumerate(todo)]
    every: list[Any] = [mine]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, mine)
    if rank != 0:
        return None
    return {"tasks": todo, "results": [[every[r][i] for r in t.ranks if every[r][i] is not None]
                                       for i, t in enumerate(todo)], "env": environment(job, device)}


def _sampler(job: ProfileJob, t: Task, rank: int, device: torch.device, group: Any) -> Iterator[Any]:
    if t.kind == "block":
        return block_samples(job, t, rank, device, group)
    if t.kind == "head":
        return ends_samples(job, t.micro_batch, job.devices[rank][3], device)
    if t.kind == "p2p":
        return p2p_samples(job, t.ranks, rank, device)
    if t.kind == "step":
        return step_samples(device)
    return allreduce_samples(job, device, group)


def summarize(job: ProfileJob, t: Task, samples: list[Any]) -> Any:
    """One measurement's kept value from its samples (:func:`pick` of each quantity)."""
    if t.kind == "block":
        keys = ("forward_s", "backward_s", "recompute_s", None, "optimizer_s")
        out = {k: pick(job, [s[i] for s in samples]) for i, k in enumerate(keys) if k}
        share = statistics.median(s[5] for s in samples)  # a ratio: its least is not the undisturbed one
        return {**out, "action_share": share, "activation_bytes": float(samples[-1][3])}
    if t.kind == "head":
        keys = ("embedding_forward_s", "embedding_backward_s", "forward_s", "backward_s")
        return {**{k: pick(job, [s[i] for s in samples]) for i, k in enumerate(keys)},
                "embedding_bytes": float(samples[-1][4]), "activation_bytes": float(samples[-1][5])}
    if t.kind == "p2p":
        if samples[0] is None:  # the echoing rank
            return None
        return [(size, pick(job, [s[j][1] for s in samples])) for j, (size, _) in enumerate(samples[0])]
    return pick(job, samples)


def pick(job: ProfileJob, values: list[float]) -> float:
    """The kept value of repeated timings: their median, or their minimum (``statistic: min``,
    the undisturbed time on a host that other work shares)."""
    return min(values) if job.statistic == "min" else statistics.median(values)


def fit_link(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``t = latency + bytes / bandwidth`` over (bytes, seconds): (latency s, GB/s).
    A fit with no positive slope (noise dominates) keeps the largest size's rate."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        big = max(points)
        return max(min(p[1] for p in points), 0.0), big[0] / max(big[1], 1e-12) / 1e9
    return max(my - slope * mx, 0.0), 1.0 / slope / 1e9


def environment(job: ProfileJob, device: torch.device) -> dict[str, Any]:
    from ..model.llama import _flash_attn_func

    half = job.dtype in ("bf16", "fp16")
    flash = _flash_attn_func is not None and device.type == "cuda" and half
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {"torch": str(torch.__version__), "backend": str(dist.get_backend()) if dist.is_initialized() else "none",
            "dtype": job.dtype, "attention": "flash-attn" if flash else "sdpa", "device": str(name),
            "threads": torch.get_num_threads(), "repeats": job.repeats, "statistic": job.statistic,
            "concurrent": job.concurrent,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def to_profile(job: ProfileJob, got: dict[str, Any]) -> Profile:
    """Rank 0's results as a :class:`Profile`: a TP block's times are its slowest member's; per
    GPU type (unless ``all_devices``) the median over the devices measured (one, unless
    ``concurrent``)."""
    gpu = {d[0]: d[2] for d in job.devices}
    name = (lambda dev: dev) if job.all_devices else (lambda dev: gpu[dev])
    blocks: dict[tuple[str, int, int], list[dict[str, float]]] = {}
    ends: dict[tuple[str, int], list[dict[str, float]]] = {}
    links, allreduce, overhead = [], [], 0.0
    for t, res in zip(got["tasks"], got["results"]):
        if t.kind == "block":
            blocks.setdefault((name(t.subject), t.micro_batch, t.group), []).append(
                {k: max(r[k] for r in res) for k in res[0]})
        elif t.kind == "head":
            ends.setdefault((name(t.subject), t.micro_batch), []).append(res[0])
        elif t.kind == "p2p":
            lat, bw = fit_link(res[0])
            links.append(LinkTiming(t.between, lat, bw, tuple((int(b), float(x)) for b, x in sorted(res[0]))))
        elif t.kind == "step":
            overhead = max(res)
        else:
            allreduce.append(AllReduceTiming(t.between, t.group,
                                             2 * (t.group - 1) / t.group * job.allreduce_bytes / max(res) / 1e9,
                                             job.allreduce_bytes))
    s, m = job.seq_len, job.model
    per: dict[str, list[BlockTiming]] = {}
    order = list(dict.fromkeys(k[0] for k in blocks))
    for (n, mb, tp), rows in sorted(blocks.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][2], kv[0][1])):
        per.setdefault(n, []).append(BlockTiming(mb, tp, s, _med(rows, "forward_s"), _med(rows, "backward_s"),
                                                 _med(rows, "recompute_s"), m.hidden, m.ffn, m.heads, m.kv_heads,
                                                 _med(rows, "activation_bytes"), _med(rows, "optimizer_s"),
                                                 _med(rows, "action_share") * (_med(rows, "forward_s") +
                                                                               _med(rows, "backward_s")),
                                                 m.head_dim))
    # a type none of whose TP groups could be timed is left out: the cost model prices it
    # analytically (a measured head alone is not used)
    devices = {n: DeviceProfile(tuple(blocks_n), *_ends(job, ends, n)) for n, blocks_n in per.items()}
    if not devices:
        raise HexicoreError(NO_TP, source="command line", field="profile.tp")
    return Profile(devices, tuple(links), tuple(allreduce), got["env"], step_overhead_s=overhead)


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _ends(job: ProfileJob, ends: dict[tuple[str, int], list[dict[str, float]]], name: str) -> tuple[tuple, tuple]:
    """A profile entry's heads and embeddings, one per micro-batch measured, at TP 1 (the
    runtime keeps both whole on every TP rank)."""
    s, m = job.seq_len, job.model
    rows = sorted((mb, r) for (n, mb), r in ends.items() if n == name)
    heads = tuple(HeadTiming(mb, s, _med(r, "forward_s"), _med(r, "backward_s"), m.hidden, m.vocab, 1,
                             _med(r, "activation_bytes")) for mb, r in rows)
    embeddings = tuple(EmbeddingTiming(mb, s, _med(r, "embedding_forward_s"), _med(r, "embedding_backward_s"),
                                       m.hidden, m.vocab, 1, _med(r, "embedding_bytes")) for mb, r in rows)
    return heads, embeddings


NO_TP = ("no TP degree of profile.tp could be timed (a degree must divide the model's heads, kv heads and FFN "
         "and fit on one machine)")


def job_from_request(request: Any, launch: LaunchSettings) -> ProfileJob:
    c = request.cluster
    devices = tuple((d.id, d.machine, d.gpu.name, c.emulation(d.id)) for d in c.devices)
    job = ProfileJob(devices, request.model, tuple(request.micro_batches), tuple(request.tp),
                 int(request.seq_len or request.model.seq_len), request.dtype, bool(request.all_devices),
                 int(request.repeats), tuple(request.link_bytes), tuple(request.allreduce_groups),
                 int(request.allreduce_bytes), int(request.seed), str(request.statistic),
                 bool(getattr(request, "concurrent", False)), launch,
                 check_links(c.emulated_links(d.id for d in c.devices), launch.backend))
    if not any(t.kind == "block" for t in tasks(job)):  # before any worker starts, not after measuring
        raise HexicoreError(NO_TP, source="command line", field="profile.tp")
    return job
