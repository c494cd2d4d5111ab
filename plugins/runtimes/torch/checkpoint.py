"""Consolidated checkpoints: the full model under standard names, plus AdamW state.

Every rank contributes the shards it owns (pipeline 0, chain 0 — replicas and DP copies are
identical — and replicated tensors from TP rank 0 only); rank 0 concatenates TP shards along
their shard dimension. The result is layout-free: ``final.pt`` is a plain ``state_dict`` of the
whole model (``torch.load(path, weights_only=True)``), and a checkpoint
``{"format", "step", "model", "optim", "losses", "step_s", "seed", "schedule"}`` can resume a run
under any layout, because resuming slices the full tensors exactly as initialisation does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hexicore.core.errors import HexicoreError

from .stage import Stage
from .tensor_parallel import TPGroup, shard, shard_dim, unshard

FORMAT = "hexicore.checkpoint/1"
OPTIM_KEYS = ("exp_avg", "exp_avg_sq")


def local_pieces(stages: dict[int, Stage], tp: TPGroup, optimizer: torch.optim.Optimizer | None,
                 pipeline: int) -> list[tuple[str, int | None, int, dict[str, torch.Tensor]]]:
    """``(name, shard dim, tp rank, {"param", "exp_avg", "exp_avg_sq"})`` this rank reports."""
    if pipeline != 0:
        return []
    out = []
    for st in stages.values():
        if not st.primary:
            continue
        for name, p in st.module.named_parameters():
            dim = shard_dim(name)
            if dim is None and tp.rank != 0:
                continue
            item = {"param": p.detach().cpu().clone()}
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            for k in OPTIM_KEYS:
                if k in state:
                    item[k] = state[k].detach().cpu().clone()
            if "step" in state:
                item["step"] = torch.as_tensor(state["step"]).detach().cpu().float().reshape(())
            out.append((name, dim, tp.rank, item))
    return out


def consolidate(pieces: list) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full ``state_dict`` and optimizer state from every rank's pieces."""
    by_name: dict[str, list] = {}
    for name, dim, r, item in pieces:
        by_name.setdefault(name, []).append((r, dim, item))
    model, optim = {}, {"exp_avg": {}, "exp_avg_sq": {}}
    step = None
    for name in sorted(by_name, key=_order):
        parts = sorted(by_name[name], key=lambda x: x[0])
        dim = parts[0][1]
        model[name] = unshard([it["param"] for _, _, it in parts], dim).contiguous()
        for k in OPTIM_KEYS:
            if all(k in it for _, _, it in parts):
                optim[k][name] = unshard([it[k] for _, _, it in parts], dim).contiguous()
        if "step" in parts[0][2]:
            step = float(parts[0][2]["step"])
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


def gather(stages: dict[int, Stage], tp: TPGroup, optimizer, pipeline: int, *, rank: int, world: int):
    """Collect the consolidated model and optimizer state on rank 0 (None elsewhere)."""
    mine = local_pieces(stages, tp, optimizer, pipeline)
    if world == 1:
        return consolidate(mine)
    every = [None] * world if rank == 0 else None
    dist.gather_object(mine, every, dst=0)
    return consolidate([p for ps in every for p in ps]) if rank == 0 else None


def save(path: str | Path, obj: Any) -> Path:
    """Write atomically (a crash never leaves a truncated checkpoint)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)
    return path


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or a directory whose latest ``step_*.pt`` (also under ``checkpoints/``) is used."""
    p = Path(path)
    if p.is_dir():
        found = sorted(list(p.glob("step_*.pt")) + list(p.glob("checkpoints/step_*.pt")),
                       key=lambda f: int(f.stem.split("_")[1]))
        if not found:
            raise HexicoreError("no step_*.pt checkpoint in this directory", source=str(p), field="resume")
        return found[-1]
    if not p.is_file():
        raise HexicoreError("no such checkpoint", source=str(p), field="resume")
    return p


def load(path: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint written by :func:`save` (``weights_only`` loading)."""
    p = resolve(path)
    try:
        ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear line
        raise HexicoreError(f"cannot read checkpoint: {str(exc).splitlines()[0]}", source=str(p),
                            field="resume") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise HexicoreError(f"not a {FORMAT} checkpoint", source=str(p), field="resume")
    return ck


@torch.no_grad()
def restore_optimizer(optimizer: torch.optim.Optimizer, stages: dict[int, Stage], tp: TPGroup,
                      optim: dict[str, Any]) -> None:
    """Give every local parameter its shard of the consolidated AdamW state."""
    if not optim or optim.get("step") is None:
        return
    for st in stages.values():
        for name, p in st.module.named_parameters():
            dim = shard_dim(name)
            state = {"step": torch.tensor(float(optim["step"]))}
            for k in OPTIM_KEYS:
                state[k] = shard(optim[k][name], dim, tp.rank, tp.size).to(p.device, p.dtype).clone()
            optimizer.state[p] = state
