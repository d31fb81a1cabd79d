"""``snowfence status``: a node's view (its workers), several nodes' side by side, or
with ``--etcd`` the cluster's (:mod:`snowfence.cli.cluster`)."""

from __future__ import annotations

import argparse
import os
import re
import time

import orjson

from ..errors import ConfigError, SnowfenceError
from ..ids import Layout, format_unix_ms
from . import node
from .args import DEFAULT_CONNECT, ETCD_FIELDS, LAYOUT_FIELDS, add_config_flags, connect_flags, load_config
from .cluster import cluster_status, clusters_status, dash


def add(sub) -> None:
    status = sub.add_parser(
        "status",
        help="Show a node's workers: worker ID, state, lease, reservation.",
        description="Ask a node (--connect) about its workers, or with --etcd read the cluster from etcd: its "
        "nodes (endpoint, region, worker IDs, rotation, clock offsets), every worker ID held (owner, lease, mark) "
        "or retired (mark). Repeat --etcd URLS --cluster NAME to see several clusters side by side, with any region "
        "number two of them use flagged.",
    )
    connect_flags(status)
    for action in status._actions:
        if action.dest == "connect":
            # None unless given: a --connect on the command line asks that node, whatever
            # SNOWFENCE_ETCD says (cmd_status reads SNOWFENCE_CONNECT and the default then).
            action.default = None
            action.help += " Given, it is the node's view, even with SNOWFENCE_ETCD set."
    status.add_argument("--json", action="store_true", help="Print the status as JSON.")
    add_config_flags(status, (*LAYOUT_FIELDS, *ETCD_FIELDS), repeatable=("etcd", "cluster"))
    status.set_defaults(run=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    etcds, clusters = getattr(args, "etcd", None) or [], getattr(args, "cluster", None) or []
    if len(etcds) > 1 or len(clusters) > 1:
        if len(etcds) != len(clusters):
            raise ConfigError("give one --cluster NAME after each --etcd URLS")
        configs = []
        for urls, name in zip(etcds, clusters, strict=True):
            args.etcd, args.cluster = urls, name
            configs.append(load_config(args))
        return clusters_status(configs, args.json)
    connect_given = args.connect is not None
    if connect_given and etcds:
        raise ConfigError("give --connect (a node's view) or --etcd (the cluster's, read from etcd), not both")
    if not connect_given:
        args.connect = os.environ.get("SNOWFENCE_CONNECT", DEFAULT_CONNECT)
    for name in ("etcd", "cluster"):
        if getattr(args, name, None):
            setattr(args, name, getattr(args, name)[0])
    if connect_given:  # the node asked for, not the etcd the environment names
        args.etcd = ""
    config = load_config(args)
    if config.etcd:
        return cluster_status(config, args.json)
    if len(node.endpoints_of(args)) > 1:
        return _nodes_status(args)
    with node.open_client(args) as client:
        status = client.status()
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0
    broker = status["broker"]
    # A server older than software_version in STATUS says only its protocol version.
    version = f"snowfence {status['software_version']}, " if status.get("software_version") else ""
    print(
        f"broker pid {broker.get('pid')} on {broker.get('bind')}: {broker.get('state')}, "
        f"{broker.get('mode')} mode, region {status.get('region')}, "
        f"{broker.get('workers_in_rotation')} of {len(broker.get('slots', []))} workers in rotation "
        f"({version}protocol {status.get('version')})"
    )
    slots = broker.get("slots", [])
    print(
        f"{sum(s.get('restarts') or 0 for s in slots)} worker restarts, "
        f"{sum(s.get('kills') or 0 for s in slots)} killed for silence; "
        f"{broker.get('connections', 0)} client connections, {broker.get('waiting', 0)} requests waiting"
    )
    print(f"fast port {_port(broker.get('fast_port'))}, HTTP port {_port(broker.get('http_port'))}")
    end = _layout_end(status)
    if end:
        print(end)
    for pool in (broker.get("watermark") or {}).get("pools") or ():
        print(
            f"region {pool.get('region')}: {pool.get('free')} of {pool.get('size')} worker IDs free, "
            f"{pool.get('held')} held, {pool.get('quarantined')} quarantined (as the last watermark round read them)"
        )
    print(
        f"{'slot':>5} {'pid':>7} {'worker_id':>9} {'state':<13} {'rotation':<8} {'fence_in_s':>16} "
        f"{'lease_s':>7} {'reserved_until':<24} reason"
    )
    rows = [*status["workers"], *_own_rows(broker)]
    for w in rows:
        reserved = w.get("reserved_until_ms")
        reserved_text = (
            format_unix_ms(reserved + status["layout"]["epoch_ms"])
            if isinstance(reserved, int) and reserved >= 0
            else "-"
        )
        print(
            f"{w.get('slot', '-'):>5} {w.get('pid', '-'):>7} {dash(w.get('worker_id')):>9} {str(w.get('state')):<13} "
            f"{'yes' if w.get('in_rotation') else 'no':<8} {_fence_text(w):>16} "
            f"{dash(w.get('lease_remaining_s')):>7} {reserved_text:<24} {_row_reason(w)}"
        )
    passed = {p["worker_id"]: p["reason"] for w in status["workers"] for p in w.get("passed_over") or ()}
    for worker_id, reason in sorted(passed.items()):
        print(f"passed over worker ID {worker_id}: {reason}")
    for problem in sorted({w["store_problem"] for w in status["workers"] if w.get("store_problem")}):
        print(f"STORE WENT BACK: {problem}")
    return 0


def _layout_end(status: dict) -> str:
    """The layout's end and the years left, as the node said them (STATUS ``layout_end``);
    from its layout by this host's clock for a node that does not say them."""
    end = status.get("layout_end")
    if not isinstance(end, dict):
        try:
            end = Layout.from_dict(status["layout"]).lifetime(time.time_ns() // 1_000_000)
        except (KeyError, TypeError, ValueError, ConfigError):
            return ""
    years = end.get("years_left")
    if not isinstance(years, int | float):
        return ""
    left = f"{years:.2f} years left" if years > 0 else "ENDED: no ID can be minted"
    return f"layout ends {end.get('end')} ({left})"


def _port(door) -> str:
    """A door of STATUS (``broker.fast_port``, ``broker.http_port``): its port, or off."""
    return str(door["port"]) if isinstance(door, dict) and door.get("port") is not None else "off"


def _own_rows(broker: dict) -> list[dict]:
    """The broker's own worker ID as rows of the status table (slot ``own``, the broker's pid)."""
    own = broker.get("own_worker_id")
    if not isinstance(own, dict):
        return []
    base = {"slot": "own", "pid": broker.get("pid"), "in_rotation": bool(own.get("ready")), "reason": own.get("reason")}
    held = [h for h in own.get("held") or () if isinstance(h, dict)]
    if not held:
        return [{**base, "worker_id": None, "state": own.get("state")}]
    return [{**h, **base} for h in held]


def _fence_text(row: dict) -> str:
    """When the worker ID fences itself: in seconds, or how long ago it did."""
    fence = row.get("fence_in_s")
    if isinstance(fence, int | float) and (fence < 0 or row.get("state") == "fenced"):
        return f"fenced {max(-fence, 0):.1f} s ago"
    return dash(fence)


def _row_reason(row: dict) -> str:
    """The reason of one row, about its own worker ID: a worker's reason names all it holds
    ("holding worker ID 11, 12, 13"), or one of them, or none (then it is about the process)."""
    reason = row.get("reason") or ""
    worker_id = row.get("worker_id")
    if worker_id is None or not reason:
        return reason
    if reason.startswith("holding worker ID "):
        return f"holding worker ID {worker_id}"
    lists = re.findall(r"worker IDs? ((?:\d+(?:, )?)+)", reason)
    named = {int(n) for listed in lists for n in listed.split(", ") if n}
    if named and worker_id not in named:
        return f"holding worker ID {worker_id}"
    return reason


def _nodes_status(args: argparse.Namespace) -> int:
    """``status --connect EP,EP...``: each node's own view, and whether two of them answer for
    one region from two stores (two homes: their IDs may repeat each other's). Exit status 1
    for such a conflict or a node that did not answer."""
    from ..clients import Client

    node.curve_keys(args)
    views: dict[str, dict] = {}
    failures: list[SnowfenceError] = []
    for endpoint in node.endpoints_of(args):
        try:
            with Client(
                endpoint,
                timeout_s=args.timeout,
                retries=0,
                server_key=args.server_key,
                client_key=args.client_key,
                discover=False,
            ) as client:
                views[endpoint] = client.status()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except SnowfenceError as exc:
            views[endpoint] = {"error": {"code": exc.code, "message": str(exc)}}
            failures.append(exc)
    if len(failures) == len(views):  # none answered: one line, as for one endpoint
        where = ", ".join(views)
        error = type(failures[0])(f"no endpoint answered ({failures[0]}): is snowfence serve running at {where}?")
        error.code = failures[0].code
        raise error
    homes: dict[int, tuple[str, str]] = {}
    conflicts = []
    for endpoint, status in views.items():
        region, store = status.get("region"), (status.get("broker") or {}).get("store_id")
        if type(region) is not int or not store:
            continue
        seen = homes.setdefault(region, (endpoint, store))
        if seen[1] != store:
            conflicts.append({"region": region, "endpoints": [seen[0], endpoint], "stores": [seen[1], store]})
    if args.json:
        print(orjson.dumps({"nodes": views, "conflicts": conflicts}, option=orjson.OPT_INDENT_2).decode())
    else:
        for endpoint, status in views.items():
            if "error" in status:
                print(f"{endpoint}: no answer ({status['error']['code']}: {status['error']['message']})")
                continue
            broker = status.get("broker") or {}
            print(
                f"{endpoint}: region {status.get('region')}, store {broker.get('store_id') or '(not read yet)'}, "
                f"{broker.get('mode')} mode, {broker.get('workers_in_rotation')} of "
                f"{len(broker.get('slots', []))} workers in rotation"
            )
        for c in conflicts:
            print(
                f"CONFLICT: region {c['region']} is answered from two stores, {c['endpoints'][0]} (store "
                f"{c['stores'][0]}) and {c['endpoints'][1]} (store {c['stores'][1]}): their IDs may repeat each "
                "other's. Give each store its own region, or let these nodes share one store"
            )
    return 1 if conflicts or any("error" in v for v in views.values()) else 0
