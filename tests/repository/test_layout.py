"""The shape of the code: no import circle (in the import graph, and none that importing a module
first would hit), imports one way between the sub-packages, no function over 80 lines without a
stated reason. Modules have no size cap: a module holds one concept and
its size follows the concept.

Imports are read with :mod:`ast` from every ``.py`` file under ``hexicore/`` and ``plugins/``
(installed as ``hexicore_plugins``), wherever they sit: module level, inside functions, under
``if`` — a lazy import inside a function still ties the two modules together. ``from P import
name`` counts as an import of ``P.name`` when that is a module, else of ``P``.

Convention for long functions: a function may run over ``MAX_FUNCTION`` lines only when its
docstring contains ``long:`` followed by the reason (e.g. ``long: one event loop over every
task; a call per task would cost ...``). Lines are counted from the ``def`` (decorators
excluded) to the last line of the body, docstring included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION = 80
LONG_REASON = re.compile(r"\blong:\s*\S")

#: sub-package (or top-level module) of hexicore -> the parts of hexicore it may import
ALLOWED = {
    "core": {"core"},
    "cost": {"core", "cost"},
    "pipeline": {"core", "pipeline"},
    "planner": {"core", "cost", "pipeline", "planner", "hookspecs", "registry"},
    "hookspecs": {"core", "hookspecs"},
    "registry": {"core", "hookspecs", "registry"},
    "builtin": {"core", "cost", "planner", "hookspecs", "registry", "builtin"},
    "app": None,  # the application layer may import every part
    "": None,  # hexicore/__init__.py: the library facade (hexicore.plan, ...)
}

def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package ``package``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """Every hexicore / hexicore_plugins module ``source`` (module ``name``) imports, at any depth."""
    found = set()
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m.split(".")[0] in ("hexicore", "hexicore_plugins")}


def import_graph() -> dict[str, set[str]]:
    files = {**module_files(ROOT / "hexicore", "hexicore"), **module_files(ROOT / "plugins", "hexicore_plugins")}
    known = set(files)
    return {name: imports_of(name, path.read_text(encoding="utf-8"), known, path.name == "__init__.py") - {name}
            for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def part(module: str) -> str:
    """The part of hexicore a module belongs to (``hexicore.pipeline.comm`` -> ``pipeline``)."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else ""


def plugin_of(module: str) -> str:
    """A plugin's own package or module (``hexicore_plugins.solvers.cpsat.tables`` -> ``...cpsat``)."""
    return ".".join(module.split(".")[:3])


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, line, length) of every function over ``MAX_FUNCTION`` lines without a ``long:`` reason."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION and not LONG_REASON.search(ast.get_docstring(node) or ""):
                out.append((node.name, node.lineno, n))
    return out


def python_files() -> list[Path]:
    return sorted([*(ROOT / "hexicore").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])


# ----------------------------------------------------------------------------- the checks
def test_no_import_circle():
    cycle = find_cycle({m: {t for t in ts} for m, ts in import_graph().items()})
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_every_module_imports_first():
    """Each module imports on its own, as the first hexicore module a process loads: an import
    circle through a package ``__init__`` (which the graph above does not see, since importing a
    submodule runs its package first) fails here. One child process; hexicore's modules are
    dropped from ``sys.modules`` before each import (third-party ones, torch included, stay)."""
    import subprocess
    import sys

    names = sorted({**module_files(ROOT / "hexicore", "hexicore"), **module_files(ROOT / "plugins", "hexicore_plugins")})
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in ('hexicore', 'hexicore_plugins')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        bad.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_imports_run_one_way_between_the_parts():
    bad = []
    for module, targets in import_graph().items():
        if not module.startswith("hexicore."):
            continue
        for t in targets:
            if t.startswith("hexicore_plugins"):
                bad.append(f"{module} imports the plugin module {t}")
                continue
            allowed = ALLOWED.get(part(module), set())
            if allowed is not None and part(t) not in allowed:
                bad.append(f"{module} ({part(module)}) imports {t} ({part(t)})")
    assert not bad, "\n".join(sorted(bad))


def test_plugins_stay_out_of_the_app_layer_and_of_each_other():
    bad = []
    for module, targets in import_graph().items():
        if not module.startswith("hexicore_plugins."):
            continue
        for t in targets:
            wrong = t.startswith("hexicore.app") or \
                (t.startswith("hexicore_plugins.") and plugin_of(t) != plugin_of(module) and t.count(".") >= 2)
            if wrong:
                bad.append(f"{module} imports {t}")
    assert not bad, "\n".join(sorted(bad))


def test_no_function_over_80_lines_without_a_reason():
    bad = [(str(p.relative_to(ROOT)), *f) for p in python_files()
           for f in long_functions(p.read_text(encoding="utf-8"))]
    assert not bad, bad


# --------------------------------------------------------------------- the checkers themselves
def test_function_level_and_relative_imports_count():
    known = {"hexicore.a", "hexicore.b", "hexicore.b.c", "hexicore_plugins.x.y.z"}
    src = "import os\nfrom hexicore.b import c, name\ndef f():\n    from hexicore import a\n    from .z import q\n"
    assert imports_of("hexicore_plugins.x.y.w", src, known) == \
        {"hexicore.b.c", "hexicore.b", "hexicore.a", "hexicore_plugins.x.y.z"}
    assert imports_of("hexicore.b", "from . import c\nfrom .. import a\n", known, is_package=True) == \
        {"hexicore.b.c", "hexicore.a"}


def test_cycle_finder():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("doc, flagged", [("", True), ('"""Long but no reason."""', True),
                                          ('"""Does x.\n\n    long: one hot loop."""', False)])
def test_long_function_finder(doc, flagged):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    src = f"def f():\n    {doc}\n{body}\n" if doc else f"def f():\n{body}\n"
    assert bool(long_functions(src)) is flagged
    assert not long_functions("def g():\n    return 1\n")
