"""The ``torch`` runtime: from a composed config to a launched, checked training run.

Everything that can be wrong with a run — an unknown schedule, TP not dividing the heads, more
stages than layers, a missing checkpoint — is found here, in the launching process, before any
worker starts (one line, exit 2). Only then are the workers launched (:mod:`.launch`).
"""

from __future__ import annotations

import os
from typing import Any

from hexicore.core.errors import HexicoreError

from .layout import Layout, plan_layout, reference_layout, single_pipeline_layout

DTYPES = ("fp32", "bf16", "fp16")


class TorchRuntime:
    """Executes action lists on torch.distributed (gloo on CPU, NCCL on CUDA)."""

    def __init__(self, backend: str = "auto", timeout_s: float = 120, lr: float = 3e-4, eps: float = 1e-5,
                 weight_decay: float = 0.1,
                 data: str = "synthetic", data_file: str | None = None, progress: bool = True,
                 start_method: str = "spawn", fault: Any = None, **unknown: Any):
        if unknown:
            raise HexicoreError(f"unknown runtime key {sorted(unknown)[0]!r}", field=f"runtime.{sorted(unknown)[0]}")
        if backend not in ("auto", "gloo", "nccl"):
            raise HexicoreError(f"unknown backend {backend!r}; choose one of: auto, gloo, nccl", field="runtime.backend")
        if not float(timeout_s) > 0:
            raise HexicoreError("must be positive", field="runtime.timeout_s")
        self.params = dict(backend=backend, timeout_s=float(timeout_s), lr=float(lr), eps=float(eps),
                           weight_decay=float(weight_decay),
                           data=str(data), data_file=data_file, progress=bool(progress),
                           fault=dict(fault) if fault else None)
        self.start_method = start_method

    # ---------------------------------------------------------------- config
    def layout(self, cfg: Any) -> tuple[Layout, str | None]:
        """The layout a config asks for (``parallel=none`` | ``plan_file`` | ``schedule`` + ranks)."""
        from hexicore.app.compose import group_params, load_model
        from hexicore.core.plan import Plan

        model = load_model(cfg)
        t = cfg.train
        seq_len = int(t.seq_len) if t.get("seq_len") is not None else model.seq_len
        parallel = str(cfg.get("parallel", "pipeline"))
        if parallel == "none":
            return reference_layout(model, global_batch=int(t.global_batch), micro_batch=int(t.micro_batch),
                                    seq_len=seq_len), None
        if parallel != "pipeline":
            raise HexicoreError(f"unknown parallel {parallel!r}; choose one of: none, pipeline", field="parallel")
        schedule = group_params(cfg, "schedule") or {"name": "1f1b"}
        if cfg.get("plan_file"):
            from hexicore.app.compose import build_cost_model, evaluate
            from hexicore.registry import Registry

            path = str(cfg.plan_file)
            plan = Plan.load(path)  # parse + hexicore.core.plan.check_structure
            evaluate(plan, build_cost_model(cfg, Registry.default()), source=path)  # what `hexicore evaluate` checks
            seq = plan.train.seq_len if t.get("seq_len") is None else seq_len
            return plan_layout(plan, schedule, seq_len=seq, source=path), path
        return single_pipeline_layout(model, schedule, int(cfg.pipeline.ranks), global_batch=int(t.global_batch),
                                      micro_batch=int(t.micro_batch), seq_len=seq_len), None

    def check_plan(self, plan: Any, source: str | None = None) -> Layout:
        """Everything this runtime adds to the plan validator (TP divides heads, kv heads and FFN;
        every schedule chunk gets a layer; ...): raises ``PlanError`` on a plan it cannot run.
        ``hexicore evaluate`` calls it too, so both agree on what a plan means (no torch needed)."""
        return plan_layout(plan, {"name": "1f1b"}, seq_len=plan.train.seq_len, source=source)

    def spec(self, cfg: Any, out: str | None):
        """A :class:`RunSpec` for this config (validated, nothing launched)."""
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise HexicoreError("runtime 'torch' needs PyTorch, which is not installed: pip install "
                                "'hexicore[torch]' (the CPU build: pip install torch==2.13.0)", field="runtime")
        from .trainer import RunSpec

        layout, plan = self.layout(cfg)
        t = cfg.train
        dtype = str(t.get("dtype", "fp32"))
        if dtype not in DTYPES:
            raise HexicoreError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}", field="train.dtype")
        steps = int(t.steps)
        every = int(t.get("checkpoint_every") or 0)
        if steps < 1 or every < 0:
            raise HexicoreError("train.steps must be >= 1 and train.checkpoint_every >= 0", field="train.steps")
        resume = cfg.get("resume")
        if resume:
            from . import checkpoint

            resume = str(checkpoint.resolve(str(resume)))
        self.check_memory(layout)
        if self._nccl():
            from .layout import check_fifo

            for p in layout.pipelines:
                check_fifo(p.actions, plan)
        if self.params["data"] == "text":
            from .data import make_source

            make_source("text", vocab=layout.model.vocab, seq_len=layout.seq_len, global_batch=1, seed=0,
                        path=self.params["data_file"])
        return RunSpec(layout=layout, steps=steps, seed=int(cfg.get("seed") or 0), dtype=dtype,
                       recompute=bool(t.get("recompute", False)), out=out, resume=resume, checkpoint_every=every,
                       plan=plan, **self.params)

    def check_memory(self, layout: Layout) -> None:
        """Refuse a local run whose weights, gradients and AdamW state (16 bytes per fp32
        parameter, per model copy and pipeline) cannot fit this machine (activations not counted)."""
        from .launch import in_torchrun

        if in_torchrun():
            return
        import torch

        copies = sum(len(p.actions.chains) for p in layout.pipelines)
        need = 16 * layout.model.total_params() * copies
        if torch.cuda.is_available():
            have = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
            need, where = need / max(layout.world, 1), "per GPU"
        else:
            have, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "on this machine"
        if need > 0.9 * have:
            raise HexicoreError(f"model {layout.model.name!r} needs about {need / 2**30:.1f} GiB {where} for weights, "
                                f"gradients and AdamW state, and there are {have / 2**30:.1f} GiB (try model=tiny)",
                                field="model")

    def _nccl(self) -> bool:
        if self.params["backend"] == "gloo":
            return False
        if self.params["backend"] == "nccl":
            return True
        import torch

        return torch.cuda.is_available()

    # ------------------------------------------------------------------- run
    def run(self, specs: list, nproc: int | None = None) -> list[dict[str, Any] | None]:
        """Launch ``specs`` (in sequence, one job) on ``nproc`` workers (default: the layout's world)."""
        from .launch import launch

        nproc = nproc or max(s.layout.world for s in specs)
        return launch(list(specs), nproc, start_method=self.start_method)
