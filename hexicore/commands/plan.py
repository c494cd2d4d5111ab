"""``hexicore plan``: solve for a plan, print it as a table, write the plan JSON."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from hexicore import app
from hexicore.registry import Registry
from hexicore.report import console, print_plan
from hexicore.sweep import record


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
    est, sol = plan.estimate or {}, plan.solver or {}
    record({"command": "plan", "solver": sol.get("name"), "cluster": plan.cluster.name, "model": plan.model.name,
            "global_batch": plan.train.global_batch, "pipelines": len(plan.pipelines),
            "iteration_s": est.get("iteration_s"), "mfu": est.get("mfu"),
            "peak_memory_gb": max((est.get("memory_gb") or {0: 0}).values()),
            "solver_s": sol.get("seconds"), "status": sol.get("status"), "plan": str(out)})
    return 0
