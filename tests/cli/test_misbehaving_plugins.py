"""Third-party plugins that break their contract: each is one line naming the plugin (a
HexicoreError from the library, exit status 2 from the command line), never a traceback, another
plugin run in its place, or a plan with NaN or negative times written to disk (docs/plugins.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hexicore.app.compose import config_from_overrides, solve
from hexicore.core.errors import HexicoreError
from hexicore.core.schedule_ref import ScheduleRef
from hexicore.cost import AnalyticCostModel
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.pipeline.actions import Action
from hexicore.pipeline.schedule import ActionSchedule, ScheduleSpec, build, loop_map
from hexicore.planner.pricing import ScheduleBook
from hexicore.registry import Registry
from tests.conftest import run_cli

BASE = ["model=tiny", "cluster=hetero2"]


class OwnSolver:
    """Says so when it runs; returns what ``returns`` names otherwise."""

    def __init__(self, speed: int = 1, returns: str = "ran"):
        self.returns = returns

    def solve(self, problem, *, time_limit=None, seed=0, progress=None):
        if self.returns == "ran":
            raise HexicoreError("the plugin's own solver ran", field="solver")
        if self.returns == "foreign":  # a plan, but for another cluster than the problem's
            from hexicore.app.api import plan

            return plan(cluster="paper_case", model="tiny", solver="megatron")
        return {"none": None, "dict": {"pipelines": []}}[self.returns]


@dataclass
class NoNameConfig:  # no ``name`` field: hexicore fell back on its default solver (megatron)
    speed: int = 1


@dataclass
class BadTypeConfig:
    speed: int = "fast"  # type: ignore[assignment] - OmegaConf cannot read it


@dataclass(frozen=True)
class BadCost(AnalyticCostModel):
    """The analytic model whose stage and hop times are ``value``."""

    value: float = float("nan")
    name: str = "badcost"

    def stage_s(self, *args, **kwargs):
        return self.value

    def hop_s(self, *args, **kwargs):
        return self.value


@dataclass(frozen=True)
class BadSchedule(ActionSchedule):
    """1F1B-shaped lists; ``mode`` breaks one promise of the schedule interface."""

    mode: str = "ok"
    name = "badsched"

    def order(self, spec: ScheduleSpec):
        if self.mode == "none":
            return None
        P, M = spec.ranks, spec.micro_batches
        lists = [[Action("F", r, m) for m in range(M)] + [Action("B", r, m) for m in range(M)] for r in range(P)]
        if self.mode == "extra_rank":
            lists.append([])
        if self.mode == "deadlock":
            lists[-1] = lists[-1][M:] + lists[-1][:M]  # the last rank's backwards before its forwards
        if self.mode == "cycle":  # each rank in order, but the last starts micro-batch 1, which
            # its neighbour sends only after micro-batch 0's backward, which the last rank owes it
            lists = [[Action(k, r, m) for m in range(M) for k in "FB"] for r in range(P)]
            lists[-1] = [Action(k, P - 1, m) for m in [1, 0, *range(2, M)] for k in "FB"]
        return build(self.name, {"mode": self.mode}, spec, loop_map(P), lists)

    def closed_form(self, stage_times, hop_times, n_mb):
        return {"nan_time": float("nan"), "negative_time": -1.0}.get(self.mode)

    def peak_rule(self, ranks, n_mb):
        return (1.0,) if self.mode == "short_peaks" else None


class NoSolve:
    """A solver object without ``solve``: the factory forgot the interface."""

    def __init__(self, speed: int = 1):
        self.speed = speed


class NoOrder:
    """A schedule that is no ActionSchedule: it has an ``order`` and nothing else."""

    name = "noorder"

    def order(self, spec):
        return None


class ListsOnly:
    """A schedule with action lists (all a run needs) but nothing the planner or simulate uses."""

    name = "listsonly"

    def actions(self, spec):
        return None


class Plugins:
    __name__ = "misbehaving"

    @hookimpl
    def hexicore_solvers(self):
        yield PluginSpec(kind="solver", name="noname", factory=OwnSolver, config=NoNameConfig)
        yield PluginSpec(kind="solver", name="misnamed", factory=OwnSolver, config={"name": "megatron", "speed": 1})
        yield PluginSpec(kind="solver", name="returns", factory=OwnSolver, config={"returns": "none"})
        yield PluginSpec(kind="solver", name="nosolve", factory=NoSolve, config={"speed": 1})

    @hookimpl
    def hexicore_cost_models(self):
        yield PluginSpec(kind="cost_model", name="badcost", factory=BadCost, config={"value": 0.0})

    @hookimpl
    def hexicore_schedules(self):
        yield PluginSpec(kind="schedule", name="badsched", factory=BadSchedule, config={"mode": "ok"})
        yield PluginSpec(kind="schedule", name="noorder", factory=NoOrder, config={})
        yield PluginSpec(kind="schedule", name="listsonly", factory=ListsOnly, config={})


@pytest.fixture
def registry(monkeypatch):
    """The installed plugins plus :class:`Plugins`, as Registry.default(); the configs they
    stored in Hydra's ConfigStore are removed afterwards."""
    from hydra.core.config_store import ConfigStore

    reg = Registry(plugins=[Plugins()], entry_points=True)
    monkeypatch.setattr(Registry, "default", classmethod(lambda cls: reg))
    reg.store_configs()
    yield reg
    repo = ConfigStore.instance().repo
    for group, name in (("solver", "noname"), ("solver", "misnamed"), ("solver", "returns"),
                        ("cost", "badcost"), ("schedule", "badsched"), ("solver", "nosolve"),
                        ("schedule", "noorder"), ("schedule", "listsonly")):
        repo.get(group, {}).pop(f"{name}.yaml", None)


