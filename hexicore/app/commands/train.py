"""``hexicore train``: run training with a runtime plugin (DESIGN.md §4, §7).

``hexicore train [plan_file=PATH | parallel=none | schedule=NAME pipeline.ranks=P] model=tiny
runtime=torch train.steps=N [train.global_batch=N train.micro_batch=N] [seed=S] [out=DIR]
[resume=CKPT] [train.checkpoint_every=K]`` checks the run (bad input: one line, exit 2, before
any process starts), launches it, prints a summary and writes ``metrics.json`` and ``final.pt``
to ``out`` (default: Hydra's output directory). A worker that fails, dies or hangs ends the run
with one line on stderr and exit status 1. Under ``torchrun`` this process is one of the workers
(see ``docs/runtime.md`` for the multi-node command).
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from hexicore.app.compose import group_params, output_dir
from hexicore.core.errors import HexicoreError
from hexicore.registry import Registry


def run(cfg: DictConfig) -> int:
    params = group_params(cfg, "runtime")
    name = str(params.pop("name", "torch"))
    runtime = Registry.default().create("runtime", name, **params)
    out = str(cfg.out) if cfg.get("out") else str(output_dir(cfg))
    spec = runtime.spec(cfg, out)
    try:
        results = runtime.run([spec])
    except HexicoreError as exc:
        if type(exc).__name__ == "LaunchError":
            print(f"hexicore: error: {exc}", file=sys.stderr)
            return 1
        raise
    if results and results[0]:
        m = results[0]["metrics"]
        print(f"trained {len(m['losses'])} steps ({m['schedule']}, {m['ranks']} ranks): loss {m['losses'][0]:.4f} -> "
              f"{m['losses'][-1]:.4f}, {m['tokens_per_s']:,.0f} tokens/s; wrote {out}/metrics.json, {out}/final.pt")
    return 0
