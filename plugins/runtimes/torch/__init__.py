"""The ``torch`` runtime plugin: executes hexicore action lists on torch.distributed.

Laid out by parallelism (as torchtitan lays out its parallelisms), one concept per module:

* :mod:`.runtime` — :class:`~hexicore.core.run_spec.RunSpec` -> checked, launched run (settings,
  every check before launch, the ``runtime.fault`` testing aid);
* :mod:`.parallel` — :mod:`~.parallel.assignment` (every pipeline of a run: ranks, stage groups,
  chunk layers, action lists; no torch), :mod:`~.parallel.layout` (this rank's
  :class:`~.parallel.layout.ParallelLayout`), :mod:`~.parallel.parallelize` (tensor + pipeline,
  then data, in a fixed order), :mod:`~.parallel.tensor` (Megatron TP), :mod:`~.parallel.pipeline`
  (the executor of action lists), :mod:`~.parallel.tied_embedding`, :mod:`~.parallel.data` (DP
  gradient sync, ZeRO, hybrid sharding, the global gradient norm);
* :mod:`.model` — Llama chunks and a rank's stage modules (seed, checkpoint or Hugging Face weights);
* :mod:`.train` — the :class:`~.train.trainer.Trainer` and its state, lr schedule, data sources;
* :mod:`.checkpoint` — native (pickle-free) and sharded checkpoints, Hugging Face I/O;
* :mod:`.profile` — ``hexicore profile`` and the measurements of a training run;
* :mod:`.launch` — starting the workers (their settings, elastic launch / torchrun, clean stops),
  emulated devices.

This module imports no torch, so registering the plugin is cheap.
"""

from __future__ import annotations

from hexicore.hookspecs import PluginSpec, hookimpl


def _factory():
    """The runtime takes no parameters: its config section arrives in each run's
    :class:`~hexicore.core.run_spec.RunSpec` (``spec.runtime``)."""
    from .runtime import TorchRuntime

    return TorchRuntime()


@hookimpl
def hexicore_runtimes():
    yield PluginSpec(kind="runtime", name="torch", factory=_factory,
                     description="torch.distributed executor of action lists (gloo on CPU, NCCL on CUDA), "
                                 "tensor-parallel Llama")
