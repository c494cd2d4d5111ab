"""Tied embeddings across stages: the embedding group (Shoeybi et al. 2019, Megatron-LM's
``embedding_group``; Narayanan et al. 2021, §4).

With ``tied_embeddings`` the LM head *is* the token embedding. A chunk that holds both uses one
Parameter, and so do chunks of one chain on the same rank (:func:`..model.stage_module.build_stages`). When the
embedding (first stage of a chain) and the head (last stage) sit on different ranks, both hold a
copy, initialised from the same stored tensor; before each update the gradients of every copy —
in every pipeline of the plan, so this also replaces the data-parallel sync of that tensor — are
summed, and every copy receives the sum. Equal start, equal gradient, equal AdamW step: the copies
stay equal, and the update is exactly the one-process one, whose single Parameter accumulates
both uses' gradients.

Who contributes: per pipeline, chain 0 and TP rank 0 only (Chimera's chain copies were already
summed into chain 0 by ``REDUCE``; TP ranks hold identical replicated gradients), each distinct
Parameter once. Under ``train.vocab_parallel`` a TP rank holds only its vocabulary rows
(:mod:`.vocab`), so every TP rank of chain 0 contributes them at their place in a zeroed
``vocab x hidden`` buffer and takes its rows of the sum back: the holders' TP degrees may
differ. One all-reduce over the ranks holding a copy (:func:`members`), created in
:meth:`.layout.ParallelLayout.build` in the same order on every rank.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .assignment import RankAssignment
from .tensor import shard_range


def members(layout: RankAssignment) -> tuple[int, ...]:
    """Global ranks holding a copy of the tied embedding/head (empty unless tied, and when one
    stage's ranks hold the only copy: its TP ranks keep equal replicated gradients already)."""
    if not layout.model.tied_embeddings:
        return ()
    holders = set()
    for part in layout.pipelines:
        for s in range(part.actions.stages):
            if part.first_of_chain(s) or part.last_of_chain(s):
                holders.add(part.groups[part.actions.stage_rank[s]].ranks)
    return tuple(sorted({r for g in holders for r in g})) if len(holders) > 1 else ()


def tied_params(stages: dict) -> list[tuple[int, torch.nn.Parameter]]:
    """``(chain, Parameter)`` of every distinct tied copy this rank holds."""
    seen, out = set(), []
    for s in sorted(stages):
        st = stages[s]
        for p in ([st.module.model.embed_tokens.weight] if st.first else []) + \
                 ([st.module.lm_head.weight] if st.last else []):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((st.chain, p))
    return out


def tied_rows(stages: dict) -> tuple[int, int] | None:
    """The vocabulary rows ``[lo, hi)`` this rank's tied copies hold (None: every row)."""
    tp = next(iter(stages.values())).module.tp
    return shard_range(next(iter(stages.values())).module.spec.vocab, tp.rank, tp.size) if tp.vocab_split else None


class TiedSync:
    """This rank's part of the embedding group."""

    def __init__(self, group: Any, tp_rank: int):
        self.group, self.tp_rank = group, tp_rank

    def run(self, stages: dict, wait: Callable[[list, str], None]) -> None:
        held = tied_params(stages)
        if not held:
            return
        ref, rows, spec = held[0][1], tied_rows(stages), next(iter(stages.values())).module.spec
        total = torch.zeros_like(ref) if rows is None else ref.new_zeros(spec.vocab, spec.hidden)
        mine = total if rows is None else total[rows[0]:rows[1]]
        if self.tp_rank == 0 or rows is not None:
            for chain, p in held:
                if chain == 0 and p.grad is not None:
                    mine += p.grad
        work = torch.distributed.all_reduce(total, group=self.group, async_op=True)
        wait([work], "tied embedding gradient sum")
        for _, p in held:
            p.grad = mine.clone()
