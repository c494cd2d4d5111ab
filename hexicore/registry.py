"""The plugin manager: entry points + lookup by name (docs/plugins.md).

:class:`Registry` wraps a pluggy manager. ``Registry.default()`` loads every module of the
``hexicore`` entry-point group — the built-in plugins and third-party packages alike. Tests
build ``Registry(plugins=[...])`` with throwaway objects and stay hermetic.

One bad plugin never takes the others down:

- a module whose import raises (or whose hooks raise, or yield something that is not a
  :class:`PluginSpec`) is skipped and kept in :attr:`Registry.broken` (entry point,
  distribution, the one-line error) for ``hexicore plugins`` to report;
- two plugins registering the same name under the same kind are kept side by side; only using
  that name (:meth:`Registry.spec`, :meth:`Registry.create`) is an error, naming both
  distributions (:meth:`Registry.conflicts` lists them).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any, Iterable

import pluggy

from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import HINTS, INTERFACE, KINDS, PROJECT, HexicoreSpecs, PluginSpec, missing_members

NOT_INSTALLED = "(not installed)"
#: the distribution that ships hexicore's own plugins (hexicore/builtin.py and plugins/)
HOME = "hexicore"


@dataclass(frozen=True)
class Entry:
    """A registered implementation and where it came from."""

    spec: PluginSpec
    plugin: str
    distribution: str


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that could not be used: its entry point (or pluggy name), the module it names,
    its distribution, and the error as one line (``ImportError: No module named 'x'``)."""

    name: str
    module: str
    distribution: str
    error: str


