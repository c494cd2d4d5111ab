"""The run's settings: one frozen dataclass per concept, its defaults defined here and nowhere else.

Every layer composes these classes rather than copying their fields:

* :class:`TrainSettings` — what is trained (the ``train`` config section): batch, sequence
  length, precision, recomputation, sharded state (ZeRO), steps and seed. A plan's ``train``
  section (plan JSON ``hexicore.plan/1``) is its planning fields (:data:`TrainSettings.PLAN_FIELDS`);
* :class:`CheckpointSettings` — where a run starts from and what it saves (``train.checkpoint_every``,
  ``resume=``, ``init_from=``, ``runtime.shard_mb``);
* :class:`OptimizerSettings` — AdamW and its learning-rate schedule (``runtime.lr``, ``runtime.eps``, ...);
* :class:`DataSettings` — what the model reads (``runtime.data``, ``runtime.data_file``);
* :class:`OutputSettings` — where results go (``out=``, ``overwrite=``).

The Hydra schema (:mod:`hexicore.app.config_schema`) builds its ``train`` section from
:class:`TrainSettings`'s fields and defaults; the run spec (:mod:`hexicore.core.run_spec`) holds
these objects; a runtime's worker spec holds them again (the same objects, not copies of their
fields).

Validation is declared on the fields (:func:`hexicore.core.fields.rule`): each field's check runs
in the class's ``__post_init__`` through :func:`~hexicore.core.fields.check_fields`, so a bad value is one line naming its config key
(``train.global_batch: must be a positive integer, got 0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hexicore.core import limits
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.fields import check_fields, flag, one_of, real, rule, text, whole
from hexicore.core.model import DTYPE_BYTES

#: ``train.zero`` values: ZeRO stages and ``auto`` (the planner searches them)
ZERO_STAGES = (0, 1, 2, 3, "auto")
#: ``train.micro_batch``'s keyword for "the planner chooses the micro-batch size"
AUTO = "auto"
ZERO_SPLITS = ("even", "memory")
#: ``train.zero_scope``: shard among all holders of a chunk, or only among those in the same
#: machine, replicating across machines (hybrid sharding, PyTorch's HSDP)
ZERO_SCOPES = ("all", "machine")
#: ``runtime.lr_schedule``: how the learning rate moves after the warmup
LR_SCHEDULES = ("constant", "linear", "cosine")
#: ``runtime.data``: a seeded synthetic token stream, byte-level text, or a token file
DATA_KINDS = ("synthetic", "text", "tokens")


# ----------------------------------------------------------------------------- the settings
@dataclass(frozen=True)
class TrainSettings:
    """What is trained, the ``train`` config section. Global batch (sequences), micro-batch,
    sequence length, dtype, recomputation, and the sharded-state stage ``zero`` (ZeRO,
    Rajbhandari et al. 2020: 0 = every data-parallel holder keeps the full state, 1 = optimizer
    state sharded among the holders of a layer chunk, 2 = + gradients, 3 = + weights; ``"auto"``
    only in a planning problem: the planner chooses; so is ``micro_batch`` ``"auto"``). ``zero_split``: ``even`` shards among a
    chunk's holders, or ``memory`` = each holder's share proportional to its device's memory
    (Cephalo-style). ``zero_scope``: ``all`` holders share the shards, or ``machine`` = shards
    among the holders in one machine, replicated across machines (hybrid sharding).
    ``dp_overlap``: the data-parallel gradient sync of a stage starts as soon as its gradients
    are final, overlapped with the rest of the rank's list (Megatron-LM's overlap-grad-reduce),
    and the cost model prices only what it does not hide; ``false``: all of it after the slowest
    pipeline's last backward (HexiScale App. A; the runtime waits for every pipeline first).
    ``vocab_parallel``: a stage's TP ranks split the token embedding, the head and the
    cross-entropy by vocabulary rows (Megatron-LM's vocabulary-parallel embedding and loss,
    Shoeybi et al. 2019 §3) instead of each keeping them whole. ``steps`` and ``seed`` concern a training run only: a plan's ``train`` section is
    :data:`PLAN_FIELDS`, and writes ``zero*``, ``dp_overlap`` and ``vocab_parallel`` only when
    not the default (0, even, all, true, false)."""

    global_batch: int = rule(24, whole())
    micro_batch: int | str = rule(1, None)  # a whole number >= 1 or auto, checked below
    seq_len: int = rule(4096, whole())
    dtype: str = rule("bf16", one_of(tuple(DTYPE_BYTES), "dtype"))
    recompute: bool = rule(True, flag)
    zero: int | str = rule(0, None)  # checked with its own message below
    zero_split: str = rule("even", one_of(ZERO_SPLITS, "zero_split"))
    zero_scope: str = rule("all", one_of(ZERO_SCOPES, "zero_scope"))
    dp_overlap: bool = rule(True, flag)
    vocab_parallel: bool = rule(False, flag)
    steps: int = rule(10, whole())
    seed: int = rule(0, whole(minimum=None), key="seed")

    #: the fields a plan records (plan JSON ``train``), in their order there
    PLAN_FIELDS = ("global_batch", "micro_batch", "seq_len", "dtype", "recompute", "zero", "zero_split", "zero_scope",
                   "vocab_parallel", "dp_overlap")

    def __post_init__(self) -> None:
        check_fields(self, "train")
        limits.check(self.global_batch, limits.MAX_GLOBAL_BATCH, "sequences", field="train.global_batch")
        limits.check(self.seq_len, limits.MAX_SEQ_LEN, "tokens", field="train.seq_len")
        if self.micro_batch != AUTO and (not isinstance(self.micro_batch, int) or isinstance(self.micro_batch, bool)
                                         or self.micro_batch < 1):
            raise HexicoreError(f"micro_batch must be a whole number >= 1 or auto; got {shown(self.micro_batch)}",
                                field="train.micro_batch")
        limits.check(self.micro_batches, limits.MAX_MICRO_BATCHES, "micro-batches",
                     field="train.micro_batch")
        if self.micro_batch != AUTO and self.global_batch % self.micro_batch:
            raise HexicoreError(f"global batch {self.global_batch} is not a multiple of micro-batch "
                                f"{self.micro_batch}: give a train.global_batch that {self.micro_batch} divides, "
                                f"or another train.micro_batch", field="train.micro_batch")
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise HexicoreError(f"zero must be one of 0, 1, 2, 3, auto; got {shown(self.zero)}", field="train.zero")

    @property
    def zero_stage(self) -> int:
        """The sharded-state stage as a number (``auto``, unresolved: 0)."""
        return self.zero if isinstance(self.zero, int) else 0

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step over the whole run (global batch / micro-batch; ``auto``,
        unresolved: as many as sequences)."""
        return self.global_batch // (1 if self.micro_batch == AUTO else self.micro_batch)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's ``train`` section: the planning fields, ``zero*`` and ``vocab_parallel``
        only when not default."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.PLAN_FIELDS[:5]}
        defaults = {f.name: f.default for f in fields(self)}
        for k in self.PLAN_FIELDS[5:]:
            if getattr(self, k) != defaults[k]:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, prefix: str = "train") -> "TrainSettings":
        """A plan JSON's (or the command line's) ``train`` section; absent or null keys take the
        defaults. Values are read as :mod:`hexicore.core.schema` reads files (``'2e3'`` is 2000)."""
        from hexicore.core import schema

        d = schema.as_mapping(data, source, prefix)
        kw: dict[str, Any] = {}
        for k in ("global_batch", "micro_batch", "seq_len", "steps"):
            v = d.get(k)
            if k == "micro_batch" and isinstance(v, str):  # the command line's text (a number or auto)
                v = v.strip()
                if v != AUTO:
                    try:
                        v = float(v)
                    except ValueError:
                        raise HexicoreError(f"expected a whole number or auto, got {shown(v)}", source=source,
                                            field=f"{prefix}.{k}") from None
            if v is not None:
                kw[k] = AUTO if k == "micro_batch" and v == AUTO else schema.integer(v, source, f"{prefix}.{k}")
        for k in ("dtype", "zero_split", "zero_scope"):
            if d.get(k) is not None:
                kw[k] = schema.string(d[k], source, f"{prefix}.{k}")
        for k in ("recompute", "vocab_parallel", "dp_overlap"):
            if d.get(k) is not None:
                if not isinstance(d[k], bool):
                    raise HexicoreError("expected true or false", source=source, field=f"{prefix}.{k}")
                kw[k] = d[k]
        if d.get("zero") is not None:
            z = d["zero"]
            if isinstance(z, str) and z.strip().isdigit():
                z = int(z)
            if isinstance(z, bool) or z not in ZERO_STAGES:
                raise HexicoreError(f"expected 0, 1, 2, 3 or auto, got {shown(z)}", source=source, field=f"{prefix}.zero")
            kw["zero"] = z
        try:
            return cls(**kw)
        except HexicoreError as exc:
            raise HexicoreError(exc.message, source=source, field=exc.field) from None


