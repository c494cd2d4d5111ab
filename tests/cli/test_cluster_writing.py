"""Writing a cluster file: ``hexicore gpus`` lists the catalog, a machine's ``bandwidth_gbs``
defaults to its GPU type's usual link, and ``max_tp`` caps the TP groups of one machine."""

from __future__ import annotations

import json

import yaml

from hexicore.core.cluster import parse_cluster
from tests.conftest import run_cli
from tests.helpers import make_plan

PCIE = {"name": "pcie", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
        "machines": [{"name": "A", "gpu": "a100-80g", "count": 4},
                     {"name": "B", "gpu": "rtx4090", "count": 4, "max_tp": 1}]}


def test_gpus_lists_the_catalog_and_a_files_types(tmp_path, capsys):
    assert run_cli(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "rtx4090" in out and "165.2" in out and "h100-80g" in out and "bandwidth_gbs" in out
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**PCIE, "gpus": {"my-gpu": {"tflops": 120, "memory_gb": 32}}}))
    assert run_cli(["gpus", f"cluster_file={tmp_path / 'c.yaml'}"]) == 0
    assert "my-gpu" in capsys.readouterr().out
    assert run_cli(["gpus", "model=tiny"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_bandwidth_defaults_to_the_gpus_usual_link():
    c = parse_cluster(PCIE, "c.yaml")
    assert c.machine("A").bandwidth_gbs == 300 and c.machine("B").bandwidth_gbs == 32
    assert c.to_dict()["machines"][1]["max_tp"] == 1 and parse_cluster(c.to_dict(), "again") == c


def test_max_tp_caps_one_machine(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(PCIE))
    for solver in ("hexiscale", "megatron"):
        out = tmp_path / f"{solver}.json"
        assert run_cli(["plan", f"cluster_file={path}", "model=llama2_7b", "train.global_batch=16", f"solver={solver}",
                        f"out={out}"]) == 0, capsys.readouterr().err
        plan = json.loads(out.read_text())
        tps = [s["tp"] for p in plan["pipelines"] for s in p["stages"] if any(d.startswith("B.") for d in s["devices"])]
        assert tps and max(tps) == 1, (solver, tps)


def test_a_plan_above_a_machines_max_tp_is_refused(tmp_path, capsys, paper_case, llama13b):
    doc = json.loads(make_plan(paper_case, llama13b).to_json())  # A.0 and A.1 form a TP-2 stage
    doc["cluster"]["machines"][0]["max_tp"] = 1
    (tmp_path / "capped.json").write_text(json.dumps(doc))
    assert run_cli(["evaluate", f"plan_file={tmp_path / 'capped.json'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_tp" in err and "capped.json" in err
