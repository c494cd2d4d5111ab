"""``hexicore simulate schedule=NAME [schedule.waves=W] pipeline.ranks=P pipeline.micro_batches=M
[timing.forward=TF timing.backward=TB timing.comm=TC] [out=DIR] [simulate.files=auto|all|[...]]``
(docs/cli.md).

Builds the schedule's action lists (comm inserted), validates and simulates them, writes
``actions.json``, ``summary.json``, ``trace.json`` (Chrome trace, µs) and ``timeline.png`` to
``out`` (default: Hydra's output dir) and prints the summary. Above :data:`FULL_FILES_MAX`
actions, ``simulate.files=auto`` writes only ``summary.json`` and a summary ``timeline.png``
(per-rank busy and idle time): the events of millions of actions cost far more to record and
write than to simulate; ``simulate.files=all`` (or a list) asks for the rest. TF/TB are one micro-batch through
one rank's whole share, TC one transfer; times are read as seconds for the trace. Next to the
simulated bubble it prints the schedule's own closed-form bubble where it declares one
(the schedule's ``closed_bubble``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hexicore.app import compose as app

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError
from hexicore.core.ownership import check_dir
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.pipeline.actions import ActionList
from hexicore.registry import Registry, require
from hexicore.pipeline.schedule import SIMULATED, ScheduleSpec
from hexicore.pipeline.simulate import SimResult
from hexicore.app.sweep import record
from hexicore.pipeline.timeline import chrome_trace, save_timeline
from hexicore.pipeline.validate import validate_actions

SRC = "command line"
#: a schedule's words for its inputs -> the keys that set them here
FIELDS = {"ranks": "pipeline.ranks", "micro_batches": "pipeline.micro_batches"}
SUMMARY_FORMAT = "hexicore.summary/1"
#: actions per (rank, micro-batch, wave) a schedule builds at most, comm included (F, B, W and
#: their sends and receives): the up-front bound checked against hexicore.core.limits.MAX_ACTIONS
ACTIONS_PER_CELL = 12
#: above this many actions ``simulate.files=auto`` writes summary.json and a summary timeline only
FULL_FILES_MAX = 100_000
NAMES = ("actions", "summary", "trace", "timeline")
#: what ``simulate`` writes into ``out``, with each file's kind (hexicore.core.ownership)
FILES = (("actions.json", "hexicore.actions"), ("summary.json", "hexicore.summary"),
         ("trace.json", "hexicore.trace"), ("timeline.png", "hexicore.png"))


def summary(al: ActionList, res: SimResult, tf: float, tb: float, tc: float,
            closed_bubble: float | None = None) -> dict[str, Any]:
    """The simulation's summary (summary.json); ``closed_bubble`` is the schedule's own
    closed-form bubble ratio for these inputs, where it has one."""
    return {"schedule": al.schedule.to_dict(), "ranks": al.ranks, "stages": al.stages, "micro_batches": al.micro_batches,
            "timing": {"forward": tf, "backward": tb, "comm": tc},
            "makespan": res.makespan, "bubble_ratio": res.bubble_ratio, "closed_form_bubble": closed_bubble,
            "busy": list(res.busy), "peak_activations": list(res.peak_activations),
            "weight_copies": len(al.chains),
            "actions": al.n_actions, "format": SUMMARY_FORMAT}


def print_summary(s: dict[str, Any], note: str | None = None) -> None:
    """The summary as a table and a line; ``note`` (the schedule's own, e.g. the free
    parameters it chose) under it."""
    from rich.table import Table

    from hexicore.app.report import console

    sched = ", ".join(f"{k}={v}" for k, v in s["schedule"].items() if k not in ("name", "auto"))
    t = Table(title=f"simulate {s['schedule'].get('name')}{f' ({sched})' if sched else ''}: P={s['ranks']}, "
                    f"M={s['micro_batches']}, {s['stages']} stages")
    for c in ("rank", "busy (time units)", "idle (time units)", "peak activations (micro-batches)"):
        t.add_column(c, justify="right")
    for r, (b, a) in enumerate(zip(s["busy"], s["peak_activations"])):
        t.add_row(str(r), f"{b:.4g}", f"{s['makespan'] - b:.4g}", f"{a:.3g}")
    out = console()
    out.print(t)
    cf = s["closed_form_bubble"]
    out.print(f"makespan {s['makespan']:.6g} time units (those of timing.forward, timing.backward and timing.comm)"
              f"   bubble ratio {s['bubble_ratio']:.4f}"
              + (f"   (closed form {cf:.4f})" if cf is not None else "")
              + f"   weight copies {s['weight_copies']}")
    if note:
        out.print(note)


def schedule_ref(cfg: DictConfig, registry: Registry) -> ScheduleRef:
    """The configured schedule section."""
    return ScheduleRef.from_mapping(app.group_params(cfg, "schedule", registry) or None, source=SRC)


def schedule_of(cfg: DictConfig, registry: Registry) -> Any:
    """The configured schedule plugin object."""
    ref = schedule_ref(cfg, registry)
    return registry.create("schedule", ref.name, **ref.kwargs())


def files_of(cfg: DictConfig) -> tuple[str, ...] | None:
    """``simulate.files``: the files asked for (None: ``auto``, decided by the size)."""
    v = (cfg.get("simulate") or {}).get("files", "auto")
    if v in (None, "auto"):
        return None
    if v == "all":
        return NAMES
    names = [v] if isinstance(v, str) else list(schema.as_list(v, SRC, "simulate.files"))
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise HexicoreError(f"unknown file {bad[0]!r}; choose auto, all or a list of: {', '.join(NAMES)}",
                            source=SRC, field="simulate.files")
    return tuple(n for n in NAMES if n in names)


def _depth(ref: ScheduleRef) -> float:
    """How many times P x M cells of actions building ``ref`` makes: its waves or chunks (a
    number, a float or a numeric string by its value, :func:`limits.count`), and for ``waves:
    auto`` every W it builds and simulates, 1 + 2 + ... + ``max_waves`` (the default 8 where absent)."""
    def number(key: str, default: float = 1.0) -> float:
        v = limits.count(ref[key]) if key in ref else None  # anything else: the schedule's own check names it
        return v if v is not None and v >= 1 else default

    if ref.get("waves") == "auto":
        top = min(number("max_waves", 8.0), limits.MAX_WAVES)  # above: the schedule's own check names it
        return top * (top + 1) / 2
    return max(number("waves"), number("chunks"))


def build(cfg: DictConfig, registry: Registry | None = None, *,
          record: bool | None = None) -> tuple[ActionList, SimResult, dict[str, Any]]:
    """Action lists (comm inserted, validated), their simulation and the summary for ``cfg``
    (schedules from ``registry``; the command builds the default one). ``record`` keeps every
    event (for trace.json and a block-by-block timeline); None: only up to
    :data:`FULL_FILES_MAX` actions (recording millions of events costs far more than simulating)."""
    registry = registry if registry is not None else Registry.default()
    pipe, timing = cfg.get("pipeline") or {}, cfg.get("timing") or {}
    P = schema.integer(pipe.get("ranks"), SRC, "pipeline.ranks")
    M = schema.integer(pipe.get("micro_batches"), SRC, "pipeline.micro_batches")
    tf = limits.quantity(timing.get("forward", 1.0), limits.SIM_TIME, "s", SRC, "timing.forward")
    tb = limits.quantity(timing.get("backward", 2.0), limits.SIM_TIME, "s", SRC, "timing.backward")
    tc = limits.quantity(timing.get("comm", 0.0), (0.0, limits.SIM_TIME[1]), "s", SRC, "timing.comm")
    limits.check(P, limits.MAX_DEVICES, "ranks", source=SRC, field="pipeline.ranks")
    limits.check(M, limits.MAX_MICRO_BATCHES, "micro-batches", source=SRC, field="pipeline.micro_batches")
    ref = schedule_ref(cfg, registry)
    app.one_schedule(ref.name, "simulate", registry)
    depth = _depth(ref)
    auto = ref.get("waves") == "auto"
    limits.check(ACTIONS_PER_CELL * P * M * depth, limits.MAX_ACTIONS,
                 "actions (about, over every W that waves=auto tries)" if auto else "actions (about)", source=SRC,
                 field="schedule.max_waves" if auto else "pipeline.micro_batches")
    spec = ScheduleSpec(P, M, (tf,) * P, (tb,) * P, (tc,) * (P - 1))
    try:  # a schedule names its own words (micro_batches); here they are the command line's
        schedule = registry.create("schedule", ref.name, **ref.kwargs())
        require("schedule", ref.name, schedule, SIMULATED)
        al = schedule.actions(spec)
        validate_actions(al, comm=True)
    except HexicoreError as exc:
        raise app.on_command_line(exc, cfg, FIELDS) from None
    from hexicore.pipeline.simulate import simulate

    keep = record if record is not None else al.n_actions <= FULL_FILES_MAX
    res = simulate(al, spec.timing(al), record=keep, comm=True)
    return al, res, summary(al, res, tf, tb, tc, schedule.closed_bubble(spec, al.schedule))


def chosen(al: ActionList, asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The files to write: those asked for, else (``auto``) all four up to
    :data:`FULL_FILES_MAX` actions and summary + timeline (a summary picture) above."""
    if asked is not None:
        return asked
    return NAMES if al.n_actions <= FULL_FILES_MAX else ("summary", "timeline")


