"""Zones: machines grouped into regions with their own links (hexicore.core.zones), priced per
device pair and honoured by the allocation (a whole zone may stay idle)."""

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.errors import HexicoreError
from hexicore.core.plan import Plan
from hexicore.core.settings import TrainSettings
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.planner.allocation.sub_clusters import machine_classes
from hexicore.planner.hexiscale import HexiScaleSolver
from hexicore.planner.problem import Problem
from hexicore.registry import Registry

from tests.conftest import model_preset

FAST = {"iterations": 8, "polish_rounds": 2, "time_budget": None}


def zoned(inter_zone_gbs, latency_us=30000.0, east=("E0", "E1"), west=("W0",)):
    ms = [{"name": n, "gpu": "rtx4090", "count": 4, "bandwidth_gbs": 32, "latency_us": 10, "zone": "east"} for n in east]
    ms += [{"name": n, "gpu": "rtx4090", "count": 4, "bandwidth_gbs": 32, "latency_us": 10, "zone": "west"} for n in west]
    return parse_cluster({"name": "z", "inter": {"bandwidth_gbs": 25.0, "latency_us": 10},
                          "inter_zone": {"bandwidth_gbs": inter_zone_gbs, "latency_us": latency_us},
                          "machines": ms}, "z.yaml")


def solve(cluster):
    m = model_preset("llama2_7b")
    p = Problem(cluster, m, TrainSettings(global_batch=32, micro_batch=1, seq_len=m.seq_len), AnalyticCostModel(),
                {"name": "1f1b"}, Registry.default())
    return HexiScaleSolver.from_params(**FAST).solve(p, seed=0)


