"""The ``profiled`` cost model: App. A's structure priced with measured times (``cost=profiled
cost.profile_file=profile.yaml``; the file is :mod:`hexicore.core.profile`).

Everything the analytic model (:mod:`hexicore.cost.analytic`) derives from catalog peaks and
configured links comes from the profile where the profile has it:

* **compute of a stage** = its blocks' forward + backward (+ recompute) seconds measured on each
  device's own entry (a ``profile.all_devices=true`` profile, keyed by device id) or else its GPU
  type's, the slowest of the stage's devices (TP waits for it), at the stage's TP degree (+ the head on the last stage), less the fixed cost of an
  action counted once per block where the profile measured it (:meth:`ProfiledCostModel.compute_s`). Micro-batch sizes, sequence
  lengths and block shapes that were not measured are interpolated in FLOPs: the time is taken
  as affine in the block's FLOPs (counted as the model's own blocks are: a block measured at the
  plan's size is priced at its measured time) through the two nearest measurements of that TP
  degree (proportional beyond the measured range, or with a single measurement, with one
  warning). A TP degree that was
  not measured is scaled from the nearest measured one by FLOPs per device (and then its TP
  communication is priced from the measured links, App. A's formula).
* **TP communication** of a stage measured at its TP degree is inside the measured block times.
* **links** (hops, DP sync, unmeasured TP) use the measured latency and bandwidth of each machine
  pair (the same machine twice: the link inside it) in place of the cluster file's figures; the
  DP sync of a layer whose holders' machines have a measured all-reduce is priced from its bus
  bandwidth (:mod:`hexicore.cost.measured_allreduce`).
* **optimizer step**: where the profile has the blocks' ``optimizer_s``, the slowest rank's
  AdamW step over the parameters it keeps (:mod:`hexicore.cost.optimizer_step`) is added to
  ``dp_s``, the step's part after the pipelines (as the runtime's measured ``dp_sync_s`` holds
  the DP reduction and the optimizer step).
* **memory**: the analytic model's, except a block's activations, which are the profile's
  measured bytes where they apply, another TP degree scaled as the formula scales
  (:mod:`hexicore.cost.measured_block`).

Anything the profile lacks (a GPU type, a machine pair) falls back to the analytic model with a
one-line warning naming what was extrapolated (logged once per item on the ``hexicore`` logger).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Sequence

from hexicore.core.cluster import Cluster, Link
from hexicore.core.errors import HexicoreError
from hexicore.core.model import DTYPE_BYTES, ModelSpec
from hexicore.core.settings import TrainSettings
from hexicore.core.profile import BlockTiming, Profile
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.config import cost_model_from_config
from hexicore.cost.base import GIB
from hexicore.cost.measured_allreduce import allreduce_layer_s
from hexicore.cost.measured_ends import embedding_work, end_s
from hexicore.cost.measured_block import (activation_bytes, block_flops, block_seconds, formula_bytes,
                                          interpolate, own_shape, span, target_flops)
from hexicore.cost.optimizer_step import optimizer_step_s
from hexicore.cost.precision import vocab_split
from hexicore.cost.split import compute_forward_fraction

log = logging.getLogger("hexicore")


def chunks_per_stage(schedule: Mapping[str, Any]) -> int:
    """Model chunks each stage's devices run per micro-batch and direction under ``schedule``, as
    its parameters say where no schedule book tells (:attr:`ProfiledCostModel.schedule_chunks`):
    its ``chunks`` parameter (interleaved schedules), else two per ``waves`` (a wave passes every
    device twice, down and back), else one. A parameter the schedule has not chosen yet
    (Hanayo's ``waves: auto``) counts as its least: one wave, one chunk."""
    def count(key: str) -> int | None:
        v = schedule.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else None

    if schedule.get("chunks"):
        return count("chunks") or 1
    return 2 * (count("waves") or 1) if schedule.get("waves") else 1


@dataclass(frozen=True)
class ProfiledCostModel(AnalyticCostModel):
    """:class:`AnalyticCostModel` with measured compute and links (module docstring)."""

    profile: Profile = field(default_factory=lambda: Profile({}))
    name: str = "profiled"
    #: measured links differ per machine (pair): no two machines are interchangeable
    class_priced: ClassVar[bool] = False
    #: per pipeline, per stage the model chunks its schedule runs on that rank (injected by the
    #: planner's schedule book from the schedule's own lists, ``least_layers``); None: the
    #: schedule's parameters (:func:`chunks_per_stage`)
    schedule_chunks: Any = field(default=None, compare=False, repr=False)
    _noted: set = field(default_factory=set, compare=False, repr=False)
    _clusters: dict = field(default_factory=dict, compare=False, repr=False)

    def _note(self, what: str) -> None:
        if what not in self._noted:
            self._noted.add(what)
            log.warning("profiled cost model: %s", what)

    def check_cluster(self, cluster: Cluster) -> None:
        """Note (one warning) the machines the profile's ``links`` or ``allreduce`` name that
        ``cluster`` lacks: a profile of a larger fleet prices any part of it, and those rows are
        unused; where no named machine is in the cluster at all the profile was measured on
        another cluster, which is refused (the file does not list the profiled machines, so
        this is checked where it meets the cluster)."""
        names = {m.name for m in cluster.machines}
        rows = [(section, i, row) for section, rs in (("links", self.profile.links), ("allreduce", self.profile.allreduce))
                for i, row in enumerate(rs)]
        named = {n for _, _, row in rows for n in row.between}
        if named and not named & names:
            section, i, _ = rows[0]
            raise HexicoreError(f"no machine it measured ({', '.join(sorted(named))}) is in cluster {cluster.name!r} "
                                f"(machines: {', '.join(sorted(names))}); was the profile measured on another cluster?",
                                source=self.profile.source, field=f"{section}[{i}].between")
        if named - names:
            self._note(f"{self.profile.source or 'profile'}: links of machines not in cluster {cluster.name!r} "
                       f"unused: {', '.join(sorted(named - names))}")

    # ------------------------------------------------------------------ links
    def measured(self, cluster: Cluster) -> Cluster:
        """``cluster`` with every machine's and machine pair's latency and bandwidth replaced by
        the profile's measurements (cached per cluster)."""
        key = id(cluster)
        hit = self._clusters.get(key)
        if hit is not None and hit[0] is cluster:
            return hit[1]
        machines, links = [], []
        names = [m.name for m in cluster.machines]
        for m in cluster.machines:
            ln = self.profile.link(m.name, m.name)
            if ln is None:
                if m.count > 1:
                    self._note(f"no measured link inside machine {m.name}; using the cluster file's")
                machines.append(m)
            else:
                machines.append(replace(m, bandwidth_gbs=ln.bandwidth_gbs, latency_us=ln.latency_s * 1e6))
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ln = self.profile.link(a, b)
                if ln is None:
                    self._note(f"no measured link between machines {a} and {b}; using the cluster file's")
                else:
                    links.append(Link((a, b), ln.bandwidth_gbs, ln.latency_s * 1e6))
        keep = [ln for ln in cluster.links if not self.profile.link(*ln.between)]
        out = replace(cluster, machines=tuple(machines), links=tuple(keep) + tuple(links))
        self._clusters[key] = (cluster, out)
        return out

    # ---------------------------------------------------------------- compute
    def _blocks(self, gpu: str) -> tuple[BlockTiming, ...]:
        """The blocks of a profile entry: a device id (``A.0``) or a GPU type (``rtx4090``)."""
        dev = self.profile.devices.get(gpu)
        return dev.blocks if dev is not None else ()

    def _key(self, cluster: Cluster, device: str) -> str:
        """The profile entry of ``device``: its own (an ``all_devices`` profile), else its GPU type's."""
        return device if device in self.profile.devices else cluster.device(device).gpu.name

    def _keys(self, cluster: Cluster, devices: Sequence[str]) -> list[str]:
        return sorted({self._key(cluster, d) for d in devices})

    def _slowest_gpu(self, cluster: Cluster, devices: Sequence[str], model: ModelSpec | None = None,
                     train: TrainSettings | None = None) -> str:
        """The entry that governs a group: where a device has its own entry (an ``all_devices``
        profile), the entry with the slowest measured block (TP waits for it); else the
        catalog's slowest GPU type."""
        if model is not None and train is not None and any(d in self.profile.devices for d in devices):
            timed = [(t, k) for k in self._keys(cluster, devices)
                     if (t := self._entry_block_s(k, model, train, len(devices))) is not None]
            if timed:
                return max(timed)[1]
        return min((cluster.device(d) for d in devices), key=lambda dev: (dev.tflops, dev.id)).gpu.name

    def _entry_block_s(self, key: str, model: ModelSpec, train: TrainSettings, tp: int) -> float | None:
        """One block's interpolated seconds from profile entry ``key`` at TP ``tp`` (None: no blocks)."""
        blocks = self._blocks(key)
        if not blocks:
            return None
        measured = self.profile.environment.get("dtype")
        if measured and train.dtype and str(measured) != str(train.dtype):
            self._note(f"{self.profile.source or 'profile'}: measured in {measured}, the plan trains {train.dtype}; "
                       f"its block times are used as measured")
        same = [b for b in blocks if b.tp == tp]
        scale = 1.0
        if not same:
            near = min({b.tp for b in blocks}, key=lambda t: (abs(t - tp), t))
            self._note(f"{key}: TP degree {tp} was not profiled; scaled from TP {near} by FLOPs per device")
            same, scale = [b for b in blocks if b.tp == near], near / tp
        if not any(own_shape(b, model) for b in same):
            self._note(f"{key}: no block of this model's shape (hidden {model.hidden}, ffn {model.ffn}, heads "
                       f"{model.heads}/{model.kv_heads} of width {model.head_dim}) was profiled; scaled from the "
                       f"shapes measured by FLOPs")
        if train.recompute and any(not b.recompute_s for b in same):
            self._note(f"{key}: recompute_s was not profiled; a recomputed forward is priced as the measured forward")
        pts = [(block_flops(b, model), block_seconds(b, train.recompute)) for b in same]
        target = target_flops(model, train)
        low, high = min(x for x, _ in pts), max(x for x, _ in pts)
        if not low * (1 - 1e-9) <= target <= high * (1 + 1e-9):
            mbs, seqs = sorted({b.micro_batch for b in blocks}), sorted({b.seq_len for b in blocks})
            self._note(f"{key}: micro-batch {train.micro_batch} x sequence {train.seq_len} lies outside the profiled "
                       f"blocks (micro-batches {span(mbs)}, sequences {span(seqs)}); its time is extrapolated in "
                       f"proportion to FLOPs")
        return interpolate(pts, target) * scale

    def block_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str]) -> float | None:
        """Measured seconds of one block on ``devices`` (a TP group), interpolated: the slowest of
        the group's profile entries (each device's own, else its GPU type's); None when one of
        them was not profiled."""
        per_entry = []
        for key in self._keys(cluster, devices):
            t = self._entry_block_s(key, model, train, len(devices))
            if t is None:
                what = f"device {key}" if key in devices else f"GPU type {key}"
                self._note(f"{what} was not profiled; its compute is the analytic model's")
                return None
            per_entry.append(t)
        return max(per_entry)

    def head_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str]) -> float:
        """The head of one micro-batch on a stage of ``devices``: from the profile's heads of the
        slowest entry (:func:`hexicore.cost.measured_ends.end_s`: per micro-batch and TP degree,
        another size by its work), else App. A's on one member; not divided by the TP
        degree, as every TP rank computes all the logits (the runtime replicates the head, and
        the analytic model prices it so), unless ``train.vocab_parallel`` splits the head: then
        ``/ tp`` (each rank its ``V / tp`` logits)."""
        key = self._slowest_gpu(cluster, devices, model, train)
        dev = self.profile.devices.get(key)
        got = end_s(dev.heads, model, train, len(devices)) if dev is not None else None
        split = vocab_split(train, len(devices))
        if got is None:
            if dev is not None:  # a type not profiled at all is noted with its blocks
                self._note(f"{key}: no head was profiled; the head's time is the analytic model's")
            k = 4.0 if train.recompute else 3.0
            tokens = train.micro_batch * train.seq_len
            return tokens * model.head_flops_per_token() * k * len(devices) / split / self.achieved_flops(cluster, devices)
        h = next((h for h in dev.heads if (h.hidden or model.hidden, h.vocab or model.vocab) !=
                  (model.hidden, model.vocab)), None)
        if h is not None:
            self._note(f"{key}: the head was profiled at hidden {h.hidden or model.hidden} x vocab {h.vocab or model.vocab}, "
                       f"this model's is {model.hidden} x {model.vocab}; its time is scaled by FLOPs")
        return got / split

    def embedding_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str]) -> float:
        """The token embedding of one micro-batch on a first stage of ``devices``: from the
        profile's embeddings of the slowest entry (:func:`hexicore.cost.measured_ends.end_s`);
        0 where it has none (App. A prices no embedding)."""
        dev = self.profile.devices.get(self._slowest_gpu(cluster, devices, model, train))
        got = end_s(dev.embeddings, model, train, len(devices), embedding_work) if dev is not None else None
        return got or 0.0

    def stage_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                n_layers: int, *, first: bool = False, last: bool = False) -> float:
        """STAGE of App. A (:meth:`AnalyticCostModel.stage_s`) + the measured embedding on a first stage."""
        own = super().stage_s(cluster, model, train, devices, n_layers, first=first, last=last)
        return own + (self.embedding_s(cluster, model, train, devices) if first else 0.0)

    def action_s(self, cluster: Cluster, devices: Sequence[str]) -> float:
        """The fixed cost of a forward and a backward action (:class:`BlockTiming.action_s`): the
        median over the profiled blocks of the lowest TP degree, the largest over the group's
        GPU types; 0 where not measured, and for a TP group (> 1 device): every block of a TP
        stage ends in all-reduces that wait for the group's slowest rank, so in training a TP
        stage pays the measured block time per block (docs/results.md, "Closed loop")."""
        if len(devices) > 1:
            return 0.0
        worst = 0.0
        for gpu in self._keys(cluster, devices):
            blocks = self._blocks(gpu)
            if blocks:
                low = min(b.tp for b in blocks)
                worst = max(worst, statistics.median(b.action_s for b in blocks if b.tp == low))
        return worst

    def pipeline_pieces(self, plan: Any, pipeline: Any) -> tuple[list[float], list[float]]:
        """App. A's pieces, each stage paying one action's fixed cost per chunk it runs
        (:attr:`schedule_chunks`, else :func:`chunks_per_stage`; :meth:`compute_s` counts one)."""
        stages, hops = super().pipeline_pieces(plan, pipeline)
        n = len(pipeline.stages)
        chunks = (tuple(self.schedule_chunks(pipeline)) if self.schedule_chunks is not None
                  else (chunks_per_stage(pipeline.schedule),) * n)
        return [x + (k - 1) * self.action_s(plan.cluster, s.devices) if k > 1 else x
                for x, s, k in zip(stages, pipeline.stages, chunks)], hops

    def compute_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                  n_layers: int, *, last: bool = False) -> float:
        """``n t - (n - 1) a`` (+ the head, less its own ``a``): ``t`` a block's measured seconds
        (:meth:`block_s`), each including one action's fixed cost ``a`` (:meth:`action_s`) that a
        stage running its ``n`` blocks (and head) in one forward and one backward action pays once."""
        blk = self.block_s(cluster, model, train, devices)
        if blk is None:
            return super().compute_s(cluster, model, train, devices, n_layers, last=last)
        fixed = min(self.action_s(cluster, devices), blk)
        head = max(self.head_s(cluster, model, train, devices) - fixed, 0.0) if last else 0.0
        return n_layers * blk - max(n_layers - 1, 0) * fixed + head

    def forward_fraction(self, cluster: Cluster, model: ModelSpec, train: TrainSettings,
                         devices: Sequence[str]) -> float:
        """The forward's share of a stage's compute (:mod:`hexicore.cost.split`): measured, the
        blocks' forward seconds over forward + backward (+ recompute) of the slowest GPU type at
        the nearest profiled TP degree; App. A's 1/3 (1/4) where that type was not profiled."""
        blocks = self._blocks(self._slowest_gpu(cluster, devices, model, train))
        if not blocks:
            return compute_forward_fraction(train.recompute)
        near = min({b.tp for b in blocks}, key=lambda t: (abs(t - len(devices)), t))
        same = [b for b in blocks if b.tp == near]
        total = sum(block_seconds(b, train.recompute) for b in same)
        return sum(b.forward_s for b in same) / total if total > 0 else compute_forward_fraction(train.recompute)

    def tp_comm_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                  n_layers: int) -> float:
        """Zero where the blocks were measured at this TP degree (inside their times), else App. A
        on the measured links."""
        if all(any(b.tp == len(devices) for b in self._blocks(g)) for g in self._keys(cluster, devices)):
            return 0.0
        return super().tp_comm_s(self.measured(cluster), model, train, devices, n_layers)

    def vocab_comm_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str], *,
                     first: bool = False, last: bool = False) -> tuple[float, float]:
        """App. A's vocabulary-parallel all-reduces (:meth:`AnalyticCostModel.vocab_comm_s`) on the
        measured links: no profiled time contains them."""
        return super().vocab_comm_s(self.measured(cluster), model, train, devices, first=first, last=last)

    def hop_s(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, src: Sequence[str],
              dst: Sequence[str]) -> float:
        return super().hop_s(self.measured(cluster), model, train, src, dst)

    def message_s(self, cluster: Cluster, a: str, b: str, nbytes: float) -> float:
        """One message from device ``a`` to ``b``: the measured seconds of the machines' link at
        this size (its ``points``, :meth:`hexicore.core.profile.LinkTiming.seconds`), else App.
        A's on the measured links."""
        if a != b:
            ln = self.profile.link(cluster.device(a).machine, cluster.device(b).machine)
            if ln is not None and ln.points:
                return ln.seconds(nbytes)
        return super().message_s(cluster, a, b, nbytes)

    def dp_layer_s(self, cluster: Cluster, holders: Sequence[Any], n_params: float, dtype_bytes: int,
                   links: dict | None = None, weight: Mapping[str, float] | None = None) -> float:
        """COMM-DP-LAYER from the measured all-reduce bus bandwidth of the holders' machines
        (:mod:`hexicore.cost.measured_allreduce`); App. A's ring on the measured links where the
        profile has none (or under uneven ZeRO shards, ``weight``)."""
        got = None if weight is not None else allreduce_layer_s(self.profile, cluster, holders, n_params, dtype_bytes)
        if got is not None:
            return got
        return super().dp_layer_s(self.measured(cluster), holders, n_params, dtype_bytes, links, weight)

    def dp_s(self, plan: Any) -> float:
        """COMM-DP (App. A) on the measured links + OPT, the measured optimizer step
        (:func:`hexicore.cost.optimizer_step.optimizer_step_s`) + the profile's per-step fixed
        overhead (``step_overhead_s``: the loss and norm all-reduces every step pays)."""
        return super().dp_s(plan) + self.step_extra_s(plan)

    def step_extra_s(self, plan: Any) -> float:
        """What follows the gradient sync: the measured optimizer step and the profile's
        per-step fixed overhead."""
        return self.optimizer_s(plan) + self.profile.step_overhead_s

    def optimizer_s(self, plan: Any) -> float:
        """The slowest rank's measured optimizer step (0 where the profile has none)."""
        return optimizer_step_s(plan, lambda d: self._blocks(self._key(plan.cluster, d)), self.kept_params(plan),
                                self.held)

    def stage_memory_parts(self, cluster: Cluster, model: ModelSpec, train: TrainSettings, devices: Sequence[str],
                           n_layers: int, *, in_flight: float = 1, share_layers: int | None = None,
                           **held: Any) -> dict[str, float]:
        """The analytic parts (:meth:`AnalyticCostModel.stage_memory_parts`) with a block's
        measured activation bytes (:meth:`activation_bytes`, each forward's casts included) in
        place of the formula's: kept ``in_flight x share_layers`` times, the weights' casts once
        where the runtime casts once per step (:meth:`held_activations`; the head's cast as the
        analytic model prices it, :meth:`head_casts`), or under recomputation
        as the workspace of the block being recomputed (the kept block inputs stay the formula's
        ``B*S*H*B_type``)."""
        out = super().stage_memory_parts(cluster, model, train, devices, n_layers, in_flight=in_flight,
                                         share_layers=share_layers, **held)
        per = self.activation_bytes(cluster, model, train, devices) if n_layers else None
        if per is None:
            return out
        if train.recompute:
            wide = self.state_bytes(train).weights
            out["workspace"] += (per - formula_bytes(model, train, len(devices), weight_bytes=wide)) / GIB
        else:
            forwards = in_flight * (n_layers if share_layers is None else share_layers)
            dp = held.get("dp", 1)
            out["activations"] = (self.held_activations(model, train, len(devices), dp, per, n_layers, forwards)
                                  + self.head_casts(model, train, dp, held.get("last", False), in_flight,
                                                    vocab_split(train, len(devices)))) / GIB
        return out

    def activation_bytes(self, cluster: Cluster, model: ModelSpec, train: TrainSettings,
                         devices: Sequence[str]) -> float | None:
        """One block's measured activation bytes for one micro-batch on a rank of ``devices``
        (:func:`hexicore.cost.measured_block.activation_bytes`), the largest of the group's
        profile entries. An entry without bytes that apply takes the largest of the other
        entries' (what a block keeps is the model's and the runtime's, not the GPU's: a GPU type
        left unmeasured must not look roomier than a measured one), else the formula's; None
        (the formula's, noted once) where no entry has any, or the profile was measured in a
        dtype of another width than the plan's."""
        dtype = self.profile.environment.get("dtype")
        if dtype and train.dtype and DTYPE_BYTES.get(str(dtype)) != train.dtype_bytes:
            self._note(f"{self.profile.source or 'profile'}: activation bytes measured in {dtype}, the plan trains "
                       f"{train.dtype}; activation memory is the analytic model's")
            return None
        tp = len(devices)
        got, missing = [], []
        for key in self._keys(cluster, devices):
            b, why = activation_bytes(self._blocks(key), model, train, tp)
            if b is not None and why:
                self._note(f"{key}: {why}")
            (got if b is not None else missing).append(b if b is not None else (key, why))
        if not missing:
            return max(got)
        others = [b for k, dev in self.profile.devices.items()
                  if (b := activation_bytes(dev.blocks, model, train, tp)[0]) is not None]
        for key, why in missing:
            self._note(f"{key}: {why}; " + ("its activation memory is the largest other profiled entry's" if others
                                             else "activation memory is the analytic model's"))
        if others:
            return max(got + others)
        if not got:
            return None
        return max(got + [formula_bytes(model, train, tp, weight_bytes=self.state_bytes(train).weights)])

    def estimate(self, plan: Any) -> Any:
        """The analytic estimate of ``plan`` on its measured cluster (every link-priced term)."""
        return super().estimate(replace(plan, cluster=self.measured(plan.cluster)))

    def work_bound_s(self, plan: Any) -> float:
        """The analytic floor (:meth:`AnalyticCostModel.work_bound_s`) on the measured cluster."""
        return super().work_bound_s(replace(plan, cluster=self.measured(plan.cluster)))


def profiled_from_config(cfg: Mapping[str, Any] | None, *, source: str = "cost") -> ProfiledCostModel:
    """``cost=profiled``: the analytic settings (fallback efficiency, state bytes, reserve) plus
    ``profile_file``; a missing or malformed profile is a one-line error naming the file."""
    from hexicore.core import schema

    d = dict(schema.as_mapping(cfg or {}, source, "cost"))
    path = d.pop("profile_file", None)
    if not path:
        raise HexicoreError("cost=profiled needs cost.profile_file=PATH (a hexicore.profile/2 or /1 file, docs/formats.md)",
                            source="command line", field="cost.profile_file")
    base = cost_model_from_config(d, source=source)
    fields = {k: getattr(base, k) for k in ("efficiency", "default_efficiency", "state_bytes_per_param",
                                             "sync_bytes_per_param", "reserve_gb")}
    return ProfiledCostModel(**fields, profile=Profile.load(str(path)))
