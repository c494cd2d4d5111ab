"""Calibrate the cost model's achieved-efficiency factor on one GPU .

Measures forward + backward of ``--layers`` Llama blocks shaped like ``--model`` (default
llama2_7b: hidden 4096, 32 heads, FFN 11008) in bf16 at the model's sequence length, one
micro-batch, with the runtime's own :class:`LlamaChunk`; attention through SDPA and, when it
imports, flash-attn. Reports tokens/s, per-layer time, achieved TFLOP/s and MFU against the GPU's
catalog peak, and the ``cost.efficiency`` value to put in conf/cost/analytic.yaml for that GPU
type (achieved / peak, counting 3 x forward FLOPs, or 4 x with ``--recompute``).

Then (``--loop``, the default) the closed loop of ``bench/gpu_loop.py`` on the same GPU:
``hexicore profile`` -> ``plan cost=profiled`` -> ``train`` of a ``--layers``-block model,
predicted vs measured step time and peak memory, tokens/s and MFU, eager and with each block
compiled (``runtime.compile=true``); then again from the same profile with micro-batch 2 and
activation recomputation (eager only). ``--results`` writes both tables, with the
date and the GPU's name, into the ``## GPU figures`` section of docs/results.md.

Writes ``bench/out/gpu_calibrate.json`` and ``.md``. One prepared run, well under 8 minutes:

    python bench/gpu_calibrate.py --results             # on a CUDA machine
    python bench/gpu_calibrate.py --device cpu --model tiny --layers 2 --steps 2 --seq-len 64   # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
OUT = ROOT / "bench" / "out"


def gpu_type(name: str) -> str | None:
    """The catalog type of a CUDA device name (``NVIDIA H200`` -> ``h200``)."""
    n = name.lower().replace(" ", "")
    for key, cat in (("h200", "h200"), ("h100", "h100-80g"), ("a800", "a800-80g-nvlink"), ("a100", "a100-80g"),
                     ("4090", "rtx4090"), ("3090", "rtx3090"), ("3080ti", "rtx3080ti"), ("l40s", "l40s"),
                     ("a6000", "rtx-a6000"), ("v100", "v100-32g")):
        if key in n:
            return cat
    return None


def measure(args: argparse.Namespace, attn: str) -> dict:
    import torch

    from hexicore.core.model import ModelSpec
    from hexicore_plugins.runtimes.torch.model import llama

    spec = ModelSpec.load(ROOT / "conf" / "model" / f"{args.model}.yaml")
    seq = args.seq_len or spec.seq_len
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    chunk = llama.LlamaChunk(spec, 0, args.layers, first=False, last=False, recompute=args.recompute)
    chunk = chunk.to(device=dev, dtype=dtype)
    saved = llama._flash_attn_func
    if attn == "sdpa":
        llama._flash_attn_func = None
    try:
        x = torch.randn(args.micro_batch, seq, spec.hidden, device=dev, dtype=dtype, requires_grad=True)

        def step() -> None:
            out = chunk(x)
            out.float().pow(2).mean().backward()

        for _ in range(args.warmup):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.steps):
                step()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000 / args.steps
            peak_mem = torch.cuda.max_memory_allocated() / 2**30
        else:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds = (time.perf_counter() - t0) / args.steps
            peak_mem = None
    finally:
        llama._flash_attn_func = saved
    tokens = args.micro_batch * seq
    flops = tokens * args.layers * spec.layer_flops_per_token(seq) * (4.0 if args.recompute else 3.0)
    return {"attention": attn, "model": spec.name, "layers": args.layers, "seq_len": seq,
            "micro_batch": args.micro_batch, "step_s": seconds, "per_layer_s": seconds / args.layers,
            "tokens_per_s": tokens / seconds, "achieved_tflops": flops / seconds / 1e12, "peak_memory_gib": peak_mem}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="llama2_7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--out", default=str(OUT / "gpu_calibrate"))
    ap.add_argument("--no-loop", dest="loop", action="store_false", help="skip profile -> plan -> train")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="the first loop without its second, compiled run")
    ap.add_argument("--results", action="store_true", help="write the figures into docs/results.md")
    args = ap.parse_args(argv)

    import torch

    from hexicore.core.cluster import GPU_CATALOG
    from hexicore_plugins.runtimes.torch.model import llama

    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    kind = gpu_type(name) if args.device.startswith("cuda") else None
    peak = GPU_CATALOG[kind].tflops if kind else None
    rows = [measure(args, "sdpa")]
    if llama._flash_attn_func is not None and args.device.startswith("cuda"):
        rows.append(measure(args, "flash-attn"))
    for r in rows:
        r["gpu"], r["gpu_type"], r["peak_tflops"] = name, kind, peak
        r["mfu"] = r["achieved_tflops"] / peak if peak else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [f"GPU: {name} (catalog type {kind}, peak {peak} TFLOPS); {rows[0]['model']}-shaped blocks, "
             f"seq {rows[0]['seq_len']}, micro-batch {args.micro_batch}, {args.layers} layers, "
             f"recompute={args.recompute}", "",
             "| attention | step s | per layer s | tokens/s | achieved TFLOP/s | MFU |", "|---|---|---|---|---|---|"]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(f"| {r['attention']} | {r['step_s']:.4f} | {r['per_layer_s']:.4f} | {r['tokens_per_s']:.0f} | "
                     f"{r['achieved_tflops']:.2f} | {mfu} |")
    if kind:
        best = max(rows, key=lambda r: r["achieved_tflops"])
        lines += ["", f"Set `cost.efficiency.{kind}={best['mfu']:.3f}` to calibrate the analytic cost model."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    code = 0
    if args.loop:
        import gpu_loop

        loop = ["--device", args.device, "--model", args.model, "--layers", str(args.layers),
                *(["--seq-len", str(args.seq_len)] if args.seq_len else [])]
        first = [] if args.compile else ["--no-compile"]
        # the second loop checks another shape against the same profile: two micro-batches of two
        # sequences each, with activation recomputation (the memory and time models' other branch)
        again = ["--micro-batch", "2", "--global-batch", "8", "--recompute", "--no-compile",
                 "--profile-file", str(OUT / "gpu_loop" / "profile.yaml")]
        for name, extra in (("gpu_loop", first), ("gpu_loop_mb2_recompute", again)):
            code = max(code, gpu_loop.main([*loop, *extra, "--out", str(OUT / name)]))
            lines += ["", (OUT / f"{name}.md").read_text().strip()]
    if args.results:
        from results import write_section

        date = time.strftime("%Y-%m-%d", time.gmtime())
        write_section("## GPU figures", f"Measured {date} by `python bench/gpu_calibrate.py --results`.\n\n"
                      + "\n".join(lines))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
