"""Idle devices of an allocated plan: which devices no pipeline uses, grouped for the reader
(a GPU type, a zone or a machine left out entirely), each with the best plan found that uses
them (the plan's ``solver.idle``, docs/formats.md; :func:`hexicore.planner.allocation.allocate`)."""

from __future__ import annotations

from hexicore.core.cluster import Cluster
from hexicore.core.plan import Plan
from hexicore.planner.objective import rate

__all__ = ["idle_groups"]


def idle_groups(cluster: Cluster, plan: Plan, trials: list) -> list[dict]:
    """Devices no pipeline of ``plan`` uses, per GPU type left out entirely, else per zone
    left out entirely, else per machine
    (else the single devices): ``{"kind", "name", "devices", "iteration_s", ...}`` where
    ``iteration_s`` / ``tokens_per_s`` / ``usd_per_mtok`` describe the best plan found that uses
    the group (null when no solved sub-cluster used it); ``trials``: the allocation's solved
    sub-clusters (:class:`hexicore.planner.allocation.Trial`)."""
    used = set(plan.devices)
    idle = [d for d in cluster.devices if d.id not in used]
    if not idle:
        return []
    groups: list[tuple[str, str, list[str]]] = []
    types = {d.gpu.name for d in cluster.devices if d.id in used}
    done: set[str] = set()
    for d in idle:
        if d.id in done:
            continue
        zone = cluster.machine(d.machine).zone
        if d.gpu.name not in types:
            members = [e.id for e in idle if e.gpu.name == d.gpu.name]
            groups.append(("gpu", d.gpu.name, members))
        elif zone is not None and all(e.id not in used for e in cluster.devices
                                      if cluster.machine(e.machine).zone == zone):
            members = [e.id for e in idle if cluster.machine(e.machine).zone == zone and e.id not in done]
            groups.append(("zone", zone, members))
        else:
            members = [e.id for e in idle if e.machine == d.machine]
            whole = all(e.id not in used for e in cluster.devices if e.machine == d.machine)
            groups.append(("machine" if whole else "devices", d.machine, members))
        done.update(members)
    out = []
    for kind, name, members in groups:
        need = {cluster.device(m).machine for m in members}
        using = [t for t in trials if t.plan is not None and need <= set(t.machines) and not t.part]
        top = min(using, key=lambda t: t.score, default=None)
        row = {"kind": kind, "name": name, "devices": members, "iteration_s": None}
        if top is not None:
            row.update({"iteration_s": top.plan.estimate.iteration_s, **rate(top.plan)})
        out.append(row)
    return out
