"""Forward and backward seconds of each stage: the two passes inside App. A's STAGE time.

HexiScale App. A prices a stage's forward + backward of one micro-batch as one number (STAGE,
:meth:`hexicore.cost.analytic.AnalyticCostModel.stage_s`). To compare a run's measured passes
with the prediction, the estimate's breakdown also carries each stage's forward and backward
part (``forward_s`` + ``backward_s`` = ``stage_s``, per pipeline). The split follows the same
formulas the stage time is made of:

* compute: the forward share of the stage's FLOPs, ``1/k`` with ``k = 3`` (forward, backward =
  2x forward) or ``k = 4`` under recomputation (the recomputed forward belongs to the backward);
  a cost model may measure it instead (``forward_fraction``, the profiled model's measured
  block forward over forward + backward + recompute);
* TP communication: of App. A's ``c`` all-reduces per layer (8, or 12 under recomputation), the
  forward runs 4 (Megatron-LM: two per block in the forward, two in the backward, plus the
  recomputed forward's two), so the forward part is ``4 / c``;
* vocabulary parallelism's all-reduces (:meth:`~hexicore.cost.analytic.AnalyticCostModel.vocab_comm_s`):
  the embedding's and the cross-entropy's belong to the forward, the head input gradient's to the backward;
* ZeRO-3 per micro-batch traffic (:meth:`~hexicore.cost.analytic.AnalyticCostModel.zero3_stage_s`):
  one of its three halves (the weight all-gather before the forward) belongs to the forward.
"""

from __future__ import annotations

from typing import Any, Sequence

from hexicore.core.plan import Pipeline, Plan


def compute_forward_fraction(recompute: bool) -> float:
    """The forward's share of a stage's compute FLOPs: 1/3, or 1/4 with recomputation."""
    return 1.0 / (4.0 if recompute else 3.0)


def tp_forward_fraction(recompute: bool) -> float:
    """The forward's share of App. A's per-layer TP all-reduces: 4 of 8, or 4 of 12."""
    return 4.0 / (12.0 if recompute else 8.0)


def forward_backward(cost: Any, plan: Plan, pipeline: Pipeline,
                     stage_times: Sequence[float]) -> tuple[list[float], list[float]]:
    """Per stage of ``pipeline`` (one micro-batch each): ``(forward_s, backward_s)`` with
    ``forward + backward == stage_times[j]`` (the pipeline's STAGE times, ZeRO-3 included).
    ``cost`` is the analytic model or one built on it (``compute_s``, ``tp_comm_s``, and
    optionally ``forward_fraction(cluster, model, train, devices)`` and ``stage_terms``, the
    copies each stage runs under its schedule's placement, each weighted by its traffic)."""
    cluster, model, train = plan.cluster, plan.model, plan.train
    last = len(pipeline.stages) - 1
    terms_of = getattr(cost, "stage_terms", None)  # the copies each stage runs (its schedule's placement)
    terms = terms_of(pipeline, pipeline.n_micro_batches(train.micro_batch)) if terms_of is not None else \
        [[(1.0, s.n_layers, j == 0, j == last)] for j, s in enumerate(pipeline.stages)]
    z3 = {}
    if train.zero_stage == 3 and len(plan.pipelines) > 1:
        i = next(k for k, q in enumerate(plan.pipelines) if q.stages == pipeline.stages)  # any schedule priced
        z3 = {j: v for (p, j), v in cost.zero3_stage_s(plan).items() if p == i}
    share = getattr(cost, "forward_fraction", None)
    forward, backward = [], []
    for j, (s, total) in enumerate(zip(pipeline.stages, stage_times)):
        frac = share(cluster, model, train, s.devices) if share is not None else \
            compute_forward_fraction(train.recompute)
        f = sum(w * (cost.compute_s(cluster, model, train, s.devices, n, last=h) * frac
                     + cost.tp_comm_s(cluster, model, train, s.devices, n) * tp_forward_fraction(train.recompute)
                     + cost.vocab_comm_s(cluster, model, train, s.devices, first=e, last=h)[0])
                for w, n, e, h in terms[j]) + z3.get(j, 0.0) / 3.0
        f = min(f, total)
        forward.append(f)
        backward.append(total - f)
    return forward, backward