def test_zone_links_price_each_pair_and_round_trip():
    c = parse_cluster({"name": "z", "inter": {"bandwidth_gbs": 25.0, "latency_us": 10},
                       "inter_zone": {"bandwidth_gbs": 1.0, "latency_us": 30000},
                       "zone_links": [{"between": ["east", "north"], "bandwidth_gbs": 3.0}],
                       "links": [{"between": ["E0", "N0"], "bandwidth_gbs": 7.0, "latency_us": 2}],
                       "machines": [{"name": n, "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32, "zone": z}
                                    for n, z in (("E0", "east"), ("E1", "east"), ("W0", "west"), ("N0", "north"))]},
                      "z.yaml")
    assert c.zones == ("east", "west", "north")
    assert (c.bandwidth_gbs("E0.0", "E1.0"), c.latency_us("E0.0", "E1.0")) == (25.0, 10)  # same zone: inter
    assert (c.bandwidth_gbs("E0.0", "W0.0"), c.latency_us("E0.0", "W0.0")) == (1.0, 30000)  # inter_zone
    assert (c.bandwidth_gbs("E1.0", "N0.0"), c.latency_us("E1.0", "N0.0")) == (3.0, 30000)  # zone pair link
    assert (c.bandwidth_gbs("E0.0", "N0.0"), c.latency_us("E0.0", "N0.0")) == (7.0, 2)  # machine pair wins
    assert parse_cluster(c.to_dict(), "plan.json", "cluster") == c
    assert len(machine_classes(c)) == 4  # E0, N0: own pair link; E1, W0: different zones
    assert machine_classes(zoned(1.0, east=("E0", "E1"))) == [("E0", "E1"), ("W0",)]  # a zone splits classes


@pytest.mark.parametrize("bad, field", [
    ({"zone_links": [{"between": ["east", "mars"], "bandwidth_gbs": 1}]}, "zone_links[0].between"),
    ({"zone_links": [{"between": ["east", "west"], "bandwidth": 1}]}, "zone_links[0].bandwidth"),
    ({"inter_zone": {"bandwidth_gbs": 0}}, "inter_zone.bandwidth_gbs"),
    ({"inter_zone": {"bandwidth_gbs": 1, "lat": 3}}, "inter_zone.lat"),
])
def test_bad_zone_sections_are_refused_with_their_field(bad, field):
    base = zoned(1.0).to_dict()
    base.pop("devices")
    base.pop("inter_zone")
    with pytest.raises(HexicoreError) as e:
        parse_cluster({**base, **bad}, "z.yaml")
    assert e.value.field == field


def test_inter_zone_without_zones_is_refused_not_ignored():
    base = zoned(1.0).to_dict()
    base.pop("devices")
    base["machines"] = [{k: v for k, v in m.items() if k != "zone"} for m in base["machines"]]
    with pytest.raises(HexicoreError) as e:
        parse_cluster(base, "z.yaml")
    assert e.value.field == "inter_zone" and "no machine names a zone" in str(e.value)
    base.pop("inter_zone")
    assert parse_cluster(base, "z.yaml").inter_zone is None


def test_a_zone_behind_a_very_slow_link_stays_idle_and_a_fast_one_is_used():
    east_only = solve(zoned(1.0, west=()))
    slow = solve(zoned(1e-4, latency_us=1e6))
    assert all(d.startswith("E") for d in slow.devices)
    assert slow.estimate.iteration_s == pytest.approx(east_only.estimate.iteration_s, rel=0, abs=1e-9)
    (idle,) = slow.solver["idle"]
    assert idle["kind"] == "zone" and idle["name"] == "west" and idle["devices"] == ["W0.0", "W0.1", "W0.2", "W0.3"]
    fast = solve(zoned(25.0, latency_us=10))
    assert any(d.startswith("W") for d in fast.devices)
    assert fast.estimate.iteration_s < east_only.estimate.iteration_s
    assert Plan.from_json(slow.to_json()).cluster == slow.cluster


def test_two_zone_preset_loads_and_plans():
    from hexicore.app.api import plan as plan_api

    p = plan_api(cluster="two_zone", model="llama2_7b", overrides=["train.global_batch=64", "solver.iterations=6"])
    assert p.cluster.zones == ("east", "west")
    assert p.cluster.bandwidth_gbs("E0.0", "W0.0") == 1.25


def test_link_matrices_agree_with_the_pairwise_links_across_zones():
    """The search's per-machine-pair matrices price zones exactly as the pairwise lookup does."""
    c = parse_cluster({"name": "z", "inter": {"bandwidth_gbs": 25.0, "latency_us": 10},
                       "inter_zone": {"bandwidth_gbs": 1.0, "latency_us": 30000},
                       "zone_links": [{"between": ["east", "north"], "bandwidth_gbs": 3.0}],
                       "links": [{"between": ["E0", "N0"], "bandwidth_gbs": 7.0, "latency_us": 2}],
                       "machines": [{"name": n, "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32, **({"zone": z} if z else {})}
                                    for n, z in (("E0", "east"), ("E1", "east"), ("W0", "west"), ("N0", "north"),
                                                 ("X0", None))]}, "z.yaml")
    row, bw, lat = c.link_matrices
    for a in c.devices:
        for b in c.devices:
            if a.id != b.id and a.machine != b.machine:
                assert (bw[row[a.id], row[b.id]], lat[row[a.id], row[b.id]]) == \
                    (c.bandwidth_gbs(a.id, b.id), c.latency_us(a.id, b.id)), (a.id, b.id)


def test_a_link_without_latency_keeps_the_latency_of_the_link_it_replaces():
    """Bandwidth and latency are a pair: an override that gives only ``bandwidth_gbs`` keeps the
    latency of the link it replaces for that pair (docs/formats.md). Across zones that is the
    zone link or ``inter_zone``, never ``inter`` (it took inter's 10 us for a 30 ms crossing)."""
    c = parse_cluster({"name": "z", "inter": {"bandwidth_gbs": 25.0, "latency_us": 10},
                       "inter_zone": {"bandwidth_gbs": 1.0, "latency_us": 30000},
                       "zone_links": [{"between": ["east", "north"], "bandwidth_gbs": 3.0}],
                       "links": [{"between": ["E0", "W0"], "bandwidth_gbs": 2.0},
                                 {"between": ["E0", "N0"], "bandwidth_gbs": 4.0},
                                 {"between": ["E0", "E1"], "bandwidth_gbs": 50.0},
                                 {"between": ["W0", "N0"], "bandwidth_gbs": 5.0, "latency_us": 7}],
                       "machines": [{"name": n, "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32, "zone": z}
                                    for n, z in (("E0", "east"), ("E1", "east"), ("W0", "west"), ("N0", "north"))]},
                      "z.yaml")
    assert (c.bandwidth_gbs("E0.0", "W0.0"), c.latency_us("E0.0", "W0.0")) == (2.0, 30000)  # inter_zone's
    assert (c.bandwidth_gbs("E0.0", "N0.0"), c.latency_us("E0.0", "N0.0")) == (4.0, 30000)  # the zone link's, inter_zone's
    assert (c.bandwidth_gbs("E0.0", "E1.0"), c.latency_us("E0.0", "E1.0")) == (50.0, 10)  # inter's, inside a zone
    assert c.latency_us("W0.0", "N0.0") == 7  # given
    assert c.latency_us("E0.0", "E0.0") == 0 and c.machine("E0").latency_us == 0  # a machine without: 0
    row, _, lat = c.link_matrices
    assert lat[row["E0.0"], row["W0.0"]] == 30000
    again = parse_cluster({k: v for k, v in c.to_dict().items() if k != "devices"}, "again")
    assert again.links == c.links  # written with the latency resolved
    with pytest.raises(HexicoreError) as e:  # null is no latency; it is refused, not read as absent
        parse_cluster({"name": "z", "inter": {"bandwidth_gbs": 1.0},
                       "machines": [{"name": n, "gpu": "rtx4090", "count": 1, "bandwidth_gbs": 32} for n in "AB"],
                       "links": [{"between": ["A", "B"], "bandwidth_gbs": 2.0, "latency_us": None}]}, "z.yaml")
    assert e.value.field == "links[0].latency_us"
