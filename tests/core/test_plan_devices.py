"""A plan's ``cluster.devices`` list (docs/formats.md, "Plan JSON"): checked, never ignored.

Beside ``machines`` every entry must agree with what the machines give (ids, machine, GPU type,
tflops, memory); on its own (a plan from another tool) each entry's figures are range-checked
and errors name ``cluster.devices[i].<field>``. Plans ``hexicore plan`` writes load unchanged.
"""

from __future__ import annotations

import copy
import json

import pytest

import hexicore
from hexicore.core.cluster import Cluster, parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from tests.conftest import CONF, run_cli
from tests.helpers import make_plan


@pytest.fixture
def plan_dict(paper_case, llama13b):
    """paper_case: A = 3 x a800-80g-nvlink (312 TFLOPS, 80 GB), B = 3 x rtx4090, C = 2 x rtx3090."""
    return make_plan(paper_case, llama13b).to_dict()


def _refused(data, field, words):
    with pytest.raises(HexicoreError) as e:
        Plan.from_dict(data, "plan.json")
    assert e.value.source == "plan.json" and e.value.field == field, str(e.value)
    assert words in e.value.message, str(e.value)
    assert "\n" not in str(e.value)
    return str(e.value)


def _devices(data):
    return data["cluster"]["devices"]


# ------------------------------------------------------------- beside machines
@pytest.mark.parametrize("key, value, words", [
    ("tflops", 55.5, "55.5 disagrees with machine A's a800-80g-nvlink (312)"),
    ("tflops", 312.5, "disagrees"),
    ("memory_gb", 40, "40 disagrees with machine A's a800-80g-nvlink (80)"),
    ("gpu", "rtx3090", "disagrees with machine A's GPU type 'a800-80g-nvlink'"),
    ("machine", "B", "names machine 'B'"),
    ("tflops", 1e300, "outside hexicore's range"),
    ("tflops", 1e-300, "outside hexicore's range"),
    ("memory_gb", 1e300, "outside hexicore's range"),
    ("tflops", "fast", "expected a number"),
    ("tflops", True, "expected a number"),
])
def test_an_edited_device_field_is_refused(plan_dict, key, value, words):
    _devices(plan_dict)[0][key] = value
    _refused(plan_dict, f"cluster.devices[0].{key}", words)


def test_the_message_of_an_edited_tflops(plan_dict):
    _devices(plan_dict)[6]["tflops"] = 55.5  # C.0, an rtx3090
    assert _refused(plan_dict, "cluster.devices[6].tflops", "disagrees") == (
        "plan.json: cluster.devices[6].tflops: 55.5 disagrees with machine C's rtx3090 (71)")


def test_a_missing_device_is_refused(plan_dict):
    del _devices(plan_dict)[4]  # B.1
    _refused(plan_dict, "cluster.devices", "lacks device(s) B.1")


def test_a_duplicate_device_is_refused(plan_dict):
    _devices(plan_dict).append(copy.deepcopy(_devices(plan_dict)[2]))
    _refused(plan_dict, "cluster.devices[8].id", "duplicate device 'A.2' (also cluster.devices[2])")


def test_a_duplicate_in_place_of_another_is_refused(plan_dict):
    _devices(plan_dict)[1] = copy.deepcopy(_devices(plan_dict)[0])  # same length, A.1 gone
    _refused(plan_dict, "cluster.devices[1].id", "duplicate device 'A.0'")


@pytest.mark.parametrize("did", ["A.3", "Z.0"])
def test_an_extra_device_is_refused(plan_dict, did):
    _devices(plan_dict).append({"id": did, "machine": did[0], "gpu": "a800-80g-nvlink", "tflops": 312.0,
                                "memory_gb": 80})
    _refused(plan_dict, "cluster.devices[8].id", "is not one of the machines' devices")


