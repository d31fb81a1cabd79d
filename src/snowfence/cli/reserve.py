"""``snowfence reserve``: reserve IDs and print them, in each output form."""

from __future__ import annotations

import argparse
import array
import sys

from ..clients.core.blocks import MAX_RESERVE
from ..ids import to_base32
from . import node
from .args import Plain, connect_flags, number

#: More IDs than any layout holds (its widths sum to 63 bits).
MAX_COUNT = (1 << 63) - 1


def add(sub) -> None:
    reserve = sub.add_parser("reserve", help="Reserve N IDs and print them.")
    reserve.add_argument(
        "count",
        type=number(int, 1, MAX_COUNT, what="a count"),
        metavar="N",
        help="IDs to reserve (at most 2^63-1: every ID a layout holds).",
    )
    connect_flags(reserve)
    reserve.add_argument(
        "--format",
        choices=["text", "json", "binary", "blocks", "uuid", "base32"],
        default="text",
        help="text: one ID per line; json: one array of IDs as strings; binary: raw little-endian int64; "
        "blocks: 'first count' per line; uuid: the RFC 9562 UUIDv7 of each ID (in the node's layout), one per "
        "line; base32: 13 Crockford base32 characters per ID, one per line. Output streams as IDs arrive.",
    )
    reserve.add_argument("--json", dest="format", action="store_const", const="json", help="Same as --format json.")
    reserve.add_argument(
        "--after",
        type=number(int, 0, (1 << 63) - 1, what="an ID"),
        metavar="ID",
        help="A causal token: every ID printed sorts after this one, wherever it came from.",
    )
    reserve.add_argument(
        "--chunk",
        type=number(int, 1, MAX_RESERVE, what="a count"),
        default=1_000_000,
        metavar="N",
        help="IDs reserved per round while streaming (default 1,000,000).",
    )
    reserve.set_defaults(run=cmd_reserve)


def cmd_reserve(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    write = _WRITERS[args.format]
    first = True
    client = node.open_client(args)  # bad endpoints and keys fail before anything is written
    if args.format == "json":
        out.write(b"[")
    with client:
        if args.format == "uuid":
            write = _uuid_writer(client.layout())
        left = args.count
        while left:
            blocks = client.reserve(min(left, args.chunk), after=args.after)
            for block in blocks:
                write(out, block, first)
                first = False
            left -= sum(b.count for b in blocks)
    if args.format == "json":
        out.write(b"]\n")
    out.flush()
    return 0


def _write_text(out, block, first: bool) -> None:
    out.write("\n".join(map(str, block.range())).encode() + b"\n")


def _write_json(out, block, first: bool) -> None:
    out.write((b"" if first else b",") + ",".join(f'"{i}"' for i in block.range()).encode())


def _write_binary(out, block, first: bool) -> None:
    ids = array.array("q", block.range())
    if sys.byteorder == "big":
        ids.byteswap()
    out.write(ids.tobytes())


def _write_blocks(out, block, first: bool) -> None:
    out.write(f"{block.first} {block.count}\n".encode())


def _write_base32(out, block, first: bool) -> None:
    out.write("".join(f"{to_base32(i)}\n" for i in block.range()).encode())


def _uuid_writer(layout):
    """The writer of ``--format uuid``: it needs the node's layout, asked once."""

    def write(out, block, first: bool) -> None:
        to_uuid = layout.to_uuid
        try:
            out.write("".join(f"{to_uuid(i)}\n" for i in block.range()).encode())
        except ValueError as exc:  # an ID whose time is past what a UUIDv7 carries
            raise Plain(str(exc)) from None

    return write


_WRITERS = {
    "text": _write_text,
    "json": _write_json,
    "binary": _write_binary,
    "blocks": _write_blocks,
    "uuid": None,  # needs the layout: _uuid_writer
    "base32": _write_base32,
}
