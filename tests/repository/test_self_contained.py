"""The repository stands alone: code, tests, configs and docs cite only files in this repository
(or papers by title) — never design notes or issue numbers kept elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: built from pieces so that this file does not match itself
FORBIDDEN = re.compile("|".join([r"DESIGN" + r"\.md", r"REFERENCE" + r"\.md", r"\.\./" + "shared",
                                 r"\bnotes/" + r"[a-z]+\.md", r"\b[Ii]ssues? #?\d+\b"]))
FOLDERS = ("hexicore", "plugins", "conf", "docs", "bench", "examples", "tests")
SUFFIXES = {".py", ".md", ".yaml", ".toml", ".txt", ".cfg"}


def test_no_citation_outside_the_repository():
    files = [p for f in FOLDERS for p in (ROOT / f).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    files += [ROOT / "README.md", ROOT / "pyproject.toml"]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits[:20])
