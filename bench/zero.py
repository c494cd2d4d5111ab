"""Benchmark of sharded training state (ZeRO) as a planning dimension: per cluster, the
hexiscale plan with ``train.zero=0`` and with ``train.zero=auto``, the ``fsdp`` baseline
(ZeRO-3 over every device) and its hybrid variant (``solver.hybrid=true``: sharded inside each
machine, replicated across), and Megatron with its ZeRO-1 option (``solver.zero=1``), all under
the runtime's 16 B/parameter state.

    python bench/zero.py [--iterations 12] [--results docs/results.md]

Columns: the ZeRO stage chosen, the plan's shape (pipelines x stages), the estimated iteration
time (analytic cost model, ``1f1b``), and the predicted peak memory per GPU type (the highest
device of that type). Writes the section ``## Sharded state (ZeRO)`` of ``--results`` (other
sections are kept) and prints it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from results import write_section

from hexicore.app import compose as app
from hexicore.core.errors import HexicoreError
from hexicore.registry import Registry

CASES = [  # (cluster, model, global batch)
    ("paper_case", "llama2_13b", 24),
    ("hetero1", "llama2_7b", 128),
    ("hetero2", "llama2_13b", 128),
    ("tight8", "llama2_7b", 32),
    ("tight16", "llama2_7b", 64),
    ("tight16", "llama2_13b", 64),
    ("homo_a800_16", "llama2_7b", 64),
]


def run(cluster: str, model: str, batch: int, extra: list[str], reg: Registry) -> dict:
    over = [f"cluster={cluster}", f"model={model}", f"train.global_batch={batch}", *extra]
    t0 = time.perf_counter()
    try:
        plan, _ = app.solve(app.config_from_overrides(over), reg)
    except HexicoreError:
        return {"fits": False}
    mem: dict[str, float] = {}
    for d, gb in plan.estimate.memory_gb.items():
        gpu = plan.cluster.device(d).gpu.name
        mem[gpu] = max(mem.get(gpu, 0.0), gb)
    return {"fits": True, "zero": plan.train.zero, "split": plan.train.zero_split, "s": plan.estimate.iteration_s,
            "shape": f"{len(plan.pipelines)} x " + "/".join(sorted({str(len(p.stages)) for p in plan.pipelines})),
            "mem": mem, "plan_s": time.perf_counter() - t0}


def cell(r: dict) -> str:
    return f"{r['s']:.2f} s" if r["fits"] else "does not fit"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args(argv)
    reg = Registry.default()
    search = [f"solver.iterations={args.iterations}"]
    rows = []
    for cluster, model, batch in CASES:
        z0 = run(cluster, model, batch, ["train.zero=0", *search], reg)
        auto = run(cluster, model, batch, ["train.zero=auto", *search], reg)
        fsdp = run(cluster, model, batch, ["solver=fsdp"], reg)
        hybrid = run(cluster, model, batch, ["solver=fsdp", "solver.hybrid=true"], reg)
        mega = run(cluster, model, batch, ["solver=megatron", "solver.zero=1"], reg)
        mem = ", ".join(f"{g} {v:.1f}" for g, v in sorted(auto["mem"].items())) if auto["fits"] else "-"
        gain = f"{z0['s'] / auto['s']:.2f}x" if z0["fits"] and auto["fits"] else "-"
        rows.append(f"| {cluster}, {model}, batch {batch} | {cell(z0)} ({z0.get('shape', '-')}) | "
                    f"{cell(auto)} ({auto.get('shape', '-')}, ZeRO-{auto.get('zero', '-')}) | {gain} | "
                    f"{cell(fsdp)} ({fsdp.get('split', '-')} shards) | {cell(hybrid)} | {cell(mega)} "
                    f"({mega.get('shape', '-')}) | {mem} |")
        print(rows[-1], flush=True)
    body = (f"`python bench/zero.py` (hexiscale with `solver.iterations={args.iterations}`, schedule 1f1b, "
            "16 B/parameter state: fp32 weights, gradients, AdamW moments). Shape = pipelines x stages per "
            "pipeline. `fsdp` = ZeRO-3 over every device, batch by speed, even or memory-proportional shards "
            "(the faster that fits); `fsdp hybrid` = the same sharded inside each machine and replicated "
            "across machines; `megatron ZeRO-1` = `solver=megatron solver.zero=1`. Memory counts what the "
            "torch runtime keeps: under TP the norms, embedding, head and logits are whole on every TP rank. "
            "Peak memory = the highest predicted device of each GPU type under `zero=auto` (GiB).\n\n"
            "| cluster, model | zero=0 | zero=auto | auto vs 0 | fsdp | fsdp hybrid | megatron ZeRO-1 | "
            "peak memory per GPU type (auto) |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    kw = {"path": args.results} if args.results else {}
    path = write_section("## Sharded state (ZeRO)", body, **kw)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
