"""``snowfence decode``: the fields of IDs, read in any form ``reserve`` prints."""

from __future__ import annotations

import argparse
import re
import sys
import time

import orjson

from .. import verify
from ..errors import ConfigError
from ..ids import BASE32_WIDTH, format_unix_ms, from_base32
from . import node
from .args import LAYOUT_FIELDS, add_config_flags, connect_flags

#: What separates IDs read from stdin: whitespace, or the commas, brackets and quotes of a JSON array.
ID_SEPARATORS = re.compile(r'[\s,\[\]"]+')


#: The text forms decode reads besides decimal: a UUID with dashes, or 32 hex digits.
UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")


def add(sub) -> None:
    decode = sub.add_parser(
        "decode",
        help="Show the fields of IDs.",
        description="Decode IDs with the configured layout (flags, env or --config).",
    )
    decode.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="IDs to decode, in decimal, as UUIDv7s (8-4-4-4-12 or 32 hex digits) or in base32 (13 Crockford "
        "characters; all digits is read as decimal), as `snowfence reserve --format text|uuid|base32` prints them; "
        "none, or -, reads them from stdin (whitespace-separated, or a JSON array of strings).",
    )
    decode.add_argument("--json", action="store_true", help="One JSON object per line.")
    decode.add_argument(
        "--check",
        action="store_true",
        help="Flag IDs that cannot be valid for the layout: a millisecond more than a day past this host's clock, "
        "or shard bits other than the (region, worker) hash gives. Flagged IDs are still printed, marked (text) "
        "or with their flags (JSON), and make the exit status 1. On by default with --connect.",
    )
    connect_flags(decode, layout=True)
    add_config_flags(decode, LAYOUT_FIELDS)
    decode.set_defaults(run=cmd_decode)


def _decode_inputs(ids: list[str]):
    """The IDs to decode: the arguments, with ``-`` (or no argument at all) read from stdin as it comes."""
    if not ids:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("decode: give IDs, or - to read them from stdin")
        ids = ["-"]
    for text in ids:
        if text != "-":
            yield text
            continue
        for line in sys.stdin:
            yield from filter(None, ID_SEPARATORS.split(line))


def cmd_decode(args: argparse.Namespace) -> int:
    layout = node.layout_for(args)
    # The node's layout says which IDs it can have minted; a configured one only when asked.
    check = args.check or args.connect is not None
    now_ms = time.time_ns() // 1_000_000
    status = 0
    flagged = 0
    for text in _decode_inputs(args.ids):
        try:
            fields = layout.decompose(_read_id(text, layout))
        except ValueError as exc:
            print(f"snowfence: {exc}", file=sys.stderr)
            status = 1
            continue
        flags = _id_flags(layout, fields, now_ms) if check else []
        if flags:
            flagged += 1
            status = 1
        if args.json:
            doc = fields.to_dict(shard=bool(layout.shard_bits))
            if check:
                doc["flags"] = flags
            print(orjson.dumps(doc).decode())
        else:
            print(
                f"{fields.id}  {format_unix_ms(fields.unix_ms)}  "
                + (f"shard={fields.shard} " if layout.shard_bits else "")
                + f"region={fields.region} "
                f"worker={fields.worker} sequence={fields.sequence}"
                + (f"  INVALID: {'; '.join(flags)}" if flags else "")
            )
    if flagged:
        print(f"snowfence: {flagged} ID{'s' if flagged != 1 else ''} cannot be valid for the layout", file=sys.stderr)
    return status


def _read_id(text: str, layout) -> int:
    """An ID from decode's input, in whichever form it comes: decimal (all digits, whatever
    the length), a UUIDv7 of ``layout`` (36 characters with dashes, or 32 hex digits), or 13
    characters of base32. Raises ``ValueError`` with one line saying why not."""
    word = text.strip()
    if word.isascii() and word.isdigit():  # str.isdigit and int() take other scripts' digits too
        try:
            return int(word)  # decompose checks the range
        except ValueError:  # digits int() does not read, e.g. superscripts
            pass
    elif UUID_TEXT.fullmatch(word):
        return layout.from_uuid(word)
    elif len(word) == BASE32_WIDTH:
        return from_base32(word)
    raise ValueError(f"{text!r} is not a snowfence ID")


def _id_flags(layout, fields, now_ms: int) -> list[str]:
    """Why an ID cannot have been minted with ``layout``, if it cannot. Its time is never
    before the epoch (the bits count from it); it can be in the future, and its shard bits
    can disagree with its worker ID's."""
    flags = []
    ahead = fields.unix_ms - now_ms
    if ahead > verify.FUTURE_MARGIN_MS:
        flags.append(f"from the future ({ahead / 86_400_000:,.1f} days past this host's clock)")
    if layout.shard_bits:
        expected = layout.shard_of(fields.region, fields.worker)
        if fields.shard != expected:
            flags.append(f"shard {fields.shard}, but region {fields.region} worker {fields.worker} is shard {expected}")
    return flags
