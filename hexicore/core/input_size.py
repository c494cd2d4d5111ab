"""How much of an input hexicore reads (docs/formats.md, "Limits"): a size limit per kind of
file, checked before the file is parsed (:func:`hexicore.core.schema.read_bytes` reads no byte
beyond it), and the bounded pieces a tokenizer is given. Memory follows these limits, never a
file's own size."""

from __future__ import annotations

#: bytes of one input file, by the kind a reader names it (:func:`file_bytes`); a kind not listed
#: (cluster, model, profile, plan, Hugging Face config, sidecar, checkpoint meta ...) takes
#: :data:`FILE_BYTES_DEFAULT`. Larger files are refused before they are read. Training data
#: (byte-level text, token files) is memory-mapped (:func:`hexicore.core.schema.map_regular`),
#: never read whole: it has no limit.
FILE_BYTES = {"action list": 1 << 30, "tokenizer": 256 << 20, "safetensors header": 100_000_000}
FILE_BYTES_DEFAULT = 64 << 20
#: characters of one piece of text a tokenizer is given at once (longer documents are cut into
#: pieces at a line or space boundary, their ids joined: prepare-data)
TOKENIZER_PIECE = 1 << 18
#: characters of one batch the tokenizer encodes at once (whatever ``prepare.batch_docs`` says): a
#: tokenizer holds about a hundred bytes per character of a word while it encodes it
TOKENIZER_BATCH = 1 << 20
#: bytes of one line of a JSON-lines input (each line is a document, read whole)
JSONL_LINE_BYTES = 256 << 20


def file_bytes(what: str) -> int:
    """The size limit of an input file of kind ``what`` (:data:`FILE_BYTES`)."""
    return FILE_BYTES.get(what, FILE_BYTES_DEFAULT)
