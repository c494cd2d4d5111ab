"""The model's two ends from a profile: the head (norm, output projection, loss) and the token
embedding of one micro-batch, priced from a profile's ``heads`` and ``embeddings`` entries
(:class:`hexicore.core.profile.HeadTiming`, ``hexicore.profile/2``; a /1 file's single head is
one entry at TP 1).

    seconds = interpolate({(work(e), forward_s(e) + backward_s(e))}, work(plan))

over the entries measured at the stage's TP degree, else at the nearest degree measured: the
runtime keeps the head and the embedding whole on every TP rank, so a TP rank's time does not
depend on the degree (never divided by it). ``work`` is what the part's time grows with: the
tokens times ``hidden x vocab`` for the head (its matrix product), times ``hidden`` for the
embedding (a row gathered per token); between two measured sizes the time is affine in it,
beyond them proportional (:func:`hexicore.cost.measured_block.interpolate`).
"""

from __future__ import annotations

from typing import Sequence

from hexicore.core.model import ModelSpec
from hexicore.core.profile import HeadTiming
from hexicore.core.settings import TrainSettings
from hexicore.cost.measured_block import interpolate


def head_work(tokens: float, hidden: int, vocab: int) -> float:
    """The head's work: ``tokens x hidden x vocab`` (its output projection)."""
    return tokens * hidden * vocab


def embedding_work(tokens: float, hidden: int, vocab: int) -> float:
    """The embedding's work: ``tokens x hidden`` (one row gathered per token)."""
    return tokens * hidden


def end_s(entries: Sequence[HeadTiming], model: ModelSpec, train: TrainSettings, tp: int, work=head_work) -> float | None:
    """Seconds of one micro-batch of the part the ``entries`` measured (module docstring) on a
    rank of a TP group of ``tp``; None without entries."""
    if not entries:
        return None
    near = min({e.tp for e in entries}, key=lambda t: (abs(t - tp), t))
    pts = [(work(e.micro_batch * e.seq_len, e.hidden or model.hidden, e.vocab or model.vocab), e.forward_s + e.backward_s)
           for e in entries if e.tp == near]
    return interpolate(pts, work(train.micro_batch * train.seq_len, model.hidden, model.vocab))
