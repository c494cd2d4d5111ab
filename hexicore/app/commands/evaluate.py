"""``hexicore evaluate plan_file=PATH [out=PATH]``: validate a plan from any source,
re-estimate it with the configured cost model, and say whether the configured runtime
would refuse it (``hexicore train`` then exits 2 with the same line)."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from hexicore.app import compose as app
from hexicore.app.report import console, memory_table, prediction_table, print_plan
from hexicore.app.sweep import record, summary_row
from hexicore.app.training import runtime_refusal
from hexicore.core.errors import HexicoreError
from hexicore.core.ownership import check_writable
from hexicore.core.prediction import predictions
from hexicore.registry import Registry


def run(cfg: DictConfig) -> int:
    if not cfg.get("plan_file"):
        raise HexicoreError("evaluate needs plan_file=PATH", source="command line", field="plan_file")
    if cfg.get("out"):
        check_writable(str(cfg.out), "hexicore.plan", overwrite=cfg.get("overwrite"))
    registry = Registry.default()
    plan, path = app.load_plan_file(cfg)
    cost = app.build_cost_model(cfg, registry)
    plan, est, warnings = app.evaluate(plan, cost, source=path, registry=registry)
    warnings += runtime_refusal(cfg, plan, est, path, registry)
    print_plan(plan, console())
    table = memory_table(plan, app.memory_cost(cfg, registry))
    if table is not None:
        console().print(table)
    if est is not None:  # what `hexicore train` will compare its measurements with
        console().print(prediction_table(predictions(est, plan.devices)))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"plan valid: {len(plan.devices)} devices of {plan.cluster.name}, every layer in one stage of each of its "
          f"{len(plan.pipelines)} pipeline{'s' if len(plan.pipelines) != 1 else ''}, every device within its memory"
          + (f" ({len(warnings)} warning{'s' if len(warnings) != 1 else ''} above)" if warnings else ""))
    if cfg.get("out"):
        plan.save(str(cfg.out), overwrite=cfg.get("overwrite"))
        print(f"plan written to {cfg.out}")
    record(summary_row(plan, "evaluate", path))
    return 0
