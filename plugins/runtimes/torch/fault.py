"""The testing aid ``runtime.fault``: a rank that dies, hangs or stops at a given step, to check
that every other rank ends the run within ``timeout_s`` (docs/runtime.md)."""

from __future__ import annotations

from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError

FAULT_KINDS = ("die", "hang", "stop")


def parse_fault(raw: Any) -> dict[str, Any] | None:
    """The testing aid ``runtime.fault``: ``{rank: R, step: K, kind: die|hang|stop}`` (``step``
    counts from 0, absent = 0; null or ``{}``: no fault). Its rank and step are checked against
    the run in :func:`check_fault`."""
    if raw is None:
        return None
    f = schema.as_mapping(raw, None, "runtime.fault")
    if not f:
        return None
    schema.known_keys(f, ("rank", "step", "kind"), None, "runtime.fault")
    rank = schema.integer(schema.get(f, "rank", None, "runtime.fault"), None, "runtime.fault.rank", minimum=0)
    step = schema.integer(f.get("step", 0), None, "runtime.fault.step", minimum=0)
    kind = schema.get(f, "kind", None, "runtime.fault")
    if kind not in FAULT_KINDS:
        raise HexicoreError(f"unknown fault kind {kind!r}; choose one of: {', '.join(FAULT_KINDS)}",
                            field="runtime.fault.kind")
    return {"rank": rank, "step": step, "kind": kind}


def check_fault(fault: Mapping[str, Any] | None, world: int, steps: int, start: int = 0) -> None:
    """A fault must hit a rank of the run (``0 .. world-1``) at one of the steps it trains
    (``start .. steps-1``; ``start``: the step a resumed run begins at)."""
    if fault is None:
        return
    if fault["rank"] >= world:
        raise HexicoreError(f"no rank {fault['rank']} in this run: its ranks are 0 to {world - 1}",
                            field="runtime.fault.rank")
    if not start <= fault["step"] < steps:
        raise HexicoreError(f"step {fault['step']} is never reached: this run trains steps {start} to {steps - 1}"
                            + (f" (resumed at step {start})" if start else f" (train.steps={steps})"),
                            field="runtime.fault.step")
