"""Checkpoints without pickles: safetensors for tensors, JSON for everything else.

Resumable checkpoints (``out/checkpoints/step_N/``): ``model.safetensors`` (the whole model under
standard names), ``optim.safetensors`` (AdamW moments as ``exp_avg.NAME`` / ``exp_avg_sq.NAME``)
and ``meta.json`` (format ``hexicore.checkpoint/2``: step, losses, step times, seed, schedule,
AdamW step count, the model spec, the data source and a fingerprint of the plan; since the lr
schedule, also the optimizer settings, ``train_steps`` and the per-step gradient norms). Every rank
contributes the shards it owns (pipeline 0, chain 0 — replicas and DP copies are identical — and
replicated tensors from TP rank 0 only); rank 0 concatenates TP shards along their shard
dimension and writes. The result is layout-free: resuming reads, on every rank, only the TP slices
of its own chunks (:class:`~.hugging_face.SafeTensors`), exactly as initialisation slices, so a run can
resume under any plan. Loading never unpickles. With tied embeddings only the embedding is stored.

The final model (``out/final/``) is a Hugging Face directory (:func:`write_final`):
``config.json`` and ``model.safetensors``, or — above ``shard_bytes`` — one shard per stage of
pipeline 0, written by that stage's TP leader, plus ``model.safetensors.index.json`` from rank 0.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown

from . import hugging_face as hf_io
from .hugging_face import EMBED, HEAD
from ..model.stage_module import StageModule, canonical, full_shape
from ..parallel.tensor import TPGroup, shard_dim, unshard

FORMAT = "hexicore.checkpoint/2"
OPTIM_KEYS = ("exp_avg", "exp_avg_sq")
META, MODEL, OPTIM = "meta.json", "model.safetensors", "optim.safetensors"


def local_pieces(stages: dict[int, StageModule], tp: TPGroup, optimizer: torch.optim.Optimizer | None,
                 pipeline: int, sharded: dict[tuple[int, str], dict[str, torch.Tensor]] | None = None
                 ) -> list[tuple[str, int | None, int, dict[str, torch.Tensor]]]:
    """``(name, shard dim, tp rank, {"param", "exp_avg", "exp_avg_sq"})`` this rank reports;
    ``sharded[(stage, name)]`` (ZeRO: :func:`.sharded.full_local`) replaces what the
    optimizer and, under ZeRO-3, the parameter hold."""
    if pipeline != 0:
        return []
    out = []
    for s, st in stages.items():
        if not st.primary:
            continue
        for name, p in st.module.named_parameters():
            if st.module.spec.tied_embeddings and name == HEAD:
                continue  # a tied head is stored as the embedding, which its chain's first stage reports
            dim = shard_dim(name, tp.vocab_parallel)
            if dim is None and tp.rank != 0:
                continue
            got = (sharded or {}).get((s, name), {})
            item = {"param": got["param"] if "param" in got else p.detach().cpu().clone()}
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            for k in OPTIM_KEYS:
                if k in got:
                    item[k] = got[k]
                elif k in state:
                    item[k] = state[k].detach().cpu().clone()
            if "step" in got or "step" in state:
                item["step"] = torch.as_tensor(got.get("step", state.get("step"))).detach().cpu().float().reshape(())
            out.append((name, dim, tp.rank, item))
    return out


def consolidate(pieces: list) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full ``state_dict`` and optimizer state from every rank's pieces."""
    by_name: dict[str, dict[int, Any]] = {}
    for name, dim, r, item in pieces:
        by_name.setdefault(name, {})[r] = (dim, item)
    model, optim = {}, {"exp_avg": {}, "exp_avg_sq": {}}
    step = None
    for name in sorted(by_name, key=_order):
        parts = [by_name[name][r] for r in sorted(by_name[name])]
        dim = parts[0][0]
        model[name] = unshard([it["param"] for _, it in parts], dim).contiguous()
        for k in OPTIM_KEYS:
            if all(k in it for _, it in parts):
                optim[k][name] = unshard([it[k] for _, it in parts], dim).contiguous()
        if "step" in parts[0][1]:
            step = float(parts[0][1]["step"])
    optim["step"] = step
    return model, optim


