"""Cluster YAML contract: catalog, devices, links, overrides, graph, synthetic fleets."""

import pytest

from hexicore.core.cluster import GPU_CATALOG, parse_cluster, synthetic_fleet
from hexicore.core.errors import HexicoreError
from tests.conftest import cluster_preset

REQUIRED_GPUS = ["a100-40g", "a100-80g", "a800-80g-nvlink", "a800-80g-pcie", "h100-80g", "h200", "rtx4090",
                 "rtx3090", "rtx3080ti", "v100-32g", "l40s", "rtx-a6000"]


def test_catalog_has_required_types_with_sources():
    for g in REQUIRED_GPUS:
        assert GPU_CATALOG[g].tflops > 0 and GPU_CATALOG[g].memory_gb > 0
        assert GPU_CATALOG[g].source


def test_paper_case_devices_and_links(paper_case):
    ids = [d.id for d in paper_case.devices]
    assert ids == ["A.0", "A.1", "A.2", "B.0", "B.1", "B.2", "C.0", "C.1"]
    assert paper_case.bandwidth_gbs("A.0", "A.1") == 200
    assert paper_case.bandwidth_gbs("B.0", "C.1") == 1.0
    assert paper_case.beta("A.0", "B.0") == 1e9
    assert paper_case.alpha("A.0", "B.0") == pytest.approx(50e-6)
    assert paper_case.alpha("C.0", "C.1") == pytest.approx(10e-6)