@dataclass(frozen=True)
class CheckpointSettings:
    """Where a run starts from and what it saves: a checkpoint every ``every`` steps and after
    the last (``train.checkpoint_every``; 0: none), ``resume`` from a checkpoint folder
    (``step_N/``) or a directory holding them, ``init_from`` a Hugging Face checkpoint directory
    (not with ``resume``), and ``final/`` as one safetensors file up to ``shard_mb`` MiB, else
    one shard per stage (``runtime.shard_mb``)."""

    every: int = rule(0, whole(minimum=0), key="train.checkpoint_every")
    resume: str | None = rule(None, text(), key="resume")
    init_from: str | None = rule(None, text(), key="init_from")
    shard_mb: float = rule(5120.0, real(above=0), key="runtime.shard_mb")

    def __post_init__(self) -> None:
        check_fields(self, "checkpoint")

    @property
    def shard_bytes(self) -> int:
        return int(self.shard_mb * 2**20)

    def start_line(self, seed: int) -> str:
        """What a run starts from: the checkpoint it resumes, the Hugging Face weights it loads,
        or a fresh initialisation from ``seed``."""
        if self.resume:
            return f"resuming from {self.resume}"
        if self.init_from:
            return f"starting from the weights in {self.init_from}"
        return f"starting from a fresh initialisation (seed {seed})"


