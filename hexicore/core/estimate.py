"""The cost model's verdict on a plan: :class:`Estimate`, the plan JSON's ``estimate`` object
(docs/formats.md, "Plan JSON").

An estimate read from a file and written back is the same JSON, byte for byte: numbers keep
their JSON type (``5820`` stays an int), keys keep their order, keys hexicore does not know
(written by another tool) are kept in :attr:`Estimate.extra`, and the optional ``oom`` and
``breakdown`` are written back only where the file had them (or where they carry something).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hexicore.core import schema
from hexicore.core.errors import HexicoreError, shown
from hexicore.core.fields import is_number

#: The keys every estimate carries (the plan JSON contract), in the order hexicore writes them.
REQUIRED = ("iteration_s", "mfu", "tokens_per_s", "pipeline_s", "dp_s", "memory_gb")
#: Keys hexicore writes too but a file from another tool may lack.
OPTIONAL = ("oom", "breakdown")
KNOWN = REQUIRED + OPTIONAL


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on a plan (seconds, GiB).

    ``iteration_s`` = slowest ``pipeline_s`` + ``dp_s`` (the analytic model of HexiScale App. A,
    :mod:`hexicore.cost.analytic`); ``mfu`` the model-FLOPs utilisation of the whole cluster;
    ``tokens_per_s`` the global batch's tokens over ``iteration_s``; ``memory_gb`` the predicted
    peak per device; ``oom`` the devices whose peak exceeds their memory; ``breakdown`` the cost
    model's own detail (for the analytic model: per pipeline ``stage_s``, ``hop_s``,
    ``micro_batches``); ``extra`` keys written by other tools, kept as they were.

    ``key_order`` is the key order of the JSON object this estimate was read from (empty for a
    fresh estimate); it only shapes :meth:`to_dict`, never equality.
    """

    iteration_s: float
    mfu: float
    tokens_per_s: float
    pipeline_s: tuple[float, ...]
    dp_s: float
    memory_gb: Mapping[str, float]
    oom: tuple[str, ...] = ()
    breakdown: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        clash = set(self.extra) & set(KNOWN)
        if clash:
            raise ValueError(f"extra must not repeat the estimate's own keys: {', '.join(sorted(clash))}")
        for name in ("pipeline_s", "oom", "key_order"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("memory_gb", "breakdown", "extra"):  # own copies: the caller's dicts may change
            object.__setattr__(self, name, dict(getattr(self, name)))

    @property
    def fits(self) -> bool:
        """True when every device's predicted peak memory fits (``oom`` is empty)."""
        return not self.oom

    @property
    def peak_memory_gb(self) -> float:
        """The largest predicted peak over the plan's devices (0 for a plan without devices)."""
        return max(self.memory_gb.values(), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's ``estimate`` object (plain dicts and lists, ready for ``json.dumps``)."""
        values = {"iteration_s": self.iteration_s, "mfu": self.mfu, "tokens_per_s": self.tokens_per_s,
                  "pipeline_s": list(self.pipeline_s), "dp_s": self.dp_s, "memory_gb": dict(self.memory_gb),
                  "oom": list(self.oom), "breakdown": _plain(self.breakdown)}
        values.update((k, _plain(v)) for k, v in self.extra.items())
        wanted = [k for k in values if k in REQUIRED or k in self.extra or k in self.key_order
                  or not self.key_order or values[k]]
        order = [k for k in self.key_order if k in wanted] + [k for k in wanted if k not in self.key_order]
        return {k: values[k] for k in order}

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None, prefix: str = "estimate") -> "Estimate":
        """Read an ``estimate`` object; a missing or mistyped field is a :class:`HexicoreError`
        naming ``source`` and the field (``estimate.mfu``)."""
        d = schema.as_mapping(data, source, prefix)
        for k in REQUIRED:
            schema.get(d, k, source, prefix)
        pipeline_s = tuple(_number(v, source, f"{prefix}.pipeline_s")
                           for v in schema.as_list(d["pipeline_s"], source, f"{prefix}.pipeline_s"))
        memory = schema.as_mapping(d["memory_gb"], source, f"{prefix}.memory_gb")
        oom = schema.optional_list(d, "oom", source, f"{prefix}.oom")
        return cls(
            iteration_s=_number(d["iteration_s"], source, f"{prefix}.iteration_s"),
            mfu=_number(d["mfu"], source, f"{prefix}.mfu"),
            tokens_per_s=_number(d["tokens_per_s"], source, f"{prefix}.tokens_per_s"),
            pipeline_s=pipeline_s,
            dp_s=_number(d["dp_s"], source, f"{prefix}.dp_s"),
            memory_gb={str(k): _number(v, source, f"{prefix}.memory_gb.{k}") for k, v in memory.items()},
            oom=tuple(schema.string(x, source, f"{prefix}.oom") for x in oom),
            breakdown=dict(schema.optional_mapping(d, "breakdown", source, f"{prefix}.breakdown")),
            extra={k: v for k, v in d.items() if k not in KNOWN},
            key_order=tuple(d),
        )


def _number(value: Any, source: str | None, field_: str) -> float:
    """A JSON number, returned unchanged (an int stays an int so it is written back as one)."""
    if not is_number(value):
        raise HexicoreError(f"expected a number, got {shown(value)}", source=source, field=field_)
    return value


def _plain(value: Any) -> Any:
    """A deep copy of JSON-like data as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
