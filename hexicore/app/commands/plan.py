"""``hexicore plan``: solve for a plan showing its progress (a bar on a terminal, a line every
few seconds elsewhere: :mod:`hexicore.app.progress_display`), print it as a table, write the plan
JSON and ``plan.png`` beside it (the cluster coloured by pipeline, a bar per pipeline); warn
where the configured runtime would refuse the plan (as ``hexicore evaluate`` does)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from rich.progress import BarColumn, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

from hexicore.app import compose as app
from hexicore.app.picture import save_plan_picture
from hexicore.app.progress_display import shown_progress
from hexicore.registry import Registry
from hexicore.app.report import console, memory_table, print_plan
from hexicore.app.sweep import record, summary_row
from hexicore.app.training import runtime_refusal
from hexicore.core.ownership import check_all


def run(cfg: DictConfig) -> int:
    out = Path(cfg.out) if cfg.get("out") else app.output_dir(cfg) / "plan.json"
    check_all([(out, "hexicore.plan"), (out.with_suffix(".png"), "hexicore.png")], overwrite=cfg.get("overwrite"))
    registry = Registry.default()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TimeElapsedColumn())
    with shown_progress("plan", "planning ...", *columns) as progress:
        plan, warnings = app.solve(cfg, registry, progress)
    warnings += runtime_refusal(cfg, plan, plan.estimate, str(out), registry)
    plan.save(out, overwrite=cfg.get("overwrite"))
    picture = save_plan_picture(plan, out.with_suffix(".png"))
    print_plan(plan, console())
    table = memory_table(plan, app.memory_cost(cfg, registry))
    if table is not None:
        console().print(table)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if (plan.solver or {}).get("replan"):  # elastic replanning: how the plan differs from the previous one
        from hexicore.planner.replan.diff import describe

        print(describe(plan.solver["replan"]))
    print(f"plan written to {out} (picture: {picture})")
    record(summary_row(plan, "plan", out))
    return 0

