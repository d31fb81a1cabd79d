"""The commands that read an etcd cluster's records: ``status --etcd`` (one cluster, or
several side by side) and ``snowfence release-region``."""

from __future__ import annotations

import argparse
import time

import orjson

from ..errors import ConfigError, EtcdUnavailable, SnowfenceError
from ..etcd.keys import REGION_CLAIMS
from ..ids import format_unix_ms
from .args import ETCD_FIELDS, Plain, add_config_flags, load_config


def add(sub) -> None:
    release = sub.add_parser(
        "release-region",
        help="Give up a retired cluster's region claims in etcd, so another cluster may use its regions.",
        description=f"Each cluster of an etcd claims its region numbers (in {REGION_CLAIMS}), so that a "
        "second cluster, a mistyped --cluster say, cannot mint in a region another cluster holds. When a cluster "
        "is retired for good, this removes its claims (--etcd/--cluster name it). Refused while any of its worker "
        "IDs is held. The next cluster to claim a region starts a new store, whose claims wait out the longest "
        "reservation window recorded for the region plus the clock-skew bound.",
    )
    add_config_flags(release, ETCD_FIELDS)
    release.set_defaults(run=cmd_release_region)


def cmd_release_region(args: argparse.Namespace) -> int:
    config = load_config(args)
    if not config.etcd:
        raise ConfigError("release-region needs --etcd and --cluster: region claims live in etcd")
    try:
        released = read_etcd(config, lambda c: c.release_regions())
    except ConfigError:
        raise
    except SnowfenceError as exc:
        raise Plain(str(exc)) from None
    if released:
        print(f"released the claims of cluster {config.cluster!r} on regions {', '.join(map(str, released))}")
    else:
        print(f"cluster {config.cluster!r} claims no region of this etcd")
    return 0


def read_etcd(config, read):
    """``read(cluster)`` on the etcd cluster ``config`` names; etcd not answering is said in plain words."""
    from ..etcd.cluster import Cluster

    cluster = Cluster(config)
    try:
        return read(cluster)
    except EtcdUnavailable as exc:
        detail = str(exc).split(" failed: ", 1)[-1]  # what the client said, without which call it was
        raise Plain(
            f"cannot reach etcd at {','.join(config.etcd)}: {detail} (each call waits up to "
            f"{config.etcd_timeout_s:g} s); is etcd running there, and are the address, TLS files and password right?"
        ) from None
    finally:
        cluster.close()


def _region_claims(cluster) -> dict:
    """This etcd's region claims for status: {region: cluster}, or why they cannot be read."""
    try:
        claims = cluster.region_claims()
    except ConfigError as exc:
        return {"unreadable": str(exc)}
    return {"regions": {str(r): c.to_dict() for r, c in sorted(claims.regions.items())}, "widths": claims.widths}


def _claim_conflicts(name: str, regions: list[int], claims: dict) -> list[str]:
    """Why the regions cluster ``name``'s nodes used are not its to mint in, if they are not."""
    if "unreadable" in claims:
        return [claims["unreadable"]]
    out = []
    for region in regions:
        claim = claims["regions"].get(str(region))
        if claim is not None and claim["cluster"] != name:
            out.append(
                f"region {region}, which nodes of cluster {name!r} used, is claimed by cluster {claim['cluster']!r}: "
                "their nodes can mint the same IDs"
            )
    return out


def cluster_status(config, as_json: bool) -> int:
    entries, members, regions, claims, known = read_etcd(
        config, lambda c: (c.census(), c.nodes(), c.regions(), _region_claims(c), c.known())
    )
    if not (known or entries or members or regions):
        others = sorted({c["cluster"] for c in claims.get("regions", {}).values()})
        raise Plain(
            f"cluster {config.cluster!r} is unknown to etcd at {','.join(config.etcd)}: no layout, node, region or "
            "worker ID of it is recorded there"
            + (f" (clusters with region claims there: {', '.join(others)})" if others else "")
            + "; is --cluster (or SNOWFENCE_CLUSTER) right?"
        )
    conflicts = _claim_conflicts(config.cluster, regions, claims)
    from ..broker.membership import bounds_differ

    unlike = bounds_differ(members)
    epoch = config.layout.epoch_ms
    now_ms = time.time_ns() // 1_000_000 - epoch
    for e in entries:
        if e.get("mark_ms") is not None:
            e["mark_time"] = format_unix_ms(e["mark_ms"] + epoch)
            e["mark_passed"] = e["mark_ms"] < now_ms
    pools = worker_id_pools(entries, regions, config.layout)
    if as_json:
        doc = {
            "cluster": config.cluster,
            "regions": regions,
            "region_claims": claims,
            "conflicts": conflicts,
            "bounds_not_alike": unlike,
            "nodes": members,
            "worker_ids": entries,
            "pools": pools,
        }
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return 1 if conflicts else 0
    print(
        f"cluster {config.cluster!r}: {len(members)} nodes, regions {', '.join(map(str, regions)) or '-'}; "
        f"{sum(e['state'] == 'held' for e in entries)} worker IDs held, "
        f"{sum(e['state'] == 'retired' for e in entries)} retired"
    )
    for pool in pools:
        print(
            f"region {pool['region']}: {pool['free']} of {pool['size']} worker IDs free, {pool['held']} held, "
            f"{pool['quarantined']} quarantined (mark ahead of the clock), {pool['unreadable']} unreadable"
        )
    if "regions" in claims:
        shown = ", ".join(f"{r} {c['cluster']}" for r, c in claims["regions"].items()) or "none"
        print(f"region claims of this etcd (region cluster): {shown}")
    for conflict in conflicts:
        print(f"CONFLICT: {conflict}")
    for line in unlike:
        print(f"WARNING: {line}; set it alike on every node")
    if members:
        print(f"{'endpoint':<32} {'region':>6} {'rotation':<8} {'worker_ids':<16} clock offsets to peers (ms)")
        for n in members:
            endpoint = (n.get("endpoints") or [None])[0] or f"({n.get('node')}: none advertised)"
            offsets = n.get("clock_offsets_ms") or {}
            shown = ", ".join(
                f"{peer} {ms:+.1f}" for peer, ms in sorted(offsets.items()) if isinstance(ms, int | float)
            )
            ids = ",".join(str(w) for w in n.get("worker_ids") or []) or "-"
            print(
                f"{endpoint:<32} {dash(n.get('region')):>6} "
                f"{'yes' if n.get('in_rotation') else 'no':<8} {ids:<16} {shown or '-'}"
            )
        print()
    print(f"{'region':>6} {'worker':>6} {'state':<8} {'lease_s':>7} {'renewed_s':>9} {'mark':<24} {'passed':<6} owner")
    for e in entries:
        print(
            f"{e['region']:>6} {e['worker_id']:>6} {e['state']:<8} {dash(e.get('lease_remaining_s')):>7} "
            f"{dash(e.get('renewed_ago_s')):>9} {e.get('mark_time', '-'):<24} "
            f"{'yes' if e.get('mark_passed') else 'no':<6} {e.get('holder') or e.get('last_holder') or ''}"
        )
    return 1 if conflicts else 0