def _order(name: str) -> tuple:
    """Embedding, blocks by index, norm, head — the order of the full model's state_dict."""
    parts = name.split(".")
    if parts[:2] == ["model", "embed_tokens"]:
        return (0, 0, name)
    if parts[:2] == ["model", "layers"]:
        return (1, int(parts[2]), name)
    return (2, 0 if parts[:2] == ["model", "norm"] else 1, name)


def gather(stages: dict[int, StageModule], tp: TPGroup, optimizer, pipeline: int, *, rank: int, world: int,
           sharded: dict | None = None):
    """Collect the consolidated model and optimizer state on rank 0 (None elsewhere)."""
    mine = local_pieces(stages, tp, optimizer, pipeline, sharded)
    if world == 1:
        return consolidate(mine)
    every = [None] * world if rank == 0 else None
    dist.gather_object(mine, every, dst=0)
    return consolidate([p for ps in every for p in ps]) if rank == 0 else None


# ------------------------------------------------------------------ resumable checkpoints
def plan_fingerprint(layout: Any) -> str:
    """A short hash of who runs what: pipelines' batches, stage ranks and layers, schedules."""
    doc = [[p.batch, [[list(g.ranks), g.layers] for g in p.groups], dict(p.actions.schedule)]
           for p in layout.pipelines]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save(folder: str | Path, model: dict[str, torch.Tensor], optim: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``folder/{model,optim}.safetensors`` and ``meta.json`` (last, so a folder with a
    ``meta.json`` is complete)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    hf_io.save_tensors(d / MODEL, model)
    moments = {f"{k}.{n}": t for k in OPTIM_KEYS for n, t in (optim.get(k) or {}).items()}
    hf_io.save_tensors(d / OPTIM, moments)
    doc = {"format": FORMAT, **meta, "adam_step": optim.get("step")}
    schema.write_text_atomic(d / META, json.dumps(doc, indent=2) + "\n")
    return d


def _step_of(p: Path) -> int:
    try:
        return int(p.name.split("_", 1)[1])
    except (IndexError, ValueError):
        return -1


def resolve(path: str | Path) -> Path:
    """A checkpoint folder (holding ``meta.json``), or a directory whose latest ``step_N/``
    (also under ``checkpoints/``) is used."""
    p = Path(path)
    if (p / META).is_file():
        return p
    if p.is_dir():
        found = sorted((f.parent for f in list(p.glob(f"step_*/{META}")) + list(p.glob(f"checkpoints/step_*/{META}"))),
                       key=_step_of)
        if not found:
            raise HexicoreError("no step_N/ checkpoint in this directory", source=str(p), field="resume")
        return found[-1]
    raise HexicoreError("no such checkpoint", source=str(p), field="resume")


def load(path: str | Path) -> dict[str, Any]:
    """The checked ``meta.json`` of a checkpoint, with ``"dir"`` (its folder). Tensors are read
    later, per rank, slice by slice (:func:`model_source`, :func:`restore_optimizer`)."""
    d = resolve(path)
    try:
        ck = json.loads(schema.read_bytes(d / META, "checkpoint meta", field="resume"))
    except ValueError as exc:
        raise HexicoreError(f"cannot read checkpoint: {exc}", source=str(d / META), field="resume") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise HexicoreError(f"not a {FORMAT} checkpoint", source=str(d), field="resume")
    check_meta(ck, str(d / META))
    for f in (MODEL, OPTIM):
        if not (d / f).is_file():
            raise HexicoreError(f"checkpoint has no {f}", source=str(d), field="resume")
    return {**ck, "dir": str(d)}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _numbers(v: Any) -> bool:
    """A list of finite numbers (NaN or an infinity is no loss, time or norm a run records)."""
    return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                       for x in v)


