"""The stage chunks of one rank: build, initialise from the seed (or a checkpoint), name the shards.

Every layout starts from identical weights: a parameter's *full* tensor is a pure function of
the seed and its standard name (its own ``torch.Generator`` seeded from both), and each rank
slices its TP shard out of it. So ``parallel=none``, any pipeline cut and any TP degree begin
from bit-identical models, and no rank ever materialises more than one full tensor at a time.
Norm weights start at 1, biases at 0, every matrix at N(0, 0.02). A :class:`TensorSource`
abstracts where tensors come from: the seed (:class:`Seeded`), or safetensors files — a Hugging
Face checkpoint (``init_from``) or a resumable checkpoint — read slice by slice
(:class:`~..checkpoint.hugging_face.SafeTensors`), so a rank reads only its own chunks' tensors and its TP shard.
A tied head (``tied_embeddings``) is stored as the embedding (:func:`canonical`); chunks that
hold both share one Parameter, and so do chunks of one chain on the same rank
(:func:`build_stages`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

import torch

from hexicore.core.model import ModelSpec

from ..parallel.assignment import PipelinePart
from .llama import EMBED, HEAD, LlamaChunk
from ..parallel.tensor import VOCAB_ROWS, TPGroup, shard, shard_dim

INIT_STD = 0.02


def init_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full initial value of parameter ``name`` (depends only on seed and name): norms 1,
    biases 0, matrices N(0, 0.02)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * INIT_STD


class TensorSource(Protocol):
    """Where a rank's initial tensors come from: ``read(name, shape, dim, rank, size)`` returns
    TP shard ``rank`` of ``size`` along ``dim`` of the full tensor ``name`` of ``shape``."""

    def read(self, name: str, shape: tuple[int, ...], dim: int | None, rank: int, size: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class Seeded:
    """Initial weights from the seed (:func:`init_tensor`), sliced after the full tensor is made."""

    seed: int

    def read(self, name: str, shape: tuple[int, ...], dim: int | None, rank: int, size: int) -> torch.Tensor:
        return shard(init_tensor(name, shape, self.seed), dim, rank, size)


def seeded(seed: int) -> Seeded:
    return Seeded(seed)


def full_shape(name: str, local: torch.Size, tp: TPGroup, model: ModelSpec) -> tuple[int, ...]:
    """The whole model's shape of parameter ``name`` whose TP shard of ``tp`` has shape ``local``:
    the shard dimension ``x tp`` (heads, FFN columns), or the model's vocabulary for a tensor
    split by vocabulary rows (perhaps unevenly, :func:`..parallel.tensor.shard_range`)."""
    shape, dim = list(local), shard_dim(name, tp.vocab_parallel)
    if dim is not None:
        shape[dim] = model.vocab if name in VOCAB_ROWS else shape[dim] * tp.size
    return tuple(shape)


def canonical(name: str, model: ModelSpec) -> str:
    """The stored name of a parameter: a tied head is the embedding."""
    return EMBED if model.tied_embeddings and name == HEAD else name


@torch.no_grad()
def load_shards(module: LlamaChunk, source: TensorSource, tp: TPGroup) -> None:
    """Fill every parameter of ``module`` with its TP shard read from ``source``."""
    for name, p in module.named_parameters():
        t = source.read(canonical(name, module.spec), full_shape(name, p.shape, tp, module.spec),
                        shard_dim(name, tp.vocab_parallel), tp.rank, tp.size)
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"tensor {name!r}: shard of shape {tuple(t.shape)}, expected {tuple(p.shape)}")
        p.copy_(t)


@dataclass
class StageModule:
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


def build_stages(model: ModelSpec, part: PipelinePart, pipe_rank: int, tp: TPGroup, *, full: TensorSource,
                 recompute: bool, device: torch.device, compile: bool = False) -> dict[int, StageModule]:
    """The chunks ``pipe_rank`` holds in ``part``, initialised from ``full`` and moved to
    ``device``. With tied embeddings, a head and an embedding of the same chain on this rank are
    one Parameter (so only one is read and updated). ``compile``: each block runs compiled
    (``nn.Module.compile``, torch.compile's default inductor backend; compiled on its first
    forward, recomputed forwards and TP collectives included), the embedding and head as they are."""
    out = {}
    for s in part.actions.stages_of(pipe_rank):
        start, end = part.chunk_layers[s]
        first, last = part.first_of_chain(s), part.last_of_chain(s)
        module = LlamaChunk(model, start, end, first=first, last=last, tp=tp, recompute=recompute)
        load_shards(module, full, tp)
        if compile:
            for block in module.model.layers.values():
                block.compile()
        out[s] = StageModule(s, part.chain_index(s), first, last, module.to(device))
    if model.tied_embeddings:
        for chain in range(len(part.actions.chains)):
            mine = [st for st in out.values() if st.chain == chain]
            emb = next((st.module.model.embed_tokens for st in mine if st.first), None)
            for st in mine:
                if emb is not None and st.last and not st.first:
                    st.module.lm_head.weight = emb.weight
    return out


def full_model(model: ModelSpec, source: TensorSource) -> LlamaChunk:
    """The whole model in one module (the reference)."""
    m = LlamaChunk(model, 0, model.layers, first=True, last=True)
    load_shards(m, source, TPGroup())
    return m
