"""The closed loop on one GPU: profile it, plan from the profile, train a few steps, and compare
the predicted step time and peak memory with the measured ones.

A one-machine cluster of this host's first GPU (its catalog type, from
:func:`gpu_calibrate.gpu_type`) and a ``--layers``-block model shaped like ``--model``
(Llama-2-7B by default, the full vocabulary and sequence length) go through the commands a user
runs: ``hexicore profile`` (bf16 on CUDA: SDPA, or flash-attn when it imports, as the runtime
picks), ``hexicore plan cost=profiled``, ``hexicore evaluate`` with the analytic model (catalog
peak x efficiency) and with the profile, and ``hexicore train`` (``--steps`` steps, synthetic
data), then once more with ``runtime.compile=true`` (each block compiled; ``--no-compile``
skips it); metrics.json's ``predicted`` and ``measured`` objects give the comparison, and the
table adds tokens/s and MFU against the catalog peak, eager and compiled. Each step is
kept even when a later one fails (the error is recorded), so one GPU session always leaves
figures. On a CPU host (``--device cpu``) the same loop runs in fp32 as a smoke test.

    python bench/gpu_loop.py                                   # on a CUDA machine
    python bench/gpu_loop.py --device cpu --model tiny --layers 2 --steps 3 --seq-len 64

Writes ``bench/out/gpu_loop.json`` and ``.md`` (the working files: ``bench/out/gpu_loop/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from gpu_calibrate import gpu_type  # noqa: E402


def host(device: str) -> tuple[str, str, dict]:
    """``(device name, catalog type, gpus entry)``: the CUDA device's catalog type, or a CPU
    stand-in with its own ``gpus:`` entry (nominal peak; the profile carries the real speed)."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(0)
        kind = gpu_type(name)
        if kind is None:
            raise SystemExit(f"no catalog type for GPU {name!r}: add it to gpu_calibrate.gpu_type")
        return name, kind, {}
    return "cpu", "host_cpu", {"host_cpu": {"tflops": 1.0, "memory_gb": 16}}


