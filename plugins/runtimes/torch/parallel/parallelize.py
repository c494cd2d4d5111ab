"""One rank's model, parallelised in a fixed order (as torchtitan's ``parallelize`` applies its
parallelisms one after the other to a model).

1. **tensor + pipeline**: the stage chunks this rank's pipeline rank holds (:class:`~.layout.ParallelLayout`'s
   ``stage_chunks``, their layer ranges from the action lists, :mod:`.assignment`), each module built
   with Megatron's column/row-parallel linears for its TP group (:mod:`.tensor`) and filled with its TP
   shard of the initial weights; a tied head and embedding on one rank share one Parameter
   (:func:`~..model.stage_module.build_stages`);
2. **data**: with ``zero`` > 0, the sharded training state over the data-parallel chunk groups
   (:mod:`.data.zero_state`), attached to this rank's gradient sync (:mod:`.data.sync`), which then
   delegates the step to it. Plain data parallelism needs nothing here: the chunk groups exist
   since :meth:`~.layout.ParallelLayout.build`.

The executor (:mod:`.pipeline`) runs the result; an idle rank gets no stages.
"""

from __future__ import annotations

import torch

from hexicore.core.settings import OptimizerSettings

from ..model.stage_module import StageModule, TensorSource, build_stages
from .assignment import zero3_runs
from .data.zero_state import ShardedAdamW, ShardedOptimizer, ShardedState
from .layout import ParallelLayout


def parallelize(parallel: ParallelLayout, *, weights: TensorSource, recompute: bool, device: torch.device,
                optimizer: OptimizerSettings,
                compile: bool = False) -> tuple[dict[int, StageModule], ShardedOptimizer | None]:
    """This rank's stage chunks (index -> :class:`~..model.stage_module.StageModule`) and its
    ZeRO-sharded state (None without ZeRO), in the order of the module docstring; the sharded
    state steps AdamW under ``optimizer`` (lr, betas, ``eps``, ``weight_decay``)."""
    if parallel.role is None:
        return {}, None
    assignment = parallel.assignment
    stages = build_stages(assignment.model, parallel.pipeline, parallel.pipe_rank, parallel.tp, full=weights,
                          recompute=recompute, device=device, compile=compile)
    sharded = None
    if parallel.zero and parallel.data is not None:  # ZeRO: the DP-synced tensors step sharded
        sharded = _sharded(parallel, stages, lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
                           weight_decay=optimizer.weight_decay)
        parallel.data.sharded = sharded
    return stages, sharded


def _sharded(parallel: ParallelLayout, stages: dict[int, StageModule], **adam) -> ShardedOptimizer:
    """The sharded optimizer of this rank: ZeRO-2 for every layout and ZeRO-3 on one-stage or
    mirrored pipelines (:func:`.assignment.zero3_runs`; hybrid too: pieces inside each machine,
    summed across machines at the step), per micro-batch (:class:`.data.zero_state.ShardedState`);
    ZeRO-1, and ZeRO-2 under hybrid sharding, at the step (:class:`.data.zero_state.ShardedAdamW`)."""
    zero, machines = parallel.zero, parallel.machines
    if zero == 3 and not zero3_runs(parallel.assignment):
        raise ValueError("ZeRO-3 runs only on one-stage or mirrored pipelines (zero3_runs)")
    if zero == 3 or (zero == 2 and machines is None):
        params = {(s, n): p for s in sorted(stages) for n, p in stages[s].module.named_parameters()}
        return ShardedState(parallel.data, params, stage=zero, weights=parallel.shard_weights,
                            layout=parallel.assignment, stages=stages, machines=machines if zero == 3 else None,
                            **adam)
    device = next(p.device for stage in stages.values() for p in stage.module.parameters())
    return ShardedAdamW(parallel.data, weights=parallel.shard_weights, machines=machines, device=device, **adam)
