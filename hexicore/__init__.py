"""hexicore: plan and run LLM training on heterogeneous GPU clusters.

Library API: :func:`plan`, :func:`evaluate`, :func:`load_plan`, :func:`simulate`,
:func:`compose` — see :mod:`hexicore.api`. ``hexicore.plan`` is the function (the plan data
model lives in the submodule, imported as ``from hexicore.plan import Plan``).
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib as _importlib  # noqa: E402

from hexicore.errors import HexicoreError  # noqa: E402

# The submodules ``hexicore.plan`` and ``hexicore.simulate`` share their names with the API
# functions: load them first, then bind the functions over the package attributes (a loaded
# submodule is never re-bound; ``from hexicore.plan import Plan`` keeps working).
_importlib.import_module("hexicore.plan")
_importlib.import_module("hexicore.simulate")
from hexicore.api import compose, evaluate, load_plan, plan, simulate  # noqa: E402  (rebinds hexicore.plan)

__all__ = ["plan", "evaluate", "load_plan", "simulate", "compose", "HexicoreError"]