def plugin_entry_points() -> list[Any]:
    """The entry points of the ``hexicore`` group (tests replace this function with fakes that
    have ``name``, ``value``, ``dist`` and ``load()``)."""
    return list(metadata.entry_points(group=PROJECT))


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` — an error fit for one line of a table."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _distribution_name(ep: Any) -> str | None:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    return getattr(dist, "name", None) or dist.metadata["Name"]


def _distribution(ep: Any) -> str:
    name = _distribution_name(ep)
    return NOT_INSTALLED if name is None else f"{name} {ep.dist.version}"


def _canonical(name: str | None) -> str:
    """A distribution name as packaging compares them (case, ``-``/``_``/``.`` alike)."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


class Registry:
    """Implementations by kind and name; broken plugins skipped, duplicate names refused on use."""

    def __init__(self, plugins: Iterable[Any] = (), *, entry_points: bool = False):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(HexicoreSpecs)
        self._dists: dict[int, str] = {}
        self._failed: list[BrokenPlugin] = []
        self._hook_failures: list[BrokenPlugin] = []
        self._config_failures: list[BrokenPlugin] = []
        self._index: dict[str, dict[str, tuple[Entry, ...]]] | None = None
        if entry_points:
            self._load_entry_points()
        for p in plugins:
            self.pm.register(p)

    @classmethod
    @lru_cache(maxsize=1)
    def default(cls) -> "Registry":
        """Every plugin installed in the ``hexicore`` entry-point group (cached per process)."""
        return cls(entry_points=True)

    @classmethod
    def shipped(cls) -> "Registry":
        """Only the plugins hexicore itself ships (the entry points of its own distribution,
        :data:`HOME`), whatever else is installed: what every install has. docs/cli.md is
        generated from these (:mod:`hexicore.app.docgen`)."""
        registry = cls()
        registry._load_entry_points(only=HOME)
        return registry

    def _load_entry_points(self, only: str | None = None) -> None:
        """Import and register each entry point's module (``only``: those of that distribution);
        remember the ones that fail (pluggy's own ``load_setuptools_entrypoints`` stops at the
        first failure)."""
        for ep in plugin_entry_points():
            if only is not None and _canonical(_distribution_name(ep)) != _canonical(only):
                continue
            if self.pm.get_plugin(ep.name) is not None or self.pm.is_blocked(ep.name):
                continue
            dist = _distribution(ep)
            try:
                plugin = ep.load()
                if self.pm.is_registered(plugin):
                    continue
                self.pm.register(plugin, name=ep.name)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - any third-party failure
                self._failed.append(BrokenPlugin(ep.name, str(ep.value), dist, one_line(exc)))
                continue
            self._dists[id(plugin)] = dist

    def register(self, plugin: Any, name: str | None = None) -> None:
        self.pm.register(plugin, name=name)
        self._index = None

    def unregister(self, plugin: Any = None, name: str | None = None) -> None:
        self.pm.unregister(plugin, name=name)
        self._index = None

    # --------------------------------------------------------------- lookup
    def _registrations(self) -> dict[str, dict[str, tuple[Entry, ...]]]:
        """kind -> name -> every registration of that name, in registration order."""
        if self._index is None:
            failures: list[BrokenPlugin] = []
            out: dict[str, dict[str, list[Entry]]] = {k: {} for k in KINDS}
            for kind, (hook, _) in KINDS.items():
                for impl in getattr(self.pm.hook, hook).get_hookimpls():
                    dist = self._dists.get(id(impl.plugin), NOT_INSTALLED)
                    try:
                        specs = list(impl.function() or ())
                        bad = [s for s in specs if not isinstance(s, PluginSpec) or s.kind != kind]
                        if bad:
                            raise TypeError(f"{hook}() must yield PluginSpec(kind={kind!r}, ...), got {bad[0]!r}")
                    except Exception as exc:  # noqa: BLE001 - a plugin's bug is reported, not fatal
                        module = getattr(impl.plugin, "__name__", type(impl.plugin).__name__)
                        failures.append(BrokenPlugin(impl.plugin_name, str(module), dist, one_line(exc)))
                        continue
                    for spec in specs:
                        out[kind].setdefault(spec.name, []).append(Entry(spec, impl.plugin_name, dist))
            self._hook_failures = failures
            self._index = {k: {n: tuple(v[n]) for n in sorted(v)} for k, v in out.items()}
        return self._index

    @property
    def broken(self) -> tuple[BrokenPlugin, ...]:
        """Plugins skipped because their module or one of their hooks failed, and the plugin
        configs :meth:`store_configs` could not store (the name then is no option of its group)."""
        self._registrations()
        return tuple(self._failed) + tuple(self._hook_failures) + tuple(self._config_failures)

    @property
    def entries(self) -> dict[str, dict[str, Entry]]:
        """kind -> name -> entry, for every name registered exactly once (a conflicting name is
        left out: see :meth:`conflicts`)."""
        return {k: {n: es[0] for n, es in by.items() if len(es) == 1} for k, by in self._registrations().items()}

    def conflicts(self) -> list[tuple[str, str, tuple[Entry, ...]]]:
        """(kind, name, the registrations) for every name registered more than once."""
        return [(k, n, es) for k, by in self._registrations().items() for n, es in by.items() if len(es) > 1]

    def names(self, kind: str) -> list[str]:
        """Every registered name of ``kind``, conflicting ones included (sorted)."""
        return list(self._registrations()[kind])

    def spec(self, kind: str, name: str) -> PluginSpec:
        """The record registered as ``name``; an unknown or doubly registered name is a one-line
        :class:`HexicoreError` (the latter naming both distributions)."""
        found = self._registrations().get(kind, {})
        label = kind.replace("_", " ")
        if name not in found:
            raise HexicoreError(f"unknown {label} {name!r}; choose one of: {', '.join(found) or '(none registered)'}",
                                field=KINDS[kind][1] or kind)
        regs = found[name]
        if len(regs) > 1:
            who = [f"{e.plugin!r} ({e.distribution})" for e in regs]
            raise HexicoreError(f"conflicting plugins: {label} {name!r} is registered by both "
                                f"{', '.join(who[:-1])} and {who[-1]}; uninstall one of them",
                                field=KINDS[kind][1] or kind)
        return regs[0].spec

    def create(self, kind: str, name: str, **params: Any) -> Any:
        """Build an implementation: ``factory(**params)``; bad params, or an object without its
        kind's methods (:data:`hexicore.hookspecs.INTERFACE`), are a one-line error."""
        spec = self.spec(kind, name)
        unknown_options(kind, name, spec.factory, params)
        try:
            built = spec.factory(**params)
        except TypeError as exc:
            raise HexicoreError(f"{kind} {name!r}: {exc}", field=KINDS[kind][1] or kind) from None
        require(kind, name, built)
        return built

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(kind, name, distribution, description) for ``hexicore plugins``; a conflicting name
        has one row per registration, its description saying so."""
        out = []
        for kind, by in self._registrations().items():
            for name, regs in by.items():
                for e in regs:
                    note = e.spec.description
                    if len(regs) > 1:
                        others = ", ".join(o.distribution for o in regs if o is not e)
                        note = f"CONFLICT (also registered by {others}; using {name!r} is an error)"
                    out.append((kind, name, e.distribution, note))
        return out

    def store_configs(self) -> None:
        """Put every plugin's structured config into Hydra's ConfigStore (provider = plugin).

        A conflicting name stores its first registration's config, so that choosing it
        (``solver=NAME``) composes and then fails where it is used, with the error naming both
        distributions, rather than as an unknown option."""
        from hydra.core.config_store import ConfigStore

        cs = ConfigStore.instance()
        failures: list[BrokenPlugin] = []
        for kind, by in self._registrations().items():
            group = KINDS[kind][1]
            if group is None:
                continue
            for name, regs in by.items():
                e = regs[0]
                if e.spec.config is not None:
                    try:
                        node = named_config(e.spec.config, name)
                    except Exception as exc:  # noqa: BLE001 - a plugin's bad config skips it, as a bad hook does
                        failures.append(BrokenPlugin(e.plugin, f"{group}/{name} config", e.distribution,
                                                     f"its {group}={name} config: {one_line(exc)}"))
                        continue
                    cs.store(group=group, name=name, node=node, provider=e.plugin)
        self._config_failures = failures


def require(kind: str, name: str, built: Any, members: Iterable[str] | None = None) -> None:
    """Refuse an object plugin ``name`` built that lacks ``members`` (default: its kind's
    interface, :data:`hexicore.hookspecs.INTERFACE`): one line naming the plugin, where hexicore
    would fail at its first call with an AttributeError traceback."""
    missing = missing_members(kind, built, members)
    if not missing:
        return
    label = kind.replace("_", " ")
    need = INTERFACE[kind] if members is None else tuple(members)
    hint = HINTS.get(kind) or f"a {label} needs {', '.join(need)}"
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    raise HexicoreError(f"{label} {name!r}: its factory built a {type(built).__name__} without {shown}; "
                        f"{hint} (docs/plugins.md)", field=KINDS[kind][1] or kind)


def named_config(config: Any, name: str) -> Any:
    """A plugin's ``config`` (a mapping, or a dataclass the way OmegaConf reads one) as the node
    Hydra stores, its ``name`` the name the plugin is registered as: choosing ``solver=NAME``
    must build that plugin, never the app's default one (a dataclass without a ``name`` field,
    or a config naming another plugin). A config OmegaConf cannot read raises."""
    from omegaconf import OmegaConf, open_dict

    if isinstance(config, dict):
        return {"name": name, **{k: v for k, v in config.items() if k != "name"}}
    node = OmegaConf.structured(config)
    with open_dict(node):
        node.name = name
    return node


#: :func:`accepts` answers per (function, bound, keyword): the pricing asks on every call
_ACCEPTS: dict[tuple, bool] = {}


def accepts(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (or ``**kwargs``; True where its signature
    cannot be read: the call itself reports). Remembered per underlying function (a bound
    method's ``__func__``: a new bound object on every attribute access, the same signature)."""
    func = getattr(fn, "__func__", fn)
    try:
        key = (func, func is not fn, name)
        hit = _ACCEPTS.get(key)
    except TypeError:  # an unhashable callable object: read its signature every time
        return _accepts(fn, name)
    if hit is None:
        hit = _accepts(fn, name)
        if len(_ACCEPTS) < 4096:
            _ACCEPTS[key] = hit
    return hit


def _accepts(fn: Any, name: str) -> bool:
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in ps)


def unknown_options(kind: str, name: str, factory: Any, params: dict[str, Any]) -> None:
    """Refuse a parameter ``factory`` does not take (unless it takes ``**kwargs``): a one-line
    :class:`HexicoreError` naming ``<group>.<option>`` and listing the options it takes."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C factory: the call itself reports
        return
    ps = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in ps):
        return
    taken = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not p.name.startswith("_")]
    extra = [str(k) for k in params if k not in taken]
    if extra:
        group = KINDS[kind][1] or kind
        has = f"its options: {', '.join(taken)}" if taken else "it takes none"
        raise HexicoreError(f"{kind.replace('_', ' ')} {name!r} has no option {extra[0]!r}; {has}",
                            field=f"{group}.{extra[0]}")
