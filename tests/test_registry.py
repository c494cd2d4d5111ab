"""Plugin registry: entry points, typed records, duplicates, unknown names (DESIGN.md §3)."""

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.registry import Registry


class Dummy:
    def __init__(self, speed=1):
        self.speed = speed


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


def test_duplicate_names_refused():
    reg = Registry(plugins=[OnePlugin(), ClashPlugin()])
    with pytest.raises(HexicoreError, match="conflicting plugins"):
        reg.names("solver")


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
