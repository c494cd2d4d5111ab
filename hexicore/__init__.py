"""hexicore: plan and run LLM training on heterogeneous GPU clusters.

Library API: :func:`plan`, :func:`evaluate`, :func:`load_plan`, :func:`simulate`,
:func:`compose` — see :mod:`hexicore.api`. ``hexicore.plan`` is the function (the plan data
model lives in the submodule, imported as ``from hexicore.plan import Plan``).
"""

from __future__ import annotations

__version__ = "0.1.0"

from hexicore.errors import HexicoreError  # noqa: E402
from hexicore.api import compose, evaluate, load_plan, plan  # noqa: E402  (rebinds hexicore.plan)

__all__ = ["plan", "evaluate", "load_plan", "compose", "HexicoreError"]
