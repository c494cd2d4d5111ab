"""What ``hexicore profile`` asks a runtime to measure (the runtime answers with a
:class:`hexicore.core.profile.Profile`).

The app layer builds a :class:`ProfileRequest` from the config's ``profile.*`` keys and hands it
to the runtime plugin's ``profile`` method, as ``train`` hands a
:class:`~hexicore.core.run_spec.RunSpec` to ``run``; the runtime never reads the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hexicore.core.settings import TrainSettings
from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec

#: the lists of sizes a request measures (each size once)
_LISTS = ("micro_batches", "tp", "link_bytes", "allreduce_groups")


@dataclass(frozen=True)
class ProfileRequest:
    """Measure ``model``'s blocks and ``cluster``'s links.

    ``micro_batches`` x ``tp``: the block shapes timed on each GPU type (a TP degree needs that
    many devices of the type on one machine); ``all_devices``: time every device, not one per
    type (devices are then named by id in the profile); ``repeats``: timed runs per measurement
    after one warm-up (the median is kept); ``link_bytes``: message sizes of the point-to-point
    fit ``t = latency + bytes / bandwidth``; ``allreduce_groups``: group sizes whose all-reduce
    bandwidth is measured with ``allreduce_bytes`` per rank; ``statistic``: ``median`` or ``min``
    of the repeats (the minimum: undisturbed times on a host other work shares); ``concurrent``:
    every device computes at the same time (per type, the median over its devices), so devices
    that share a host are measured sharing it, as a training run shares it.

    A size listed twice is measured once (a profile holds one measurement per point); the link
    fit needs at least two different ``link_bytes`` (one size cannot tell latency from
    bandwidth), else :class:`HexicoreError` naming ``link_bytes``."""

    cluster: Cluster
    model: ModelSpec
    micro_batches: tuple[int, ...] = (1, 2)
    tp: tuple[int, ...] = (1, 2)
    seq_len: int = 0
    dtype: str = field(default=TrainSettings.dtype, metadata={"key": "train.dtype"})  # the training default
    all_devices: bool = False
    repeats: int = 5
    statistic: str = "median"
    concurrent: bool = False
    link_bytes: tuple[int, ...] = (4096, 262144, 4194304)
    allreduce_groups: tuple[int, ...] = (2, 4, 8)
    allreduce_bytes: int = 4194304
    seed: int = field(default=0, metadata={"key": "seed"})
    runtime: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _LISTS:
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        if len(self.link_bytes) < 2:
            raise HexicoreError("needs at least two different message sizes: the fit latency + bytes / bandwidth "
                                f"cannot separate the two from one (got {list(self.link_bytes)})", field="link_bytes")
