"""The precision recipe: training-state bytes per parameter, stated once, and how ZeRO shards them.

The runtime (``plugins/runtimes/torch``) keeps every parameter in fp32 (master weights) and runs
``train.dtype`` only inside ``torch.autocast`` (bf16/fp16; fp32 runs without it); gradients
accumulate in the parameters' dtype (fp32); ``torch.optim.AdamW`` keeps two moments per
parameter in the parameters' dtype. Per parameter that is

    weights 4 B + gradients 4 B + optimizer 8 B = 16 B, for every ``train.dtype``

(:func:`state_bytes`). An explicit ``cost.state_bytes_per_param = X`` overrides the total and is
split in the recipe's proportions (1/4 weights, 1/4 gradients, 1/2 optimizer).

ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20) shards the optimizer state (stage 1), also the gradients (2), also the weights
(3) among the ``n`` devices that hold the same chunk of a layer — the chunked data-parallel
groups of HexiScale §3.2, one holder per pipeline — so each keeps ``1/n`` of those parts
(:func:`sharded`).

Tensor parallelism splits a block's matrices ``/ tp`` and replicates the rest
(:func:`tp_replicated_layer_params`); the ``V x H`` embedding and head matrices are replicated
too, unless ``train.vocab_parallel`` splits them by vocabulary rows (:func:`vocab_split`): a
device then keeps ``ceil(V / tp) x H`` of each (:func:`vocab_matrix`; the largest shard where
``tp`` does not divide ``V``, the runtime's first ``V mod tp`` ranks holding one row more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: bytes per parameter the torch runtime keeps with AdamW: fp32 master weights, fp32 gradients,
#: two fp32 Adam moments (the same for bf16/fp16 autocast and for plain fp32)
RECIPE = {"weights": 4.0, "gradients": 4.0, "optimizer": 8.0}
#: which parts each ZeRO stage shards
SHARDED_PARTS = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"), 3: ("optimizer", "gradients", "weights")}


def sharded_parts(zero: int, scope: str = "all") -> tuple[str, ...]:
    """The parts of the state ZeRO stage ``zero`` shards as the torch runtime runs it: under
    hybrid sharding (``scope="machine"``) stage 2 sums the gradients at the step, so it keeps
    them whole between micro-batches like stage 1 (``plugins/runtimes/torch/parallel/data/hybrid.py``)."""
    return SHARDED_PARTS[1 if zero == 2 and scope == "machine" else zero]


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each part of the training state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer

    def parts(self) -> dict[str, float]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer}


#: the recipe's :class:`StateBytes` (immutable: one shared value)
RECIPE_BYTES = StateBytes(**RECIPE)


def state_bytes(dtype: str, override: float | None = None) -> StateBytes:
    """Per-parameter state of the runtime's recipe (module docstring): 4 + 4 + 8 = 16 B whatever
    ``dtype`` (the autocast dtype only shapes activations and messages); ``override`` (the
    ``cost.state_bytes_per_param`` setting) replaces the total, split 1/4 : 1/4 : 1/2."""
    if override is not None:
        return StateBytes(override / 4.0, override / 4.0, override / 2.0)
    return RECIPE_BYTES


def sync_bytes(cost: Any, train: Any) -> float:
    """Bytes per parameter that data-parallel traffic moves — the gradient all-reduce, ZeRO's
    reduce-scatter and all-gathers, a tied embedding's sum: ``cost.sync_bytes_per_param`` where
    set (the ``cost.sync_bytes_per_param`` setting: the wire apart from the memory accounting),
    else the recipe's gradient bytes, ``cost.state_bytes(train).gradients`` — 4 under the torch
    runtime's recipe, whose gradients are fp32 whatever ``train.dtype`` (as Megatron-LM reduces
    bf16 runs' gradients in fp32), 2 under the paper's ``state_bytes_per_param = 8`` — or
    ``train.dtype_bytes`` for a cost model without :meth:`state_bytes`. Pipeline and TP messages
    travel in ``train.dtype``."""
    explicit = getattr(cost, "sync_bytes_per_param", None)
    if explicit is not None:
        return float(explicit)
    fn = getattr(cost, "state_bytes", None)
    return fn(train).gradients if callable(fn) else train.dtype_bytes


def sharded(per: StateBytes, zero: int, n: int) -> StateBytes:
    """Bytes per parameter one holder keeps when ``n`` holders shard under ZeRO stage ``zero``
    (even shards): each sharded part divided by ``n``."""
    parts = per.parts()
    n = max(1, n)
    for k in SHARDED_PARTS[zero]:
        parts[k] /= n
    return StateBytes(**parts)


def tp_replicated_layer_params(model) -> int:
    """Parameters of one block that tensor parallelism does *not* split (Megatron's column/row
    split, as the torch runtime does it, ``plugins/runtimes/torch/parallel/tensor.py``): the two
    norms and the biases added after a row-parallel all-reduce (o_proj's, and the MLP down
    projection's in the GPT layout). Every TP rank keeps a full copy of them, as of the
    embedding and the head (final norm + output projection), which the runtime replicates too
    unless ``train.vocab_parallel`` splits their matrices by rows (:func:`vocab_split`)."""
    o_bias = model.arch == "gpt" or getattr(model, "o_bias", False)
    down_bias = model.arch != "llama"
    return 2 * model.norm_params() + (model.hidden if o_bias else 0) + (model.hidden if down_bias else 0)


def vocab_split(train, tp: int) -> int:
    """The number of ranks the ``V x H`` embedding and head matrices are split over by vocabulary
    rows on a ``tp``-way stage: ``tp`` under ``train.vocab_parallel`` (Megatron-LM's vocabulary
    parallelism, ``plugins/runtimes/torch/parallel/vocab.py``), else 1 (replicated)."""
    return max(1, tp) if train.vocab_parallel else 1


def vocab_matrix(model, split: int = 1) -> int:
    """Parameters of one ``V x H`` embedding or head matrix a device keeps when ``split`` ranks
    share it by rows: ``ceil(V / split) x H`` (the largest shard; ``V x H`` unsplit)."""
    return -(-model.vocab // max(1, split)) * model.hidden


def tied_copies(model, first: bool | int, last: bool | int, tied_heads: float | None = None) -> float:
    """Heads a stage keeps as their own copy of the tied embedding (``tied_embeddings``; 0 when
    untied): a head shares one Parameter with its chain's embedding on the same rank, any other
    head is a copy whose gradients the embedding group sums (Megatron-LM's last stage keeps one
    too). ``tied_heads`` where the placement knows the chains (:meth:`AnalyticCostModel.held`),
    else ``max(0, heads - embeddings)`` (right when a rank's embedding and head are of one chain:
    the plain placement, V shapes and waves)."""
    if not model.tied_embeddings:
        return 0.0
    return float(tied_heads) if tied_heads is not None else max(0.0, float(last) - float(first))


def tied_whole(model, first: bool | int, last: bool | int, tied_heads: float | None = None, split: int = 1) -> float:
    """Parameters of the tied embedding a stage keeps whole under ZeRO: its embeddings' and its
    heads' own copies (:func:`tied_copies`) of ``vocab x hidden`` (of its rows under
    vocabulary parallelism, ``split`` ranks: :func:`vocab_matrix`); 0 when untied. The embedding
    group sums these copies' gradients itself (``plugins/runtimes/torch/parallel/tied_embedding.py``), outside the
    sharded data-parallel state, so no ZeRO stage splits them."""
    if not model.tied_embeddings:
        return 0.0
    return (float(first) + tied_copies(model, first, last, tied_heads)) * vocab_matrix(model, split)


def end_params(model, split: int = 1) -> tuple[float, float]:
    """``(embedding, head)`` parameters one device keeps of the model's ends: the embedding
    (+ learned positions and token types for gpt) and the final norm + output projection
    (none when tied: :func:`tied_copies`), their ``V x H`` matrices split by rows among
    ``split`` ranks (:func:`vocab_matrix`)."""
    cut = model.vocab * model.hidden - vocab_matrix(model, split)
    return model.embedding_params() - cut, model.head_params() - (0 if model.tied_embeddings else cut)


def device_params(model, n_layers: int, tp: int, *, first: bool | int, last: bool | int,
                  tied_heads: float | None = None, split: int = 1) -> float:
    """Parameters one device of a ``tp``-way stage keeps: ``n_layers`` blocks (the split part
    ``/ tp``, the replicated part whole, :func:`tp_replicated_layer_params`), plus the
    embedding on the first stage and the head on the last (``first``/``last``: how many
    copies the stage keeps, True = 1; a schedule's placement may give a rank two; whole, or
    their rows among ``split`` ranks under vocabulary parallelism, :func:`end_params`), and with
    tied embeddings each head's own copy of the embedding (:func:`tied_copies`)."""
    rep = tp_replicated_layer_params(model)
    embedding, head = end_params(model, split)
    return n_layers * ((model.layer_params() - rep) / tp + rep) + first * embedding + last * head + \
        tied_copies(model, first, last, tied_heads) * vocab_matrix(model, split)


