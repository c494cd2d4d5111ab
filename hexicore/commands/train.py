"""``hexicore train``: not available yet."""

from __future__ import annotations

from omegaconf import DictConfig

from hexicore.errors import HexicoreError


def run(cfg: DictConfig) -> int:
    raise HexicoreError("not available yet: needs the torch runtime capability (executor of action lists), "
                        "which has not landed", field="train")
