"""The plugin manager: entry points + lookup by name (DESIGN.md §3).

:class:`Registry` wraps a pluggy manager. ``Registry.default()`` loads every module of the
``hexicore`` entry-point group — the built-in plugins and third-party packages alike. Tests
build ``Registry(plugins=[...])`` with throwaway objects and stay hermetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

import pluggy

from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import KINDS, PROJECT, HexicoreSpecs, PluginSpec


@dataclass(frozen=True)
class Entry:
    """A registered implementation and where it came from."""

    spec: PluginSpec
    plugin: str
    distribution: str


class Registry:
    """Implementations by kind and name; duplicate names are refused."""

    def __init__(self, plugins: Iterable[Any] = (), *, entry_points: bool = False):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(HexicoreSpecs)
        if entry_points:
            self.pm.load_setuptools_entrypoints(PROJECT)
        for p in plugins:
            self.pm.register(p)
        self._entries: dict[str, dict[str, Entry]] | None = None

    @classmethod
    @lru_cache(maxsize=1)
    def default(cls) -> "Registry":
        """Every plugin installed in the ``hexicore`` entry-point group (cached per process)."""
        return cls(entry_points=True)

    def register(self, plugin: Any, name: str | None = None) -> None:
        self.pm.register(plugin, name=name)
        self._entries = None

    def unregister(self, plugin: Any = None, name: str | None = None) -> None:
        self.pm.unregister(plugin, name=name)
        self._entries = None

    # --------------------------------------------------------------- lookup
    def _dists(self) -> dict[int, str]:
        return {id(p): f"{d.project_name} {d.version}" for p, d in self.pm.list_plugin_distinfo()}

    @property
    def entries(self) -> dict[str, dict[str, Entry]]:
        if self._entries is None:
            dists = self._dists()
            out: dict[str, dict[str, Entry]] = {k: {} for k in KINDS}
            for kind, (hook, _) in KINDS.items():
                caller = getattr(self.pm.hook, hook)
                for impl in caller.get_hookimpls():
                    specs = impl.function()
                    for spec in list(specs or ()):
                        if not isinstance(spec, PluginSpec) or spec.kind != kind:
                            raise HexicoreError(f"plugin {impl.plugin_name!r}: {hook}() must yield "
                                                f"PluginSpec(kind={kind!r}, ...), got {spec!r}")
                        if spec.name in out[kind]:
                            other = out[kind][spec.name].plugin
                            raise HexicoreError(f"conflicting plugins: {kind} {spec.name!r} is registered by both "
                                                f"{other!r} and {impl.plugin_name!r}")
                        out[kind][spec.name] = Entry(spec, impl.plugin_name,
                                                     dists.get(id(impl.plugin), "(not installed)"))
            self._entries = {k: dict(sorted(v.items())) for k, v in out.items()}
        return self._entries

    def names(self, kind: str) -> list[str]:
        return list(self.entries[kind])

    def spec(self, kind: str, name: str) -> PluginSpec:
        found = self.entries.get(kind, {})
        if name not in found:
            label = kind.replace("_", " ")
            raise HexicoreError(f"unknown {label} {name!r}; choose one of: {', '.join(found) or '(none registered)'}",
                                field=KINDS[kind][1] or kind)
        return found[name].spec

    def create(self, kind: str, name: str, **params: Any) -> Any:
        """Build an implementation: ``factory(**params)``; bad params are a one-line error."""
        spec = self.spec(kind, name)
        try:
            return spec.factory(**params)
        except TypeError as exc:
            raise HexicoreError(f"{kind} {name!r}: {exc}", field=KINDS[kind][1] or kind) from None

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(kind, name, distribution, description) for ``hexicore plugins``."""
        return [(kind, name, e.distribution, e.spec.description)
                for kind, by in self.entries.items() for name, e in by.items()]

    def store_configs(self) -> None:
        """Put every plugin's structured config into Hydra's ConfigStore (provider = plugin)."""
        from hydra.core.config_store import ConfigStore

        cs = ConfigStore.instance()
        for kind, by in self.entries.items():
            group = KINDS[kind][1]
            if group is None:
                continue
            for name, e in by.items():
                if e.spec.config is not None:
                    node = e.spec.config
                    if isinstance(node, dict):
                        node = {"name": name, **node}
                    cs.store(group=group, name=name, node=node, provider=e.plugin)
