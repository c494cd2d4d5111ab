"""Documented limits on sizes hexicore accepts (docs/formats.md, "Limits").

Every command's time and memory follow the real problem, never a number a user typed: a size
beyond one of these limits is refused up front with one line naming the field, the value and the
limit (:func:`check`), before anything is built. The limits sit well above every cluster, model
and schedule the papers describe (HexiScale's largest setting is 256 GPUs; Llama 2 70B has 80
blocks) and low enough that the work they allow fits in seconds and a few GB.
"""

from __future__ import annotations

from typing import Any

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown

#: GPUs in one cluster (also the ranks of one pipeline)
MAX_DEVICES = 4096
#: transformer blocks of one model
MAX_LAYERS = 1024
#: sequences in one global batch
MAX_GLOBAL_BATCH = 1 << 20
#: micro-batches of one pipeline (global batch / micro-batch)
MAX_MICRO_BATCHES = 1 << 16
#: tokens in one sequence
MAX_SEQ_LEN = 1 << 20
#: waves (or chunks) of one schedule
MAX_WAVES = 256
#: actions in one set of action lists (a file, or what one simulation builds)
MAX_ACTIONS = 1 << 24
#: timed repeats of one ``hexicore profile`` measurement
MAX_REPEATS = 1000
#: bytes of one message ``hexicore profile`` times (point to point, all-reduce)
MAX_MESSAGE_BYTES = 1 << 30

#: the range, (smallest, largest), of each physical figure a cluster file gives: generous for any
#: real hardware, so that a slipped exponent (``1.0e+300``, ``1.0e-300``) is refused instead of
#: pricing every step at 0 s or at 1e296 s
TFLOPS = (1e-6, 1e6)  # peak TFLOP/s of one GPU
MEMORY_GB = (1e-6, 1e5)  # GB of one GPU
BANDWIDTH_GBS = (1e-6, 1e6)  # GB/s of one link, one direction
LATENCY_US = (0.0, 1e7)  # microseconds of one link (10 s)
PROFILED_S = (0.0, 1e5)  # seconds of one measured block, head, action or optimizer step (a day)
SIM_TIME = (1e-9, 1e9)  # one forward, backward or transfer in `simulate` (its unit, seconds by default)
SCHEDULE_S = (1e-15, 1e5)  # seconds of one stage (forward + backward) or hop a schedule records (hops may be 0)

TABLE = {"devices": MAX_DEVICES, "layers": MAX_LAYERS, "global batch": MAX_GLOBAL_BATCH,
         "micro-batches": MAX_MICRO_BATCHES, "sequence length": MAX_SEQ_LEN, "waves": MAX_WAVES,
         "actions": MAX_ACTIONS, "profile repeats": MAX_REPEATS, "profiled message bytes": MAX_MESSAGE_BYTES}


def check(value: Any, limit: int, what: str, *, source: str | None = None, field: str | None = None) -> None:
    """Refuse ``value`` above ``limit`` (one line: the field, the value, the limit). A float or a
    numeric string counts by its number (``1e9`` reads as a float and a schedule takes ``"2"``
    as 2: neither may slip past the limit); other values are left to the field's own check."""
    n = count(value)
    if n is not None and n > limit:
        text = (shown(n) if isinstance(n, int) and n.bit_length() > 200 else f"{n:,}" if isinstance(n, int)
                else f"{int(n):,}" if n.is_integer() else f"{n:g}")
        raise HexicoreError(f"{text} {what} is above hexicore's limit of {limit:,} (docs/formats.md, Limits)",
                            source=source, field=field)


def count(value: Any) -> float | int | None:
    """``value`` as a number to compare with a limit (infinity included), or None (a bool, NaN,
    text that is no number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and value == value:
        return value
    return None


def quantity(value: Any, bounds: tuple[float, float], unit: str, source: str | None, field: str) -> float:
    """A finite number within ``bounds`` (inclusive; one of the ranges above), else one line
    naming the field, the value and the range."""
    low, high = bounds
    v = schema.number(value, source, field, allow_zero=low == 0)
    if not low <= v <= high:
        text = f"{v:g}" if float(f"{v:g}") == v else repr(float(v))  # never shown as the bound it passes
        raise HexicoreError(f"{text} {unit} is outside hexicore's range of {low:g} to {high:g} {unit} "
                            "(docs/formats.md, Limits)", source=source, field=field)
    return v


def bandwidth(value: Any, source: str | None, field: str) -> float:
    """A link's ``bandwidth_gbs`` (:data:`BANDWIDTH_GBS`)."""
    return quantity(value, BANDWIDTH_GBS, "GB/s", source, field)


def latency(value: Any, source: str | None, field: str) -> float:
    """A link's ``latency_us`` (:data:`LATENCY_US`)."""
    return quantity(value, LATENCY_US, "us", source, field)
