"""``snowfence id-at`` (the IDs a time or range of time can carry) and ``snowfence watermark``
(the cluster's promise about time)."""

from __future__ import annotations

import argparse
import time

import orjson

from ..errors import ConfigError
from ..ids import format_unix_ms, unix_ms_of
from . import node
from .args import LAYOUT_FIELDS, add_config_flags, connect_flags


def add(sub) -> None:
    id_at = sub.add_parser(
        "id-at",
        help="Print the first and last ID that can carry a time or a range of time, per shard.",
        description="The lowest and highest ID that can carry TIME (one millisecond), or the range from TIME up "
        "to END (END excluded, unless --closed): one line per shard, 'first last', for a query such as "
        "`WHERE id BETWEEN first AND last`. With shard bits the shard sits above the timestamp, so a time is "
        "one range per shard (OR them). The layout is the node's with --connect, else the layout flags, the "
        "environment or --config. A time before the epoch or past the layout's last millisecond is refused.",
    )
    id_at.add_argument(
        "time", metavar="TIME", help="Unix milliseconds or ISO-8601 (e.g. 2026-03-01T12:00:00Z; no offset: UTC)."
    )
    id_at.add_argument("end", nargs="?", metavar="END", help="End of the range, excluded (--closed: included).")
    id_at.add_argument("--closed", action="store_true", help="Include END's millisecond in the range.")
    id_at.add_argument("--json", action="store_true", help="One JSON object per shard, per line; IDs as strings.")
    connect_flags(id_at, layout=True)
    add_config_flags(id_at, LAYOUT_FIELDS)
    id_at.set_defaults(run=cmd_id_at)

    mark = sub.add_parser(
        "watermark",
        help="Print the cluster's watermark: no ID of an earlier millisecond is minted after it is answered.",
        description="Ask a node for the cluster's watermark W: a promise that no ID carrying a millisecond before "
        "W is minted, by any node of the cluster, after the reply. Prints W's time, its Unix milliseconds, the "
        "lowest ID of that millisecond (per shard, with shard bits) and how far W is behind this host's clock. "
        "Exit status 1 while the node has promised none yet (it is starting, or its store is away).",
    )
    mark.add_argument("--json", action="store_true", help="Print one JSON object (IDs as strings).")
    connect_flags(mark)
    mark.set_defaults(run=cmd_watermark)


def cmd_id_at(args: argparse.Namespace) -> int:
    try:
        # The times first: a typo fails before a node is asked for its layout.
        start, end = (None if t is None else unix_ms_of(t) for t in (args.time, args.end))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    layout = node.layout_for(args)
    try:
        ranges = layout.bounds(start, end, closed=args.closed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for r in ranges:
        if args.json:
            print(orjson.dumps(r.to_dict()).decode())
        else:
            doc = r.to_dict()
            span = doc["start"] if r.start_ms == r.end_ms else f"{doc['start']} to {doc['end']}"
            print(f"{r.first} {r.last}  " + (f"shard={r.shard} " if layout.shard_bits else "") + span)
    return 0


def cmd_watermark(args: argparse.Namespace) -> int:
    with node.open_client(args) as client:
        mark = client.watermark()
        layout = client.layout()
    lag_ms = time.time_ns() // 1_000_000 - mark.unix_ms
    ids = mark.ids(layout)
    if args.json:
        doc = {
            "unix_ms": mark.unix_ms,
            "time": format_unix_ms(mark.unix_ms),
            "lowest": [str(i) for i in ids] if layout.shard_bits else str(ids[0]),
            "lag_ms": lag_ms,
        }
        print(orjson.dumps(doc).decode())
    else:
        lowest = " ".join(f"shard={s}:{i}" for s, i in enumerate(ids)) if layout.shard_bits else str(ids[0])
        print(f"{format_unix_ms(mark.unix_ms)}  {mark.unix_ms}  lowest={lowest}  lag={lag_ms / 1000:.3f} s")
    return 0
