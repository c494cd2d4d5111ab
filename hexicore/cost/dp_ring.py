"""COMM-DP-LAYER of HexiScale App. A for many pipelines, vectorised over the holders.

:meth:`hexicore.cost.analytic.AnalyticCostModel.dp_layer_s` prices one layer's gradient
all-reduce among the stages (one per pipeline) that hold it: every device sums, over the chunks
it holds and every other holder of each chunk, ``alpha + chunk / (|D| * beta)``, and the layer
costs twice the largest such sum. With many pipelines that is ``chunks x |D|^2`` terms per
layer; :func:`ring_layer_s` computes the same terms as arrays (per machine pair, from
:attr:`hexicore.core.cluster.Cluster.link_matrices`) and sums each device's terms in the loop's
order with a cumulative sum, so the result is the loop's to the last bit.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

#: below this many terms (chunks x holders x (holders - 1)) the plain loop is faster
MIN_TERMS = 256
GB = 1e9


def ring_layer_s(cluster: Any, holders: Sequence[Any], n_params: float, dtype_bytes: int) -> float:
    """``max_d 2 * sum_{c in chunks(d)} sum_{d' != d holds c} (alpha + chunk / (|D| beta))``
    with even shares (the loop of ``dp_layer_s`` without ``weight``)."""
    n = len(holders)
    chunks = math.lcm(*(s.tp for s in holders))
    chunk = n_params * dtype_bytes / chunks
    share = chunk * (1.0 / n)  # the loop's ``chunk * share`` with share = 1 / n
    row_of, bw, lat = cluster.link_matrices
    rows = np.array([[row_of[s.devices[c * s.tp // chunks]] for s in holders] for c in range(chunks)])
    pick = (rows[:, :, None], rows[:, None, :])  # (chunk, holder, peer) -> machine pair
    terms = lat[pick] * 1e-6 + share / (bw[pick] * GB)
    off = ~np.eye(n, dtype=bool)
    per = terms[:, off].reshape(chunks, n, n - 1).transpose(1, 0, 2)  # holder, chunk, other holders in order
    worst = 0.0
    for tp in sorted({s.tp for s in holders}):
        idx = [i for i, s in enumerate(holders) if s.tp == tp]
        seq = per[idx].reshape(len(idx), tp, (chunks // tp) * (n - 1))  # device k of a holder: its chunks' terms
        worst = max(worst, float(2.0 * np.cumsum(seq, axis=2)[:, :, -1].max()))
    return worst
