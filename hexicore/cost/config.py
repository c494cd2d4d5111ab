"""Building the ``analytic`` cost model from the ``cost:`` config section (conf/cost/analytic.yaml)."""

from __future__ import annotations

from typing import Any, Mapping

from hexicore.cost.analytic import AnalyticCostModel
from hexicore.cost.base import DEFAULT_EFFICIENCY, PipelineTimer


def cost_model_from_config(cfg: Mapping[str, Any] | None, *, pipeline_timer: PipelineTimer | None = None,
                           source: str = "cost") -> AnalyticCostModel:
    """Build the analytic model from the ``cost:`` config section (see conf/cost/analytic.yaml)."""
    from hexicore.core import schema

    d = dict(schema.as_mapping(cfg or {}, source, "cost"))
    eff = schema.as_mapping(d.get("efficiency") or {}, source, "cost.efficiency")
    efficiency = {str(k): schema.number(v, source, f"cost.efficiency.{k}") for k, v in eff.items()}
    for k, v in efficiency.items():
        if v > 1:
            from hexicore.core.errors import HexicoreError
            raise HexicoreError(f"efficiency must be in (0, 1], got {v:g}", source=source, field=f"cost.efficiency.{k}")
    sbp = d.get("state_bytes_per_param")
    default = schema.number(d.get("default_efficiency", DEFAULT_EFFICIENCY), source, "cost.default_efficiency")
    if default > 1:
        from hexicore.core.errors import HexicoreError
        raise HexicoreError(f"efficiency must be in (0, 1], got {default:g}", source=source,
                            field="cost.default_efficiency")
    return AnalyticCostModel(
        efficiency=efficiency,
        default_efficiency=default,
        state_bytes_per_param=None if sbp is None else schema.number(sbp, source, "cost.state_bytes_per_param"),
        sync_bytes_per_param=None if d.get("sync_bytes_per_param") is None else schema.number(
            d["sync_bytes_per_param"], source, "cost.sync_bytes_per_param"),
        reserve_gb=schema.number(d.get("reserve_gb", 1.0), source, "cost.reserve_gb", allow_zero=True),
        pipeline_timer=pipeline_timer,
    )
