"""``hexicore evaluate plan_file=PATH [out=PATH]``: validate a plan from any source and
re-estimate it with the configured cost model."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from hexicore.app import compose as app
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.registry import Registry
from hexicore.app.report import console, print_plan


def run(cfg: DictConfig) -> int:
    if not cfg.get("plan_file"):
        raise HexicoreError("evaluate needs plan_file=PATH", source="command line", field="plan_file")
    path = str(cfg.plan_file)
    plan = Plan.load(path)
    cost = app.build_cost_model(cfg, Registry.default())
    plan, _, warnings = app.evaluate(plan, cost, source=path)
    warnings += _runtime_refusal(cfg, plan, path)
    print_plan(plan, console())
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if cfg.get("out"):
        plan.save(str(cfg.out))
        print(f"plan written to {cfg.out}")
    return 0


def _runtime_refusal(cfg: DictConfig, plan: Plan, path: str) -> list[str]:
    """What the configured runtime would refuse (``hexicore train`` exits 2 on the same line)."""
    params = app.group_params(cfg, "runtime")
    name = str(params.pop("name", "torch"))
    try:
        runtime = Registry.default().create("runtime", name, **params)
    except HexicoreError:
        return []
    check = getattr(runtime, "check_plan", None)
    try:
        if check is not None:
            check(plan, path)
    except HexicoreError as exc:
        return [f"runtime {name} cannot run this plan: {exc}"]
    return []
