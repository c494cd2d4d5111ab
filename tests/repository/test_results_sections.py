"""bench/results.py: a benchmark rewrites only its own section of docs/results.md, and keeps the
hand-written notes that follow the section's notes line (what a run shows, what was tried)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_rewritten_section_keeps_its_notes_and_the_other_sections(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "results", raising=False)
    results = importlib.import_module("results")
    path = tmp_path / "results.md"
    path.write_text(f"# Results\n\n## A\n\nold table\n\n{results.NOTES}\n\nwhy it moved\n\n## B\n\nb's table\n")
    for body in ("new table", "newer table"):
        results.write_section("## A", body + "\n", path)
        text = path.read_text()
        assert f"## A\n\n{body}\n\n{results.NOTES}\n\nwhy it moved\n\n## B\n\nb's table\n" in text
        assert "old table" not in text and text.count(results.NOTES) == 1
    results.write_section("## B", "b again\n", path)  # no notes line: the body alone
    assert path.read_text().endswith("## B\n\nb again\n") and "why it moved" in path.read_text()
    results.write_section("## C", "c\n", path)  # a new section is appended
    assert path.read_text().endswith("## C\n\nc\n")
