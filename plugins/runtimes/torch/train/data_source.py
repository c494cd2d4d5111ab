"""Training data: a seeded synthetic token stream, a byte-level text file, a tokenized corpus.

A source returns the *global* batch of a step, ``[global_batch, seq_len + 1]`` token ids (inputs
are ``[:, :-1]``, labels ``[:, 1:]``), as a pure function of ``(seed, step)``. Every rank and the
``parallel=none`` reference therefore see the same rows in the same order, and a resumed run
sees exactly what the uninterrupted one saw. Pipeline ``p`` takes rows ``[offset_p, offset_p +
batch_p)``; its micro-batch ``m`` the ``m``-th slice of those. ``batch(step, lo, hi)`` returns
rows ``[lo, hi)`` only: for a token file (:class:`TokenData`, ``hexicore.tokens/1`` written by
``hexicore prepare-data``) only those windows are read from the memory-mapped ids.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from hexicore.core.errors import HexicoreError


def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_033 + int(step) * 7_919 + 12_345) % (2**63))


class SyntheticTokens:
    """Learnable synthetic sequences: each row counts from a random start by a random stride
    (mod vocab), so a model can drive the loss down, and the data cost nothing to produce."""

    def __init__(self, vocab: int, seq_len: int, global_batch: int, seed: int):
        self.vocab, self.seq_len, self.global_batch, self.seed = vocab, seq_len, global_batch, seed

    def batch(self, step: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        g = _generator(self.seed, step)
        start = torch.randint(0, self.vocab, (self.global_batch, 1), generator=g)
        stride = torch.randint(1, 8, (self.global_batch, 1), generator=g)
        pos = torch.arange(self.seq_len + 1).unsqueeze(0)
        return ((start + stride * pos) % self.vocab)[lo:hi]


def demo_text_path() -> Path:
    """The small text file shipped with the runtime for the byte-level demo."""
    return Path(str(resources.files("hexicore_plugins.runtimes.torch.train").joinpath("data", "demo.txt")))


class ByteText:
    """A text file tokenised at byte level (vocab 256): each row is a window at a seeded offset.
    The file is memory-mapped (:func:`hexicore.core.schema.map_regular`): a step reads its
    windows, never the whole text, so memory stays bounded whatever the file's size."""

    def __init__(self, path: str | Path | None, vocab: int, seq_len: int, global_batch: int, seed: int):
        from hexicore.core.schema import map_regular

        path = Path(path) if path else demo_text_path()
        if vocab < 256:
            raise HexicoreError(f"byte-level text needs a vocabulary of at least 256, the model has {vocab}",
                                field="model.vocab")
        self.data = map_regular(path, "text data", field="runtime.data_file")  # one byte a token
        if len(self.data) < seq_len + 2:
            raise HexicoreError(f"the text has {len(self.data)} bytes; windows of {seq_len + 1} need at least "
                                f"{seq_len + 2}", source=str(path), field="runtime.data_file")
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed

    def batch(self, step: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        from hexicore.core.token_file import windows

        g = _generator(self.seed, step)
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (self.global_batch,), generator=g)
        return torch.from_numpy(windows(self.data, starts[lo:hi].numpy(), self.seq_len + 1))


class TokenData:
    """A tokenized corpus (:mod:`hexicore.core.token_file`): seeded windows of ``seq_len + 1``
    ids; the step's window starts are a pure function of ``(seed, step)``
    (:func:`~hexicore.core.token_file.window_starts`), and only rows ``[lo, hi)`` are read."""

    def __init__(self, path: str | Path | None, vocab: int, seq_len: int, global_batch: int, seed: int,
                 check_ids: bool = True):
        from hexicore.core.token_file import TokenFile

        if not path:
            raise HexicoreError("runtime.data=tokens needs runtime.data_file=X.bin (hexicore prepare-data writes it)",
                                field="runtime.data_file")
        self.file = TokenFile.open(path)
        self.file.check(vocab, seq_len, ids=check_ids)
        self.data = self.file.array()
        self.seq_len, self.global_batch, self.seed, self.vocab = seq_len, global_batch, seed, vocab

    def batch(self, step: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Rows ``[lo, hi)`` of step ``step``; every id read is checked against the vocabulary
        (a sidecar's ``max_id`` is a shortcut for the up-front check, never trusted over the ids)."""
        from hexicore.core.token_file import window_starts, windows

        width = self.seq_len + 1
        starts = window_starts(self.seed, step, self.global_batch, self.file.tokens, width)[lo:hi]
        rows = windows(self.data, starts, width)
        if rows.size and not 0 <= int(rows.min()) <= int(rows.max()) < self.vocab:
            raise HexicoreError(f"holds token id {int(rows.max())} at or beyond the model's vocabulary of {self.vocab} "
                                "(its sidecar's max_id does not describe it: rerun prepare-data)",
                                source=self.file.path, field="runtime.data_file")
        return torch.from_numpy(rows)


def make_source(kind: str, *, vocab: int, seq_len: int, global_batch: int, seed: int, path: str | None = None,
                check_ids: bool = True):
    """``kind``: ``synthetic``, ``text`` (byte level; ``path`` or the shipped demo file) or
    ``tokens`` (a ``hexicore.tokens/1`` file at ``path``; ids checked against ``vocab`` unless
    ``check_ids`` is false: a worker whose launcher checked them)."""
    if kind == "tokens":
        return TokenData(path, vocab, seq_len, global_batch, seed, check_ids)
    if kind == "synthetic":
        return SyntheticTokens(vocab, seq_len, global_batch, seed)
    if kind == "text":
        return ByteText(path, vocab, seq_len, global_batch, seed)
    raise HexicoreError(f"unknown data {kind!r}; choose one of: synthetic, text, tokens", field="runtime.data")
