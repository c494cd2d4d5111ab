"""plan.png: the cluster coloured by pipeline, and one bar per pipeline.

Left: every machine is a column of its GPUs; a GPU's colour is its pipeline, its label
``p<i>s<j>`` the stage it serves; arrows join consecutive stages' leaders (the pipeline's path
through the cluster). Right: one horizontal bar per pipeline over the layer axis ``[0, L)``,
a segment per stage labelled with its devices and TP degree, and the pipeline's batch share.
matplotlib is imported lazily (Agg backend) so planning without pictures stays light.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from hexicore.core import schema
from hexicore.core.ownership import png_metadata
from hexicore.core.plan import Plan

_LABEL_LIMIT = 96  # above this many devices, labels would overlap: draw colours only


def _glyphs_quiet(draw: Callable[..., Path]) -> Callable[..., Path]:
    """``draw`` without matplotlib's warning per character its font lacks (a cluster named in
    another script, an emoji): the picture shows a box for it; stderr stays hexicore's."""
    @functools.wraps(draw)
    def quiet(*args: Any, **kwargs: Any) -> Path:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            return draw(*args, **kwargs)

    return quiet


def _positions(plan: Plan) -> dict[str, tuple[float, float]]:
    cols: dict[str, int] = {}
    pos = {}
    for d in plan.cluster.devices:
        x = cols.setdefault(d.machine, len(cols))
        pos[d.id] = (float(x), -float(d.index))
    return pos