def check_meta(ck: dict[str, Any], src: str) -> None:
    """Every field of ``meta.json`` that resuming reads, checked (one line naming the field):
    ``step`` a positive int, ``losses`` and ``step_s`` one number per step done, ``seed`` an
    int, ``adam_step`` null or a non-negative whole number, ``model`` and ``data`` mappings,
    ``plan`` a string, ``global_batch``/``seq_len`` (absent in older checkpoints) positive ints."""
    def bad(field: str, what: str) -> HexicoreError:
        return HexicoreError(f"{what}, got {shown(ck.get(field))}", source=src, field=field)

    step = ck.get("step")
    if not _int(step) or step < 1:
        raise bad("step", "expected the number of steps done, a positive integer")
    for f in ("losses", "step_s"):
        if not _numbers(ck.get(f)) or len(ck[f]) != step:
            raise bad(f, f"expected a list of {step} numbers, one per step done (step is {step})")
    if any(x < 0 for x in ck["step_s"]):
        raise bad("step_s", "step times must be non-negative")
    if not _int(ck.get("seed")) or not 0 <= ck["seed"] < 2**63:
        raise bad("seed", "expected an integer seed from 0 to 2^63 - 1")
    a = ck.get("adam_step")
    if a is not None and (not isinstance(a, (int, float)) or isinstance(a, bool) or not math.isfinite(a)
                          or not float(a).is_integer() or not 0 <= a <= step):
        raise bad("adam_step", f"expected null or a whole number of optimizer steps from 0 to step ({step})")
    for f in ("model", "data"):
        if not isinstance(ck.get(f), dict):
            raise bad(f, "expected a mapping")
    if not isinstance(ck.get("plan"), str):
        raise bad("plan", "expected the plan's fingerprint, a string")
    for f in ("global_batch", "seq_len", "train_steps"):
        if f in ck and (not _int(ck[f]) or ck[f] < 1):
            raise bad(f, "expected a positive integer")
    norms = ck.get("grad_norms")
    if "grad_norms" in ck and not (isinstance(norms, list) and len(norms) == step and
                                   _numbers([x for x in norms if x is not None])):
        raise bad("grad_norms", f"expected a list of {step} numbers or nulls, one per step done")


def model_source(ck: dict[str, Any]) -> hf_io.SafeTensors:
    return hf_io.SafeTensors.directory(ck["dir"], field="resume")


def optim_source(ck: dict[str, Any]) -> hf_io.SafeTensors:
    path = Path(ck["dir"]) / OPTIM
    return hf_io.SafeTensors({n: path for n in hf_io.header_shapes(path, "resume")}, field="resume")