def test_an_excluded_device_listed_is_refused(plan_dict):
    plan_dict["cluster"]["excluded"] = ["B.2"]
    _refused(plan_dict, "cluster.devices[5].id", "device 'B.2' is excluded")
    del _devices(plan_dict)[5]  # as Plan.save writes it: excluded devices are not listed
    assert not parse_cluster(plan_dict["cluster"], "plan.json", "cluster").has_device("B.2")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(id="A0"), "cluster.devices[0].id"),
    (lambda d: d.update(colour="red"), "cluster.devices[0].colour"),
    (lambda d: d.pop("id"), "cluster.devices[0].id"),
    (lambda d: d.update(id="A.00"), "cluster.devices[0].id"),  # A.0 under another id
])
def test_a_malformed_entry_is_refused(plan_dict, edit, field):
    edit(_devices(plan_dict)[0])
    with pytest.raises(HexicoreError) as e:
        Plan.from_dict(plan_dict, "plan.json")
    assert e.value.field == field


def test_a_changed_machine_with_stale_devices_is_refused(plan_dict):
    plan_dict["cluster"]["machines"][2]["gpu"] = "rtx4090"  # C's devices still say rtx3090
    _refused(plan_dict, "cluster.devices[6].gpu", "disagrees with machine C's GPU type 'rtx4090'")


def test_entries_may_leave_out_fields_and_come_in_any_order(plan_dict):
    devs = _devices(plan_dict)
    plan_dict["cluster"]["devices"] = [{"id": d["id"]} for d in reversed(devs)]
    assert Plan.from_dict(plan_dict, "plan.json").cluster.to_dict()["devices"] == devs


