"""``snowfence accept-restore``: accept, once, a store that went back."""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError, SnowfenceError
from ..ids import format_unix_ms
from ..workers.exits import Exit
from .args import add_config_flags, load_config
from .cluster import read_etcd


def add(sub) -> None:
    accept = sub.add_parser(
        "accept-restore",
        help="Accept a store that went back (restored from a backup, its keys or files deleted), once.",
        description="Nodes refuse to claim worker IDs from a store that forgot or went back on what their "
        "journals saw (`snowfence status` says what). If that was done on purpose, say so here, once, with the "
        "settings the nodes use (--etcd/--cluster, or --state-dir, and the layout): the store gets a new restore "
        "record, every claim of it waits out a quarantine (the longest reservation window plus the clock-skew "
        "bound), and the nodes take it at their next claim, keeping their journals' floors. It is no setting: a "
        "later restore needs another acceptance.",
    )
    accept.add_argument("--reason", required=True, metavar="TEXT", help="Why: recorded with the acceptance.")
    accept.add_argument(
        "--dry-run",
        action="store_true",
        help="Say what it would do (whether the store went back, the quarantine it would impose) and change nothing.",
    )
    accept.add_argument(
        "--force",
        action="store_true",
        help="Accept even a store that shows no sign of going back (its layout record is there and no node, "
        "nor this host's journal, reports it went back); exit status 78 without it.",
    )
    add_config_flags(accept)
    accept.set_defaults(run=cmd_accept_restore)


def cmd_accept_restore(args: argparse.Namespace) -> int:
    config = load_config(args)
    if not args.reason.strip() or not args.reason.isprintable():
        raise ConfigError("--reason must be printable text")
    from ..store import open_store

    # The store as the node opens it, every setting counted; an etcd cluster's without this
    # host's journal (the command may run on any host that reaches etcd).
    store = open_store(config, journal=config.embedded)
    signs = []
    if config.embedded:
        where = f"state directory {config.state_dir}"
        if store.journal.problem:
            print(f"this host's journal had refused: {store.journal.problem}")
            signs.append(f"this host's journal refused it: {store.journal.problem}")
    else:
        where = f"cluster {config.cluster!r}"
    try:
        planned = store.accept_restore(args.reason.strip(), dry_run=True)
        if not store.found_genesis:
            signs.append("its layout record is gone")
        behind = getattr(store, "marks_behind", ())
        if behind:
            signs.append(f"the marks of worker IDs {', '.join(map(str, behind))} are below this host's journal")
        if not signs and not config.embedded:
            signs.extend(_nodes_refusing(config))
        until = format_unix_ms(planned.quarantine_until_ms + config.layout.epoch_ms)
        state = f"went back ({'; '.join(signs)})" if signs else "shows no sign of going back"
        if args.dry_run:
            print(
                f"dry run: {where} (store {planned.store_id}) {state}; accepting a restore would make claims mint "
                f"nothing until {until}; nothing was changed"
            )
            return 0
        if not signs and not args.force:
            print(
                f"snowfence: {where} shows no sign of going back (its layout record is there and no node reports it "
                f"went back): not imposing a quarantine until {until}; --force to accept a restore anyway",
                file=sys.stderr,
            )
            return Exit.CONFIG
        genesis = store.accept_restore(args.reason.strip())
    finally:
        store.close()
    until = format_unix_ms(genesis.quarantine_until_ms + config.layout.epoch_ms)
    print(
        f"accepted restore {genesis.restore.id} of {where} (store {genesis.store_id}): claims mint nothing "
        f"until {until}; nodes that refused take it at their next claim"
    )
    return 0


def _nodes_refusing(config) -> list[str]:
    """What the cluster's live nodes report of a store that went back: in their etcd entries
    (``store_problem``, which a node that takes only CURVE clients can tell), and, from a node
    whose entry says nothing (written before it found out, or by an older release), in its
    STATUS, asked once; a node that does not answer says nothing."""
    from ..clients.blocking import Client

    try:
        entries = read_etcd(config, lambda c: c.nodes())
    except SnowfenceError:
        return []
    said = []
    for entry in entries:
        if entry.get("store_problem"):
            said.append(f"node {entry.get('node')} refuses it: {entry['store_problem']}")
            continue
        if not entry.get("endpoints"):
            continue
        try:
            with Client(entry["endpoints"][0], timeout_s=2.0, retries=0, discover=False) as client:
                status = client.status()
        except (SnowfenceError, ValueError):
            continue
        for worker in status.get("workers") or ():
            if worker.get("store_problem"):
                said.append(f"node {entry['node']} refuses it: {worker['store_problem']}")
                break
    return said
