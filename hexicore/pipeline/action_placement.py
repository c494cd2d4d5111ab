"""An action list's :class:`hexicore.core.placement.Placement`: which blocks, embeddings and heads
each pipeline rank holds, read from its stage map and chains the way the runtime lays out its
chunks (``plugins/runtimes/torch/parallel/assignment.py``, ``chunk_layers``; docs/formats.md):

* a chain walks the model's blocks ``[0, L)`` once in data order, a rank's stages on it sharing
  the rank's plan layer count — the rank holds one copy of its own blocks (source = itself);
* a further chain as long as the first is a model copy: its stage at position k holds the blocks
  of the first chain's stage at position k, so a rank's copy on it has the layer count of the
  rank that holds those positions on the first chain (Chimera's mirrored stage);
* a chain's first stage holds the embedding, its last the final norm + head;
* a copy's ``traffic`` is ``1 / chains``: the chains share the micro-batches evenly (Chimera
  alternates them; with an odd count one chain runs one more), so a placement depends on the
  stage map and chains only, not on the number of micro-batches.
"""

from __future__ import annotations

from typing import Callable

from hexicore.core.errors import HexicoreError, ScheduleError
from hexicore.core.placement import Copy, Placement
from hexicore.pipeline.actions import ActionList


def _source(al: ActionList, ci: int, stages: list[int]) -> int:
    """The plan stage whose blocks ``stages`` (one rank's stages on chain ``ci``) repeat."""
    chain, first = al.chains[ci], al.chains[0]
    if ci == 0 or len(chain) != len(first):
        return al.stage_rank[stages[0]]
    mirrored = [first[chain.index(s)] for s in stages]
    owners = {al.stage_rank[s] for s in mirrored}
    owner = next(iter(owners))
    if len(owners) != 1 or sorted(mirrored) != [s for s in first if al.stage_rank[s] == owner]:
        raise ScheduleError(f"chain {ci}: rank {al.stage_rank[stages[0]]}'s stages repeat part of a rank's blocks "
                            "(a model copy must repeat whole ranks' shares)", field="chains")
    return owner


def placement(al: ActionList) -> Placement:
    """Per rank the copies it holds (module docstring), chains in order."""
    out: list[list[Copy]] = [[] for _ in range(al.ranks)]
    traffic = 1.0 / len(al.chains)
    for ci, chain in enumerate(al.chains):
        for r in range(al.ranks):
            mine = [s for s in chain if al.stage_rank[s] == r]
            if mine:
                out[r].append(Copy(_source(al, ci, mine), chain[0] in mine, chain[-1] in mine, traffic, ci))
    return Placement(tuple(tuple(cs) for cs in out))


def built_template(cache: dict, template: Callable[[int, int], ActionList], ranks: int) -> ActionList:
    """A template the schedule has built for ``ranks`` ranks already (``cache`` key
    ``("template", P, n)``), else ``template(P, P)`` — or ``template(P, 2P)`` where the schedule
    refuses fewer micro-batches than that (DualPipe-V): its stage map and chains do not depend
    on the number of micro-batches."""
    al = next((v for k, v in cache.items() if k[:2] == ("template", ranks)), None)
    if al is None:
        try:
            al = template(ranks, ranks)
        except HexicoreError:
            al = template(ranks, 2 * ranks)
    return al


def built_placement(cache: dict, template: Callable[[int, int], ActionList], ranks: int) -> Placement:
    """A schedule's placement on ``ranks`` ranks (its stage map and chains do not depend on the
    number of micro-batches): of a template it has built for them already (``cache`` key
    ``("template", P, n)``), else of ``template(P, P)`` — or ``template(P, 2P)`` where the
    schedule refuses fewer micro-batches than that (DualPipe-V); kept in ``cache`` under
    ``("placement", P)``."""
    hit = cache.get(("placement", ranks))
    if hit is None:
        hit = cache[("placement", ranks)] = placement(built_template(cache, template, ranks))
    return hit


def chunk_counts(al: ActionList) -> tuple[int, ...]:
    """Per rank the most stages one chain puts on it (a model copy's chain, as long as the first,
    repeats the first's blocks and is not counted): the runtime cuts a rank's blocks among them,
    one at least each, so a plan stage needs at least this many layers (``chunk_layers``)."""
    out = [1] * al.ranks
    for ci, chain in enumerate(al.chains):
        if ci and len(chain) == len(al.chains[0]):
            continue
        for r in range(al.ranks):
            out[r] = max(out[r], sum(1 for s in chain if al.stage_rank[s] == r))
    return tuple(out)
