"""Typed schema of hexicore's primary config (``conf/config.yaml``): Hydra structured configs.

The top-level keys and the ``train``, ``pipeline``, ``timing`` and ``prepare`` sections are
dataclasses, stored in Hydra's ConfigStore as ``hexicore_schema`` and listed first in the
primary config's defaults. Hydra itself then refuses a wrong type (``seed=abc``,
``train.steps=abc``) or an unknown key (``train.global_bach=8``, even with ``+``) when the
config is composed — before any work — and the CLI prints that as one line with exit status 2.
Ranges (positive batch, efficiency <= 1, ...) are checked where the values are used, with the
field named. Config groups (cluster, model, solver, schedule, cost, runtime) are typed by their
own plugins' configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from hexicore.core.profile_request import ProfileRequest
from hexicore.core.settings import (DTYPE_BYTES, ZERO_SCOPES, ZERO_SPLITS, ZERO_STAGES, CheckpointSettings,
                                    TrainSettings)


#: ``train`` keys whose schema default is null: "the plan's, else the model's or the class default"
#: (:func:`hexicore.app.compose.train_settings`)
INHERITED = ("seq_len", "dtype", "recompute", "vocab_parallel", "dp_overlap")


def config_section(section: str, *settings: type, inherited: tuple[str, ...] = ()) -> type:
    """The Hydra structured-config class of config section ``section``, composed from the
    settings classes (:mod:`hexicore.core.settings`) whose fields live there: each field whose
    config key is ``<section>.<name>`` (a field's ``key`` metadata, else its class's section
    name) with the class's default; ``inherited`` fields are optional with a null default. A
    ``int | str`` field (``train.zero``: 0-3 or ``auto``) is typed ``str``, as text on the
    command line."""
    from dataclasses import MISSING as NO_DEFAULT, fields, make_dataclass

    columns = []
    for cls in settings:
        for f in fields(cls):
            key = f.metadata.get("key") or f"{section}.{f.name}"
            prefix, _, name = key.rpartition(".")
            if prefix != section or f.default is NO_DEFAULT:
                continue
            kind = str if ("str" in str(f.type) and "int" in str(f.type)) else type(f.default)
            default = str(f.default) if kind is str and f.default is not None else f.default
            if name in inherited:
                columns.append((name, Optional[kind], field(default=None)))
            elif isinstance(default, tuple):  # a list on the command line: profile.tp=[1,2]
                columns.append((name, List[type(default[0])], field(default_factory=lambda items=default: list(items))))
            else:
                columns.append((name, kind, field(default=default)))
    return make_dataclass(f"{section.title()}Section", columns)


TrainSection = config_section("train", TrainSettings, CheckpointSettings, inherited=INHERITED)


@dataclass
class PipelineSection:
    ranks: int = 4
    micro_batches: int = 8


@dataclass
class TimingSection:
    forward: float = 1.0
    backward: float = 2.0
    comm: float = 0.0


@dataclass
class SimulateSection:
    files: Any = "auto"


@dataclass
class PrepareSection:
    text_key: str = "text"
    eos: Optional[Any] = None
    batch_docs: int = 1024


#: ``profile.*``: the fields of :class:`~hexicore.core.profile_request.ProfileRequest` (the
#: sequence length is null: ``train.seq_len``, else the model's)
ProfileSection = config_section("profile", ProfileRequest, inherited=("seq_len",))


@dataclass
class HexicoreConfig:
    """The primary config; groups are filled by the defaults list."""

    cluster: Any = MISSING
    model: Any = MISSING
    solver: Any = MISSING
    schedule: Any = MISSING
    cost: Any = MISSING
    runtime: Any = MISSING
    cluster_file: Optional[str] = None
    model_file: Optional[str] = None
    plan_file: Optional[str] = None
    out: Optional[str] = None
    overwrite: Optional[bool] = None
    exclude: List[str] = field(default_factory=list)
    warm_start: Optional[str] = None
    seed: int = 0
    parallel: str = "pipeline"
    resume: Optional[str] = None
    init_from: Optional[str] = None
    input: Optional[Any] = None
    tokenizer: Optional[str] = None
    objective: str = "throughput"
    budget_per_hour: Optional[float] = None
    min_tokens_per_s: Optional[float] = None
    prepare: PrepareSection = field(default_factory=PrepareSection)
    train: TrainSection = field(default_factory=TrainSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    timing: TimingSection = field(default_factory=TimingSection)
    simulate: SimulateSection = field(default_factory=SimulateSection)
    profile: ProfileSection = field(default_factory=ProfileSection)


def store_schema() -> None:
    """Register :class:`HexicoreConfig` as ``hexicore_schema`` and the ``hexicore_pid`` resolver
    that makes run directories unique (idempotent)."""
    import os

    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hexicore_pid"):
        OmegaConf.register_new_resolver("hexicore_pid", lambda: str(os.getpid()), use_cache=True)
    ConfigStore.instance().store(name="hexicore_schema", node=HexicoreConfig, provider="hexicore")


#: the config groups (``cluster=NAME``); every config holds each of them
GROUPS = ("cluster", "model", "solver", "schedule", "cost", "runtime")
#: allowed values of the string keys the schema types as ``str``
CHOICES = {"parallel": ("pipeline", "none"), "train.dtype": tuple(DTYPE_BYTES),
           "train.zero": tuple(str(stage) for stage in ZERO_STAGES),
           "train.zero_split": ZERO_SPLITS, "train.zero_scope": ZERO_SCOPES,
           "profile.statistic": ("median", "min")}
_SECTIONS = {"": HexicoreConfig, "train": TrainSection, "pipeline": PipelineSection, "timing": TimingSection,
             "prepare": PrepareSection, "profile": ProfileSection}


def check_config(cfg: Any, keys: Any = ()) -> None:
    """Refuse keys the schema does not declare (``+train.global_bach=8`` bypasses Hydra's struct
    check), string values outside their choices and overrides of ``keys`` (the keys the command
    line overrides) that a file makes void (:func:`check_sources`); one-line :class:`HexicoreError`."""
    from dataclasses import fields as dc_fields

    from omegaconf import OmegaConf

    from hexicore.core.errors import HexicoreError

    for group in GROUPS:  # ``~solver`` would leave the command to a default of its own
        if group not in cfg or OmegaConf.is_missing(cfg, group):
            raise HexicoreError(f"the {group} config group cannot be removed (~{group}); choose one: {group}=NAME",
                                source="command line", field=group)
    for section, schema_cls in _SECTIONS.items():
        node = cfg.get(section) if section else cfg
        if node is None:
            raise HexicoreError(f"the {section} section cannot be removed (~{section}); override its keys",
                                source="command line", field=section)
        known = {f.name for f in dc_fields(schema_cls)} | ({"hydra"} if not section else set())
        for key in node.keys():
            if key not in known:
                where = f"{section}.{key}" if section else str(key)
                raise HexicoreError(f"unknown key; {section or 'top-level'} keys are: {', '.join(sorted(known - {'hydra'}))}",
                                    source="command line", field=where)
    for key, allowed in CHOICES.items():
        node, _, leaf = key.rpartition(".")
        value = (cfg.get(node) if node else cfg).get(leaf)
        if value is not None and str(value) not in allowed:
            raise HexicoreError(f"must be one of {', '.join(allowed)}, got {value!r}", source="command line", field=key)
    check_sources(keys)


#: a file that gives a whole config group: the group's choice and fields have no effect beside it
FILE_GROUPS = {"model_file": "model", "cluster_file": "cluster"}


def check_sources(keys: Any) -> None:
    """Refuse overrides the command would silently ignore: ``model=NAME`` or ``model.x=V`` beside
    ``model_file=PATH`` (the file gives the whole model; likewise ``cluster``/``cluster_file``).
    ``keys`` are the overridden keys as Hydra parses them (``model``, ``model.layers``, ...)."""
    from hexicore.core.errors import HexicoreError

    keys = list(keys)
    for file_key, group in FILE_GROUPS.items():
        if file_key not in keys:
            continue
        for key in keys:
            if key == group or key.startswith(group + "."):
                raise HexicoreError(f"has no effect beside {file_key}= (the file gives the whole {group}): edit the "
                                    f"file, or drop {file_key}= to use the {group} group", source="command line",
                                    field=key)