def save_png(fig, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` as a marked PNG (hexicore.core.ownership), atomically, and close it."""
    import matplotlib.pyplot as plt

    schema.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, metadata=png_metadata("picture")))
    plt.close(fig)
    return path


def device_span(devices: Iterable[str]) -> str:
    """Devices as a short label that names each: per machine its indices, runs as ranges
    (``A1.0-2``, ``A1.0,3``, ``A.1+B.0``)."""
    by_machine: dict[str, list[str]] = {}
    for d in devices:
        machine, _, index = d.rpartition(".")
        by_machine.setdefault(machine, []).append(index)
    parts = []
    for machine, indices in by_machine.items():
        if not all(i.isdigit() for i in indices):
            parts += [f"{machine}.{i}" for i in indices]
            continue
        runs: list[list[int]] = []
        for i in sorted(int(x) for x in indices):
            if runs and i == runs[-1][1] + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        parts.append(f"{machine}." + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs))
    return "+".join(parts)


@_glyphs_quiet
def save_plan_picture(plan: Plan, path: str | Path) -> Path:
    """Draw ``plan`` to ``path`` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    path = Path(path)
    cmap = plt.get_cmap("tab20" if len(plan.pipelines) > 10 else "tab10")
    n_dev = len(plan.cluster.devices)
    machines = list(dict.fromkeys(d.machine for d in plan.cluster.devices))
    tall = max((m.count for m in plan.cluster.machines), default=1)
    fig_w = min(4 + 0.6 * len(machines), 24) + 7
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(fig_w, max(4.0, min(0.35 * tall + 2, 14))),
                                 gridspec_kw={"width_ratios": [max(1, len(machines)), 4]})
    pos = _positions(plan)
    where: dict[str, tuple[int, int]] = {}
    for i, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            for d in s.devices:
                where[d] = (i, j)
    size = 260 if n_dev <= _LABEL_LIMIT else 40
    used = [(x, y, cmap(where[d][0] % cmap.N)) for d, (x, y) in pos.items() if d in where]
    idle = [(x, y) for d, (x, y) in pos.items() if d not in where]  # no pipeline uses it (solver.idle)
    if used:  # (one collection per kind: a call per device took 0.6 s on 320 devices)
        ax.scatter([u[0] for u in used], [u[1] for u in used], s=size, c=[u[2] for u in used], zorder=3,
                   edgecolors="black", linewidths=0.5)
    if idle:
        ax.scatter([u[0] for u in idle], [u[1] for u in idle], s=size, facecolors="white", edgecolors="grey",
                   zorder=3)
    if n_dev <= _LABEL_LIMIT:
        for d, (x, y) in pos.items():
            if d in where:
                ax.annotate(f"{d}\ns{where[d][1]}", (x, y), ha="center", va="center", fontsize=5, zorder=4)
            else:
                ax.annotate("idle", (x, y), ha="center", va="center", fontsize=5, color="grey", zorder=4)
    for i, p in enumerate(plan.pipelines):
        for a, b in zip(p.stages, p.stages[1:]):
            (x0, y0), (x1, y1) = pos[a.leader], pos[b.leader]
            ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=8,
                                         color=cmap(i % cmap.N), alpha=0.7, connectionstyle="arc3,rad=0.15"))
    ax.set_xticks(range(len(machines)))
    ax.set_xticklabels([f"{m}\n{plan.cluster.machine(m).gpu.name}" for m in machines], fontsize=7,
                       rotation=90 if len(machines) > 12 else 0)
    ax.set_yticks([])
    ax.set_xlim(-0.7, len(machines) - 0.3)
    ax.set_ylim(-tall + 0.4, 0.7)
    ax.set_title("devices (colour: pipeline, s<j>: its stage j)", fontsize=9)
    idle = [g for g in (plan.solver or {}).get("idle") or [] if g.get("iteration_s") is not None]
    if idle:  # what each left-out group would cost: the best plan found that uses it
        ax.set_xlabel("\n".join(f"idle {g['name']}: best plan using it {g['iteration_s']:.3g} s" for g in idle[:4]),
                      fontsize=7)

    L = plan.model.layers
    for i, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            lo, hi = s.layers
            bx.barh(i, hi - lo, left=lo, color=cmap(i % cmap.N), edgecolor="black", alpha=0.85)
            if len(plan.pipelines) <= 24 and len(p.stages) <= 16:
                bx.text((lo + hi) / 2, i, f"{device_span(s.devices)}\ntp{s.tp}", ha="center", va="center", fontsize=6)
    bx.set_yticks(range(len(plan.pipelines)))
    bx.set_yticklabels([f"pipeline {i}\nbatch {p.batch}" for i, p in enumerate(plan.pipelines)], fontsize=7)
    bx.invert_yaxis()
    bx.set_xlim(0, L)
    bx.set_xlabel("transformer layers")
    est = plan.estimate
    title = f"{plan.model.name} on {plan.cluster.name}"
    if est is not None:
        title += f": {est.iteration_s:.3g} s / iteration, MFU {100 * est.mfu:.1f}%"
    bx.set_title(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    return path


@_glyphs_quiet
def save_cluster_picture(cluster, path: str | Path) -> Path:
    """The device graph of HexiScale §4.2: one box per machine with its GPUs (vertex weight
    TFLOPS in the label), intra-machine bandwidth in the box title, inter-machine links as
    edges labelled with their bandwidth (GB/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    path = Path(path)
    machines = list(cluster.machines)
    fig, ax = plt.subplots(figsize=(max(6, 2.6 * len(machines)), 4))
    centers = {}
    for x, m in enumerate(machines):
        cx = 2.6 * x
        centers[m.name] = cx
        ax.add_patch(FancyBboxPatch((cx - 1.0, -0.4 - 0.55 * m.count), 2.0, 0.55 * m.count + 0.9,
                                    boxstyle="round,pad=0.05", fc="#eef3fb", ec="#4a6fa5"))
        ax.text(cx, 0.35, f"machine {m.name}: {m.gpu.name}\nintra {m.bandwidth_gbs:g} GB/s", ha="center",
                va="center", fontsize=7)
        for i in range(m.count):
            did = f"{m.name}.{i}"
            gone = did in cluster.excluded
            ax.add_patch(FancyBboxPatch((cx - 0.8, -0.45 - 0.55 * i), 1.6, 0.42, boxstyle="round,pad=0.02",
                                        fc="white" if gone else "#ffd9a8", ec="grey"))
            ax.text(cx, -0.24 - 0.55 * i, f"{did}  {m.gpu.tflops:g} TF, {m.gpu.memory_gb:g} GB"
                    + ("  (excluded)" if gone else ""), ha="center", va="center", fontsize=6)
    pairs = [(a, b) for i, a in enumerate(machines) for b in machines[i + 1:]]
    for k, (a, b) in enumerate(pairs):
        bw = cluster.bandwidth_gbs(f"{a.name}.0", f"{b.name}.0") if a.count and b.count else cluster.inter_bandwidth_gbs
        y = 1.0 + 0.35 * k
        ax.annotate("", (centers[b.name], 0.6), (centers[a.name], 0.6),
                    arrowprops=dict(arrowstyle="-", connectionstyle=f"arc3,rad={-0.25 - 0.1 * k}", color="#a33"))
        ax.text((centers[a.name] + centers[b.name]) / 2, y, f"{a.name}-{b.name}: {bw:g} GB/s", ha="center",
                fontsize=7, color="#a33")
    tall = max(m.count for m in machines)
    ax.set_xlim(-1.4, 2.6 * (len(machines) - 1) + 1.4)
    ax.set_ylim(-0.7 - 0.55 * tall, 1.4 + 0.35 * len(pairs))
    ax.axis("off")
    ax.set_title(f"cluster {cluster.name}: {len(cluster.devices)} GPUs, {cluster.total_tflops:g} TFLOPS", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    return path


@_glyphs_quiet
def save_action_list_picture(al, path: str | Path, limit: int = 40) -> Path:
    """Per-rank action lists as a grid: one row per rank, one cell per action in list order,
    compute cells coloured by micro-batch, communication cells grey (first ``limit`` actions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    width = min(limit, max(len(a) for a in al.actions))
    fig, ax = plt.subplots(figsize=(0.55 * width + 1.5, 0.6 * al.ranks + 1.2))
    cmap = plt.get_cmap("tab10")
    for r, acts in enumerate(al.actions):
        for k, a in enumerate(acts[:width]):
            colour = cmap(a.mb % 10) if a.is_compute and a.mb is not None else "#dddddd"
            alpha = 0.45 if a.op == "F" else 0.95
            ax.add_patch(plt.Rectangle((k, -r - 0.9), 0.95, 0.8, fc=colour, alpha=alpha, ec="black", lw=0.3))
            label = str(a).replace("SEND_", "S").replace("RECV_", "R")
            ax.text(k + 0.47, -r - 0.5, label, ha="center", va="center", fontsize=5, rotation=90)
    ax.set_xlim(0, width)
    ax.set_ylim(-al.ranks, 0)
    ax.set_yticks([-r - 0.5 for r in range(al.ranks)])
    ax.set_yticklabels([f"rank {r}" for r in range(al.ranks)], fontsize=7)
    ax.set_xlabel("position in the rank's list: <stage><op><micro-batch>, SF/SB send forward/backward, RF/RB receive, ->peer", fontsize=7)
    ax.set_title(f"action lists: {al.schedule.get('name')} {dict((k, v) for k, v in al.schedule.items() if k != 'name')}"
                 f", P={al.ranks}, M={al.micro_batches}", fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    return path
