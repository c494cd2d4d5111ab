"""Phase 2 shared by interchangeable parts on large clusters.

Above ``solver.machine_graph_above`` devices phase 1 hands out whole machines, and most parts
of one candidate are made of the same machine classes (same GPU type and links, the classes of
:meth:`hexicore.planner.stages.StageTable.signature`). Under a ``class_priced`` cost model two
such parts have the same layouts with their devices renamed: a stage's time, memory and hops
depend only on its machine's class, its size and whether the next stage shares its machine. So
:func:`shared_phase2` lays out one part per signature — the part's machines ordered by class then
name, each with its device count — and renames that layout's devices for every other part of the
signature. Phase 2 then costs per distinct signature rather than per part (thousands of parts
in a 4096-GPU search). The search below the threshold is unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

from hexicore.planner.stages import Layout


def canonical(ctx: Any, part: Sequence[str]) -> tuple[list[str], tuple] | None:
    """The part's devices in canonical order (machines by class, then name; devices by index)
    and its signature; None when the cost model is not ``class_priced``."""
    classes = ctx.table._classes
    if classes is None:
        return None
    cl = ctx.problem.cluster
    by: dict[str, list] = {}
    for d in part:
        by.setdefault(cl.device(d).machine, []).append(cl.device(d))
    ids = ctx.class_ids
    order = sorted(by, key=lambda m: (ids.setdefault(classes[m], len(ids)), m))
    canon = [d.id for m in order for d in sorted(by[m], key=lambda dev: dev.index)]
    return canon, tuple((ids[classes[m]], len(by[m])) for m in order)


def shared_phase2(ctx: Any, part: Sequence[str], k: int, n_mb_max: int, seed: int, lay_out: Any) -> Layout | None:
    """``lay_out(devices, k, n_mb_max, seed)`` (phase 2 proper) once per signature, renamed for ``part``."""
    found = canonical(ctx, part)
    if found is None:
        return lay_out(list(part), k, n_mb_max, seed)
    canon, sig = found
    key = ("shared", sig, k, n_mb_max)
    if key not in ctx.phase2_cache:
        ctx.phase2_cache[key] = (tuple(canon), lay_out(canon, k, n_mb_max, seed))
    rep, lay = ctx.phase2_cache[key]
    if lay is None or rep == tuple(canon):
        return lay
    rename = dict(zip(rep, canon))
    return Layout(tuple(tuple(rename[d] for d in g) for g in lay.stages), lay.layers, lay.stage_s, lay.hop_s)
