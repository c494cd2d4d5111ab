"""Stage chunks of one rank: build, initialise from the seed (or a checkpoint), name the shards.

Every layout starts from identical weights: a parameter's *full* tensor is a pure function of
the seed and its standard name (its own ``torch.Generator`` seeded from both), and each rank
slices its TP shard out of it. So ``parallel=none``, any pipeline cut and any TP degree begin
from bit-identical models, and no rank ever materialises more than one full tensor at a time.
Norm weights start at 1, every matrix at N(0, 0.02).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from hexicore.core.model import ModelSpec

from .layout import PipelinePart
from .model import LlamaChunk
from .tensor_parallel import TPGroup, shard, shard_dim

INIT_STD = 0.02

FullTensor = Callable[[str, tuple[int, ...]], torch.Tensor]


def init_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full initial value of parameter ``name`` (depends only on seed and name)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * INIT_STD


def seeded(seed: int) -> FullTensor:
    return lambda name, shape: init_tensor(name, shape, seed)


def from_state(state: Mapping[str, torch.Tensor]) -> FullTensor:
    """Full tensors from a consolidated state dict (resume); shapes are checked."""
    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"checkpoint has no parameter {name!r}")
        t = state[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"checkpoint parameter {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return t
    return get


def full_shape(name: str, local: torch.Size, tp: TPGroup) -> tuple[int, ...]:
    shape, dim = list(local), shard_dim(name)
    if dim is not None:
        shape[dim] *= tp.size
    return tuple(shape)


@torch.no_grad()
def load_shards(module: torch.nn.Module, full: FullTensor, tp: TPGroup) -> None:
    """Fill every parameter of ``module`` with its TP shard of the full tensor."""
    for name, p in module.named_parameters():
        t = full(name, full_shape(name, p.shape, tp))
        p.copy_(shard(t, shard_dim(name), tp.rank, tp.size))


@dataclass
class Stage:
    """A model chunk this rank executes: action-list stage id, chain, and its module."""

    index: int
    chain: int
    first: bool
    last: bool
    module: LlamaChunk

    @property
    def primary(self) -> bool:
        """Chain 0 holds the copy that checkpoints report (Chimera's replicas are identical)."""
        return self.chain == 0


def build_stages(model: ModelSpec, part: PipelinePart, pipe_rank: int, tp: TPGroup, *, full: FullTensor,
                 recompute: bool, device: torch.device) -> dict[int, Stage]:
    """The chunks ``pipe_rank`` holds in ``part``, initialised from ``full`` and moved to ``device``."""
    out = {}
    for s in part.actions.stages_of(pipe_rank):
        start, end = part.chunk_layers[s]
        first, last = part.first_of_chain(s), part.last_of_chain(s)
        module = LlamaChunk(model, start, end, first=first, last=last, tp=tp, recompute=recompute)
        load_shards(module, full, tp)
        out[s] = Stage(s, part.chain_index(s), first, last, module.to(device))
    return out


def full_model(model: ModelSpec, full: FullTensor) -> LlamaChunk:
    """The whole model in one module (the reference, and for loading ``final.pt``)."""
    m = LlamaChunk(model, 0, model.layers, first=True, last=True)
    load_shards(m, full, TPGroup())
    return m
