"""The cost model's verdict on a plan: :class:`Estimate` (the plan JSON's ``estimate`` object,
docs/formats.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on a plan (serialised into the plan's ``estimate``)."""

    iteration_s: float
    mfu: float
    tokens_per_s: float
    pipeline_s: tuple[float, ...]
    dp_s: float
    memory_gb: Mapping[str, float]
    oom: tuple[str, ...] = ()
    breakdown: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.oom

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "mfu": self.mfu, "tokens_per_s": self.tokens_per_s,
                "pipeline_s": list(self.pipeline_s), "dp_s": self.dp_s,
                "memory_gb": dict(self.memory_gb), "oom": list(self.oom), "breakdown": dict(self.breakdown)}
