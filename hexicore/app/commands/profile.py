"""``hexicore profile cluster_file=... model=... out=profile.yaml``: measure the cluster's own
devices and links through the runtime, print them, write a ``hexicore.profile/2`` file
(:mod:`hexicore.core.profile`) for ``cost=profiled cost.profile_file=...``.

The runtime plugin (``runtime=torch``) launches one process per device of the cluster (local
processes here; under torchrun this process is one of them, as for ``train``) and measures
what ``profile.*`` asks (docs/cli.md): a transformer block of the model at each micro-batch x TP
degree per GPU type, embedding + head, point-to-point links per machine and machine pair,
all-reduce per group size. Seconds are wall seconds, ``emulate:`` included.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hexicore.app import compose as app
from hexicore.app.report import console, rows_table
from hexicore.app.training import runtime_settings
from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.ownership import check_writable
from hexicore.core.profile import Profile
from hexicore.core.cluster import Cluster
from hexicore.core.profile_request import ProfileRequest
from hexicore.core.settings import TrainSettings
from hexicore.registry import Registry

SRC = "command line"
#: ``profile.allreduce_groups`` as shipped (conf/config.yaml): trimmed to the cluster, never refused
DEFAULT_GROUPS = next(f.default for f in fields(ProfileRequest) if f.name == "allreduce_groups")


def _ints(value: Any, field: str, minimum: int = 1, *, limit: int, what: str) -> tuple[int, ...]:
    """A non-empty list of integers in ``[minimum, limit]`` (limits.py: refused before any work)."""
    items = schema.as_list(app._plain(value) if value is not None else [], SRC, field)
    if not items:
        raise HexicoreError("needs at least one value", source=SRC, field=field)
    out = tuple(schema.integer(v, SRC, f"{field}[{i}]", minimum=minimum) for i, v in enumerate(items))
    for i, v in enumerate(out):
        limits.check(v, limit, what, source=SRC, field=f"{field}[{i}]")
    return out


def _int(value: Any, field: str, minimum: int, *, limit: int, what: str) -> int:
    v = schema.integer(value, SRC, field, minimum=minimum)
    limits.check(v, limit, what, source=SRC, field=field)
    return v


def allreduce_groups(value: Any, cluster: Cluster) -> tuple[int, ...]:
    """``profile.allreduce_groups``: group sizes no larger than the largest all-reduce the cluster
    forms (the devices of one machine, or of two alternating); a larger one is refused. The
    default list is trimmed to the cluster instead (a small cluster measures the sizes it has)."""
    field = "profile.allreduce_groups"
    groups = _ints(value, field, 2, limit=limits.MAX_DEVICES, what="GPUs")
    counts = list(Counter(d.machine for d in cluster.devices).values())
    most = max([*counts, *(2 * min(a, b) for i, a in enumerate(counts) for b in counts[i + 1:])], default=0)
    if groups == DEFAULT_GROUPS:
        return tuple(g for g in groups if g <= most)
    for i, g in enumerate(groups):
        if g > most:
            raise HexicoreError(f"a group of {g} GPUs is larger than any all-reduce cluster {cluster.name!r} forms "
                                f"(at most {most} devices: one machine's, or two machines' alternating)",
                                source=SRC, field=f"{field}[{i}]")
    return groups


def request_from_config(cfg: DictConfig) -> ProfileRequest:
    """The cluster, model and ``profile.*`` keys, checked (one line naming the key)."""
    p = cfg.get("profile") or {}
    model = app.load_model(cfg)
    t = cfg.get("train") or {}
    seq = p.get("seq_len") if p.get("seq_len") is not None else t.get("seq_len")
    seq_len = _int(seq, "profile.seq_len", 1, limit=limits.MAX_SEQ_LEN, what="tokens") if seq is not None \
        else model.seq_len
    model.check_seq_len(seq_len, "command line", "profile.seq_len" if p.get("seq_len") is not None else "train.seq_len")
    cluster = app.load_cluster(cfg)
    try:
        return _request(cfg, p, t, model, cluster, seq_len)
    except HexicoreError as exc:  # a list the request refuses (ProfileRequest): its profile.* key
        raise exc if exc.source else exc.located(SRC, "profile")


def _request(cfg: DictConfig, p: Any, t: Any, model: Any, cluster: Cluster, seq_len: int) -> ProfileRequest:
    return ProfileRequest(
        cluster=cluster, model=model,
        micro_batches=_ints(p.get("micro_batches"), "profile.micro_batches", limit=limits.MAX_GLOBAL_BATCH,
                            what="sequences"),
        tp=_ints(p.get("tp"), "profile.tp", limit=limits.MAX_DEVICES, what="GPUs"),
        seq_len=seq_len, dtype=str(t.get("dtype") or TrainSettings.dtype), all_devices=bool(p.get("all_devices")),
        repeats=_int(p.get("repeats"), "profile.repeats", 1, limit=limits.MAX_REPEATS, what="repeats"),
        link_bytes=_ints(p.get("link_bytes"), "profile.link_bytes", 4, limit=limits.MAX_MESSAGE_BYTES, what="bytes"),
        allreduce_groups=allreduce_groups(p.get("allreduce_groups"), cluster),
        allreduce_bytes=_int(p.get("allreduce_bytes"), "profile.allreduce_bytes", 4, limit=limits.MAX_MESSAGE_BYTES,
                             what="bytes"),
        seed=schema.integer(cfg.get("seed") or 0, SRC, "seed", minimum=None),
        statistic=str(p.get("statistic", "median")), concurrent=bool(p.get("concurrent")), runtime=runtime_settings(cfg).params)


def run(cfg: DictConfig) -> int:
    out = Path(cfg.out) if cfg.get("out") else app.output_dir(cfg) / "profile.yaml"
    lead = os.environ.get("RANK", "0") == "0"
    if lead:
        check_writable(out, "hexicore.profile", overwrite=cfg.get("overwrite"))
    request = request_from_config(cfg)
    settings = runtime_settings(cfg)
    runtime = Registry.default().create("runtime", settings.name)
    if not hasattr(runtime, "profile"):
        raise HexicoreError(f"runtime {settings.name!r} cannot profile devices", source=SRC, field="runtime")
    profile = runtime.profile(request)
    if profile is None:  # another torchrun rank: rank 0 reports and writes
        return 0
    print_profile(profile)
    profile.save(out)
    print(f"profile written to {out} (use: cost=profiled cost.profile_file={out})")
    return 0


def print_profile(p: Profile) -> None:
    """Blocks per device type, then links and all-reduces, as rich tables."""
    out = console()
    rows = [(name, b.micro_batch, b.tp, b.seq_len, f"{b.forward_s * 1e3:.3f}", f"{b.backward_s * 1e3:.3f}",
             f"{b.recompute_s * 1e3:.3f}", f"{b.activation_bytes / 2**20:.2f}",
             f"{b.optimizer_s * 1e3:.3f}" if b.optimizer_s else "", f"{b.action_s * 1e3:.3f}" if b.action_s else "")
            for name, dev in p.devices.items() for b in dev.blocks]
    rows += [(name, e.micro_batch, f"{part} (TP {e.tp})", e.seq_len, f"{e.forward_s * 1e3:.3f}",
              f"{e.backward_s * 1e3:.3f}", "", f"{e.activation_bytes / 2**20:.2f}" if e.activation_bytes else "", "", "")
             for name, dev in p.devices.items() for part, es in (("embedding", dev.embeddings), ("head", dev.heads))
             for e in es]
    out.print(rows_table("compute (one micro-batch)", ("device", "micro-batch", "TP", "seq", "forward ms",
                                                        "backward ms", "recompute ms", "activations MiB",
                                                        "optimizer step ms", "fixed per F+B action ms"), rows))
    links = [(" - ".join(ln.between), f"{ln.latency_s * 1e6:.1f}", f"{ln.bandwidth_gbs:.3f}") for ln in p.links]
    links += [(" - ".join(a.between), f"all-reduce x{a.group}", f"{a.bandwidth_gbs:.3f}") for a in p.allreduce]
    out.print(rows_table("links", ("between", "latency us", "GB/s"), links))
    if p.step_overhead_s:
        out.print(f"per step beyond the stages (loss and norm all-reduces): {p.step_overhead_s * 1e3:.3f} ms")
    env = p.environment
    out.print(f"torch {env.get('torch')}, {env.get('backend')}, {env.get('dtype')}, attention {env.get('attention')}, "
              f"{env.get('device')}, {env.get('date')}")
