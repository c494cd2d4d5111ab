"""Plugin registry: entry points, typed records, duplicates, unknown names, and isolation of
broken or clashing plugins (docs/plugins.md)."""

import importlib
from dataclasses import dataclass
from typing import Any

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore import registry as registry_module
from hexicore.registry import Registry
from tests.conftest import run_cli


class Dummy:
    def __init__(self, speed=1):
        self.speed = speed

    def solve(self, problem, *, time_limit=None, seed=0, progress=None):
        raise NotImplementedError  # never called: these tests build it, registry.create checks it has solve()


class OnePlugin:
    __name__ = "one"

    @hookimpl
    def hexicore_solvers(self):
        yield PluginSpec(kind="solver", name="dummy", factory=Dummy, description="test solver")


class ClashPlugin:
    __name__ = "clash"

    @hookimpl
    def hexicore_solvers(self):
        return [PluginSpec(kind="solver", name="dummy", factory=Dummy)]


def test_fresh_registry_is_hermetic():
    reg = Registry(plugins=[OnePlugin()])
    assert reg.names("solver") == ["dummy"]
    assert reg.create("solver", "dummy", speed=3).speed == 3
    assert reg.names("schedule") == []


def test_unknown_name_lists_choices():
    reg = Registry(plugins=[OnePlugin()])
    with pytest.raises(HexicoreError, match=r"unknown solver 'x'; choose one of: dummy"):
        reg.spec("solver", "x")


def test_bad_params_are_one_line_errors():
    reg = Registry(plugins=[OnePlugin()])
    with pytest.raises(HexicoreError, match="solver 'dummy'"):
        reg.create("solver", "dummy", colour="red")


def test_duplicate_names_refused_only_where_used():
    reg = Registry(plugins=[OnePlugin(), ClashPlugin()])
    assert reg.names("solver") == ["dummy"] and "dummy" not in reg.entries["solver"]
    with pytest.raises(HexicoreError, match="conflicting plugins: solver 'dummy' is registered by both"):
        reg.create("solver", "dummy")
    [(kind, name, regs)] = reg.conflicts()
    assert (kind, name, sorted(e.plugin for e in regs)) == ("solver", "dummy", ["clash", "one"])


def test_register_and_unregister():
    reg = Registry()
    p = OnePlugin()
    reg.register(p, name="tmp")
    try:
        assert "dummy" in reg.names("solver")
    finally:
        reg.unregister(name="tmp")
    assert "dummy" not in reg.names("solver")


def test_record_validation():
    with pytest.raises(ValueError, match="unknown plugin kind"):
        PluginSpec(kind="gizmo", name="x", factory=Dummy)
    with pytest.raises(ValueError, match="lower-case"):
        PluginSpec(kind="solver", name="Big", factory=Dummy)


def test_builtins_come_through_entry_points():
    reg = Registry.default()
    rows = {(kind, name): dist for kind, name, dist, _ in reg.rows()}
    assert rows[("cost_model", "analytic")].startswith("hexicore")
    assert rows[("solver", "megatron")].startswith("hexicore")


# ------------------------------------------------------------------ isolation (fake entry points)
@dataclass(frozen=True)
class FakeDist:
    name: str
    version: str


@dataclass(frozen=True)
class FakeEntryPoint:
    """What the registry needs of an importlib.metadata.EntryPoint."""

    name: str
    value: str
    dist: FakeDist
    obj: Any = None

    def load(self) -> Any:
        return importlib.import_module(self.value) if self.obj is None else self.obj


def twin(plugin_name: str):
    class Twin:
        __name__ = plugin_name

        @hookimpl
        def hexicore_solvers(self):
            yield PluginSpec(kind="solver", name="twin", factory=Dummy, config={"speed": 1},
                             description=f"the {plugin_name} twin")

    return Twin()