def check_resume(ck: dict[str, Any], *, model: dict[str, Any], seed: int, data: dict[str, Any],
                 plan: str, steps: int | None = None, batch: dict[str, int] | None = None,
                 optim: dict[str, Any] | None = None) -> str | None:
    """Refuse resuming with another seed, model, data, global batch or sequence length (one line
    naming the difference), another optimizer setting the checkpoint records (``optim``: the
    run's ``runtime.*`` values of :data:`hexicore.core.settings.OptimizerSettings.RECORDED`; older checkpoints record none)
    or, under a decaying lr schedule, another ``train.steps`` (:func:`check_optim`), or at a step
    with nothing left to train (``steps``: ``train.steps``); a different plan or schedule is
    allowed: returns the line that says so (None when the same)."""
    src = ck.get("dir")
    if ck.get("seed") != seed:
        raise HexicoreError(f"the checkpoint was trained with seed {ck.get('seed')}, this run has seed {seed}",
                            source=src, field="seed")
    have, want = _plain(ck.get("model") or {}), _plain(model)
    keys = sorted(k for k in set(have) | set(want) if k != "name" and have.get(k) != want.get(k))
    if keys:  # the name is cosmetic (a config directory's name); the architecture is not
        diff = "; ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} here" for k in keys)
        raise HexicoreError(f"the checkpoint's model differs in {', '.join(keys)} ({diff})", source=src,
                            field="model")
    if ck.get("data") != _comparable(data, ck.get("data")):
        raise HexicoreError(f"the checkpoint was trained on data {ck.get('data')}, this run uses {data}", source=src,
                            field="runtime.data")
    for k, v in (batch or {}).items():  # the data of a step depends on them: another value is another run
        if k in ck and ck[k] != v:
            raise HexicoreError(f"the checkpoint was trained with {k} {ck[k]}, this run has {v}", source=src,
                                field=f"train.{k}")
    check_optim(ck, optim or {}, steps)
    if steps is not None and ck["step"] >= steps:
        raise HexicoreError(f"the checkpoint has done {ck['step']} steps and train.steps={steps}: nothing to train "
                            f"(raise train.steps)", source=src, field="train.steps")
    if ck.get("plan") != plan:
        return (f"hexicore: resuming step {ck.get('step')} under another plan/schedule than the checkpoint's "
                f"({ck.get('schedule')}, plan {ck.get('plan')} -> {plan})")
    return None


def check_optim(ck: dict[str, Any], optim: dict[str, Any], steps: int | None) -> None:
    """Resuming continues the checkpoint's optimizer: every recorded ``runtime.*`` setting must
    be the run's, and a linear or cosine schedule decays over ``train.steps``, so another
    ``train.steps`` would change every later lr (refused; a constant schedule may be extended)."""
    from ..train.lr_schedule import decays

    src = ck.get("dir")
    differ = [k for k, v in optim.items() if k in ck and ck[k] != v]
    if differ:  # every one at once, with what to give: a resume repeats the run's runtime.* settings
        both = "; ".join(f"{k} {ck[k]!r}, this run has {optim[k]!r}" for k in differ)
        give = " ".join(f"runtime.{k}={'null' if ck[k] is None else ck[k]}" for k in differ)
        raise HexicoreError(f"the checkpoint was trained with {both} (resuming continues its optimizer and lr "
                            f"schedule: give {give})", source=src, field=f"runtime.{differ[0]}")
    done = ck.get("train_steps")
    if steps is not None and done is not None and decays(str(ck.get("lr_schedule"))) and done != steps:
        raise HexicoreError(f"the checkpoint's {ck.get('lr_schedule')} lr schedule decays over train.steps={done}, "
                            f"this run has {steps} (every later lr would change)", source=src, field="train.steps")


def _comparable(data: dict[str, Any], theirs: Any) -> dict[str, Any]:
    """This run's data identity as the checkpoint records it: a checkpoint written before data
    digests were recorded is compared without one."""
    if isinstance(theirs, dict) and "digest" not in theirs:
        return {k: v for k, v in data.items() if k != "digest"}
    return data


def check_tensors(ck: dict[str, Any], expected: dict[str, tuple[int, ...]], *, tied: bool) -> None:
    """The checkpoint's weights and (with ``adam_step``) AdamW moments are exactly the model's
    tensors: names, shapes, floating dtypes, from the headers only (before launch)."""
    d = Path(ck["dir"])
    hf_io.check_shapes(expected, d / MODEL, tied=tied, field="resume")
    if ck.get("adam_step") is not None:
        for k in OPTIM_KEYS:
            hf_io.check_shapes(expected, d / OPTIM, tied=tied, field="resume", prefix=f"{k}.")


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=list))


