"""``hexicore plan``: solve for a plan, print it as a table, write the plan JSON."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from hexicore import app
from hexicore.registry import Registry
from hexicore.report import console, print_plan


def run(cfg: DictConfig) -> int:
    err = console(stderr=True)
    registry = Registry.default()
    with err.status("planning ...") as status:
        def progress(message: str, fraction: float) -> None:
            status.update(f"{message} ({100 * fraction:.0f}%)")

        plan, warnings = app.solve(cfg, registry, progress)
    out = Path(cfg.out) if cfg.get("out") else app.output_dir(cfg) / "plan.json"
    plan.save(out)
    print_plan(plan, console())
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"plan written to {out}")
    return 0