def _betas(value: Any, name: str) -> None:
    """AdamW's two moment decays: a pair of numbers in ``[0, 1)``."""
    ok = isinstance(value, tuple) and len(value) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in value)
    if not ok:
        raise HexicoreError(f"expected two numbers in [0, 1), e.g. [0.9, 0.95], got {value!r}"[:200], field=name)


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW as Llama trains (Touvron et al. 2023, §2.2): betas (0.9, 0.95), ``eps`` 1e-5,
    weight decay 0.1; the learning rate ``lr`` after a linear warmup of ``warmup_steps`` steps
    (step k < warmup runs at lr (k + 1) / warmup) stays (``constant``) or decays to ``min_lr``
    over the remaining steps (``linear``, ``cosine``); ``clip_grad`` clips the global gradient
    L2 norm (None: no clipping). The config keys are ``runtime.<field>``."""

    lr: float = rule(3e-4, real(above=0), key="runtime.lr")
    betas: tuple[float, float] = rule((0.9, 0.95), lambda value, name: _betas(value, name), key="runtime.betas")
    eps: float = rule(1e-5, real(above=0), key="runtime.eps")
    weight_decay: float = rule(0.1, real(minimum=0), key="runtime.weight_decay")
    lr_schedule: str = rule("constant", one_of(LR_SCHEDULES, "lr schedule"), key="runtime.lr_schedule")
    warmup_steps: int = rule(0, whole(minimum=0), key="runtime.warmup_steps")
    min_lr: float = rule(0.0, real(minimum=0), key="runtime.min_lr")
    clip_grad: float | None = rule(None, real(above=0, optional=True), key="runtime.clip_grad")

    def __post_init__(self) -> None:
        check_fields(self, "runtime")
        if self.min_lr > self.lr:
            raise HexicoreError(f"min_lr {self.min_lr:g} is above lr {self.lr:g}: the schedule decays from lr to min_lr",
                                field="runtime.min_lr")

    #: what a checkpoint records of these settings, to refuse resuming under other ones
    RECORDED = ("lr", "min_lr", "lr_schedule", "warmup_steps", "clip_grad", "eps", "weight_decay", "betas")

    def recorded(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v := getattr(self, k), tuple) else v for k in self.RECORDED}  # as JSON keeps it


@dataclass(frozen=True)
class DataSettings:
    """What the model reads: ``synthetic`` (a seeded token stream), ``text`` (byte-level, from
    ``file`` or the shipped demo text) or ``tokens`` (``file`` written by ``hexicore prepare-data``).

    A ``file`` given beside ``synthetic`` (the default), which reads none, is what the run trains
    on: a token file ``hexicore prepare-data`` wrote (its ``X.bin.json`` beside it) makes the kind
    ``tokens`` (:attr:`implied`); any other file is refused, naming ``runtime.data=text``."""

    kind: str = rule("synthetic", one_of(DATA_KINDS, "data"), key="runtime.data")
    file: str | None = rule(None, text(), key="runtime.data_file")
    #: whether ``kind`` was implied by ``file`` (a token file given beside the default ``synthetic``)
    implied: bool = field(default=False, init=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(self, "runtime")
        if self.kind == "synthetic" and self.file:
            from hexicore.core.token_file import sidecar_path

            if not sidecar_path(self.file).is_file():
                raise HexicoreError(f"synthetic data reads no file, and {self.file} is not a token file "
                                    f"(no {sidecar_path(self.file).name} beside it, as hexicore prepare-data "
                                    "writes); give runtime.data=text to train on it as byte-level text",
                                    field="runtime.data")
            object.__setattr__(self, "kind", "tokens")
            object.__setattr__(self, "implied", True)


@dataclass(frozen=True)
class OutputSettings:
    """Where a run's results go (``out=``: metrics.json, final/, checkpoints/) and whether it may
    replace files there that are not its own (``overwrite=``; None: not said)."""

    out: str | None = rule(None, text(), key="out")
    overwrite: bool | None = None

    def __post_init__(self) -> None:
        check_fields(self, "")

