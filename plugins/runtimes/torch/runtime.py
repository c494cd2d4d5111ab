"""The ``torch`` runtime: from a :class:`~hexicore.core.run_spec.RunSpec` to a launched, checked run.

The app layer hands over the run (layout, schedules, train settings, this runtime's config
section; a plan already checked by the cost model) and the registry. Everything this runtime can
find wrong with it — an unknown schedule, TP not dividing the heads, more stages than layers, a
missing checkpoint, a model too big for this machine — is found here, in the launching process,
before any worker starts (one line, exit 2). Then the workers are launched (:mod:`.launch.launcher`) with a
:class:`~.train.trainer.WorkerSpec` that holds the built action lists, so no worker needs a registry.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError
from hexicore.core.fields import check_fields, field_of
from hexicore.core.prediction import predictions
from hexicore.core.run_spec import PipelineLayout, PlanLayout, ReferenceLayout, RunSpec
from hexicore.core.settings import CheckpointSettings, DataSettings, OptimizerSettings

from .launch.settings import LaunchSettings, check_links, uses_nccl
from .parallel.assignment import RankAssignment, plan_layout, reference_layout, single_pipeline_layout, zero3_runs
from .train.lr_schedule import check_steps
from .train.metric_log import check_log


# ------------------------------------------------------------ the testing aid runtime.fault
# a rank that dies, hangs or stops at a given step, to check that every other rank ends the run
# within timeout_s (docs/runtime.md); the trainer injects it
FAULT_KINDS = ("die", "hang", "stop")


def parse_fault(raw: Any) -> dict[str, Any] | None:
    """The testing aid ``runtime.fault``: ``{rank: R, step: K, kind: die|hang|stop}`` (``step``
    counts from 0, absent = 0; null or ``{}``: no fault). Its rank and step are checked against
    the run in :func:`check_fault`."""
    if raw is None:
        return None
    f = schema.as_mapping(raw, None, "runtime.fault")
    if not f:
        return None
    schema.known_keys(f, ("rank", "step", "kind"), None, "runtime.fault")
    rank = schema.integer(schema.get(f, "rank", None, "runtime.fault"), None, "runtime.fault.rank", minimum=0)
    step = schema.integer(f.get("step", 0), None, "runtime.fault.step", minimum=0)
    kind = schema.get(f, "kind", None, "runtime.fault")
    if kind not in FAULT_KINDS:
        raise HexicoreError(f"unknown fault kind {kind!r}; choose one of: {', '.join(FAULT_KINDS)}",
                            field="runtime.fault.kind")
    return {"rank": rank, "step": step, "kind": kind}


def check_fault(fault: Mapping[str, Any] | None, world: int, steps: int, start: int = 0) -> None:
    """A fault must hit a rank of the run (``0 .. world-1``) at one of the steps it trains
    (``start .. steps-1``; ``start``: the step a resumed run begins at)."""
    if fault is None:
        return
    if fault["rank"] >= world:
        raise HexicoreError(f"no rank {fault['rank']} in this run: its ranks are 0 to {world - 1}",
                            field="runtime.fault.rank")
    if not start <= fault["step"] < steps:
        raise HexicoreError(f"step {fault['step']} is never reached: this run trains steps {start} to {steps - 1}"
                            + (f" (resumed at step {start})" if start else f" (train.steps={steps})"),
                            field="runtime.fault.step")


#: how ``runtime.<key>`` is read from the config before its settings class checks it, as the
#: config files are read (:mod:`hexicore.core.schema`: ``'1e-4'`` is a number, 120 is 120.0)
READERS = {
    "timeout_s": lambda v: schema.number(v, None, "runtime.timeout_s"),
    "lr": lambda v: schema.number(v, None, "runtime.lr"),
    "eps": lambda v: schema.number(v, None, "runtime.eps"),
    "weight_decay": lambda v: schema.number(v, None, "runtime.weight_decay", allow_zero=True),
    "shard_mb": lambda v: schema.number(v, None, "runtime.shard_mb"),
    "warmup_steps": lambda v: schema.integer(v, None, "runtime.warmup_steps", minimum=0),
    "min_lr": lambda v: schema.number(v, None, "runtime.min_lr", allow_zero=True),
    "clip_grad": lambda v: None if v is None else schema.number(v, None, "runtime.clip_grad"),
    "betas": lambda v: tuple(schema.number(b, None, "runtime.betas", allow_zero=True) for b in v)
    if isinstance(v, (list, tuple)) else v,
    "data_file": lambda v: None if v is None else str(v),
    "fault": parse_fault,
}


#: the settings classes a :class:`TorchSettings` holds, by its field name
PARTS = {"launch": LaunchSettings, "data": DataSettings, "optimizer": OptimizerSettings}


@dataclass(frozen=True)
class TorchSettings:
    """The ``runtime`` config section of ``runtime=torch`` (conf/runtime/torch.yaml), typed: the
    optimizer (:class:`~hexicore.core.settings.OptimizerSettings`: ``runtime.lr``, ``eps``,
    ``weight_decay``, ``lr_schedule``, ``warmup_steps``, ``min_lr``, ``clip_grad``), the data
    (:class:`~hexicore.core.settings.DataSettings`: ``runtime.data``, ``data_file``), the launch
    (:class:`~.launch.settings.LaunchSettings`: ``runtime.backend``, ``timeout_s``, ``progress``,
    ``start_method``, ``fault``) and the checkpoint's ``runtime.shard_mb``
    (:class:`~hexicore.core.settings.CheckpointSettings`). Each key's default and check are its
    class's (:func:`section_keys`)."""

    optimizer: OptimizerSettings = OptimizerSettings()
    data: DataSettings = DataSettings()
    launch: LaunchSettings = LaunchSettings()
    shard_mb: float = field_of(CheckpointSettings, "shard_mb")

    def __post_init__(self) -> None:
        check_fields(self, "runtime")

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> "TorchSettings":
        """Check the section: unknown keys and bad values are one line naming ``runtime.KEY``.
        Each value is read (:data:`READERS`), then checked by its settings class."""
        keys = section_keys()
        unknown = sorted(set(params) - set(keys))
        if unknown:
            raise HexicoreError(f"unknown runtime key {unknown[0]!r}; choose from: {', '.join(sorted(keys))}",
                                field=f"runtime.{unknown[0]}")
        parts: dict[str | None, dict[str, Any]] = {part: {} for part in PARTS}
        parts[None] = {}
        for key, value in params.items():
            part, name = keys[key]
            parts[part][name] = READERS[key](value) if key in READERS else value
        return cls(**{part: PARTS[part](**given) for part, given in parts.items() if part is not None}, **parts[None])


