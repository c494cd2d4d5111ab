"""docs/results.md is shared by every benchmark: each one owns one ``## `` section and replaces
only that section (appending it when missing), so the scripts can run in any order."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
TITLE = "# Results\n\nMeasured by the scripts in `bench/` (`python bench/run_all.py` regenerates every table).\n"


#: in a section, what follows this line is written by hand (what a run shows, what was tried):
#: a benchmark that rewrites the section keeps it, after its new body
NOTES = "<!-- written by hand below: kept when the benchmark rewrites this section -->"


def write_section(heading: str, body: str, path: Path = RESULTS) -> Path:
    """Replace the section that starts with the line ``heading`` (``## ...``) by ``heading`` +
    ``body``, keeping the old section's hand-written notes (whatever follows its :data:`NOTES`
    line); every other section of ``path`` is kept as it is."""
    text = path.read_text(encoding="utf-8") if path.exists() else TITLE
    section = heading.rstrip() + "\n\n" + body.strip("\n") + "\n"
    pattern = re.compile(rf"^{re.escape(heading.rstrip())}\n.*?(?=^## |\Z)", re.S | re.M)
    old = pattern.search(text)
    if old is not None and NOTES in old.group(0):
        section += "\n" + NOTES + "\n\n" + old.group(0).split(NOTES, 1)[1].strip("\n") + "\n"
    if old is not None:
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n", encoding="utf-8")
    return path
