"""What each top-level key of the primary config means, for ``hexicore COMMAND --help`` and the
CLI reference: read from ``conf/config.yaml``'s own comments (one place for the words), each
key's comment and its continuation lines. A comment that starts with commands
(``train:``, ``evaluate/train:``, ``prepare-data:``) names the commands that read the key; a
section's such comment (``pipeline:  # simulate/train ...``) holds for its keys; keys without
one are read by every command that plans or runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_]\w*):(?P<value>[^#]*?)\s*(?:#\s?(?P<note>.*))?$")
_MORE = re.compile(r"^\s+#\s?(?P<note>.*)$")
_FOR = re.compile(r"^(?P<commands>[a-z-]+(?:/[a-z-]+)*):\s+(?P<rest>.*)$")
#: the sections that are not keys of a command (Hydra's own, the config groups' defaults list)
SKIPPED = ("defaults", "hydra")


@dataclass(frozen=True)
class KeyHelp:
    """One key: its dotted name, its default as the file writes it, what it means, and the
    commands that read it (empty: every one)."""

    key: str
    default: str
    text: str
    commands: tuple[str, ...] = ()

    def read_by(self, command: str) -> bool:
        """Whether ``command`` reads the key: one its comment names, or any that plans or runs
        when it names none."""
        return command in (self.commands or UNMARKED)


#: the commands that read a key whose comment names none
UNMARKED = ("plan", "evaluate", "train", "profile")


_NAMED = re.compile(r"(?:^|;\s*)(?P<commands>[a-z-]+(?:/[a-z-]+)*):\s")
_SECTION = re.compile(r"^(?P<commands>[a-z-]+(?:/[a-z-]+)*)(?::|\s|$)")


def _for(note: str, commands: frozenset[str], section: bool = False) -> tuple[str, ...]:
    """The commands a comment names: ``cmd: ...`` at its start or after ``; `` (a section's
    comment may also start with the bare names, ``simulate/train without a plan``)."""
    names: list[str] = []
    for found in (_SECTION.finditer(note) if section else _NAMED.finditer(note)):
        these = found["commands"].split("/")
        if set(these) <= commands:
            names += these
    return tuple(dict.fromkeys(names))


def key_help(commands: frozenset[str], text: str | None = None) -> list[KeyHelp]:
    """Every key of the primary config (``text``: the file's text, default the installed
    ``conf/config.yaml``) with its meaning, in the file's order."""
    if text is None:
        text = resources.files("hexicore.conf").joinpath("config.yaml").read_text(encoding="utf-8")
    out: list[KeyHelp] = []
    section, section_for = None, ()
    last: KeyHelp | None = None
    for line in text.splitlines():
        more = _MORE.match(line)
        if more and last is not None and not _KEY.match(line):
            last = KeyHelp(last.key, last.default, f"{last.text} {more['note'].strip()}".strip(), last.commands)
            out[-1] = last
            continue
        found = _KEY.match(line)
        if not found or line.lstrip().startswith("#"):
            last = None if not line.strip() else last
            continue
        key, value, note = found["key"], found["value"].strip(), (found["note"] or "").strip()
        if not found["indent"]:
            section = key if not value else None
            if key in SKIPPED:
                section, last = "skip", None
                continue
            if section:
                section_for, last = _for(note, commands, section=True), None
                continue
            last = KeyHelp(key, value, note, _for(note, commands))
            out.append(last)
        elif section and section != "skip" and len(found["indent"]) == 2:
            last = KeyHelp(f"{section}.{key}", value, note, _for(note, commands) or section_for)
            out.append(last)
        else:
            last = None
    return out


def command_help(command: str, description: str, groups: dict[str, list[str]], commands: frozenset[str]) -> str:
    """``hexicore COMMAND --help``: its usage, what it does, the config groups with their
    options, and the keys it reads with their defaults and meanings."""
    keys = [k for k in key_help(commands) if k.read_by(command)]
    width = min(max((len(f"{k.key}={k.default}") for k in keys), default=0), 40)
    lines = [f"usage: hexicore {command} [key=value ...] [-m] [--cfg job] [--hydra-help]", "", description, ""]
    if command not in ("simulate", "prepare-data"):
        lines += ["config groups (group=option; group.key=value overrides one key of it):"]
        lines += [f"  {g:<9} {', '.join(opts)}" for g, opts in groups.items()]
        lines.append("")
    lines.append("keys (key=default  what it is):")
    for k in keys:
        shown = f"{k.key}={k.default}"
        lines.append(f"  {shown:<{width}}  {k.text}" if len(shown) <= width else f"  {shown}\n  {'':<{width}}  {k.text}")
    lines += ["", f"every key and its full default: hexicore {command} --cfg job; Hydra's own help: --hydra-help; "
                  "the reference: docs/cli.md"]
    return "\n".join(lines)