def section_keys() -> dict[str, tuple[str | None, str]]:
    """Every key of the ``runtime`` section -> (the :data:`PARTS` field that holds it, or None for
    :class:`TorchSettings`'s own; its field there): the fields whose config key is
    ``runtime.<key>``."""
    found: dict[str, tuple[str | None, str]] = {}
    for part, owner in [*PARTS.items(), (None, TorchSettings)]:
        for f in fields(owner):
            key = f.metadata.get("key") or ""
            if key.startswith("runtime."):
                found[key.removeprefix("runtime.")] = (part, f.name)
    return found


class TorchRuntime:
    """Executes action lists on torch.distributed (gloo on CPU, NCCL on CUDA). Stateless: the
    run, settings included, is the :class:`RunSpec`; the registry builds the schedules."""

    def layout(self, spec: RunSpec, *, registry: Any) -> RankAssignment:
        """The runtime's :class:`~.parallel.assignment.RankAssignment` of ``spec`` (ranks, chunks, action lists from
        ``registry``); raises ``PlanError`` for what it cannot run. Pure Python, no torch."""
        t, where = spec.train, spec.layout
        if isinstance(where, ReferenceLayout):
            return reference_layout(spec.model, global_batch=t.global_batch, micro_batch=t.micro_batch,
                                    seq_len=t.seq_len)
        if isinstance(where, PipelineLayout):
            return single_pipeline_layout(spec.model, spec.schedules[0], where.ranks, registry=registry,
                                          global_batch=t.global_batch, micro_batch=t.micro_batch, seq_len=t.seq_len,
                                          tp=where.tp, vocab_parallel=t.vocab_parallel)
        if isinstance(where, PlanLayout):
            check_zero(where.plan.train, where.plan.pipelines, t, where.source)
            layout = plan_layout(where.plan, spec.schedules, registry=registry, seq_len=t.seq_len, source=where.source)
            check_zero_layout(where.plan.train, layout, where.source)
            return layout
        raise HexicoreError(f"runtime 'torch' cannot run a {type(where).__name__}", field="parallel")

    def check_plan(self, spec: RunSpec, *, registry: Any) -> RankAssignment:
        """What ``hexicore evaluate`` asks: would this runtime refuse the run's layout (TP divides
        heads, kv heads and FFN; every schedule chunk gets a layer; ...)? No torch needed, so
        ``evaluate`` and ``train`` agree on what a plan means on any machine."""
        return self.layout(spec, registry=registry)

    def prepare(self, spec: RunSpec, *, registry: Any):
        """The :class:`~.train.trainer.WorkerSpec` of ``spec``, fully checked; nothing launched."""
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise HexicoreError("runtime 'torch' needs PyTorch, which is not installed: pip install "
                                "'hexicore[torch]' (the CPU build: pip install torch==2.13.0)", field="runtime")
        from .train.trainer import WorkerSpec

        settings = TorchSettings.parse(spec.runtime.params)
        layout = self.layout(spec, registry=registry)
        t = spec.train
        resume = spec.checkpoint.resume
        if resume:
            from .checkpoint import native as checkpoint

            resume = str(checkpoint.resolve(resume))
        check_memory(layout)
        if uses_nccl(settings.launch.backend):
            from .parallel.assignment import check_fifo

            for p in layout.pipelines:
                check_fifo(p.actions, spec.layout.source if isinstance(spec.layout, PlanLayout) else None)
        check_steps(settings.optimizer.warmup_steps, t.steps)
        data_id = check_data(settings.data, layout)
        check_log(settings.launch.log)
        if settings.data.implied:
            print(f"note: training on the token file {settings.data.file} (runtime.data=tokens, implied by "
                  "runtime.data_file)", file=sys.stderr)
        init_from = None
        if spec.checkpoint.init_from and not resume:
            init_from = check_init_from(spec.checkpoint.init_from, layout)
        check_fault(settings.launch.fault, layout.world, t.steps,
                    _check_resume(resume, layout, t.seed, data_id, t.steps, settings.optimizer) if resume else 0)
        # on resume init_from gives no weights, but still its ids, generation config and tokenizer
        extras = final_extras(spec, settings.data, layout, init_from or spec.checkpoint.init_from)  # last check: warnings follow no error
        plan = spec.layout.source if isinstance(spec.layout, PlanLayout) else None
        zero = spec.layout.plan.train.zero_stage if isinstance(spec.layout, PlanLayout) else 0
        emulation, links, predicted = (), None, None
        if isinstance(spec.layout, PlanLayout):  # ranks are the plan's devices in order
            pl = spec.layout.plan
            emulation = tuple(pl.cluster.emulation(d) for d in pl.devices)
            links = check_links(pl.cluster.emulated_links(pl.devices), settings.launch.backend)
            predicted = predictions(spec.estimate, pl.devices) if spec.estimate is not None else None
        checkpoint_settings = replace(spec.checkpoint, resume=resume, init_from=init_from, shard_mb=settings.shard_mb)
        return WorkerSpec(layout=layout, train=t, optimizer=settings.optimizer, data=settings.data,
                          checkpoint=checkpoint_settings, output=spec.output, launch=settings.launch,
                          data_id=data_id, data_checked=True, final_extras=extras, plan=plan, zero=zero,
                          shard_weights=shard_weights(spec), machines=machines(spec),
                          emulation=emulation if any(e.active for e in emulation) else (), links=links,
                          predicted=predicted)

    def profile(self, request: Any) -> Any:
        """Measure a :class:`~hexicore.core.profile_request.ProfileRequest` on the cluster's own
        devices (:mod:`.profile.profiler`); the :class:`~hexicore.core.profile.Profile` on rank 0, None
        on the other ranks under torchrun."""
        return profile_cluster(request)

    def run(self, spec: RunSpec, *, registry: Any) -> dict[str, Any] | None:
        """Check ``spec``, launch its workers (``layout.world`` processes; under torchrun, this
        process is one of them) and return the metrics (``metrics.json``) on the process that
        reports them (rank 0), None elsewhere. A worker that fails: :class:`~.launch.launcher.LaunchError`."""
        from .launch.launcher import launch

        job = self.prepare(spec, registry=registry)
        if os.environ.get("RANK", "0") == "0":  # every check passed: say what the run starts from
            print(spec.checkpoint.start_line(spec.train.seed), flush=True)
        results = launch([job], job.layout.world)
        return results[0]["metrics"] if results and results[0] else None