def write_inputs(args, out: Path) -> tuple[Path, Path, str]:
    """The cluster and model files of the loop; returns them and the GPU's name."""
    import yaml

    name, kind, gpus = host(args.device)
    cluster = {"name": "gpu_host", "machines": [{"name": "G", "gpu": kind, "count": 1, "bandwidth_gbs": 100.0,
                                                 "latency_us": 5.0}]}
    if gpus:
        cluster["gpus"] = gpus
    model = yaml.safe_load((ROOT / "conf" / "model" / f"{args.model}.yaml").read_text())
    model.update(name=f"{model['name']}_{args.layers}l", layers=args.layers)
    if args.seq_len:
        model["seq_len"] = args.seq_len
    (out / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    (out / "model.yaml").write_text(yaml.safe_dump(model, sort_keys=False))
    return out / "cluster.yaml", out / "model.yaml", name


def step(record: dict, key: str, cmd: list[str], log: Path) -> bool:
    """Run one command, its output in ``log``; record its seconds, or its failure."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    record[f"{key}_s"] = round(time.perf_counter() - t0, 2)
    if code:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        record.setdefault("errors", []).append(f"{key} exited {code}: {' | '.join(tail)}")
    return code == 0


def predicted(plan: Path, cost: list[str]) -> dict | None:
    """``hexicore evaluate``'s estimate of ``plan`` under ``cost`` (iteration seconds, MFU,
    tokens/s), read through the library (the CLI prints it with a unit); None if it refuses."""
    from hexicore.app import api
    from hexicore.core.errors import HexicoreError

    try:
        est = api.evaluate(plan, overrides=cost).estimate
    except HexicoreError as exc:
        return {"error": str(exc)}
    return {"iteration_s": est.iteration_s, "mfu": est.mfu, "tokens_per_s": est.tokens_per_s}


def trained(rec: dict, key: str, cmd: list[str], run_dir: Path, log: Path) -> dict:
    """Train (``cmd``, its seconds as ``<key>_s``) and return (and record under ``key``) the
    median step after the first, tokens/s and the run's predicted and measured objects
    (metrics.json); empty if it failed."""
    if not step(rec, key, cmd, log):
        return {}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    steps = metrics.get("step_s") or []
    rec[key] = {"step_s": steps, "measured_step_s": statistics.median(steps[1:] or steps) if steps else None,
                "tokens_per_s": metrics.get("tokens_per_s"), "predicted": metrics.get("predicted"),
                "measured": metrics.get("measured")}
    return rec[key]


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster, model, name = write_inputs(args, out)
    cuda = args.device.startswith("cuda")
    dtype = "bf16" if cuda else "fp32"
    hexi = [sys.executable, "-m", "hexicore.app.cli"]
    recompute = f"train.recompute={str(args.recompute).lower()}"
    common = [f"cluster_file={cluster}", f"model_file={model}", f"train.dtype={dtype}", recompute,
              f"hydra.run.dir={out / 'hydra'}"]
    rec: dict = {"gpu": name, "device": args.device, "dtype": dtype, "model": args.model, "layers": args.layers,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    prof, plan, run_dir = out / "profile.yaml", out / "plan.json", out / "run"
    rec.update(micro_batch=args.micro_batch, recompute=args.recompute, global_batch=args.global_batch)
    if args.profile_file:  # an earlier loop's profile of this GPU and model
        prof, ok = Path(args.profile_file), Path(args.profile_file).is_file()
    else:
        ok = step(rec, "profile", [*hexi, "profile", *common, "profile.micro_batches=[1,2]", "profile.tp=[1]",
                                   f"profile.repeats={args.repeats}", f"out={prof}", "overwrite=true"], out / "profile.log")
    cost = ["cost=profiled", f"cost.profile_file={prof}"] if ok else ["cost=analytic"]
    rec["planned_with"] = cost[0]
    ok = step(rec, "plan", [*hexi, "plan", *common, *cost, f"train.global_batch={args.global_batch}",
                            f"train.micro_batch={args.micro_batch}", "schedule=1f1b", f"out={plan}", "overwrite=true"],
              out / "plan.log")
    if not ok:
        return rec
    rec["analytic"] = predicted(plan, ["cost=analytic"])
    if prof.exists():
        rec["profiled"] = predicted(plan, ["cost=profiled", f"cost.profile_file={prof}"])
    train = [*hexi, "train", f"plan_file={plan}", *cost, f"train.steps={args.steps}", f"train.dtype={dtype}", recompute,
             "runtime.progress=false", "overwrite=true", f"hydra.run.dir={out / 'hydra'}"]
    rec.update(trained(rec, "train", [*train, f"out={run_dir}"], run_dir, out / "train.log"))  # (its figures at the top too)
    if args.compile:  # the same run with each block compiled (torch.compile)
        trained(rec, "compiled", [*train, "runtime.compile=true", f"out={run_dir}_compiled"], Path(f"{run_dir}_compiled"),
                out / "train_compiled.log")
    return rec


def table(rec: dict) -> str:
    """The Markdown lines of one loop's figures: predicted (analytic, profiled) and measured step,
    tokens/s and MFU (eager and compiled), and peak memory against the prediction."""
    def f(x, unit=""):
        return "n/a" if x is None else (f"{x:.4g}{unit}" if isinstance(x, float) else f"{x}{unit}")

    analytic, profiled = rec.get("analytic") or {}, rec.get("profiled") or {}

    def mfu(step_s):  # the analytic estimate's FLOPs and peak, over this step time
        if step_s is None or not analytic.get("iteration_s"):
            return None
        return analytic["mfu"] * analytic["iteration_s"] / step_s

    lines = [f"Closed loop on {rec['gpu']} ({rec['date']}): {rec['model']}-shaped model with {rec['layers']} "
             f"blocks, {rec['dtype']}, global batch {rec.get('global_batch')} of micro-batch {rec.get('micro_batch')}, "
             f"recompute={rec.get('recompute')}, 1F1B on one device, planned with `{rec['planned_with']}`; "
             f"profile {rec.get('profile_s', 'n/a')} s, train {rec.get('train_s', 'n/a')} s (whole commands).", "",
             "| quantity | analytic (catalog) | profiled | measured | measured, compiled |", "|---|---|---|---|---|"]
    runs = [rec.get(k) or {} for k in ("train", "compiled")]
    steps = [r.get("measured_step_s") for r in runs]
    lines.append(f"| step s | {f(analytic.get('iteration_s'))} | {f(profiled.get('iteration_s'))} | {f(steps[0])} | "
                 f"{f(steps[1])} |")
    lines.append(f"| tokens/s | {f(analytic.get('tokens_per_s'))} | {f(profiled.get('tokens_per_s'))} | "
                 f"{f(runs[0].get('tokens_per_s'))} | {f(runs[1].get('tokens_per_s'))} |")
    lines.append(f"| MFU (catalog peak) | {f(analytic.get('mfu'))} | {f(mfu(profiled.get('iteration_s')))} | "
                 f"{f(mfu(steps[0]))} | {f(mfu(steps[1]))} |")
    peaks = []
    for r in runs:
        pm = ((r.get("predicted") or {}).get("peak_memory_gb") or [None])[0]
        mm = ((r.get("measured") or {}).get("peak_memory_gb") or [None])[0]
        peaks.append((pm, mm, None if pm is None or not mm else (pm - mm) / mm))
    def pct(x):
        return "n/a" if x is None else f"{x:+.1%}"

    lines.append(f"| peak memory GB (rank 0): predicted / measured (error) | | | {f(peaks[0][0])} / {f(peaks[0][1])} "
                 f"({pct(peaks[0][2])}) | {f(peaks[1][0])} / {f(peaks[1][1])} ({pct(peaks[1][2])}) |")
    for e in rec.get("errors", []):
        lines.append(f"\nFailed: {e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="llama2_7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--recompute", action="store_true", help="train (and plan) with activation recomputation")
    ap.add_argument("--profile-file", default=None, help="reuse this profile instead of profiling again")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="skip the second run with runtime.compile=true")
    ap.add_argument("--out", default=str(HERE / "out" / "gpu_loop"))
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rec = run(args)
    path = Path(args.out)
    path.with_suffix(".json").write_text(json.dumps(rec, indent=2) + "\n")
    path.with_suffix(".md").write_text(table(rec) + "\n")
    print(table(rec))
    return 1 if rec.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
