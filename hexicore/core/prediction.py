"""What a plan run is predicted to take, and its comparison with what the run measured.

``hexicore train`` writes two objects side by side into ``metrics.json`` (docs/formats.md,
"Training metrics"): ``predicted``, built here from the cost model's
:class:`~hexicore.core.estimate.Estimate` of the plan, and ``measured``, built by the runtime
with the same keys. ``hexicore evaluate`` prints the same ``predicted`` object without training.
Both are plain JSON data:

* ``step_s``: seconds per training step (the estimate's ``iteration_s``);
* ``pipelines_s``: per pipeline, the seconds of its schedule (``pipeline_s``);
* ``dp_sync_s``: the step-end data-parallel gradient sync (``dp_s``); the runtime measures the
  optimizer step together with the sync, and the profiled cost model prices it inside ``dp_s``
  where its profile measured it (:mod:`hexicore.cost.optimizer_step`; the analytic model does not);
* ``peak_memory_gb``: per rank (the plan's devices in order), the predicted peak of the run's
  tensors: ``memory_gb`` less the memory the cost model keeps free for the CUDA context and
  allocator slack (the breakdown's ``reserve_gb``, :class:`~hexicore.cost.analytic.AnalyticCostModel`),
  which a CUDA allocator's peak does not count;
* ``stages``: per pipeline, per stage, ``forward_s`` and ``backward_s`` of one micro-batch (the
  breakdown's ``forward_s``/``backward_s``, :mod:`hexicore.cost.split`); null when the cost
  model's breakdown does not split its stages;
* ``hops``: per pipeline, per boundary between stages ``j`` and ``j + 1``, the seconds one
  message, a micro-batch's activation or its gradient (the same bytes), takes to cross it: half
  the breakdown's ``hop_s`` (COMM-PP-HOP, which counts both directions); null when the breakdown
  has none.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hexicore.core.estimate import Estimate

#: the keys both objects carry, in the order they are written
KEYS = ("step_s", "pipelines_s", "dp_sync_s", "peak_memory_gb", "stages", "hops")


def predictions(estimate: Estimate, devices: Sequence[str]) -> dict[str, Any]:
    """The ``predicted`` object of a plan run from the cost model's ``estimate``; ``devices`` are
    the plan's devices in rank order (:attr:`hexicore.core.plan.Plan.devices`). Numbers are the
    estimate's, unchanged, but for the peaks, which leave out the breakdown's ``reserve_gb``."""
    parts = estimate.breakdown.get("pipelines") if isinstance(estimate.breakdown, Mapping) else None
    stages = None
    if isinstance(parts, Sequence) and parts and all(
            isinstance(p, Mapping) and "forward_s" in p and "backward_s" in p for p in parts):
        stages = [[{"forward_s": f, "backward_s": b} for f, b in zip(p["forward_s"], p["backward_s"])]
                  for p in parts]
    hops = [[h / 2 for h in p["hop_s"]] for p in parts] if isinstance(parts, Sequence) and parts and all(
        isinstance(p, Mapping) and "hop_s" in p for p in parts) else None
    reserve = estimate.breakdown.get("reserve_gb", 0.0) if isinstance(estimate.breakdown, Mapping) else 0.0
    reserve = reserve if isinstance(reserve, (int, float)) and not isinstance(reserve, bool) else 0.0
    peaks = [None if estimate.memory_gb.get(d) is None else round(max(estimate.memory_gb[d] - reserve, 0.0), 3)
             for d in devices]
    return {"step_s": estimate.iteration_s, "pipelines_s": list(estimate.pipeline_s), "dp_sync_s": estimate.dp_s,
            "peak_memory_gb": peaks, "stages": stages, "hops": hops}


def error_pct(predicted: Any, measured: Any) -> float | None:
    """``(predicted - measured) / measured`` in percent; None when either is missing or measured is 0."""
    if not isinstance(predicted, (int, float)) or not isinstance(measured, (int, float)) or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def comparison_rows(predicted: Mapping[str, Any] | None,
                    measured: Mapping[str, Any] | None) -> list[tuple[str, Any, Any, float | None]]:
    """Rows ``(quantity, predicted, measured, error %)`` of the two objects, either of which may be
    None (``evaluate`` has no measurement, a run without a plan no prediction): step, each
    pipeline, DP sync, each stage's forward and backward, each hop, each rank's peak memory."""
    p, m = dict(predicted or {}), dict(measured or {})

    def at(obj: Mapping[str, Any], key: str, *index: int) -> Any:
        v = obj.get(key)
        for i in index:
            if not isinstance(v, Sequence) or i >= len(v):
                return None
            v = v[i]
        return v

    def count(key: str, *index: int) -> int:
        return max((len(x) for x in (at(p, key, *index), at(m, key, *index)) if isinstance(x, Sequence)), default=0)

    rows = [("step_s", p.get("step_s"), m.get("step_s"))]
    rows += [(f"pipeline {i} s", at(p, "pipelines_s", i), at(m, "pipelines_s", i)) for i in range(count("pipelines_s"))]
    rows.append(("dp_sync_s", p.get("dp_sync_s"), m.get("dp_sync_s")))
    for i in range(count("stages")):
        for j in range(count("stages", i)):
            for kind in ("forward_s", "backward_s"):
                pv, mv = at(p, "stages", i, j), at(m, "stages", i, j)
                rows.append((f"pipeline {i} stage {j} {kind}", (pv or {}).get(kind), (mv or {}).get(kind)))
    rows += [(f"pipeline {i} hop {j} s", at(p, "hops", i, j), at(m, "hops", i, j))
             for i in range(count("hops")) for j in range(count("hops", i))]
    rows += [(f"rank {r} peak_memory_gb", at(p, "peak_memory_gb", r), at(m, "peak_memory_gb", r))
             for r in range(count("peak_memory_gb"))]
    return [(q, a, b, error_pct(a, b)) for q, a, b in rows]