def test_evaluate_refuses_an_edited_plan_with_one_line_and_writes_nothing(tmp_path, capsys, plan_dict):
    _devices(plan_dict)[0]["tflops"] = 1e300
    (tmp_path / "p.json").write_text(json.dumps(plan_dict))
    code = run_cli(["evaluate", f"plan_file={tmp_path / 'p.json'}", f"out={tmp_path / 'o.json'}",
                    f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not (tmp_path / "o.json").exists()
    assert len(err.splitlines()) == 1 and "p.json: cluster.devices[0].tflops:" in err and "Traceback" not in err


# -------------------------------------------------------------- devices only
def _foreign(plan_dict):
    """The cluster as another tool writes it: devices and links, no machines."""
    plan_dict["cluster"] = {"name": "foreign", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                            "intra": {"bandwidth_gbs": 100, "latency_us": 5}, "devices": _devices(plan_dict)}
    return plan_dict


def test_a_devices_only_id_with_a_leading_zero_is_refused_naming_it(plan_dict):
    """``M.01`` alone was read as machine M's device 1, device 0 excluded: the error named
    ``cluster.excluded``, a field the file does not have."""
    data = _foreign(plan_dict)
    _devices(data)[3]["id"] = "B.01"
    _refused(data, "cluster.devices[3].id", "without leading zeros (B.1)")


@pytest.mark.parametrize("i", [0, 2, 7])  # the first, the last of type a800, the very last
@pytest.mark.parametrize("key, value", [("tflops", 1e300), ("tflops", 1e-300), ("memory_gb", 1e300)])
def test_devices_only_range_errors_name_the_device_field(plan_dict, i, key, value):
    data = _foreign(plan_dict)
    _devices(data)[i][key] = value
    _refused(data, f"cluster.devices[{i}].{key}", "outside hexicore's range")


def test_devices_only_devices_of_one_type_must_agree(plan_dict):
    data = _foreign(plan_dict)
    _devices(data)[1]["tflops"] = 300.0
    _refused(data, "cluster.devices[1].tflops", "300 disagrees with cluster.devices[0] of the same GPU type")


def test_devices_only_figures_override_the_catalog_when_they_agree(plan_dict):
    data = _foreign(plan_dict)
    for d in _devices(data)[:3]:
        d["tflops"] = 300.0
    assert Plan.from_dict(data, "plan.json").cluster.device("A.2").tflops == 300.0


def test_devices_only_duplicate_is_refused(plan_dict):
    data = _foreign(plan_dict)
    _devices(data).append({**_devices(data)[0], "tflops": 1.0})
    _refused(data, "cluster.devices[8].id", "duplicate device 'A.0'")


def test_intra_beside_machines_is_refused_not_ignored(plan_dict):
    plan_dict["cluster"]["intra"] = {"bandwidth_gbs": 100}
    _refused(plan_dict, "cluster.intra", "applies only to a cluster given as devices")


def test_devices_only_new_gpu_type_needs_its_figures(plan_dict):
    data = _foreign(plan_dict)
    for d in _devices(data)[6:]:  # C.0, C.1
        del d["memory_gb"]
        d["gpu"] = "mystery"
    _refused(data, "cluster.devices[6].memory_gb", "missing required field")
    _devices(data)[7]["memory_gb"] = 16  # given by another device of the type: enough
    assert Plan.from_dict(data, "plan.json").cluster.device("C.0").memory_gb == 16


@pytest.mark.parametrize("intra, field, words", [
    ({"bandwdith_gbs": 5}, "cluster.intra.bandwdith_gbs", "unknown field"),  # a typo, not ignored
    ({"bandwidth_gbs": 5e6}, "cluster.intra.bandwidth_gbs", "outside hexicore's range"),
    ({"latency_us": -1}, "cluster.intra.latency_us", ">= 0"),
    ([], "cluster.intra", "expected a mapping"),
])
def test_devices_only_intra_errors_name_intra(plan_dict, intra, field, words):
    data = _foreign(plan_dict)
    data["cluster"]["intra"] = intra
    _refused(data, field, words)


def test_devices_only_intra_gives_every_machine_its_link(plan_dict):
    cluster = Plan.from_dict(_foreign(plan_dict), "plan.json").cluster
    assert {(m.bandwidth_gbs, m.latency_us) for m in cluster.machines} == {(100.0, 5.0)}


@pytest.mark.parametrize("edit, field, words", [
    (lambda ds: ds.clear(), "cluster.devices", "needs at least one device"),
    (lambda ds: ds[7].update(id="C.x.1", machine="C.x"), "cluster.devices[7].id", "must not contain '.'"),
    (lambda ds: ds[7].update(id="C.4095"), "cluster.devices", "4,102 GPUs is above"),
    (lambda ds: ds[7].update(id="C.\u0661"), "cluster.devices[7].id", "is not <machine>.<index>"),
])
def test_devices_only_errors_name_the_devices_not_derived_machines(plan_dict, edit, field, words):
    """The machines are derived from the list: an error names what the file says, never
    ``cluster.machines``, which it lacks."""
    data = _foreign(plan_dict)
    edit(_devices(data))
    _refused(data, field, words)


@pytest.mark.parametrize("excluded, words", [
    ("A.0", "expected a list, got str"),  # not read as the ids 'A', '.', '0'
    (0, "expected a list, got int"),  # not read as absent
    (False, "expected a list, got bool"),
    ([[1]], "unknown device [1]"),
])
def test_devices_only_excluded_of_the_wrong_type_is_refused(plan_dict, excluded, words):
    data = _foreign(plan_dict)
    data["cluster"]["excluded"] = excluded
    _refused(data, "cluster.excluded", words)


def test_devices_only_plan_saved_again_loads(plan_dict, tmp_path):
    plan = Plan.from_dict(_foreign(plan_dict), "foreign.json")
    path = plan.save(tmp_path / "again.json")
    again = Plan.load(path)
    assert again.to_dict() == plan.to_dict() == json.loads(path.read_text())


# --------------------------------------------------------------- round trips
CUSTOM = """
name: custom
gpus:
  my-gpu: {tflops: 120.5, memory_gb: 32, price_per_hour: 1.1}
  rtx4090: {price_per_hour: 0.40}
  rtx3090: {tflops: 1.0e+2, memory_gb: 24.5}
inter: {bandwidth_gbs: 2, latency_us: 40}
machines:
  - {name: X, gpu: my-gpu, count: 2, bandwidth_gbs: 32, latency_us: 10}
  - {name: Y, gpu: rtx4090, count: 3, bandwidth_gbs: 32, emulate: {slowdown: 2}}
  - {name: Z, gpu: rtx3090, count: 2, bandwidth_gbs: 16}
links:
  - {between: [X, Z], bandwidth_gbs: 5, latency_us: 20}
excluded: [Y.1]
"""
ZONES = """
name: zoned
gpus: {slow: {tflops: 33.3, memory_gb: 12}}
inter: {bandwidth_gbs: 25, latency_us: 5}
inter_zone: {bandwidth_gbs: 1.25, latency_us: 30000}
zone_links: [{between: [east, north], bandwidth_gbs: 3, latency_us: 900}]
machines:
  - {name: E0, gpu: a100-80g, count: 2, bandwidth_gbs: 300, latency_us: 3, zone: east}
  - {name: W0, gpu: h100-80g, count: 2, bandwidth_gbs: 450, latency_us: 3, zone: west}
  - {name: N0, gpu: slow, count: 3, bandwidth_gbs: 16, latency_us: 3, zone: north}
excluded: [N0.0, E0.1]
"""
SYNTHETIC = """
name: syn
synthetic: {gpus: 20, mix: {rtx4090: 1, my-gpu: 1, a100-80g: 1}, seed: 3, per_machine: 4}
gpus: {my-gpu: {tflops: 50, memory_gb: 16}}
excluded: [m1.2, m4.0]
"""


def _facts(c):
    """What the cost model and the runtime see of each device, and its GPU type whole: the
    provenance notes (``source``, ``price_source``) read back too."""
    return [(d.id, d.machine, d.gpu, d.tflops, d.memory_gb, c.slowdown(d.id)) for d in c.devices]


@pytest.mark.parametrize("text", [CUSTOM, ZONES, SYNTHETIC], ids=["custom", "zones", "synthetic"])
def test_a_cluster_written_into_a_plan_reads_back_the_same(tmp_path, text):
    (tmp_path / "c.yaml").write_text(text)
    c = Cluster.load(tmp_path / "c.yaml")
    d = json.loads(json.dumps(c.to_dict()))
    again = parse_cluster(d, "p.json", "cluster")
    assert again.to_dict() == d and _facts(again) == _facts(c) and again.excluded == c.excluded


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "cluster").glob("*.yaml")))
def test_every_preset_cluster_reads_back_the_same(name):
    c = Cluster.load(CONF / "cluster" / f"{name}.yaml")
    d = json.loads(json.dumps(c.to_dict()))
    assert parse_cluster(d, "p.json", "cluster").to_dict() == d


@pytest.mark.parametrize("cluster, text, overrides", [
    ("paper_case", None, []),
    (None, CUSTOM, []),
    (None, ZONES, []),
    (None, SYNTHETIC, []),
    ("synthetic", None, ["cluster.synthetic.gpus=24"]),
], ids=["paper_case", "custom", "zones", "synthetic-file", "synthetic-preset"])
def test_a_written_plan_loads_unchanged(tmp_path, cluster, text, overrides):
    kw = {}
    if text is not None:
        (tmp_path / "c.yaml").write_text(text)
        kw["cluster_file"] = tmp_path / "c.yaml"
    plan = hexicore.plan(cluster, "tiny", overrides=["train.global_batch=8", *overrides], **kw)
    path = plan.save(tmp_path / "p.json")
    written = json.loads(path.read_text())
    again = Plan.load(path)
    assert again.to_dict() == written and _facts(again.cluster) == _facts(plan.cluster)
    assert hexicore.evaluate(path).estimate.iteration_s == pytest.approx(plan.estimate.iteration_s)