def solved(registry, *overrides):
    return solve(config_from_overrides([*BASE, *overrides], registry=registry), registry)


@pytest.mark.parametrize("name", ["noname", "misnamed"])
def test_choosing_a_plugin_runs_that_plugin(registry, name):
    """A config without ``name`` (or naming another plugin) composed ``solver=noname`` into
    the default solver's section: megatron ran and its plan was written as if all were well."""
    assert config_from_overrides([f"solver={name}"], registry=registry).solver.name == name
    with pytest.raises(HexicoreError, match="the plugin's own solver ran"):
        solved(registry, f"solver={name}")


def test_choosing_a_plugin_on_the_command_line_runs_that_plugin(registry, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = run_cli(["plan", *BASE, "solver=noname", "solver.speed=2", f"out={out}", f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].endswith("the plugin's own solver ran") and not out.exists(), err


class BadConfigPlugin:
    __name__ = "badconfig"

    @hookimpl
    def hexicore_solvers(self):
        yield PluginSpec(kind="solver", name="badtype", factory=OwnSolver, config=BadTypeConfig)


def test_a_config_omegaconf_cannot_read_is_a_broken_plugin(monkeypatch, tmp_path, capsys):
    """It stopped every command with a traceback (storing the configs raised); now it is
    reported like a plugin that fails to import, and every other command runs."""
    reg = Registry(plugins=[BadConfigPlugin()], entry_points=True)
    monkeypatch.setattr(Registry, "default", classmethod(lambda cls: reg))
    assert run_cli(["plugins"]) == 0
    assert "broken: plugin 'badconfig'" in capsys.readouterr().out
    broken = {b.module: b for b in reg.broken}
    assert "its solver=badtype config: ValidationError" in broken["solver/badtype config"].error
    out = tmp_path / "plan.json"
    assert run_cli(["plan", *BASE, "solver=megatron", f"out={out}", f"hydra.run.dir={tmp_path}"]) == 0
    assert out.is_file()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: plugin 'badconfig'"), err


@pytest.mark.parametrize("returns,text", [("none", "returned NoneType, not a hexicore Plan"),
                                          ("dict", "Plan.from_dict"),
                                          ("foreign", "a plan for cluster 'paper_case'; the problem's is 'hetero2'")])
def test_a_solver_that_returns_no_plan(registry, returns, text):
    with pytest.raises(HexicoreError, match=text) as info:
        solved(registry, "solver=returns", f"solver.returns={returns}")
    assert str(info.value).startswith("solver returns:")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the search's inf - inf, refused after
@pytest.mark.parametrize("solver", ["megatron", "hexiscale"])
@pytest.mark.parametrize("value", ["nan", "-1.0", "inf"])
def test_a_cost_model_pricing_nan_or_negative_times_writes_no_plan(registry, solver, value):
    extra = ["solver.iterations=2", "solver.polish_rounds=0"] if solver == "hexiscale" else []
    with pytest.raises(HexicoreError) as info:
        solved(registry, f"solver={solver}", "cost=badcost", f"cost.value={value}", *extra)
    assert "cost model badcost" in str(info.value) or value == "inf", info.value


def test_a_cost_model_estimate_is_checked_before_a_plan_carries_it(registry):
    with pytest.raises(HexicoreError, match="estimate.iteration_s") as info:
        solved(registry, "solver=megatron", "cost=badcost", "cost.value=nan")
    assert str(info.value).startswith("cost model badcost:")


@pytest.mark.parametrize("mode,text", [("extra_rank", "expected 4 action lists, got 5"),
                                       ("none", "order() returned NoneType, not an ActionList")])
def test_schedule_lists_of_the_wrong_shape(mode, text):
    with pytest.raises(HexicoreError, match=text.replace("(", r"\(").replace(")", r"\)")) as info:
        BadSchedule(mode=mode).actions(ScheduleSpec(4, 8))
    assert info.value.source == "schedule badsched"


@pytest.mark.parametrize("mode,call,text", [
    ("nan_time", lambda b, ref: b.exact(ref, [3.0] * 4, [0.0] * 3, 8), "pipeline_time() returned nan"),
    ("negative_time", lambda b, ref: b.model(ref, [3.0] * 4, [0.0] * 3, 16), "returned -1.0"),
    ("negative_time", lambda b, ref: b.resolve(ref, [3.0] * 4, [0.0] * 3, 8), "returned -1.0"),
    ("short_peaks", lambda b, ref: b.peaks(ref, 4, 8), "1 values for 4 ranks"),
    ("extra_rank", lambda b, ref: b.peaks(ref, 4, 8), "expected 4 action lists"),
    ("cycle", lambda b, ref: b.exact(ref, [3.0] * 4, [0.0] * 3, 8), "deadlock"),
    ("cycle", lambda b, ref: b.peaks(ref, 4, 8), "deadlock"),
])
def test_the_planner_refuses_a_schedule_s_bad_prices(registry, mode, call, text):
    book = ScheduleBook(registry)
    with pytest.raises(HexicoreError, match=text.replace("(", r"\(").replace(")", r"\)")) as info:
        call(book, ScheduleRef("badsched", {"mode": mode}))
    assert info.value.source == "schedule badsched"


@pytest.mark.parametrize("mode", ["nan_time", "negative_time", "extra_rank", "cycle"])
def test_a_plan_under_a_badly_priced_schedule_is_refused(registry, mode, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = run_cli(["plan", *BASE, "solver=megatron", "schedule=badsched", f"schedule.mode={mode}", f"out={out}",
                    f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and "schedule badsched" in err[0] and not out.exists(), err


def test_training_refuses_lists_that_deadlock_before_any_worker_starts(registry):
    """Without a plan (``hexicore train schedule=NAME``) nothing priced the lists: the workers
    started, deadlocked and the run failed (exit 1) instead of being refused (exit 2)."""
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.assignment import schedule_actions

    assert schedule_actions({"name": "badsched", "mode": "ok"}, 2, 4, registry).ranks == 2
    with pytest.raises(HexicoreError, match="backward before its forward") as info:
        schedule_actions({"name": "badsched", "mode": "deadlock"}, 2, 4, registry)
    assert info.value.source == "schedule badsched"


@pytest.mark.parametrize("argv,text", [
    (["plan", *BASE, "solver=nosolve"], "solver 'nosolve': its factory built a NoSolve without solve(); "
                                        "a solver needs solve"),
    (["simulate", "schedule=noorder"], "schedule 'noorder': its factory built a NoOrder without actions(); "
                                       "subclass hexicore.pipeline.schedule.ActionSchedule and write order()"),
    (["plan", *BASE, "solver=megatron", "schedule=listsonly"],
     "schedule 'listsonly': its factory built a ListsOnly without pricing, pipeline_time(), model_time() and 4 more"),
    (["simulate", "schedule=listsonly"], "ListsOnly without closed_bubble(), note()"),
])
def test_a_plugin_object_without_its_kind_s_methods(registry, argv, text, tmp_path, capsys):
    """It was an AttributeError traceback at the first call hexicore made on it."""
    code = run_cli([*argv, f"out={tmp_path / 'o'}", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and text in err[0] and not (tmp_path / "o").exists(), err


def test_the_registry_refuses_an_object_without_its_kind_s_methods(registry):
    with pytest.raises(HexicoreError, match="NoSolve without solve()") as info:
        registry.create("solver", "nosolve")
    assert info.value.field == "solver"
    assert registry.create("schedule", "listsonly").name == "listsonly"  # lists are all a run needs
