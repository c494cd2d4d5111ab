"""How a replanned plan differs from the previous one (``hexicore plan exclude=... warm_start=...``,
the plan's ``solver.replan``, docs/formats.md): devices lost, devices moved and layers moved —
what a runtime has to reload."""

from __future__ import annotations

from typing import Any

from hexicore.core.cluster import Cluster
from hexicore.core.plan import Plan


def device_holdings(plan: Plan) -> dict[str, tuple]:
    """Per device: (layer range, TP degree, rank in the TP group) — what it holds."""
    return {d: (s.layers, s.tp, s.devices.index(d)) for p in plan.pipelines for s in p.stages for d in s.devices}


def plan_diff(old: Plan, new: Plan, cluster: Cluster | None = None) -> dict[str, Any]:
    """How ``new`` differs from ``old``: devices lost (gone from ``cluster``, the cluster the
    replan was asked for, default ``new``'s; devices a machine allocation left idle are moved,
    not lost), devices moved (their layer range, TP degree or TP rank changed, or they are newly
    used or now idle: their weights change), and layers moved = sum over the new plan's devices
    of the layers (as TP shards) that device did not hold before — the weights a runtime has to
    load."""
    cluster = new.cluster if cluster is None else cluster
    a, b = device_holdings(old), device_holdings(new)
    lost = sorted(d for d in a if not cluster.has_device(d))
    moved = sorted(d for d in set(a) | set(b) if d not in lost and a.get(d) != b.get(d))

    def shards(p: tuple | None) -> set:
        return set() if p is None else {(k, p[1], p[2]) for k in range(*p[0])}

    layers = sum(len(shards(b[d]) - shards(a.get(d))) for d in b)
    same = sum(1 for p in new.pipelines if any(tuple(p.stages) == tuple(q.stages) for q in old.pipelines))
    return {"excluded": list(cluster.excluded), "lost": lost, "pipelines_kept": same,
            "pipelines_before": len(old.pipelines), "pipelines_after": len(new.pipelines),
            "devices_moved": len(moved), "moved": moved[:32], "layers_moved": layers,
            "previous_iteration_s": old.estimate.iteration_s if old.estimate else None}


def describe(diff: dict[str, Any]) -> str:
    """One line for ``hexicore plan``."""
    ex = ", ".join(diff["excluded"]) or "none"
    return (f"replan: excluded {ex}; {diff['pipelines_kept']}/{diff['pipelines_after']} pipelines unchanged "
            f"(were {diff['pipelines_before']}); {diff['devices_moved']} devices moved, "
            f"{diff['layers_moved']} layer shards to load")
