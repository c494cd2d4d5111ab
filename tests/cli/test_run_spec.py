"""The app -> runtime interface: the app builds a typed RunSpec (plan checked first), and one
registry object — the caller's — reaches the runtime, which builds the schedules from it; the
workers get the built action lists, so a schedule that exists only in the caller's registry
trains, on one process and on several."""

from __future__ import annotations

import json
import pickle
from dataclasses import FrozenInstanceError

import pytest

from hexicore.app.compose import config_from_overrides
from hexicore.app.training import build_run_spec
from hexicore.core.errors import HexicoreError, PlanError
from hexicore.core.run_spec import PipelineLayout, PlanLayout, ReferenceLayout, RunSpec, RuntimeSettings
from hexicore.core.settings import TrainSettings
from hexicore.hookspecs import PluginSpec, hookimpl
from hexicore.pipeline.actions import Action, ActionList
from hexicore.registry import Registry
from tests.conftest import model_preset

TRAIN = ["model=tiny", "train.dtype=fp32", "train.recompute=false", "train.global_batch=4", "runtime.progress=false"]


class LifoDrain:
    """A schedule only this test module knows: all forwards, then the backwards newest first."""

    name = "lifo_drain"

    def actions(self, spec) -> ActionList:
        P, M = spec.ranks, spec.micro_batches
        lists = tuple(tuple([Action("F", r, m) for m in range(M)] + [Action("B", r, m) for m in reversed(range(M))])
                      for r in range(P))
        return ActionList({"name": self.name}, P, P, M, tuple(range(P)), lists)


class LifoPlugin:
    @hookimpl
    def hexicore_schedules(self):
        yield PluginSpec(kind="schedule", name="lifo_drain", factory=LifoDrain, description="test only")


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(entry_points=True)  # every installed plugin plus the test's own schedule
    reg.register(LifoPlugin())
    return reg


def spec_of(overrides, registry, out=None) -> RunSpec:
    return build_run_spec(config_from_overrides(list(overrides), registry=registry), registry, out)


# ------------------------------------------------------------- building the spec
def test_spec_per_parallel_mode(tmp_path):
    reg = Registry.default()
    ref = spec_of([*TRAIN, "parallel=none", "seed=4", "train.steps=3", f"resume={tmp_path}"], reg)
    assert isinstance(ref.layout, ReferenceLayout) and ref.schedules == () and ref.estimate is None
    assert ref.train == TrainSettings(steps=3, global_batch=4, micro_batch=1, seq_len=ref.model.seq_len, dtype="fp32",
                                      recompute=False, seed=4) and ref.checkpoint.resume == str(tmp_path)
    pipe = spec_of([*TRAIN, "schedule=hanayo", "schedule.waves=1", "pipeline.ranks=2"], reg, out="o")
    assert pipe.layout == PipelineLayout(2) and pipe.output.out == "o"
    assert [dict(s) for s in pipe.schedules] == [{"name": "hanayo", "waves": 1, "max_waves": 8, "memory": None}]
    assert pipe.runtime.name == "torch" and pipe.runtime.params["timeout_s"] == 120
    with pytest.raises(TypeError):
        pipe.runtime.params["lr"] = 1.0  # read-only
    with pytest.raises(FrozenInstanceError):
        pipe.train = None
    again = pickle.loads(pickle.dumps(pipe))
    assert again == pipe and dict(again.runtime.params) == dict(pipe.runtime.params)


def _plan_file(tmp_path, schedule=None, memory_gb=24):
    from hexicore.core.cluster import parse_cluster
    from hexicore.core.plan import Pipeline, Plan, Stage
    from hexicore.core.settings import TrainSettings

    cluster = parse_cluster({"name": "two", "gpus": {"x": {"tflops": 10, "memory_gb": memory_gb}},
                             "inter": {"bandwidth_gbs": 1, "latency_us": 50},
                             "machines": [{"name": "M", "gpu": "x", "count": 2, "bandwidth_gbs": 32,
                                           "latency_us": 10}]}, "test cluster")
    sched = {"schedule": schedule} if schedule else {}
    plan = Plan(model_preset("tiny"), cluster, TrainSettings(4, 1, 32, "fp32", False),
                (Pipeline(2, (Stage(("M.0",), 1, (0, 8)),), **sched), Pipeline(2, (Stage(("M.1",), 1, (0, 8)),))))
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


def test_plan_spec_is_checked_by_the_cost_model_first(tmp_path):
    reg = Registry.default()
    path = _plan_file(tmp_path, {"name": "gpipe"})
    spec = spec_of([*TRAIN, f"plan_file={path}", "schedule=zb_h1", "train.steps=2"], reg)
    assert isinstance(spec.layout, PlanLayout) and spec.layout.source == str(path)
    assert [s["name"] for s in spec.schedules] == ["gpipe", "1f1b"]  # the plan's own; the plan format's default
    assert spec.estimate is not None and spec.estimate.fits and spec.cluster.name == "two"
    assert (spec.train.global_batch, spec.train.seq_len) == (4, 32)  # the plan's, not train.global_batch's
    # a plan trains in its own dtype and recompute setting unless the command line gives them
    base = ["model=tiny", "runtime.progress=false", f"plan_file={path}"]
    assert (spec_of(base, reg).train.dtype, spec_of(base, reg).train.recompute) == ("fp32", False)
    given = spec_of([*base, "train.dtype=bf16", "train.recompute=true"], reg).train
    assert (given.dtype, given.recompute) == ("bf16", True)
    plain = spec_of(["model=tiny", "parallel=none"], reg).train
    assert (plain.dtype, plain.recompute) == ("bf16", True)  # no plan: bf16 with recompute
    small = tmp_path / "small"
    small.mkdir()
    with pytest.raises(PlanError, match="needs .* GB but has"):  # refused before any runtime sees it
        spec_of([*TRAIN, f"plan_file={_plan_file(small, memory_gb=0.0001)}"], reg)


