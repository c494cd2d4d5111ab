"""``hexicore plugins`` (the one command without a Hydra config) and the warnings every other
command prints about broken plugins (docs/plugins.md): the registry's rows, its broken plugins
and its conflicting names."""

from __future__ import annotations

import sys
from typing import Sequence


def plugins_command(args: Sequence[str] = ()) -> int:
    """The registered implementations; then the plugins that failed to load and the names
    registered twice (both are skipped or refused only where used, so every other command runs).
    ``--help`` says so; any other argument is refused (the command takes none)."""
    from hexicore.core.errors import HexicoreError
    from hexicore.registry import Registry
    from hexicore.app.report import console, rows_table

    if any(a in ("-h", "--help") for a in args):
        print("usage: hexicore plugins\n\nList every registered solver, partitioner, refiner, orderer, cost model, "
              "schedule and runtime with the distribution it came from, then the plugins that failed to load "
              "and the names registered twice.")
        return 0
    if args:
        raise HexicoreError(f"hexicore plugins takes no arguments, got {' '.join(args)!r}", source="command line")

    registry = Registry.default()
    out = console()
    out.print(rows_table("hexicore plugins", ("kind", "name", "distribution", "description"), registry.rows()))
    lines = [f"broken: plugin {b.name!r} ({b.distribution}, module {b.module}) skipped: {b.error}"
             for b in registry.broken]
    for kind, name, regs in registry.conflicts():
        who = " and ".join(f"{e.plugin!r} ({e.distribution})" for e in regs)
        lines.append(f"conflict: {kind.replace('_', ' ')} {name!r} is registered by {who}; using it is an error")
    for line in lines:  # plain lines (never wrapped, no markup): errors are quoted as they are
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    return 0


def warn_broken_plugins() -> None:
    """One line on stderr per plugin that failed to load (no traceback; details in ``hexicore plugins``)."""
    from hexicore.registry import Registry

    for b in Registry.default().broken:
        print(f"warning: plugin {b.name!r} ({b.distribution}) skipped: {b.error} "
              "(see `hexicore plugins`)", file=sys.stderr)