def profile_cluster(request: Any) -> Any:
    """:meth:`TorchRuntime.profile`: one worker per device of ``request.cluster``."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise HexicoreError("runtime 'torch' needs PyTorch, which is not installed: pip install 'hexicore[torch]'",
                            field="runtime")
    from .launch.launcher import launch
    from .profile.profiler import job_from_request, to_profile

    settings = TorchSettings.parse(request.runtime)
    if request.dtype not in ("fp32", "bf16", "fp16"):
        raise HexicoreError(f"unknown dtype {request.dtype!r}; choose one of: fp32, bf16, fp16", field="train.dtype")
    job = job_from_request(request, settings.launch)
    results = launch([job], job.world)
    return to_profile(job, results[0]) if results and results[0] else None


def check_data(data: DataSettings, layout: RankAssignment) -> dict[str, Any]:
    """Open the data source once here (a bad file, or ids >= the model's vocabulary in a token
    file, is one line before launch); returns what identifies it in checkpoints: kind, file
    name, size and a digest of sampled contents (:func:`hexicore.core.token_file.fingerprint`)."""
    from pathlib import Path

    from hexicore.core.token_file import fingerprint

    from .train.data_source import demo_text_path, make_source

    if data.kind == "synthetic":
        return {"kind": "synthetic"}
    src = make_source(data.kind, vocab=layout.model.vocab, seq_len=layout.seq_len, global_batch=1, seed=0,
                      path=data.file)
    path = src.file.path if data.kind == "tokens" else (data.file or demo_text_path())
    size = src.file.tokens if data.kind == "tokens" else len(src.data)
    return {"kind": data.kind, "file": Path(path).name, "size": int(size), "digest": fingerprint(path)}


def final_extras(spec: RunSpec, data: DataSettings, layout: RankAssignment, init_from: str | None) -> Any:
    """What ``out/final/`` gets beside weights and config (:mod:`hexicore.core.hf_export`): from
    ``model_file``, then ``init_from`` (also when resuming: its weights are not read then, its
    config and tokenizer files are), and the token file's tokenizer; checked before launch (a
    missing ``init_from`` directory, a bad ``generation_config.json``, a file in ``final/`` the run
    did not write), warnings printed here."""
    from pathlib import Path

    from hexicore.core import hf_export
    from hexicore.core.ownership import check_final_extras
    from hexicore.core.token_file import TokenFile

    if init_from and not Path(init_from).is_dir():
        raise HexicoreError("no such directory", source=str(init_from), field="init_from")
    sources = [(label, p) for label, p in (("model_file", spec.model_source), ("init_from", init_from)) if p]
    found, notes = None, []
    if data.kind == "tokens" and data.file:
        found, notes = hf_export.data_tokenizer(TokenFile.open(data.file))
    extras, more = hf_export.resolve(sources, found, layout.model.vocab)
    data_json = dict(extras.tokenizer.files).get("tokenizer.json") if extras.tokenizer else None
    if found is not None and extras.tokenizer.digest == found.digest and data_json:  # final/ gets the data's tokenizer
        from hexicore.core.hf_config import hf_config_dict

        extras, differs = hf_export.keep_data_pipeline(extras, hf_config_dict(layout.model, extras.tokens), data_json)
        more = [*more, *([differs] if differs else [])]
    if spec.output.out:
        check_final_extras(Path(spec.output.out) / "final", extras.names(), overwrite=spec.output.overwrite)
    for line in notes + more:
        print(line, file=sys.stderr)
    return extras


def check_init_from(folder: str, layout: RankAssignment) -> str:
    """A Hugging Face checkpoint directory whose tensors (names and shapes, from the safetensors
    headers only) are exactly the model's, and whose ``config.json``, if any, describes the same
    network; else one line naming the first bad tensor or the differing fields."""
    from pathlib import Path

    from .parallel.data.sync import full_shapes
    from .checkpoint.hugging_face import check_config, check_shapes

    check_shapes(full_shapes(layout.model), folder, tied=layout.model.tied_embeddings)
    check_config(folder, layout.model)
    return str(Path(folder).resolve())


def _check_resume(resume: str, layout: RankAssignment, seed: int, data_id: dict[str, Any], steps: int,
                  optimizer: OptimizerSettings) -> int:
    """The checkpoint's ``meta.json`` is well formed, matches this run (seed, model, data, batch,
    sequence length, optimizer settings; steps left to train) and its tensors are the model's
    (headers only); the step the resumed run starts at."""

    from .checkpoint import native as checkpoint
    from .parallel.data.sync import full_shapes

    ck = checkpoint.load(resume)
    note = checkpoint.check_resume(ck, model=layout.model.to_dict(), seed=seed, data=data_id,
                                   plan=checkpoint.plan_fingerprint(layout), steps=steps,
                                   optim=optimizer.recorded(),
                                   batch={"global_batch": layout.global_batch, "seq_len": layout.seq_len})
    checkpoint.check_tensors(ck, full_shapes(layout.model), tied=layout.model.tied_embeddings)
    if note:
        print(note, file=sys.stderr)
    return int(ck["step"])


def shard_weights(spec: RunSpec) -> tuple[float, ...] | None:
    """Per global rank, its share weight under uneven ZeRO shards (``zero_split=memory``: the
    device's memory, as :meth:`hexicore.cost.analytic.AnalyticCostModel.shard_weights`); None
    for even shards or a run without a plan."""
    if not isinstance(spec.layout, PlanLayout):
        return None
    plan = spec.layout.plan
    if plan.train.zero_stage == 0 or plan.train.zero_split != "memory":
        return None
    return tuple(float(plan.cluster.device(d).memory_gb) for d in plan.devices)


def machines(spec: RunSpec) -> tuple[str, ...] | None:
    """Per global rank, the machine of its device under hybrid sharding (``zero_scope=machine``,
    :mod:`.parallel.data.hybrid`); None otherwise."""
    if not isinstance(spec.layout, PlanLayout):
        return None
    plan = spec.layout.plan
    if plan.train.zero_stage == 0 or plan.train.zero_scope != "machine":
        return None
    return tuple(plan.cluster.device(d).machine for d in plan.devices)


def _mirrored_plan(pipelines: Any) -> bool:
    """Whether a plan's pipelines mirror each other: the same batch, schedule, and per stage the
    same TP degree and layers (what ZeRO-3 over multi-stage pipelines needs, :func:`.zero.zero3_runs`)."""
    shape = [(p.batch, p.schedule, tuple((s.tp, tuple(s.layers)) for s in p.stages)) for p in pipelines]
    return all(x == shape[0] for x in shape)


def check_zero(train: Any, pipelines: Any, settings: Any, source: str | None) -> None:
    """What of ``train.zero`` this runtime executes: ZeRO-1/2 for every plan shape, even or
    uneven shards (ZeRO-1 at the step, :class:`~.parallel.data.zero_state.ShardedAdamW`; ZeRO-2 per
    micro-batch, :class:`~.parallel.data.zero_state.ShardedState`), ZeRO-3 where every pipeline is one stage or the
    pipelines mirror each other (``pipelines``: the plan's pipelines, or their count), each also
    hybrid (``zero_scope=machine``, :mod:`.parallel.data.hybrid`); checkpoints of any stage
    (:mod:`.checkpoint.sharded`). Not yet ZeRO-3 for other multi-stage plans.
    Refused before launch (a plan relying on sharding would not fit unsharded); ``settings`` is
    unused (kept for callers)."""
    from hexicore.core.errors import PlanError

    z = train.zero_stage
    count = pipelines if isinstance(pipelines, int) else len(pipelines)
    if not z or count <= 1:
        return
    if z == 3 and (isinstance(pipelines, int) or
                   not (all(len(p.stages) == 1 for p in pipelines) or _mirrored_plan(pipelines))):
        raise PlanError(f"the torch runtime does not execute ZeRO-3 for pipelines of more than one stage that "
                        f"differ from each other yet (plan has train.zero={z}, zero_scope="
                        f"{getattr(train, 'zero_scope', 'all')}); plan with train.zero=0, 1 or 2, or ZeRO-3 with "
                        f"one stage per pipeline (solver=fsdp) or identical pipelines", source=source,
                        field="train.zero")


def check_zero_layout(train: Any, layout: RankAssignment, source: str | None) -> None:
    """ZeRO-3 also needs the schedules to keep the pipelines mirrored (or one stage chunk per
    pipeline) and one model copy each (:func:`.zero_units.zero3_runs`)."""
    from hexicore.core.errors import PlanError

    if train.zero_stage == 3 and len(layout.pipelines) > 1 and not zero3_runs(layout):
        raise PlanError("the torch runtime runs ZeRO-3 only on one-stage pipelines or on identical pipelines with "
                        "one model copy each; this plan's action lists differ between pipelines or keep model "
                        "copies (use schedule=1f1b or gpipe)", source=source, field="train.zero")


def check_memory(layout: RankAssignment) -> None:
    """Refuse a local run whose weights, gradients and AdamW state (16 bytes per fp32
    parameter, per model copy and pipeline) cannot fit this machine (activations not counted)."""
    from .launch.launcher import in_torchrun

    if in_torchrun():
        return
    import torch

    copies = sum(len(p.actions.chains) for p in layout.pipelines)
    need = 16 * layout.model.total_params() * copies
    if torch.cuda.is_available():
        have = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        need, where = need / max(layout.world, 1), "per GPU"
    else:
        have, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "on this machine"
    if need > 0.9 * have:
        raise HexicoreError(f"model {layout.model.name!r} needs about {need / 2**30:.1f} GiB {where} for weights, "
                            f"gradients and AdamW state, and there are {have / 2**30:.1f} GiB (try model=tiny)",
                            field="model")


