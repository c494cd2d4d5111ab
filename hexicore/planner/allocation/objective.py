"""What a plan optimises (the ``objective``, ``budget_per_hour`` and ``min_tokens_per_s`` keys
of conf/config.yaml): throughput (iteration time) or cost per token, optionally under a budget
or a throughput floor.

A plan's price is the sum of ``price_per_hour`` over the devices its pipelines use (idle devices
are not paid for: they can be released); its cost per token is
``usd_per_mtok = usd_per_hour / 3600 / tokens_per_s * 1e6``. For one fixed device set both
objectives rank plans the same way (the price is fixed, so the faster plan is the cheaper per
token); they differ in which devices to use, which :mod:`hexicore.planner.allocation` decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hexicore.core.fields import is_number
from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.plan import Plan

__all__ = ["KINDS", "Objective", "plan_price", "rate"]

KINDS = ("throughput", "cost")
INF = math.inf


def plan_price(plan: Plan) -> float:
    """Dollars per hour of the devices the plan uses (unpriced GPU types count 0)."""
    cl = plan.cluster
    return sum(cl.device(d).gpu.price_per_hour or 0.0 for d in plan.devices)


def rate(plan: Plan) -> dict[str, float | None]:
    """``tokens_per_s``, ``usd_per_hour`` and ``usd_per_mtok`` of a plan with an estimate
    (the dollar figures are None when a used GPU type has no ``price_per_hour``)."""
    est = plan.estimate
    tps = est.tokens_per_s if est is not None else None
    cl = plan.cluster
    if any(cl.device(d).gpu.price_per_hour is None for d in plan.devices):
        return {"tokens_per_s": tps, "usd_per_hour": None, "usd_per_mtok": None}
    usd = plan_price(plan)
    per_m = usd / 3600.0 / tps * 1e6 if tps else None
    return {"tokens_per_s": tps, "usd_per_hour": usd, "usd_per_mtok": per_m}


@dataclass(frozen=True)
class Objective:
    """``kind``: ``throughput`` (least iteration time) or ``cost`` (least dollars per million
    tokens); ``budget_per_hour``: plans costing more per hour are not allowed; 
    ``min_tokens_per_s``: plans slower than this are not allowed."""

    kind: str = "throughput"
    budget_per_hour: float | None = None
    min_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HexicoreError(f"unknown objective {self.kind!r}; choose one of: {', '.join(KINDS)}",
                                field="objective")
        for key in ("budget_per_hour", "min_tokens_per_s"):
            v = getattr(self, key)
            if v is not None and (not is_number(v) or not 0 < v < math.inf):
                raise HexicoreError(f"{key} must be a finite positive number or null, got {shown(v)}", field=key)

    @property
    def needs_prices(self) -> bool:
        return self.kind == "cost" or self.budget_per_hour is not None

    def check_prices(self, cluster: Cluster) -> None:
        """Cost objectives and budgets need a price for every GPU type of the cluster."""
        if not self.needs_prices:
            return
        missing = sorted({d.gpu.name for d in cluster.devices if d.gpu.price_per_hour is None})
        if missing:
            what = "objective=cost" if self.kind == "cost" else "budget_per_hour"
            raise HexicoreError(f"{what} needs price_per_hour for GPU type(s) {', '.join(missing)}; add it under "
                                "the cluster file's gpus: section", field="objective")

    def allows(self, plan: Plan) -> bool:
        r = rate(plan)
        if self.budget_per_hour is not None and plan_price(plan) > self.budget_per_hour + 1e-9:
            return False
        return self.min_tokens_per_s is None or (r["tokens_per_s"] or 0.0) >= self.min_tokens_per_s

    def score(self, plan: Plan) -> tuple[float, float]:
        """Smaller is better: (iteration s, $/M tokens) or ($/M tokens, iteration s); both
        infinite when the plan breaks a constraint."""
        if not self.allows(plan):
            return (INF, INF)
        t = plan.estimate.iteration_s
        cost = rate(plan)["usd_per_mtok"]
        cost = INF if cost is None else cost
        return (cost, t) if self.kind == "cost" else (t, cost)

    def unmet(self, problem: Any, trials: dict) -> HexicoreError:
        """No sub-cluster's plan meets the constraints: say which and the nearest miss."""
        plans = [t.plan for t in trials.values() if t is not None and t.plan is not None]
        parts = []
        if self.budget_per_hour is not None:
            parts.append(f"budget_per_hour={self.budget_per_hour:g}")
        if self.min_tokens_per_s is not None:
            parts.append(f"min_tokens_per_s={self.min_tokens_per_s:g}")
        seen = "; ".join(f"{rate(p)['tokens_per_s']:.0f} tokens/s at ${plan_price(p):.2f}/h" for p in plans[:3])
        return HexicoreError(f"no plan on {problem.cluster.name!r} meets {' and '.join(parts) or 'the objective'}"
                             + (f" (plans found: {seen})" if seen else ""), field="objective")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "budget_per_hour": self.budget_per_hour, "min_tokens_per_s": self.min_tokens_per_s}
