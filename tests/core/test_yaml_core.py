"""Cluster, model and profile files are read with YAML 1.2's plain scalars
(hexicore/core/yaml_core.py): PyYAML's YAML 1.1 made ``latency_us: 1:30`` the number 90,
``count: 017`` 15 and ``tied_embeddings: yes`` true, silently."""

from __future__ import annotations

import pytest
import yaml

from hexicore.core.cluster import Cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.model import ModelSpec
from hexicore.core.yaml_core import CoreLoader
from tests.conftest import run_cli

CLUSTER = ("name: y\ninter: {bandwidth_gbs: 1.0, latency_us: 50}\n"
           "machines:\n  - {name: A, gpu: rtx4090, count: 2, bandwidth_gbs: 32, latency_us: 10}\n")
MODEL = "name: m\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nffn: 176\nvocab: 256\nseq_len: 32\n"


@pytest.mark.parametrize("old, new, field, yaml11", [
    ("latency_us: 50", "latency_us: 1:30", "inter.latency_us", "90"),
    ("count: 2", "count: 017", "machines[0].count", "15"),
    ("bandwidth_gbs: 32", "bandwidth_gbs: 1_000", "machines[0].bandwidth_gbs", "1000"),
    ("count: 2", "count: 0b10", "machines[0].count", "2"),
    ("latency_us: 10", "latency_us: on", "machines[0].latency_us", None),
])
def test_yaml11_numbers_in_a_cluster_file_are_one_line_naming_the_field(old, new, field, yaml11, tmp_path, capsys):
    path, out = tmp_path / "c.yaml", tmp_path / "p.json"
    path.write_text(CLUSTER.replace(old, new))
    code = run_cli(["plan", f"cluster_file={path}", "model=tiny", f"out={out}", f"hydra.run.dir={tmp_path / 'h'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    value = new.split(": ", 1)[1]
    assert f"c.yaml: {field}: expected" in err and repr(value) in err and not out.exists(), err
    assert (f"YAML 1.1 would read {yaml11}" in err) == (yaml11 is not None), err


@pytest.mark.parametrize("line, field", [("tied_embeddings: yes", "tied_embeddings"), ("qkv_bias: on", "qkv_bias"),
                                         ("layers: 010", "layers"), ("seq_len: 1:04", "seq_len")])
def test_yaml11_forms_in_a_model_file_are_refused(line, field, tmp_path):
    key = line.split(":")[0]
    text = "\n".join(ln for ln in MODEL.splitlines() if not ln.startswith(f"{key}:")) + f"\n{line}\n"
    (tmp_path / "m.yaml").write_text(text)
    with pytest.raises(HexicoreError) as e:
        ModelSpec.load(tmp_path / "m.yaml")
    assert e.value.field == field and e.value.source.endswith("m.yaml"), str(e.value)


def test_names_that_yaml11_took_for_booleans_or_numbers_are_text(tmp_path):
    """``name: on`` was the boolean true (refused as no name), ``name: 1:30`` the number 90."""
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("name: y", "name: 1:30").replace("name: A", "name: on"))
    c = Cluster.load(path)
    assert c.name == "1:30" and [d.id for d in c.devices] == ["on.0", "on.1"]


def test_what_the_loader_resolves():
    text = ("t: true\nf: False\nn: ~\ne:\ni: -12\nz: 0\nh: 0x1F\nx: 1.5\nd: .5\ns: 1e3\nk: 1.0e-05\ninf: .inf\n"
            "b: &b {p: 1}\nm: {<<: *b, q: 2}\ny: yes\no: off\nt11: 2001-12-14\noct: 017\n")
    got = yaml.load(text, Loader=CoreLoader)
    assert got == {"t": True, "f": False, "n": None, "e": None, "i": -12, "z": 0, "h": 31, "x": 1.5, "d": 0.5,
                   "s": 1000.0, "k": 1e-05, "inf": float("inf"), "b": {"p": 1}, "m": {"p": 1, "q": 2}, "y": "yes",
                   "o": "off", "t11": "2001-12-14", "oct": "017"}
    assert yaml.safe_load("a: 1:30") == {"a": 90}  # PyYAML's own loader is left as it is


def test_files_hexicore_writes_read_back_the_same(tmp_path):
    """A profile (yaml.safe_dump) and the shipped presets read alike under both resolutions."""
    from importlib import resources

    doc = {"a": 1e-05, "b": 1.0e20, "c": float("inf"), "d": -3, "e": "yes", "f": "1:30", "g": "017", "h": True,
           "i": None, "j": "0x10", "k": 12345678901234}
    assert yaml.load(yaml.safe_dump(doc), Loader=CoreLoader) == doc
    for group in ("cluster", "model"):
        for f in resources.files("hexicore.conf").joinpath(group).iterdir():
            if f.name.endswith(".yaml"):
                text = f.read_text(encoding="utf-8")
                assert yaml.load(text, Loader=CoreLoader) == yaml.safe_load(text), f.name