class RaisingHook:
    __name__ = "raising_hook"

    @hookimpl
    def hexicore_schedules(self):
        raise RuntimeError("schedule table missing")


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """The installed plugins plus: a module that raises on import, two distributions that both
    register solver ``twin``, a plugin whose hook raises. Registry.default() and Hydra's
    ConfigStore are restored afterwards."""
    from hydra.core.config_store import ConfigStore

    (tmp_path / "hexicore_test_broken_plugin.py").write_text(
        "raise RuntimeError('needs libfoo 3\\nsecond line of the message')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = registry_module.plugin_entry_points()
    fakes = [FakeEntryPoint("broken", "hexicore_test_broken_plugin", FakeDist("hexicore-broken", "0.3")),
             FakeEntryPoint("twin_a", "twin_a", FakeDist("twin-a", "1.0"), twin("twin_a")),
             FakeEntryPoint("twin_b", "twin_b", FakeDist("twin-b", "2.0"), twin("twin_b")),
             FakeEntryPoint("raising", "raising", FakeDist("raising", "0.1"), RaisingHook())]
    monkeypatch.setattr(registry_module, "plugin_entry_points", lambda: real + fakes)
    reg = Registry(entry_points=True)
    monkeypatch.setattr(Registry, "default", classmethod(lambda cls: reg))
    yield reg
    ConfigStore.instance().repo.get("solver", {}).pop("twin.yaml", None)  # the one config they stored


def test_broken_plugins_are_skipped_and_remembered(isolated):
    broken = {b.name: b for b in isolated.broken}
    assert set(broken) == {"broken", "raising"}
    b = broken["broken"]
    assert (b.module, b.distribution) == ("hexicore_test_broken_plugin", "hexicore-broken 0.3")
    assert b.error == "RuntimeError: needs libfoo 3"
    assert broken["raising"].error == "RuntimeError: schedule table missing"
    assert "megatron" in isolated.names("solver") and "hanayo" in isolated.names("schedule")
    assert isolated.create("solver", "megatron") is not None


def test_plugins_command_reports_broken_and_conflicting(isolated, capsys):
    assert run_cli(["plugins"]) == 0
    out = capsys.readouterr().out
    assert ("broken: plugin 'broken' (hexicore-broken 0.3, module hexicore_test_broken_plugin) skipped: "
            "RuntimeError: needs libfoo 3") in out
    assert "second line" not in out and "Traceback" not in out
    assert ("conflict: solver 'twin' is registered by 'twin_a' (twin-a 1.0) and 'twin_b' (twin-b 2.0); "
            "using it is an error") in out
    assert "megatron" in out


def test_other_commands_still_work_with_one_warning(isolated, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert run_cli(["plan", "model=tiny", "cluster=hetero2", "solver=megatron", f"out={out}",
                    f"hydra.run.dir={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and "Traceback" not in err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: plugin")]
    assert len(warnings) == 2 and "'broken' (hexicore-broken 0.3)" in warnings[0]


def test_using_a_doubly_registered_name_exits_2_naming_both(isolated, tmp_path, capsys):
    code = run_cli(["plan", "model=tiny", "cluster=hetero2", "solver=twin", f"hydra.run.dir={tmp_path}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning: ")]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hexicore: error:") and "'twin_a' (twin-a 1.0)" in err[0] and "'twin_b' (twin-b 2.0)" in err[0]


def test_shipped_registry_holds_only_hexicore_own_plugins(isolated):
    """Registry.shipped(): the plugins of hexicore's own distribution, none of another package."""
    from hexicore.app.cli import _group_options

    shipped = Registry.shipped()
    assert "twin" in isolated.names("solver") and "twin" not in shipped.names("solver")
    assert {"megatron", "hexiscale", "cpsat"} <= set(shipped.names("solver")) and "annealing" not in shipped.names("solver")
    assert "hanayo" in shipped.names("schedule") and "torch" in shipped.names("runtime")
    assert not shipped.broken and all(dist.startswith("hexicore ") for _, _, dist, _ in shipped.rows())
    isolated.store_configs()
    assert "twin" in _group_options("solver") and "twin" not in _group_options("solver", shipped)


def test_plugins_after_a_broken_one_still_load(isolated):
    """Why the registry iterates entry points itself: every plugin after the broken one loads."""
    assert {"twin_a", "twin_b"} <= {name for name, _ in isolated.pm.list_name_plugin()}


class ConfiguredPlugin:
    __name__ = "configured"

    @hookimpl
    def hexicore_solvers(self):
        yield PluginSpec(kind="solver", name="configured", factory=Dummy, config={"speed": 1},
                         description="a plugin solver with a structured config and no YAML")


def test_library_knows_a_plugin_solver_on_its_first_call(monkeypatch):
    """The library's first compose in a process knows a plugin's structured-config solver, as the
    command line does (it checked group options before storing the plugins' configs, so
    ``hexicore.plan(solver="annealing")`` in a fresh process was an 'unknown solver')."""
    from hydra.core.config_store import ConfigStore

    from hexicore.app.api import compose

    reg = Registry(plugins=[ConfiguredPlugin()], entry_points=True)
    monkeypatch.setattr(Registry, "default", classmethod(lambda cls: reg))
    repo = ConfigStore.instance().repo.get("solver", {})
    repo.pop("configured.yaml", None)
    try:
        cfg = compose(["solver=configured", "solver.speed=3", "model=tiny"])
        assert cfg.solver.name == "configured" and cfg.solver.speed == 3
    finally:
        repo.pop("configured.yaml", None)
