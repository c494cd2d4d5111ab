"""How the workers of a run are launched and kept in step: :class:`LaunchSettings`, the part of
the ``runtime`` config section (``runtime=torch``) that is the launcher's — the process-group
backend, how long a rank waits for a peer, the progress bar, how local workers are started, and
the ``runtime.fault`` testing aid. Its defaults are defined here and nowhere else; the runtime's
settings (:class:`~..runtime.TorchSettings`), the worker spec
(:class:`~..train.trainer.WorkerSpec`) and the profiling job
(:class:`~..profile.profiler.ProfileJob`) hold this object.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any, Mapping

from hexicore.core.errors import HexicoreError
from hexicore.core.fields import check_fields, flag, one_of, real, rule

#: ``runtime.backend``: ``auto`` is NCCL where CUDA is available, else gloo
BACKENDS = ("auto", "gloo", "nccl")
#: ``runtime.log``: where rank 0 also logs the training metrics (:mod:`..train.metric_log`)
LOGS = ("none", "tensorboard", "wandb")


def known_start_method(value: Any, name: str) -> None:
    """A start method this platform offers (:func:`multiprocessing.get_all_start_methods`)."""
    methods = multiprocessing.get_all_start_methods()
    if value not in methods:
        raise HexicoreError(f"unknown start method {value!r}; this platform offers: {', '.join(methods)}", field=name)


@dataclass(frozen=True)
class LaunchSettings:
    """``runtime.backend`` (gloo on CPU, NCCL on CUDA for ``auto``), ``runtime.timeout_s`` (a rank
    waiting longer than this for a peer fails the run: a dead or hung rank ends every rank within
    it), ``runtime.progress`` (a progress bar on rank 0 when stderr is a terminal),
    ``runtime.start_method`` (how the local launcher starts workers) and ``runtime.fault`` (testing
    aid: ``{"rank": r, "step": k, "kind": "die"|"hang"|"stop"}``, read by
    :func:`~..runtime.parse_fault`; None: no fault) and ``runtime.log`` (``none``, ``tensorboard``
    or ``wandb``: where rank 0 also logs the metrics, :mod:`..train.metric_log`) and
    ``runtime.compile`` (each transformer block compiled with ``torch.compile``, its inductor
    kernels: :func:`~..model.stage_module.build_stages`)."""

    backend: str = rule("auto", one_of(BACKENDS, "backend"), key="runtime.backend")
    timeout_s: float = rule(120.0, real(above=0), key="runtime.timeout_s")
    progress: bool = rule(True, flag, key="runtime.progress")
    start_method: str = rule("spawn", known_start_method, key="runtime.start_method")
    fault: Mapping[str, Any] | None = rule(None, None, key="runtime.fault")
    log: str = rule("none", one_of(LOGS, "log"), key="runtime.log")
    compile: bool = rule(False, flag, key="runtime.compile")

    def __post_init__(self) -> None:
        check_fields(self, "runtime")


def uses_nccl(backend: str) -> bool:
    """Whether ``runtime.backend`` means NCCL here (``auto``: where CUDA is available)."""
    if backend != "auto":
        return backend == "nccl"
    import torch

    return torch.cuda.is_available()


def check_links(links: Any, backend: str) -> Any:
    """Emulated links (a cluster's ``emulate: {links: true}``, :mod:`.emulated_links`) as the job
    runs them: they wrap gloo, so a run that would use NCCL is refused (one line naming
    ``runtime.backend``); ``links`` back."""
    if links is not None and uses_nccl(backend):
        raise HexicoreError("the cluster emulates its links (emulate: {links: true}), which runs on gloo: "
                            "give runtime.backend=gloo", field="runtime.backend")
    return links
