"""Pictures of a simulated schedule: Chrome trace (Perfetto) and a matplotlib Gantt chart
(Chrome trace event format: complete events ``ph: "X"`` in µs; one row per rank like the papers' figures).
Both files are marked as hexicore's (``otherData.generator``, the PNG's ``Software`` text) and
written atomically (hexicore.core.schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexicore.core import schema
from hexicore.core.ownership import png_metadata
from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.timing import SimResult

COMM_ROW = 1000  # trace thread id offset of a rank's send row


def chrome_trace(al: ActionList, res: SimResult, unit_s: float = 1.0) -> dict[str, Any]:
    """``traceEvents``: one complete event per compute (row = rank) and per send (row = rank's
    sends, spanning until arrival); ``ts``/``dur`` in µs for times given in ``unit_s`` seconds."""
    us = 1e6 * unit_s
    ev: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0,
                                 "args": {"name": f"{al.schedule.get('name', 'schedule')} pipeline"}}]
    for r in range(al.ranks):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": COMM_ROW + r,
                   "args": {"name": f"rank {r} sends"}})
    for e in res.events:
        a = e.action
        comm = a.is_comm
        ev.append({"name": f"{a.op}{a.mb}" if a.mb is not None else a.op,
                   "cat": "communication" if comm else "computation", "ph": "X",
                   "ts": e.start * us, "dur": (e.end - e.start) * us, "pid": 0,
                   "tid": COMM_ROW + e.rank if comm else e.rank,
                   "args": {"stage": a.stage, "mb": a.mb, **({"peer": a.peer} if comm else {})}})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"generator": "hexicore"}}


#: the most compute blocks per rank a Gantt chart draws legibly; above it (or without recorded
#: events) :func:`save_timeline` draws the per-rank summary instead
LEGIBLE_BLOCKS = 600


def legible(al: ActionList, res: SimResult) -> bool:
    """Whether the Gantt chart of ``res`` can be drawn legibly (events recorded, few enough)."""
    if not res.events or al.ranks > 128:
        return False
    return sum(not e.action.is_comm for e in res.events) / max(al.ranks, 1) <= LEGIBLE_BLOCKS


def save_timeline(al: ActionList, res: SimResult, path: str | Path, title: str = "") -> Path:
    """The Gantt chart where it is legible (:func:`legible`), else :func:`save_summary_chart`."""
    return save_gantt(al, res, path, title) if legible(al, res) else save_summary_chart(al, res, path, title)


def save_summary_chart(al: ActionList, res: SimResult, path: str | Path, title: str = "") -> Path:
    """A timeline too large to draw block by block, summarised: per rank, its busy time and its
    idle time (makespan - busy) as one bar each, and the actions it runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.0, min(0.18 * al.ranks + 1.8, 30.0)))
    ys = [al.ranks - 1 - r for r in range(al.ranks)]
    busy = list(res.busy)
    ax.barh(ys, busy, color="tab:blue", label="busy")
    ax.barh(ys, [res.makespan - b for b in busy], left=busy, color="lightgrey", label="idle (bubble)")
    step = max(1, al.ranks // 32)
    ax.set_yticks([al.ranks - 1 - r for r in range(0, al.ranks, step)])
    ax.set_yticklabels([f"rank {r}" for r in range(0, al.ranks, step)], fontsize=7)
    ax.set_xlim(0, res.makespan or 1.0)
    ax.set_xlabel(f"time ({TIME_UNIT})")
    ax.set_title(title or f"{al.schedule.get('name')}: makespan {res.makespan:.4g}, bubble {res.bubble_ratio:.3f} "
                          f"(summary: {al.n_actions:,} actions are too many to draw one by one)", fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    try:
        schema.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110,
                                                         metadata=png_metadata("timeline")))
    finally:
        plt.close(fig)
    return path


def _chunks(res: SimResult) -> tuple[dict[tuple[int, int], int], bool]:
    """(rank, stage) -> the stage's chunk on that rank (0, 1, ... in stage order), and whether
    some rank holds several (an interleaved or V schedule)."""
    stages: dict[int, set[int]] = {}
    for e in res.events:
        if not e.action.is_comm and e.action.stage is not None:
            stages.setdefault(e.rank, set()).add(e.action.stage)
    chunk = {(r, st): k for r, held in stages.items() for k, st in enumerate(sorted(held))}
    return chunk, any(len(held) > 1 for held in stages.values())


#: the time axis of a simulated schedule: the units its timings are given in
TIME_UNIT = "units of timing.forward / timing.backward"


def save_gantt(al: ActionList, res: SimResult, path: str | Path, title: str = "", unit: str = TIME_UNIT) -> Path:
    """A row per rank; blocks coloured by micro-batch; forward light, backward (B, I) solid, W
    hatched, a rank's odd chunks (interleaved schedules) dotted and labelled ``<mb>c<chunk>``;
    the micro-batch number on blocks wide enough to read; the legend lists the kinds drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba

    cmap = plt.get_cmap("tab10")
    span = res.makespan or 1.0
    per_rank = sum(not e.action.is_comm for e in res.events) / max(al.ranks, 1)
    fig, ax = plt.subplots(figsize=(min(max(8.0, 0.12 * per_rank), 40.0), 0.45 * al.ranks + 1.8))
    chunk, several = _chunks(res)
    groups: dict[tuple[str, bool], tuple[list, list]] = {}
    for e in res.events:  # one collection per kind: drawing thousands of blocks stays fast
        a = e.action
        if a.is_comm:
            continue
        y = al.ranks - 1 - e.rank
        kind = a.op if a.op in ("F", "W") else "B"
        k = chunk[(e.rank, a.stage)]
        verts, colours = groups.setdefault((kind, k % 2 == 1), ([], []))
        verts.append(((e.start, y + 0.08), (e.start, y + 0.92), (e.end, y + 0.92), (e.end, y + 0.08)))
        colours.append(to_rgba(cmap(a.mb % 10), 0.45 if kind == "F" else 1.0))
        if (e.end - e.start) / span > 0.012:
            label = f"{a.mb}c{k}" if several else f"{a.mb}"
            ax.text((e.start + e.end) / 2, y + 0.5, label, ha="center", va="center", fontsize=6)
    for (kind, odd), (verts, colours) in groups.items():
        hatch = ("//" if kind == "W" else "") + (".." if odd else "")
        ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="black", linewidths=0.3,
                                         hatch=hatch or None))
    ax.set_xlim(0, span)
    ax.set_ylim(0, al.ranks)
    ax.set_yticks([al.ranks - 1 - r + 0.5 for r in range(al.ranks)])
    ax.set_yticklabels([f"rank {r}" for r in range(al.ranks)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or f"{al.schedule.get('name')}: makespan {res.makespan:.4g}, bubble {res.bubble_ratio:.3f}")
    kinds = {kind for kind, _ in groups}
    handles = [Patch(facecolor="grey", alpha=0.45, label="forward")] * ("F" in kinds)
    handles += [Patch(facecolor="grey", label="backward")] * ("B" in kinds)
    handles += [Patch(facecolor="white", edgecolor="black", hatch="//", label="W (weight grad)")] * ("W" in kinds)
    if any(odd for _, odd in groups):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="..",
                             label="odd chunks (c1, c3, ...: <micro-batch>c<chunk>)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (al.ranks + 2)),
              ncol=len(handles), fontsize=7)
    fig.tight_layout()
    path = Path(path)
    try:  # atomic, and marked as ours (hexicore.core.ownership)
        schema.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110,
                                                         metadata=png_metadata("timeline")))
    finally:
        plt.close(fig)
    return path
