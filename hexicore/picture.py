"""plan.png: the cluster coloured by pipeline, and one bar per pipeline (issue 3, item 5).

Left: every machine is a column of its GPUs; a GPU's colour is its pipeline, its label
``p<i>s<j>`` the stage it serves; arrows join consecutive stages' leaders (the pipeline's path
through the cluster). Right: one horizontal bar per pipeline over the layer axis ``[0, L)``,
a segment per stage labelled with its devices and TP degree, and the pipeline's batch share.
matplotlib is imported lazily (Agg backend) so planning without pictures stays light.
"""

from __future__ import annotations

from pathlib import Path

from hexicore.plan import Plan

_LABEL_LIMIT = 96  # above this many devices, labels would overlap: draw colours only


def _positions(plan: Plan) -> dict[str, tuple[float, float]]:
    cols: dict[str, int] = {}
    pos = {}
    for d in plan.cluster.devices:
        x = cols.setdefault(d.machine, len(cols))
        pos[d.id] = (float(x), -float(d.index))
    return pos


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
    for d, (x, y) in pos.items():
        if d in where:
            i, j = where[d]
            ax.scatter([x], [y], s=260 if n_dev <= _LABEL_LIMIT else 40, color=cmap(i % cmap.N), zorder=3,
                       edgecolors="black", linewidths=0.5)
            if n_dev <= _LABEL_LIMIT:
                ax.annotate(f"p{i}s{j}", (x, y), ha="center", va="center", fontsize=6, zorder=4)
        else:
            ax.scatter([x], [y], s=260 if n_dev <= _LABEL_LIMIT else 40, facecolors="white", edgecolors="grey",
                       zorder=3)
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
    ax.set_title("devices by pipeline (p<i>s<j>: pipeline i, stage j)", fontsize=9)

    L = plan.model.layers
    for i, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            lo, hi = s.layers
            bx.barh(i, hi - lo, left=lo, color=cmap(i % cmap.N), edgecolor="black", alpha=0.85)
            if len(plan.pipelines) <= 24 and len(p.stages) <= 16:
                devs = s.devices[0] + (f"+{len(s.devices) - 1}" if len(s.devices) > 1 else "")
                bx.text((lo + hi) / 2, i, f"{devs}\ntp{s.tp}", ha="center", va="center", fontsize=6)
    bx.set_yticks(range(len(plan.pipelines)))
    bx.set_yticklabels([f"pipeline {i}\nbatch {p.batch}" for i, p in enumerate(plan.pipelines)], fontsize=7)
    bx.invert_yaxis()
    bx.set_xlim(0, L)
    bx.set_xlabel("transformer layers")
    est = plan.estimate or {}
    title = f"{plan.model.name} on {plan.cluster.name}"
    if est:
        title += f": {est['iteration_s']:.3g} s / iteration, MFU {100 * est['mfu']:.1f}%"
    bx.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
