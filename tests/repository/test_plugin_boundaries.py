"""Import boundaries of the plugins and the registry: plugins never import the app layer, Hydra
or OmegaConf, nor another plugin's modules (shared code lives in the core); only the app layer
constructs the process-wide registry."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_PLUGINS = ("hexicore.app", "hydra", "omegaconf")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


def _package(path: Path) -> str:
    """``hexicore_plugins.<kind>.<plugin>`` of a plugin file (a plugin is a module or a package)."""
    kind, rest = path.relative_to(ROOT / "plugins").parts[0], path.relative_to(ROOT / "plugins").parts[1:]
    return f"hexicore_plugins.{kind}.{Path(rest[0]).stem}" if rest else f"hexicore_plugins.{kind}"


def test_plugins_import_neither_the_app_nor_hydra_nor_each_other():
    bad = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        own = _package(path)
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IN_PLUGINS):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            parts = name.split(".")
            if parts[0] == "hexicore_plugins" and len(parts) >= 3 and ".".join(parts[:3]) != own:
                bad.append(f"{path.relative_to(ROOT)} imports another plugin's module {name}")
    assert not bad, bad


def test_only_the_app_layer_builds_the_default_registry():
    calls = []
    for path in sorted(list((ROOT / "hexicore").rglob("*.py")) + list((ROOT / "plugins").rglob("*.py"))):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("hexicore", "app") or rel == Path("hexicore/registry.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "default" and \
                    isinstance(node.value, ast.Name) and node.value.id == "Registry":
                calls.append(f"{rel}:{node.lineno}")
    assert not calls, calls