def write(out: Path, al: ActionList, res: SimResult, s: dict[str, Any],
          files: tuple[str, ...] = ("actions", "summary", "trace", "timeline")) -> list[str]:
    """The chosen ``files`` of actions.json, summary.json, trace.json (needs recorded events) and
    timeline.png (a Gantt chart, or a summary picture when that is not legible) into ``out``;
    the names written."""
    out.mkdir(parents=True, exist_ok=True)
    if "actions" in files:
        al.save(out / "actions.json")
    if "summary" in files:
        schema.write_text_atomic(out / "summary.json", json.dumps(s, indent=2) + "\n")
    if "trace" in files:
        if not res.events:
            raise HexicoreError("trace.json needs the simulation's events: build with record=True",
                                field="simulate.files")
        schema.write_text_atomic(out / "trace.json", json.dumps(chrome_trace(al, res), separators=(",", ":")) + "\n")
    if "timeline" in files:
        save_timeline(al, res, out / "timeline.png")
    return [f for name, f in zip(NAMES, ("actions.json", "summary.json", "trace.json", "timeline.png"))
            if name in files]


def run(cfg: DictConfig) -> int:
    asked = files_of(cfg)
    out = check_dir(Path(str(cfg.out)) if cfg.get("out") else app.output_dir(cfg),
                    [f for n, f in zip(NAMES, FILES) if asked is None or n in asked], overwrite=cfg.get("overwrite"))
    al, res, s = build(cfg, record=True if asked and "trace" in asked else None)
    written = write(out, al, res, s, chosen(al, asked))
    print_summary(s, schedule_of(cfg, Registry.default()).note(al.schedule))
    print(f"wrote {', '.join(written)} to {out}")
    if asked is None and len(written) < len(NAMES):
        print(f"({al.n_actions:,} actions: actions.json and trace.json are written when asked, "
              "e.g. simulate.files=all; timeline.png is a summary)")
    sched = s["schedule"]
    record({"command": "simulate", "schedule": sched.get("name"), "P": s["ranks"], "M": s["micro_batches"],
            "W": sched.get("waves"), "chunks": sched.get("chunks"), "makespan": s["makespan"],
            "bubble_ratio": s["bubble_ratio"], "closed_form_bubble": s["closed_form_bubble"],
            "peak_activations": max(s["peak_activations"]), "out": str(out)})
    return 0
