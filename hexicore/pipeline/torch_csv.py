"""Interop with torch.distributed.pipelining's CSV pipeline-order format.

torch's ``_PipelineScheduleRuntime._load_csv(path, format="compute_only"|"compute_comms")`` reads
one row per rank of action strings ``<stage><op><mb>`` (``2F0``, ``3SEND_F1``; ``_Action.from_str``)
and ``_dump_csv`` writes them. Our ops use the same vocabulary and the same stage convention
(SEND carries the sending stage, RECV the receiving one), so a hexicore schedule — Hanayo has no
torch implementation — can run on torch's runtime. Only single-chain lists convert (torch's IR
has one linear chain of stages); ``REDUCE`` and ``STEP`` have no torch counterpart here and are
dropped (torch runs the optimizer outside the schedule). No torch import: plain strings.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from hexicore.pipeline.actions import Action, ActionList
from hexicore.core.errors import HexicoreError

_ACTION = re.compile(r"^(\d+)(F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B)(\d+)$")


def torch_rows(al: ActionList, *, comms: bool = False) -> list[list[str]]:
    """Per-rank action strings; ``comms``: keep SEND/RECV (torch's "compute_comms")."""
    if len(al.chains) != 1 or list(al.chains[0]) != list(range(al.stages)):
        raise HexicoreError("torch's pipeline order has one linear chain of stages; this action list has "
                            f"{len(al.chains)} chains", field="chains")
    keep = ("F", "I", "B", "W") + (("SEND_F", "RECV_F", "SEND_B", "RECV_B") if comms else ())
    return [[f"{a.stage}{a.op}{a.mb}" for a in acts if a.op in keep] for acts in al.actions]


def save_torch_csv(al: ActionList, path: str | Path, *, comms: bool = False) -> Path:
    """Write ``al`` in torch's CSV format (one row per rank)."""
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(torch_rows(al, comms=comms))
    return path


def load_torch_csv(path: str | Path, schedule: str = "torch_csv") -> ActionList:
    """Read torch's CSV (either format) into an :class:`ActionList`; the stage map is inferred
    from where each stage's compute runs (as torch's ``_validate_schedule`` does)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as f:
        rows = [[c.strip() for c in row if c.strip()] for row in csv.reader(f)]
    parsed: list[list[tuple[int, str, int]]] = []
    for r, row in enumerate(rows):
        out = []
        for k, cell in enumerate(row):
            m = _ACTION.match(cell)
            if not m:
                raise HexicoreError(f"rank {r}, position {k}: cannot read action {cell!r}", source=str(path),
                                    field=f"row {r}")
            out.append((int(m.group(1)), m.group(2), int(m.group(3))))
        parsed.append(out)
    where: dict[int, int] = {}
    for r, row in enumerate(parsed):
        for s, op, _ in row:
            if op in ("F", "B", "I", "W") and where.setdefault(s, r) != r:
                raise HexicoreError(f"stage {s} computes on ranks {where[s]} and {r}", source=str(path))
    stages = max(where, default=-1) + 1
    if sorted(where) != list(range(stages)):
        raise HexicoreError(f"stages {sorted(set(range(stages)) - set(where))} never compute", source=str(path))
    mbs = 1 + max((mb for row in parsed for _, _, mb in row), default=-1)
    s2r = tuple(where[s] for s in range(stages))

    def peer(s: int, op: str) -> int | None:
        if op in ("SEND_F", "RECV_B"):
            return s2r[s + 1] if s + 1 < stages else None
        if op in ("SEND_B", "RECV_F"):
            return s2r[s - 1] if s > 0 else None
        return None

    acts = tuple(tuple(Action(op, s, mb, peer(s, op)) for s, op, mb in row) for row in parsed)
    return ActionList({"name": schedule}, len(parsed), stages, mbs, s2r, acts)