def largest_unit_params(model, n_layers: int, tp: int, *, first: bool, last: bool,
                        tied_heads: float | None = None, split: int = 1) -> float:
    """Parameters of a ``tp``-way stage's largest *unit* on one device: a block (its split part
    ``/ tp``, its replicated part whole), the embedding, or the final norm with the head. The
    torch runtime (``plugins/runtimes/torch/parallel/data/zero_state.py``) handles sharded state unit by unit: ZeRO-3
    gathers one unit's weights at a time, just before its forward or backward, and frees them
    after; ZeRO-2/3 sum each unit's gradient as soon as its backward has accumulated it and free
    it. So at its peak a device holds the largest unit's weights gathered (ZeRO-3) and its full
    gradient not summed yet (ZeRO-2/3). A tied embedding and the heads' copies of it are kept
    whole (:func:`tied_whole`), so they are no unit (``tied_heads`` does not change the result);
    ``split``: the ranks sharing the ends' ``V x H`` matrices (:func:`end_params`)."""
    units = [device_params(model, 1, tp, first=False, last=False)] if n_layers else []
    embedding, head = end_params(model, split)
    tied = vocab_matrix(model, split) if model.tied_embeddings else 0  # kept whole: :func:`tied_whole`
    units += [embedding - tied] if first else []
    units += [head] if last else []
    return max(units, default=0.0)
