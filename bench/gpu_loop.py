"""The closed loop on one GPU: profile it, plan from the profile, train a few steps, and compare
the predicted step time and peak memory with the measured ones.

A one-machine cluster of this host's first GPU (its catalog type, from
:func:`gpu_calibrate.gpu_type`) and a ``--layers``-block model shaped like ``--model``
(Llama-2-7B by default, the full vocabulary and sequence length) go through the commands a user
runs: ``hexicore profile`` (bf16 on CUDA: SDPA, or flash-attn when it imports, as the runtime
picks), ``hexicore plan cost=profiled``, ``hexicore evaluate`` with the analytic model (catalog
peak x efficiency) and with the profile, and ``hexicore train`` (``--steps`` steps, synthetic
data); metrics.json's ``predicted`` and ``measured`` objects give the comparison. Each step is
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


def predicted_s(plan: Path, cost: list[str], log: Path) -> float | None:
    """The iteration time ``hexicore evaluate`` prints for ``plan`` under ``cost``."""
    cmd = [sys.executable, "-m", "hexicore.app.cli", "evaluate", f"plan_file={plan}", *cost,
           f"hydra.run.dir={log.parent / 'hydra'}"]
    text = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout
    log.write_text(text)
    for line in text.splitlines():
        if line.startswith("predicted iteration time"):
            return float(line.split()[3])
    return None


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
    rec["analytic_s"] = predicted_s(plan, ["cost=analytic"], out / "evaluate_analytic.log")
    if prof.exists():
        rec["profiled_s"] = predicted_s(plan, ["cost=profiled", f"cost.profile_file={prof}"],
                                        out / "evaluate_profiled.log")
    if step(rec, "train", [*hexi, "train", f"plan_file={plan}", *cost, f"train.steps={args.steps}",
                           f"train.dtype={dtype}", recompute, "runtime.progress=false",
                           f"out={run_dir}", "overwrite=true", f"hydra.run.dir={out / 'hydra'}"], out / "train.log"):
        metrics = json.loads((run_dir / "metrics.json").read_text())
        rec["step_s"] = metrics.get("step_s")
        rec["measured_step_s"] = statistics.median(rec["step_s"][1:] or rec["step_s"])
        rec["predicted"], rec["measured"] = metrics.get("predicted"), metrics.get("measured")
    return rec


def table(rec: dict) -> str:
    """The Markdown lines of one loop's figures."""
    def f(x, unit=""):
        return "n/a" if x is None else (f"{x:.4g}{unit}" if isinstance(x, float) else f"{x}{unit}")

    pred = rec.get("predicted") or {}
    meas = rec.get("measured") or {}
    pm, mm = (pred.get("peak_memory_gb") or [None])[0], (meas.get("peak_memory_gb") or [None])[0]
    lines = [f"Closed loop on {rec['gpu']} ({rec['date']}): {rec['model']}-shaped model with {rec['layers']} "
             f"blocks, {rec['dtype']}, global batch {rec.get('global_batch')} of micro-batch {rec.get('micro_batch')}, "
             f"recompute={rec.get('recompute')}, 1F1B on one device, planned with `{rec['planned_with']}`; "
             f"profile {rec.get('profile_s', 'n/a')} s, train {rec.get('train_s', 'n/a')} s (whole commands).", "",
             "| quantity | analytic (catalog) | profiled | measured |", "|---|---|---|---|",
             f"| step s | {f(rec.get('analytic_s'))} | {f(rec.get('profiled_s'))} | {f(rec.get('measured_step_s'))} |",
             f"| peak memory GB (rank 0) | | {f(pm)} | {f(mm)} |"]
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
