"""The ``torch`` runtime plugin: executes hexicore action lists on torch.distributed.

Modules (one concept each): :mod:`.model` (Llama chunks), :mod:`.tensor_parallel` (Megatron
column/row parallel), :mod:`.layout` (ranks, pipelines, chunk layer ranges; no torch),
:mod:`.groups` (process groups), :mod:`.stage` (build + init of a rank's chunks: seed,
checkpoint or Hugging Face weights), :mod:`.tied` (tied embeddings across stages),
:mod:`.executor` (the action-list interpreter), :mod:`.data`, :mod:`.hf_io` (safetensors slices
in, Hugging Face directories out), :mod:`.checkpoint` (pickle-free checkpoints),
:mod:`.trainer` (one rank's loop), :mod:`.profile` + :mod:`.measure` (``hexicore profile``), :mod:`.launch` (elastic launch / torchrun), :mod:`.runtime`
(:class:`~hexicore.core.run_spec.RunSpec` -> checked, launched run). This module imports no torch, so registering the plugin is cheap.
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
