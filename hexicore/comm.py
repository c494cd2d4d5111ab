"""The shared communication pass: compute-only action lists -> lists with SEND/RECV pairs
(DESIGN.md §6 "schedules emit compute; one shared pass inserts the matching communication").

Rules (what a runtime executing the lists may rely on):

1. ``SEND_F(s, mb, peer)`` directly follows ``F(s, mb)`` when the next stage of ``mb``'s chain
   lives on another rank; ``SEND_B(s, mb, peer)`` directly follows ``B(s, mb)`` (or ``I``) when
   the previous stage does. Consecutive stages on one rank (a wave's turn, a V) exchange nothing.
2. Each link (sender, receiver) is FIFO: a receiver's ``RECV_*`` on a link appear in exactly the
   order of the sender's ``SEND_*`` on it, so untagged point-to-point (NCCL) matches them.
3. A ``RECV`` is placed as late as possible: just before the compute that consumes it — unless
   an earlier message on the same link is still unreceived, in which case that one is received
   first (rule 2) and kept until its consumer runs.

With asynchronous sends (``isend``/``batch_isend_irecv``) and blocking receives this order
cannot deadlock when the compute order itself is feasible: an early receive waits only for a
message that its sender posted before the one the consumer needs. A runtime may prefetch (post
the ``irecv`` of the next ``RECV`` right after the previous compute, as Hanayo's runtime does)
and wait on it at the ``RECV``'s position; it must wait on its ``isend`` handles before
``STEP``.
"""

from __future__ import annotations

from collections import defaultdict

from hexicore.actions import Action, ActionList
from hexicore.errors import ScheduleError


def insert_comm(al: ActionList) -> ActionList:
    """Return ``al`` with SEND/RECV inserted per the module rules (existing comm is dropped first)."""
    base = al.compute_only()
    s2r = base.stage_rank
    prev_of, next_of = {}, {}
    for c, chain in enumerate(base.chains):
        for i, s in enumerate(chain):
            prev_of[c, s] = chain[i - 1] if i else None
            next_of[c, s] = chain[i + 1] if i + 1 < len(chain) else None
    # pass 1: sends right after producers; remember each link's message order
    with_sends: list[list[Action]] = []
    sent: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    for r, acts in enumerate(base.actions):
        out = []
        for a in acts:
            out.append(a)
            if a.op not in ("F", "B", "I") or a.mb is None:
                continue
            c = base.mb_chain[a.mb]
            if a.op == "F":
                to = next_of.get((c, a.stage))
                if to is not None and s2r[to] != r:
                    out.append(Action("SEND_F", a.stage, a.mb, s2r[to]))
                    sent[r, s2r[to]].append(("F", to, a.mb))
            else:
                to = prev_of.get((c, a.stage))
                if to is not None and s2r[to] != r:
                    out.append(Action("SEND_B", a.stage, a.mb, s2r[to]))
                    sent[r, s2r[to]].append(("B", to, a.mb))
        with_sends.append(out)
    # pass 2: receives just before consumers, in each link's send order
    index = {link: {m: i for i, m in enumerate(msgs)} for link, msgs in sent.items()}
    cursor: dict[tuple[int, int], int] = defaultdict(int)
    result = []
    for r, acts in enumerate(with_sends):
        out = []
        for k, a in enumerate(acts):
            if a.op in ("F", "B", "I") and a.mb is not None:
                c = base.mb_chain[a.mb]
                src = prev_of.get((c, a.stage)) if a.op == "F" else next_of.get((c, a.stage))
                if src is not None and s2r[src] != r:
                    link, msg = (s2r[src], r), ("F" if a.op == "F" else "B", a.stage, a.mb)
                    i = index.get(link, {}).get(msg)
                    if i is None:
                        raise ScheduleError(f"rank {r}, action {a}: rank {s2r[src]} never produces its input "
                                            f"{src}{'F' if a.op == 'F' else 'B'}{a.mb}", field=f"actions[{r}]")
                    while cursor[link] <= i:
                        kind, st, mb = sent[link][cursor[link]]
                        out.append(Action("RECV_" + kind, st, mb, link[0]))
                        cursor[link] += 1
            out.append(a)
        result.append(tuple(out))
    return ActionList(base.schedule, base.ranks, base.stages, base.micro_batches, base.stage_rank, tuple(result),
                      base.chains, base.mb_chain, dict(base.meta))