def test_bad_settings_are_one_line_errors():
    reg = Registry.default()
    with pytest.raises(HexicoreError, match="unknown parallel 'both'"):
        spec_of([*TRAIN, "parallel=both"], reg)
    with pytest.raises(HexicoreError, match="train.steps: must be"):
        spec_of([*TRAIN, "train.steps=0"], reg)
    with pytest.raises(HexicoreError, match="unknown dtype 'fp8'"):
        spec_of([*TRAIN, "train.dtype=fp8"], reg)
    with pytest.raises(HexicoreError, match="1 schedules for 0 pipelines"):
        RunSpec(ReferenceLayout(), model_preset("tiny"), ({"name": "gpipe"},),
                TrainSettings(4, 1, 32, steps=1), RuntimeSettings("torch"))
    from hexicore_plugins.runtimes.torch.runtime import TorchSettings

    with pytest.raises(HexicoreError, match="unknown runtime key 'lr_max'") as err:
        TorchSettings.parse({"lr_max": 1})
    assert err.value.field == "runtime.lr_max"
    with pytest.raises(HexicoreError, match="runtime.timeout_s"):
        TorchSettings.parse({"timeout_s": 0})
    assert TorchSettings.parse({"lr": 1e-3, "fault": {"rank": 1, "kind": "die"}}).launch.fault == {"rank": 1, "step": 0, "kind": "die"}


def test_the_runtime_config_file_lists_the_settings_defaults():
    """conf/runtime/torch.yaml shows every ``runtime`` key with a value for users; each value is
    its settings class's default (OptimizerSettings, DataSettings, LaunchSettings, CheckpointSettings's
    shard_mb), which is defined there and nowhere else."""
    from omegaconf import OmegaConf

    from hexicore_plugins.runtimes.torch.runtime import TorchSettings, section_keys
    from tests.conftest import CONF

    listed = OmegaConf.to_container(OmegaConf.load(CONF / "runtime" / "torch.yaml"))
    assert listed.pop("name") == "torch"
    assert sorted(listed) == sorted(section_keys())
    assert TorchSettings.parse(listed) == TorchSettings()


def test_group_params_of_the_schedule_need_the_registry():
    from hexicore.app.compose import group_params

    with pytest.raises(TypeError, match="registry"):
        group_params(config_from_overrides([]), "schedule")


# ----------------------------------------------------- the registry passed down
def test_the_callers_registry_builds_the_runtimes_schedules(registry):
    from hexicore.app.training import create_runtime

    spec = spec_of([*TRAIN, "schedule.name=lifo_drain", "pipeline.ranks=2"], registry)
    runtime = create_runtime(spec, registry)
    layout = runtime.layout(spec, registry=registry)
    acts = layout.pipelines[0].actions
    assert acts.schedule["name"] == "lifo_drain" and layout.schedule_name == "lifo_drain"
    assert [str(a) for a in acts.actions[1] if a.is_compute] == ["1F0", "1F1", "1F2", "1F3", "1B3", "1B2", "1B1", "1B0"]
    assert any(a.is_comm for a in acts.actions[0])  # the shared comm pass ran
    with pytest.raises(HexicoreError, match="unknown schedule 'lifo_drain'"):  # the process-wide one lacks it
        runtime.layout(spec, registry=Registry.default())


def test_train_command_with_a_test_only_schedule_in_process(registry, tmp_path, capsys):
    from hexicore.app.commands.train import train

    cfg = config_from_overrides([*TRAIN, "schedule.name=lifo_drain", "pipeline.ranks=1", "train.steps=2",
                                 f"out={tmp_path}"], registry=registry)
    assert train(cfg, registry) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["schedule"] == "lifo_drain" and len(m["losses"]) == 2 and m["ranks"] == 1
    assert "trained 2 steps (lifo_drain, 1 rank)" in capsys.readouterr().out


@pytest.mark.slow
def test_spawned_workers_run_a_schedule_they_cannot_look_up(registry, tmp_path):
    """Two spawned workers (which never see the test's plugin) train under it exactly like the
    single-process reference."""
    from hexicore.app.commands.train import train

    def run(extra, out):
        cfg = config_from_overrides([*TRAIN, "train.steps=2", "seed=1", f"out={out}", *extra], registry=registry)
        assert train(cfg, registry) == 0
        return json.loads((out / "metrics.json").read_text())

    ref = run(["parallel=none"], tmp_path / "ref")
    got = run(["schedule.name=lifo_drain", "pipeline.ranks=2"], tmp_path / "lifo")
    assert (got["ranks"], got["schedule"], ref["ranks"]) == (2, "lifo_drain", 1)
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5)
