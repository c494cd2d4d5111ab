"""Links between a cluster's machines: per-pair overrides and zones (regions) with their own links.

A geo-distributed fleet is machines in several zones (regions, data centres): links inside a
zone are the cluster's ``inter`` link (or a per-pair ``links`` override), links between zones are
much slower. The cluster file says so with ``zone: NAME`` on each machine, ``inter_zone:
{bandwidth_gbs, latency_us}`` (the default between zones) and optional ``zone_links`` per zone
pair. Pricing sees the resulting per-pair bandwidth and latency (HexiScale App. A's alpha/beta),
so the planner crosses a slow zone boundary only where the cost model says it pays, and the
allocation may leave a whole zone idle (:mod:`hexicore.planner.allocation`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from hexicore.core import limits, schema
from hexicore.core.errors import HexicoreError

#: the fields of a link (``inter``, ``inter_zone``; ``links``/``zone_links`` add ``between``)
LINK_KEYS = frozenset({"bandwidth_gbs", "latency_us"})


def parse_inter(d: Mapping[str, Any], n_machines: int, source: str | None, prefix: str | None) -> tuple[float, float]:
    """``inter: {bandwidth_gbs, latency_us}``, the default link between machines, as (GB/s, us):
    required with more than one machine; ``latency_us`` absent is 0."""
    ip = schema.dotted(prefix, "inter")
    inter = d.get("inter")
    if inter is None:
        if n_machines > 1:
            raise HexicoreError("missing required field (the default inter-machine link)", source=source, field=ip)
        inter = {"bandwidth_gbs": 1.0, "latency_us": 0.0}
    inter = schema.as_mapping(inter, source, ip)
    schema.known_keys(inter, LINK_KEYS, source, ip)
    return (limits.bandwidth(schema.get(inter, "bandwidth_gbs", source, ip), source, schema.dotted(ip, "bandwidth_gbs")),
            limits.latency(inter.get("latency_us", 0.0), source, schema.dotted(ip, "latency_us")))


def parse_zones(d: Mapping[str, Any], zones: set[str], inter: tuple[float, float], source: str | None,
                prefix: str | None) -> tuple[tuple[float, float] | None, tuple[tuple, ...]]:
    """``inter_zone: {bandwidth_gbs, latency_us}`` (the default link between machines of
    different zones; required where two zones have no ``zone_links`` entry) and ``zone_links`` (per zone-pair overrides); a machine
    joins a zone with ``zone: NAME`` (``zones``: the names the machines use). Returns
    ``(inter_zone or None, ((between, bandwidth_gbs, latency_us), ...))``."""
    inter_zone = None
    if d.get("inter_zone") is not None:
        zp = schema.dotted(prefix, "inter_zone")
        if not zones:  # it would price no link: a zone-less cluster's machines all use ``inter``
            raise HexicoreError("inter_zone is the link between machines of different zones, but no machine "
                                "names a zone (zone: NAME)", source=source, field=zp)
        z = schema.as_mapping(d["inter_zone"], source, zp)
        schema.known_keys(z, LINK_KEYS, source, zp)
        inter_zone = (limits.bandwidth(schema.get(z, "bandwidth_gbs", source, zp), source, schema.dotted(zp, "bandwidth_gbs")),
                      limits.latency(z.get("latency_us", inter[1]), source, schema.dotted(zp, "latency_us")))
    links: list[tuple] = []
    for i, raw in enumerate(schema.optional_list(d, "zone_links", source, schema.dotted(prefix, "zone_links"))):
        fp = schema.dotted(prefix, f"zone_links[{i}]")
        l = schema.as_mapping(raw, source, fp)
        schema.known_keys(l, LINK_KEYS | {"between"}, source, fp)
        between = [str(x) for x in schema.as_list(schema.get(l, "between", source, fp), source, schema.dotted(fp, "between"))]
        if len(between) != 2 or between[0] == between[1] or any(z not in zones for z in between):
            raise HexicoreError(f"between must name two different zones of the machines ({', '.join(sorted(zones)) or 'none'})",
                                source=source, field=schema.dotted(fp, "between"))
        if any(set(x[0]) == set(between) for x in links):
            raise HexicoreError(f"duplicate zone link between {between[0]} and {between[1]}", source=source, field=fp)
        links.append(((between[0], between[1]),
                          limits.bandwidth(schema.get(l, "bandwidth_gbs", source, fp), source, schema.dotted(fp, "bandwidth_gbs")),
                          limits.latency(l.get("latency_us", (inter_zone or inter)[1]), source,
                                         schema.dotted(fp, "latency_us"))))
    if inter_zone is None:  # zones without their link would be priced as one zone, without a word
        covered = {frozenset(x[0]) for x in links}
        ordered = sorted(zones)
        loose = next(((a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:] if {a, b} not in covered), None)
        if loose is not None:
            raise HexicoreError(f"the machines name zones, but no link between zones {loose[0]} and {loose[1]} is given: "
                                "add inter_zone: {bandwidth_gbs, latency_us} (or zone_links for every pair)",
                                source=source, field=schema.dotted(prefix, "inter_zone"))
    return inter_zone, tuple(links)


def parse_links(d: Mapping[str, Any], seen: set[str], replaced_latency: Callable[[str, str], float],
                source: str | None, prefix: str | None) -> list[tuple]:
    """The ``links`` section: per machine-pair overrides, as ``(between, GB/s, us)``. An entry
    without ``latency_us`` keeps ``replaced_latency(a, b)``: the latency of the link it replaces
    (``inter``, or between machines of different zones their zone link or ``inter_zone``)."""
    links: list[tuple] = []
    pairs: set[frozenset] = set()
    for i, raw in enumerate(schema.optional_list(d, "links", source, schema.dotted(prefix, "links"))):
        fp = schema.dotted(prefix, f"links[{i}]")
        l = schema.as_mapping(raw, source, fp)
        schema.known_keys(l, LINK_KEYS | {"between"}, source, fp)
        between = schema.as_list(schema.get(l, "between", source, fp), source, schema.dotted(fp, "between"))
        if len(between) != 2 or between[0] == between[1]:
            raise HexicoreError("between must name two different machines", source=source, field=schema.dotted(fp, "between"))
        for mname in between:
            if str(mname) not in seen:
                raise HexicoreError(f"link names unknown machine {mname!r}", source=source, field=schema.dotted(fp, "between"))
        key = frozenset(map(str, between))
        if key in pairs:
            raise HexicoreError(f"duplicate link between {between[0]} and {between[1]}", source=source, field=fp)
        pairs.add(key)
        links.append((
            (str(between[0]), str(between[1])),
            limits.bandwidth(schema.get(l, "bandwidth_gbs", source, fp), source, schema.dotted(fp, "bandwidth_gbs")),
            limits.latency(l["latency_us"] if "latency_us" in l else replaced_latency(*map(str, between)), source,
                           schema.dotted(fp, "latency_us")),
        ))
    return links


def fill_zone_links(cluster: Any, bw: Any, lat: Any) -> None:
    """Set the machine-pair matrices' entries between machines of different zones (in place) to
    their zone link or ``inter_zone`` (rows in ``cluster.machines`` order), as the pairwise
    lookup prices them; per-pair overrides and the diagonal are the caller's."""
    import numpy as np

    zones = cluster.zones
    if not zones:
        return
    zid = np.array([zones.index(m.zone) if m.zone is not None else -1 for m in cluster.machines])
    first = {int(i): cluster.machines[int(np.argmax(zid == i))].name for i in set(zid.tolist())}
    for i, a in first.items():
        for j, b in first.items():
            if i != j:
                mask = (zid[:, None] == i) & (zid[None, :] == j)
                bw[mask], lat[mask] = cluster._between_machines(a, b)
