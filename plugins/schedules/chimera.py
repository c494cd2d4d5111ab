"""Schedule ``chimera``: bidirectional pipelines (Li & Hoefler, SC'21).

Two model copies: chain 0 (down) puts stage j on rank j, chain 1 (up) puts stage P+j on rank
P-1-j, so every rank holds one stage of each direction (two weight copies). Even micro-batches
run down, odd ones up. The compute order is the greedy list schedule of :mod:`hexicore.pipeline.greedy`
(backward first or forward first, whichever simulates faster under the spec's times; then
lowest micro-batch; each rank admits at most ``memory`` micro-batches,
default 2P: room for both directions — a tighter cap costs bubble under this greedy rule, whereas
Chimera's hand-made units keep P; a cap so tight that the two directions would wait on each other
for ever is exceeded by one micro-batch where they meet, the greedy rule's way out, and the
simulated peak, which memory is priced with, shows it). Phases: 1. both directions fill from opposite ends; 2. steady forward/backward
interleaving; 3. drain; 4. ``REDUCE`` of each model part between its two replicas (parts in
ascending order on every rank, so the rendezvous cannot cross), then ``STEP``.

Pricing: simulated; two directions need two ranks, so a one-rank pipeline (no bubble under any
schedule) is priced as 1F1B.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexicore.pipeline.actions import Action, ActionList
from hexicore.pipeline.greedy import greedy_order
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.schedule import ActionSchedule, Pricing, ScheduleSpec, build, need, positive_memory
from hexicore.pipeline.simulate import makespan


def chimera_layout(ranks: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(stage_rank, chains): down chain 0..P-1 on ranks 0..P-1, up chain P..2P-1 on P-1..0."""
    return tuple(range(ranks)) + tuple(reversed(range(ranks))), (tuple(range(ranks)), tuple(range(ranks, 2 * ranks)))


def reduces(rank: int, ranks: int) -> list[Action]:
    """REDUCE of every model part the rank holds, ascending by part (stage j and P+j are part j)."""
    out = []
    for part in sorted({rank, ranks - 1 - rank}):
        down, up = part, ranks + part  # replicas: down on rank part, up on rank P-1-part
        for mine, other_rank in ((down, ranks - 1 - part), (up, part)):
            if (mine < ranks and mine == rank) or (mine >= ranks and ranks - 1 - part == rank):
                out.append(Action("REDUCE", mine, None, other_rank))
    return out


@dataclass(frozen=True)
class Chimera(ActionSchedule):
    memory: float | None = None
    name = "chimera"
    pricing = Pricing(min_ranks=2, fewer_ranks=ScheduleRef("1f1b"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", positive_memory(self.memory, self.name))

    def params(self) -> dict:
        """The cap, where given, shapes the order: recorded so the lists can be rebuilt."""
        return {} if self.memory is None else {"memory": self.memory}

    def order(self, spec: ScheduleSpec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        need(P >= 2, self.name, f"needs pipeline.ranks >= 2 (two directions), got {P}")
        need(M >= 1, self.name, "needs micro_batches >= 1")
        s2r, chains = chimera_layout(P)
        mb_chain = tuple(m % 2 for m in range(M))
        probe = ActionList({}, P, 2 * P, M, s2r, ((),) * P, chains, mb_chain)
        cap = float(self.memory) if self.memory is not None else 2.0 * P
        timing = spec.timing(probe)
        best = None
        for forward_first in (False, True):
            lists = greedy_order(P, s2r, chains, mb_chain, timing, cap=[cap] * P, forward_first=forward_first)
            lists = [acts + reduces(r, P) for r, acts in enumerate(lists)]
            al = build(self.name, self.params(), spec, s2r, lists, chains, mb_chain, {"weight_copies": 2})
            t = makespan(al, timing)
            if best is None or t < best[0] - 1e-12:
                best = (t, al)
        return best[1]


@hookimpl
def hexicore_schedules():
    yield PluginSpec(kind="schedule", name="chimera", factory=Chimera,
                     description="Chimera: two directions, two model copies, REDUCE between replicas")