def test_link_override_and_custom_gpu():
    c = parse_cluster({
        "name": "x", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
        "machines": [{"name": "A", "gpu": "my-gpu", "count": 2, "bandwidth_gbs": 100},
                     {"name": "B", "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32}],
        "links": [{"between": ["A", "B"], "bandwidth_gbs": 2.0, "latency_us": 40}],
        "gpus": {"my-gpu": {"tflops": 120.0, "memory_gb": 32}, "rtx4090": {"tflops": 200}},
    }, "x.yaml")
    assert c.bandwidth_gbs("A.1", "B.0") == 2.0 and c.latency_us("B.0", "A.0") == 40
    assert c.device("A.0").tflops == 120.0 and c.device("B.0").tflops == 200 and c.device("B.0").memory_gb == 24
    again = parse_cluster(c.to_dict(), "round-trip")
    assert again.to_dict() == c.to_dict()


def test_device_graph_weights(paper_case):
    g = paper_case.graph()
    assert g.number_of_nodes() == 8 and g.number_of_edges() == 28
    assert g.nodes["B.0"]["tflops"] == GPU_CATALOG["rtx4090"].tflops
    assert g.edges["A.0", "A.2"]["bandwidth"] == 200 and g.edges["A.0", "C.0"]["bandwidth"] == 1.0


def test_exclude_keeps_ids(paper_case):
    c = paper_case.exclude(["A.1", "B.0"])
    assert [d.id for d in c.devices] == ["A.0", "A.2", "B.1", "B.2", "C.0", "C.1"]
    with pytest.raises(HexicoreError, match="unknown device"):
        paper_case.exclude(["Z.9"])
    with pytest.raises(HexicoreError, match="every device"):
        paper_case.exclude([d.id for d in paper_case.devices])


@pytest.mark.parametrize("name, n", [("paper_case", 8), ("hetero1", 40), ("hetero2", 32), ("hetero3", 56),
                                     ("homo_a800_16", 16), ("homo_a800_32", 32)])
def test_presets(name, n):
    c = cluster_preset(name)
    assert len(c.devices) == n


def test_hetero_settings_match_paper_flops_ratios():
    # HexiScale §5 (docs/background.md) gives total FLOPS relative to the A800 PCIe baselines; with our catalog
    # figures hetero1 is within a few percent of 2x8 A800 (the paper: +1.36%).
    h1 = cluster_preset("hetero1").total_tflops / cluster_preset("homo_a800_16").total_tflops
    assert 0.85 < h1 < 1.15


def test_synthetic_fleet_is_seeded():
    a = synthetic_fleet(100, {"rtx4090": 1, "a100-80g": 1}, seed=3)
    b = synthetic_fleet(100, {"rtx4090": 1, "a100-80g": 1}, seed=3)
    assert a == b
    c = parse_cluster(a, "synthetic")
    assert len(c.devices) == 100
    assert parse_cluster({"synthetic": {"gpus": 20, "mix": {"rtx3090": 1}, "seed": 1}}, "s").devices[-1].id == "m2.3"


def test_unknown_or_misspelled_cluster_fields_are_refused_with_their_place():
    from hexicore.core.cluster import parse_cluster

    good = {"name": "k", "inter": {"bandwidth_gbs": 1.0},
            "machines": [{"name": "A", "gpu": "a100-80g", "count": 2, "bandwidth_gbs": 100.0}]}
    assert parse_cluster(good, "k.yaml").name == "k"
    cases = [({"linkss": []}, "linkss"), ({"inter": {"bandwidth_gbs": 1.0, "latncy_us": 2}}, "inter.latncy_us"),
             ({"machines": [{**good["machines"][0], "cnt": 3}]}, "machines[0].cnt"),
             ({"gpus": {"x": {"tflops": 1, "memory_gb": 2, "mem": 3}}}, "gpus.x.mem"),
             ({"links": [{"between": ["A", "B"], "bandwith_gbs": 1}]}, "links[0].bandwith_gbs")]
    for extra, field in cases:
        with pytest.raises(HexicoreError, match="unknown field") as e:
            parse_cluster({**good, **extra}, "k.yaml")
        assert e.value.field == field, extra


TWO = ("inter: {bandwidth_gbs: 1.0, latency_us: 50}\n"
       "machines:\n  - {name: A, gpu: g, count: 2, bandwidth_gbs: 32}\n  - {name: B, gpu: g, count: 2, bandwidth_gbs: 32}\n")
BAD_FILES = [
    ("synthetic: {gpus: 16, mix: {rtx4090: 1}}\nmachines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32}\n",
     "machines"),
    ("synthetic: {gpus: 16, mix: {rtx4090: 1}}\nlinks: []\n", "links"),
    (TWO + "gpus: {g: {tflops: 100, memory_gb: 8}}\nexcluded: [A.0, A.1, B.0, B.1]\n", "excluded"),
    # an id excluded twice was accepted silently (as once), in both forms
    (TWO + "gpus: {g: {tflops: 100, memory_gb: 8}}\nexcluded: [A.1, B.0, A.1]\n", "excluded[2]"),
    ("devices:\n  - {id: A.0, gpu: rtx4090}\n  - {id: A.2, gpu: rtx4090}\nexcluded: [A.1, A.1]\n", "excluded[1]"),
    (TWO + "gpus: {g: {tflops: 1.0e+300, memory_gb: 80}}\n", "gpus.g.tflops"),
    (TWO + "gpus: {g: {tflops: 1.0e-300, memory_gb: 80}}\n", "gpus.g.tflops"),
    (TWO + "gpus: {g: {tflops: 100, memory_gb: 1e300}}\n", "gpus.g.memory_gb"),
    (TWO.replace("bandwidth_gbs: 1.0,", "bandwidth_gbs: 1.0e+300,") + "gpus: {g: {tflops: 100, memory_gb: 8}}\n",
     "inter.bandwidth_gbs"),
    (TWO.replace("count: 2, bandwidth_gbs: 32}", "count: 2, bandwidth_gbs: 1.0e-300}", 1)
     + "gpus: {g: {tflops: 100, memory_gb: 8}}\n", "machines[0].bandwidth_gbs"),
    (TWO.replace("latency_us: 50", "latency_us: 1.0e+300") + "gpus: {g: {tflops: 100, memory_gb: 8}}\n",
     "inter.latency_us"),
]


@pytest.mark.parametrize("text, field", BAD_FILES, ids=[f for _, f in BAD_FILES])
def test_bad_cluster_file_is_one_line_exit_2(text, field, tmp_path, capsys):
    from tests.conftest import run_cli

    path, out = tmp_path / "c.yaml", tmp_path / "p.json"
    path.write_text(text)
    code = run_cli(["plan", f"cluster_file={path}", "model=tiny", f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: {field}:" in err and not out.exists(), err


def test_physical_figures_at_their_bounds_and_in_scientific_text(tmp_path):
    from hexicore.core.cluster import Cluster

    path = tmp_path / "c.yaml"  # YAML 1.1 reads 1e6 and 1.0e5 as text: read as the numbers they spell
    path.write_text(TWO.replace("32}", "1e6, latency_us: 1.0e7}") + "gpus: {g: {tflops: 1e6, memory_gb: 1.0e5}}\n")
    c = Cluster.load(path)
    assert c.device("A.0").tflops == 1e6 and c.device("B.1").memory_gb == 1e5
    assert c.bandwidth_gbs("A.0", "A.1") == 1e6 and c.latency_us("B.0", "B.1") == 1e7
    assert Cluster.from_dict(c.to_dict()).to_dict() == c.to_dict()


def test_synthetic_fleet_keeps_its_excluded_devices():
    c = parse_cluster({"synthetic": {"gpus": 16, "mix": {"rtx3090": 1}}, "excluded": ["m0.0"]}, "s")
    assert len(c.devices) == 15 and c.excluded == ("m0.0",)