@torch.no_grad()
def restore_optimizer(optimizer: torch.optim.Optimizer, stages: dict[int, StageModule], tp: TPGroup,
                      ck: dict[str, Any]) -> None:
    """Give every parameter of ``optimizer`` its shard of the stored AdamW state (read slice by
    slice); ZeRO-sharded tensors are not the optimizer's (:func:`.sharded.restore`)."""
    if ck.get("adam_step") is None or optimizer is None:
        return
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    src = optim_source(ck)
    for st in stages.values():
        for name, p in st.module.named_parameters():
            if id(p) not in mine:
                continue
            name = canonical(name, st.module.spec)
            dim, full = shard_dim(name, tp.vocab_parallel), full_shape(name, p.shape, tp, st.module.spec)
            state = {"step": torch.tensor(float(ck["adam_step"]))}
            for k in OPTIM_KEYS:
                state[k] = src.with_prefix(f"{k}.").read(name, full, dim, tp.rank, tp.size).to(p.device, p.dtype)
            optimizer.state[p] = state


# ------------------------------------------------------------------ the final Hugging Face directory
def write_final(folder: str | Path, stages: dict[int, StageModule], parallel: Any, *, shard_bytes: int,
                extras: Any = None) -> None:
    """``folder`` as a Hugging Face checkpoint directory (collective: every rank calls it; ``parallel``:
    its :class:`~..parallel.layout.ParallelLayout`);
    ``extras`` (:class:`hexicore.core.hf_export.FinalExtras`): token ids, generation config and
    tokenizer files, written by rank 0 after the weights (:func:`_finish_final`)."""
    d = Path(folder)
    rank, world, layout, role = parallel.rank, parallel.world, parallel.assignment, parallel.role
    model = layout.model
    total = 4 * model.total_params()
    if total <= shard_bytes or world == 1:
        got = gather(stages, parallel.tp, None, role.pipeline if role else -1, rank=rank, world=world)
        if rank == 0:
            d.mkdir(parents=True, exist_ok=True)
            hf_io.save_tensors(d / hf_io.SINGLE, _drop_tied(got[0], model))
            hf_io.remove_stale_weights(d, keep=[hf_io.SINGLE])
            _finish_final(d, model, extras)
        return
    part0 = layout.pipelines[0]
    mine = local_pieces(stages, parallel.tp, None, role.pipeline if role else -1)
    tp = parallel.tp
    if tp.size > 1:
        pieces = [None] * tp.size if tp.rank == 0 else None
        dist.gather_object(mine, pieces, dst=parallel.tp_leader, group=tp.group)
        mine = [x for ps in pieces for x in ps] if tp.rank == 0 else []
    written = []
    if mine and tp.rank == 0:
        tensors = _drop_tied(consolidate(mine)[0], model)
        name = hf_io.shard_name(role.pipe_rank, len(part0.groups))
        d.mkdir(parents=True, exist_ok=True)
        hf_io.save_tensors(d / name, tensors)
        written = [(n, name, t.numel() * t.element_size()) for n, t in tensors.items()]
    every = [None] * world if rank == 0 else None
    dist.gather_object(written, every, dst=0)
    if rank == 0:
        rows = [x for w in every for x in w]
        hf_io.write_index(d, {n: f for n, f, _ in rows}, sum(b for _, _, b in rows))
        hf_io.remove_stale_weights(d, keep=[hf_io.INDEX, *(f for _, f, _ in rows)])
        _finish_final(d, model, extras)


def _finish_final(d: Path, model: Any, extras: Any) -> None:
    """``config.json`` (with the source's special token ids), then the generation config and
    tokenizer files (:func:`hexicore.core.hf_export.write_extras`)."""
    from hexicore.core.hf_config import write_hf_config
    from hexicore.core.hf_export import write_extras

    write_hf_config(model, d, extras.tokens if extras else None)
    write_extras(d, extras)


def _drop_tied(tensors: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    return {n: t for n, t in tensors.items() if not (model.tied_embeddings and n == HEAD)}


__all__ = ["FORMAT", "EMBED", "HEAD", "consolidate", "gather", "save", "load", "resolve", "check_resume",
           "restore_optimizer", "write_final", "plan_fingerprint", "model_source"]
