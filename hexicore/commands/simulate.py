"""``hexicore simulate``: not available yet."""

from __future__ import annotations

from omegaconf import DictConfig

from hexicore.errors import HexicoreError


def run(cfg: DictConfig) -> int:
    raise HexicoreError("not available yet: needs the pipeline-schedules capability (action lists, validator, "
                        "event simulator), which has not landed", field="simulate")