def worker_id_pools(entries: list[dict], regions: list[int], layout) -> list[dict]:
    """How close each region's worker-ID pool is to exhaustion, from the census (``entries``
    with ``mark_passed`` set): ``size`` (``2**worker_bits``), ``held`` (claimed), ``quarantined``
    (retired, its mark not yet passed: a new owner would mint nothing until it has),
    ``unreadable`` (a claim passes it over) and ``free`` (the rest: never used, or retired
    with its mark passed). One per region the cluster's nodes used or the census names."""
    size = layout.max_worker + 1
    counts: dict[int, dict] = {
        region: {"region": region, "size": size, "free": size, "held": 0, "quarantined": 0, "unreadable": 0}
        for region in sorted({*regions, *(e["region"] for e in entries)})
    }
    for e in entries:
        pool = counts[e["region"]]
        kind = e["state"] if e["state"] in ("held", "unreadable") else None
        if e["state"] == "retired" and not e.get("mark_passed"):
            kind = "quarantined"
        if kind:
            pool[kind] += 1
            pool["free"] -= 1
    return list(counts.values())


def clusters_status(configs: list, as_json: bool) -> int:
    """Several etcd clusters (one a region, say) side by side: their nodes and the
    region numbers each records; a region number two clusters use is a conflict
    (their nodes could mint the same IDs), and makes the exit status 1; so does a cluster
    its etcd knows nothing of (a mistyped --cluster would otherwise look like a quiet one)."""
    seen = []
    for config in configs:
        regions, members, claims, known, census = read_etcd(
            config, lambda c: (c.regions(), c.nodes(), _region_claims(c), c.known(), c.census())
        )
        entry = {"cluster": config.cluster, "etcd": list(config.etcd), "regions": regions, "nodes": members}
        entry["known"] = bool(known or census or members or regions)
        seen.append({**entry, "region_claims": claims})
    unknown = [entry for entry in seen if not entry["known"]]
    users: dict[int, list[str]] = {}
    for entry in seen:
        # The regions its nodes used, and those its etcd's claims give it.
        claimed = [
            int(r) for r, c in entry["region_claims"].get("regions", {}).items() if c["cluster"] == entry["cluster"]
        ]
        for region in sorted({*entry["regions"], *claimed}):
            users.setdefault(region, []).append(entry["cluster"])
    conflicts = {region: names for region, names in sorted(users.items()) if len(names) > 1}
    if as_json:
        doc = {
            "clusters": seen,
            "conflicts": [{"region": r, "clusters": n} for r, n in conflicts.items()],
            "unknown": [entry["cluster"] for entry in unknown],
        }
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{'cluster':<20} {'regions':<16} {'nodes':>5}  etcd")
        for entry in seen:
            regions = ",".join(map(str, entry["regions"])) or "-"
            print(f"{entry['cluster']:<20} {regions:<16} {len(entry['nodes']):>5}  {','.join(entry['etcd'])}")
        for region, names in conflicts.items():
            print(
                f"CONFLICT: region {region} is used by clusters {', '.join(names)}: their nodes can mint the same IDs; "
                "give each cluster its own region numbers"
            )
        for entry in unknown:
            print(
                f"UNKNOWN: cluster {entry['cluster']!r} is unknown to etcd at {','.join(entry['etcd'])}: no layout, "
                "node, region or worker ID of it is recorded there; is its --cluster right?"
            )
        if not conflicts:
            print("no region number is used by two clusters" + (" of those known" if unknown else ""))
    return 1 if conflicts or unknown else 0


def dash(value) -> str:
    """A value of a table, or - for none."""
    return "-" if value is None else str(value)
