"""``snowfence verify``: check a dump of IDs.

A loader that took IDs from snowfence and wrote them somewhere can dump them
back (one file per receiver, or stdin) and have them checked against the layout
they were minted with:

* duplicates: an ID that appears more than once, across all the inputs;
* invalid IDs: negative or 2^63 and above (not a 63-bit ID), a time more than
  ``--future-margin`` seconds (a day) ahead of this host's clock, a time before ``--since``, and with
  shard bits, a shard field that is not the hash of the ID's worker ID;
* order: a dump keeps the order IDs were received in, and one worker ID mints
  increasing IDs, so within each input an ID lower than the previous ID of the
  same worker ID (region, worker) is out of order (``--no-order`` for dumps that
  were shuffled);
* ``--from``/``--to``: IDs whose time is outside [FROM, TO).

Formats (``--format``): ``text`` whitespace-separated decimal IDs (what
``snowfence reserve`` prints), ``json`` an array of IDs as strings or numbers,
``binary`` raw little-endian int64, ``blocks`` one "first count" pair per line
(``reserve --format blocks``), ``uuid`` and ``base32`` the UUIDv7s and the 13
Crockford base32 characters of ``reserve --format uuid|base32``, whitespace-separated.
``auto`` (the default) looks at the first 64 KiB of each input: only printable
ASCII and whitespace is JSON when it starts with ``[``, UUIDs when its first word
is one, base32 when every word has 13 characters and not every word is all
digits, and text otherwise; anything else is binary. Blocks are never guessed.

The work is vectorised with NumPy (an optional dependency: the ``verify``
extra). All IDs are held in memory as int64 (8 bytes each); the order and
validity checks run in chunks, and duplicates are found by sorting that array
in place at the end. Without NumPy the same checks run in plain Python, ID by
ID (``_PureChecker``): the same summary, about 8 times slower and with about 4
times the memory (10 million binary IDs: 9.3 s and 520 MB, against 1.2 s and
140 MB with NumPy, on two cores); fine for tens of millions of IDs.
"""

from __future__ import annotations

import argparse
import array
import itertools
import os
import re
import stat
import sys
import time
from collections.abc import Sequence

from .errors import ConfigError
from .ids import BASE32_WIDTH, Layout, format_unix_ms, from_base32, parse_epoch

DESCRIPTION = (
    "Check a dump of IDs (files, or stdin): duplicates; IDs not valid for the layout (negative or above 63 bits, "
    "from the future, before --since, a shard field that disagrees with the worker ID); IDs of one worker ID out "
    "of the order they were minted in; IDs outside --from/--to. Prints a summary; exit status 0 if clean, 1 if "
    "problems were found, 2 for an unknown flag, 78 for a bad value or an input that cannot be read as IDs. "
    "Formats: text (whitespace-"
    "separated decimal IDs), json (an array of strings or numbers), binary (little-endian int64), blocks "
    "('first count' per line, as `reserve --format blocks` prints). --format auto (the default) reads an input "
    "whose first 64 KiB are printable ASCII as json if it starts with '[', as text otherwise, and anything else "
    "as binary; uuid and base32 (as `reserve --format uuid|base32` prints) are read too, and detected. With NumPy "
    "(pip install 'snowfence[verify]') it checks billions of IDs; without, the same checks run in plain Python, "
    "about 8 times slower: fine for tens of millions."
)

#: How far past this host's clock an ID's millisecond may be before it is invalid ("from the
#: future"; ``decode --check`` flags it too). A node mints no ID ahead of its own clock, and
#: refuses to mint when its clock is off by more than the skew bound (milliseconds to
#: seconds); a day also allows for this host's clock being well off, and still catches IDs
#: read with the wrong layout or epoch, or made up.
FUTURE_MARGIN_MS = 24 * 3600 * 1000
FORMATS = ("auto", "text", "json", "binary", "blocks", "uuid", "base32")
#: Bytes auto-detection looks at.
SNIFF_BYTES = 64 * 1024
#: IDs checked at a time by the order and validity pass.
CHUNK_IDS = 1 << 20  # 8 MiB: small enough that the allocator reuses its memory (page faults are slow)
#: Bytes of text parsed at a time.
TEXT_CHUNK = 1 << 20
#: Worker IDs listed by name in the summary (all are counted).
LISTED_WORKERS = 16
#: Worker IDs listed in the JSON summary.
JSON_WORKERS = 4096
_WHITESPACE = b" \t\n\r\v\f"
_TOKEN = re.compile(rb"[-0-9]+")
_PRINTABLE = frozenset(range(32, 127)) | frozenset(_WHITESPACE)
_MULTIPLIER = 0x9E3779B97F4A7C15  # Layout.shard_of's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="FILE",
        help="Dumps to check, in the order given; none, or -, reads stdin. Duplicates are looked for across all "
        "of them, order within each one.",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="How the inputs are written (default auto: see above).",
    )
    parser.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    parser.add_argument(
        "--no-order",
        dest="order",
        action="store_false",
        help="Skip the order check (for dumps that were shuffled or sorted).",
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="IDs minted before this time are invalid (ISO-8601 or Unix ms): when the cluster started, say.",
    )
    parser.add_argument(
        "--from", dest="time_from", metavar="TIME", help="Report IDs minted before TIME (ISO-8601 or Unix ms)."
    )
    parser.add_argument(
        "--to", dest="time_to", metavar="TIME", help="Report IDs minted at or after TIME (ISO-8601 or Unix ms)."
    )
    parser.add_argument(
        "--future-margin",
        type=float,
        default=FUTURE_MARGIN_MS / 1000,
        metavar="S",
        help=f"IDs more than S seconds ahead of this host's clock are invalid (default {FUTURE_MARGIN_MS // 1000:,}: "
        "a day, as for decode --check, room for this host's clock to be wrong; a minute is tighter).",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=5,
        metavar="N",
        help="Examples shown of each kind of problem (default 5).",
    )


def _numpy():
    """NumPy, or None when it is not installed (the checks then run in plain Python)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _time_arg(flag: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_epoch(value)
    except ConfigError:
        raise ConfigError(f"{flag} {value!r} is neither Unix milliseconds nor an ISO-8601 time") from None


# -- reading -------------------------------------------------------------------------------------------------------


class _Source:
    """One input: its name, a binary stream, and the bytes already read from it to detect its format."""

    def __init__(self, name: str, stream, head: bytes, size: int | None) -> None:
        self.name = name
        self.stream = stream
        self.head = head
        #: Bytes left after ``head`` when the input is a regular file (None for a pipe).
        self.size = size
        self.format = ""

    def chunks(self, size: int):
        if self.head:
            yield self.head
        while True:
            data = self.stream.read(size)
            if not data:
                return
            yield data


def _open(name: str, stdin_used: list) -> _Source:
    if name == "-":
        if stdin_used:
            raise ConfigError("verify: stdin (-) given twice")
        stdin_used.append(True)
        stream = sys.stdin.buffer
        label = "<stdin>"
    else:
        try:
            stream = open(name, "rb", buffering=0)  # noqa: SIM115 - closed by run()
        except OSError as exc:  # an input that cannot be read is a bad argument (78), not a problem found (1)
            raise ConfigError(f"verify: cannot read {name}: {exc.strerror or exc}") from None
        label = name
    size = None
    try:
        info = os.fstat(stream.fileno())
        if stat.S_ISREG(info.st_mode):
            size = info.st_size - stream.tell()
    except (OSError, ValueError, AttributeError):
        pass
    head = _read_exactly(stream, SNIFF_BYTES) if size is None or size > 0 else b""
    if size is not None:
        size -= len(head)
    return _Source(label, stream, head, size)


def _read_exactly(stream, count: int) -> bytes:
    parts, got = [], 0
    while got < count:
        data = stream.read(count - got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _detect(head: bytes) -> str:
    if any(byte not in _PRINTABLE for byte in head):
        return "binary"
    if head.lstrip(_WHITESPACE).startswith(b"["):
        return "json"
    words = head.split()
    if len(head) == SNIFF_BYTES and words and not head[-1:].isspace():
        words.pop()  # cut off by the sniff: a word is judged whole
    if words and _UUID_WORD.fullmatch(words[0]):
        return "uuid"
    if words and all(len(w) == BASE32_WIDTH for w in words) and not all(w.isdigit() for w in words):
        return "base32"  # (all digits: decimal IDs of 13 digits; a word that is no base32 is said when read)
    return "text"


_UUID_WORD = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")


def _read_words(source: _Source, convert, fmt: str):
    """The IDs of a ``uuid`` or ``base32`` input (one word each, whitespace between), as an int64 array."""
    out = array.array("q")
    carry, line = b"", 1
    for data in source.chunks(TEXT_CHUNK):
        data = carry + data
        cut = max(data.rfind(c, max(0, len(data) - 64)) for c in _WHITESPACE) + 1
        if not cut and len(data) > 64:
            cut = len(data)  # no whitespace in the last 64 bytes: a word too long for either form
        line = _convert_words(source, data[:cut], convert, fmt, line, out)
        carry = data[cut:]
    _convert_words(source, carry, convert, fmt, line, out)
    return out


def _convert_words(source: _Source, data: bytes, convert, fmt: str, line: int, out) -> int:
    append = out.append
    for text in data.split(b"\n"):
        for word in text.split():
            try:
                append(convert(word.decode("ascii")))
            except (ValueError, UnicodeDecodeError) as exc:
                why = exc if isinstance(exc, ValueError) else f"{word[:40]!r} is not ASCII"
                raise ConfigError(f"{source.name}: line {line}: {why} (read as {fmt}; see --format)") from None
        line += 1
    return line - 1


def _read_binary(np, source: _Source):
    """The IDs of a binary input as a list of arrays (a regular file: one array, read in place)."""
    if np is None:
        data = b"".join(source.chunks(64 << 20))
        _check_whole(source, len(data))
        ids = array.array("q", data)
        if sys.byteorder == "big":
            ids.byteswap()
        return [ids]
    if source.size is not None:
        total = len(source.head) + source.size
        _check_whole(source, total)
        out = np.empty(total // 8, dtype=np.int64)
        raw = memoryview(out).cast("B")
        raw[: len(source.head)] = source.head
        at = len(source.head)
        while at < total:
            got = source.stream.readinto(raw[at : min(total, at + (1 << 30))])
            if not got:
                raise ConfigError(f"{source.name}: the file shrank while being read")
            at += got
        return [_little_endian(np, out)]
    parts, pending, total = [], b"", 0
    for data in source.chunks(64 << 20):
        data = pending + data
        whole = len(data) - len(data) % 8
        pending = data[whole:]
        total += len(data) - len(pending)
        if whole:
            parts.append(_little_endian(np, np.frombuffer(data[:whole], dtype=np.int64).copy()))
    _check_whole(source, total + len(pending))
    return parts


def _check_whole(source: _Source, size: int) -> None:
    if size % 8:
        hint = "" if source.format == "binary" else " (read as binary; say --format if it is text or JSON)"
        raise ConfigError(f"{source.name}: {size:,} bytes is not a whole number of 8-byte binary IDs{hint}")


def _little_endian(np, ids):
    if sys.byteorder == "big":
        ids.byteswap(inplace=True)
    return ids


class _TextParser:
    """Decimal numbers separated by whitespace (and for JSON by brackets, commas and quotes), parsed with NumPy.

    A token is an optional ``-`` and 1 to 19 digits; its value is taken modulo 2^64 as an int64, so that one of
    2^63 and above reads as negative (and is reported as not a 63-bit ID), as it would in a binary dump. Longer
    tokens read as -2^63.
    """

    def __init__(self, np, source: _Source, json: bool) -> None:
        self.np = np
        self.source = source
        self.json = json
        self.lines = 0  # newlines before the bytes being parsed
        self.brackets = [0, 0]
        self.quotes = 0
        separators = _WHITESPACE + (b'[],"' if json else b"")
        self.separators = separators
        if np is None:
            return
        self.kind = np.zeros(256, dtype=np.uint8)  # 0: not allowed, 1: digit, 2: minus, 3: separator
        self.kind[ord("0") : ord("9") + 1] = 1
        self.kind[ord("-")] = 2
        self.kind[list(separators)] = 3
        self.pow10 = np.array([10**i for i in range(20)], dtype=np.uint64)

    def parse(self) -> list:
        np = self.np
        if np is None:
            return self._parse_pure()
        parts, carry, last = [], b"", b""
        first = True
        for data in self.source.chunks(TEXT_CHUNK):
            last = data.rstrip(_WHITESPACE)[-1:] or last
            if first and self.json:
                if not data.lstrip(_WHITESPACE).startswith(b"["):
                    self._fail("a JSON array of IDs starts with '['")
            first = False
            data = carry + data
            kind = np.take(self.kind, np.frombuffer(data, dtype=np.uint8))
            tail = kind[-1024:] == 3  # an ID is at most 20 bytes: the last separator is near the end
            if not tail.any():
                if len(data) > 1024:
                    self._fail("no separator between IDs in 1 KiB", data, 0)
                carry = data
                continue
            cut = len(data) - int(np.argmax(tail[::-1]))
            parts.append(self._tokens(data[:cut], kind[:cut]))
            self.lines += data.count(b"\n", 0, cut)
            carry = data[cut:]
        if carry:
            data = carry + b"\n"
            parts.append(self._tokens(data, np.take(self.kind, np.frombuffer(data, dtype=np.uint8))))
        if self.json:
            if first:
                self._fail("empty: a JSON array of IDs is '[...]'")
            if self.brackets != [1, 1] or self.quotes % 2 or last != b"]":
                self._fail("not a JSON array of IDs (one '[', one ']', quotes in pairs)")
        return parts

    def _parse_pure(self) -> list:
        """What :meth:`parse` reads, the same IDs and the same refusals, in plain Python, the input whole."""
        data = b"".join(self.source.chunks(TEXT_CHUNK))
        if self.json:
            if not data:
                self._fail("empty: a JSON array of IDs is '[...]'")
            if not data.lstrip(_WHITESPACE).startswith(b"["):
                self._fail("a JSON array of IDs starts with '['")
        stray = data.translate(None, b"0123456789-" + self.separators)
        if stray:
            self._fail("not a decimal ID", data, data.index(stray[:1]))
        ids = array.array("q")
        for match in _TOKEN.finditer(data):
            token = match.group()
            if b"-" in token[1:]:
                self._fail("a minus sign inside a number", data, match.start() + 1 + token[1:].index(b"-"))
            digits = token.lstrip(b"-")
            if not digits:
                self._fail("a minus sign without a number", data, match.start())
            # As the vectorised parser reads it: modulo 2^64 as an int64, more than 19 digits as -2^63.
            value = int(digits) if len(digits) <= 19 else 1 << 63
            if token[:1] == b"-":
                value = -min(value, 1 << 63)
            elif value >= 1 << 63:
                value -= 1 << 64
            ids.append(value)
        if self.json:
            last = data.rstrip(_WHITESPACE)[-1:]
            if data.count(b"[") != 1 or data.count(b"]") != 1 or data.count(b'"') % 2 or last != b"]":
                self._fail("not a JSON array of IDs (one '[', one ']', quotes in pairs)")
        return [ids]

    def _fail(self, why: str, data: bytes | None = None, at: int | None = None):
        where = ""
        if data is not None and at is not None:
            line = self.lines + data.count(b"\n", 0, at) + 1
            start = max(data.rfind(b"\n", 0, at), at - 40) + 1
            end = min(len(data), at + 40)
            newline = data.find(b"\n", at, end)
            end = newline if newline >= 0 else end
            where = f" line {line}: {data[start:end].decode('ascii', 'replace')!r}:"
        fmt = "JSON" if self.json else "text"
        raise ConfigError(f"{self.source.name}:{where} {why} (read as {fmt}; see --format)")

    def _tokens(self, data: bytes, kind):
        np = self.np
        if not kind.all():
            self._fail("not a decimal ID", data, int(np.argmin(kind)))
        if self.json:
            buf = np.frombuffer(data, dtype=np.uint8)
            self.brackets[0] += int(np.count_nonzero(buf == ord("[")))
            self.brackets[1] += int(np.count_nonzero(buf == ord("]")))
            self.quotes += int(np.count_nonzero(buf == ord('"')))
        token = kind != 3  # digits and minus signs; data ends with a separator
        edges = np.flatnonzero(np.diff(token.view(np.int8), prepend=np.int8(0)))
        starts, ends = edges[0::2], edges[1::2]
        if not len(starts):
            return np.empty(0, dtype=np.int64)
        minus = kind == 2
        negative = minus[starts]
        if np.count_nonzero(minus) != np.count_nonzero(negative):
            misplaced = np.flatnonzero(minus)
            misplaced = misplaced[~np.isin(misplaced, starts)]
            self._fail("a minus sign inside a number", data, int(misplaced[0]))
        digit_starts = starts + negative
        digits = ends - digit_starts
        if np.any(digits == 0):
            self._fail("a minus sign without a number", data, int(starts[digits == 0][0]))
        positions = np.flatnonzero(kind == 1)
        power = np.repeat(ends - 1, digits) - positions
        np.minimum(power, 19, out=power)
        values = (np.frombuffer(data, dtype=np.uint8)[positions] - ord("0")).astype(np.uint64)
        values *= self.pow10[power]
        offsets = np.zeros(len(digits), dtype=np.int64)
        np.cumsum(digits[:-1], out=offsets[1:])
        ids = np.add.reduceat(values, offsets).view(np.int64)
        ids[digits > 19] = np.iinfo(np.int64).min
        if np.any(negative):
            magnitude = ids[negative].view(np.uint64)
            ids[negative] = -np.minimum(magnitude, np.uint64(1 << 63)).astype(np.int64)
        return ids


def _expand_blocks(np, source: _Source, parts: list) -> list:
    if np is None:
        pairs = [n for part in parts for n in part]
        if len(pairs) % 2:
            raise ConfigError(f"{source.name}: blocks are 'first count' pairs; an odd number of numbers was read")
        ids = array.array("q")
        for first, count in zip(pairs[0::2], pairs[1::2], strict=True):
            if count < 1 or first < 0:
                raise ConfigError(f"{source.name}: a block with a negative first ID or a count below 1")
            if first + count - 1 >= 1 << 63:
                raise ConfigError(f"{source.name}: a block that runs past 2^63")
            ids.extend(range(first, first + count))
        return [ids]
    pairs = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if len(pairs) % 2:
        raise ConfigError(f"{source.name}: blocks are 'first count' pairs; an odd number of numbers was read")
    first, count = pairs[0::2], pairs[1::2]
    if np.any(count < 1) or np.any(first < 0):
        raise ConfigError(f"{source.name}: a block with a negative first ID or a count below 1")
    if np.any(first + count - 1 < first):
        raise ConfigError(f"{source.name}: a block that runs past 2^63")
    total = int(count.sum())
    ids = np.arange(total, dtype=np.int64)
    ids += np.repeat(first - (np.cumsum(count) - count), count)
    return [ids]


def _read(np, source: _Source, fmt: str, layout: Layout) -> list:
    source.format = _detect(source.head) if fmt == "auto" else fmt
    if source.format == "binary":
        return _read_binary(np, source)
    if source.format in ("uuid", "base32"):
        convert = layout.from_uuid if source.format == "uuid" else from_base32
        ids = _read_words(source, convert, source.format)
        return [ids if np is None else np.frombuffer(ids, dtype=np.int64).copy()]
    parts = _TextParser(np, source, json=source.format == "json").parse()
    if source.format == "blocks":
        return _expand_blocks(np, source, parts)
    return parts


def _load(np, names: list[str], fmt: str, layout: Layout):
    """All the IDs, in one int64 array in input order, and each input's (name, format, start, end)."""
    arrays, inputs, total = [], [], 0
    stdin_used: list = []
    for name in names:
        source = _open(name, stdin_used)
        try:
            parts = _read(np, source, fmt, layout)
        finally:
            if source.stream is not sys.stdin.buffer:
                source.stream.close()
        count = sum(len(p) for p in parts)
        inputs.append((source.name, source.format, total, total + count))
        arrays.extend(parts)
        total += count
    if len(arrays) == 1:
        return arrays[0], inputs
    if np is None:
        out = array.array("q")
        for part in arrays:
            out.extend(part)
        return out, inputs
    out = np.empty(total, dtype=np.int64)
    at = 0
    while arrays:
        part = arrays.pop(0)
        out[at : at + len(part)] = part
        at += len(part)
    return out, inputs


# -- checking ------------------------------------------------------------------------------------------------------


class _Checks:
    """What both checkers are asked and what they count, which the summary reads: the checks'
    settings, each kind of problem's count and first examples, the time span, the worker IDs seen."""

    def __init__(self, layout: Layout, args: argparse.Namespace, now_ms: int) -> None:
        self.layout = layout
        self.order = args.order
        self.examples = args.examples
        self.since = _time_arg("--since", args.since)
        self.time_from = _time_arg("--from", args.time_from)
        self.time_to = _time_arg("--to", args.time_to)
        if self.time_from is not None and self.time_to is not None and self.time_from >= self.time_to:
            raise ConfigError("--from must be before --to")
        self.future_ms = now_ms + int(args.future_margin * 1000)
        self.key_bits = layout.region_bits + layout.worker_bits
        self.invalid = {"not_63_bit": 0, "future": 0, "before_since": 0, "shard": 0}
        self.invalid_ids = 0
        self.invalid_examples: list = []
        self.out_of_order = 0
        self.order_examples: list = []
        self.outside = 0
        self.outside_examples: list = []
        self.earliest: int | None = None
        self.latest: int | None = None
        # Every worker ID seen: sorted keys ((region << worker_bits) | worker) and their counts.
        self.keys: Sequence[int] = []
        self.key_counts: Sequence[int] = []


class _Checker(_Checks):
    """The checks vectorised with NumPy, a chunk of IDs at a time."""

    def __init__(self, np, layout: Layout, args: argparse.Namespace, now_ms: int) -> None:
        super().__init__(layout, args, now_ms)
        self.np = np
        self.key_type = np.uint16 if self.key_bits <= 16 else np.uint32 if self.key_bits <= 32 else np.int64
        #: IDs lower than the ID just before them in the dump: few means long sorted runs, which a stable
        #: sort (timsort) merges in a fraction of a quicksort's time.
        self.descents = 0
        self.keys = np.empty(0, dtype=np.int64)
        self.key_counts = np.empty(0, dtype=np.int64)

    def _example(self, into: list, name: str, index, ids, extra: dict | None = None) -> None:
        room = self.examples - len(into)
        for k in range(min(room, len(index))):
            entry = {"input": name, "position": int(index[k]) + 1, "id": int(ids[k])}
            for key, values in (extra or {}).items():
                entry[key] = values[k]
            into.append(entry)

    def check_input(self, ids, name: str) -> None:
        """One input's IDs, in the order received: validity, range, order, worker IDs."""
        np = self.np
        last_keys = np.empty(0, dtype=np.int64)  # order carries over chunks, not over inputs
        last_ids = np.empty(0, dtype=np.int64)
        for start in range(0, len(ids), CHUNK_IDS):
            chunk = ids[start : start + CHUNK_IDS]
            self.descents += int(np.count_nonzero(chunk[1:] < chunk[:-1]))
            negative = chunk < 0
            where = None
            if np.any(negative):
                where = np.flatnonzero(negative)
                self.invalid["not_63_bit"] += len(where)
                self.invalid_ids += len(where)
                reasons = ["not a 63-bit ID (negative, or 2^63 and above)"] * len(where)
                self._example(self.invalid_examples, name, where + start, chunk[where], {"reason": reasons})
                where = np.flatnonzero(~negative)
                chunk = chunk[where]

            def index(i, base=start, kept=where):
                return (i if kept is None else kept[i]) + base

            if not len(chunk):
                continue
            self._validity(chunk, name, index)
            last_keys, last_ids = self._order(chunk, name, index, last_keys, last_ids)

    def _validity(self, chunk, name: str, index) -> None:
        np = self.np
        layout = self.layout
        unix_ms = (chunk >> layout.time_shift) & layout.max_ms
        unix_ms += layout.epoch_ms
        low, high = int(unix_ms.min()), int(unix_ms.max())
        self.earliest = low if self.earliest is None else min(self.earliest, low)
        self.latest = high if self.latest is None else max(self.latest, high)
        bad = np.zeros(len(chunk), dtype=bool)
        checks = []
        if high > self.future_ms:
            checks.append(("future", unix_ms > self.future_ms, "from the future"))
        if self.since is not None and low < self.since:
            checks.append(("before_since", unix_ms < self.since, "before --since"))
        if layout.shard_bits:
            key = ((chunk >> layout.region_shift) & layout.max_region).astype(np.uint64) << np.uint64(20)
            key |= ((chunk >> layout.worker_shift) & layout.max_worker).astype(np.uint64)
            key *= np.uint64(_MULTIPLIER)
            key >>= np.uint64(64 - layout.shard_bits)
            wrong = (chunk >> layout.shard_shift).astype(np.uint64) != key
            checks.append(("shard", wrong, "shard field disagrees with its worker ID"))
        for kind, mask, why in checks:
            hits = np.flatnonzero(mask)
            if len(hits):
                self.invalid[kind] += len(hits)
                bad |= mask
                self._example(self.invalid_examples, name, index(hits), chunk[hits], {"reason": [why] * len(hits)})
        self.invalid_ids += int(np.count_nonzero(bad))
        if self.time_from is not None or self.time_to is not None:
            outside = np.zeros(len(chunk), dtype=bool)
            if self.time_from is not None:
                outside |= unix_ms < self.time_from
            if self.time_to is not None:
                outside |= unix_ms >= self.time_to
            hits = np.flatnonzero(outside)
            self.outside += len(hits)
            self._example(self.outside_examples, name, index(hits), chunk[hits])

    def _order(self, chunk, name: str, index, last_keys, last_ids):
        """Out-of-order IDs of one chunk, given each worker ID's last ID from the chunks before; the new lasts."""
        np = self.np
        keys = ((chunk >> self.layout.worker_shift) & ((1 << self.key_bits) - 1)).astype(self.key_type)
        order = np.argsort(keys, kind="stable")  # each worker ID's IDs together, in the order received
        keys = keys[order]
        ids = chunk[order]
        del chunk
        new_group = keys[1:] != keys[:-1]
        starts = np.concatenate(([0], np.flatnonzero(new_group) + 1))
        ends = np.append(starts[1:], len(keys))
        group_keys = keys[starts].astype(np.int64)
        if self.order:
            lower = ids[1:] < ids[:-1]
            lower &= ~new_group
            hits = np.flatnonzero(lower)
            self.out_of_order += len(hits)
            self._example(
                self.order_examples, name, index(order[hits + 1]), ids[hits + 1], {"after": ids[hits].tolist()}
            )
            # Each worker ID's first ID here against its last one in the chunks before.
            at = np.searchsorted(last_keys, group_keys)
            known = at < len(last_keys)
            known[known] = last_keys[at[known]] == group_keys[known]
            firsts = ids[starts]
            lower = np.zeros(len(starts), dtype=bool)
            lower[known] = firsts[known] < last_ids[at[known]]
            hits = np.flatnonzero(lower)
            self.out_of_order += len(hits)
            previous = last_ids[at[hits]].tolist()
            self._example(self.order_examples, name, index(order[starts[hits]]), firsts[hits], {"after": previous})
            last_ids = last_ids.copy()
            last_ids[at[known]] = ids[ends - 1][known]
            fresh = ~known
            last_keys = np.concatenate((last_keys, group_keys[fresh]))
            last_ids = np.concatenate((last_ids, ids[ends - 1][fresh]))
            by_key = np.argsort(last_keys, kind="stable")
            last_keys, last_ids = last_keys[by_key], last_ids[by_key]
        self._count_workers(group_keys, ends - starts)
        return last_keys, last_ids

    def _count_workers(self, group_keys, counts) -> None:
        np = self.np
        keys = np.concatenate((self.keys, group_keys))
        counts = np.concatenate((self.key_counts, counts))
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.key_counts = np.bincount(inverse.ravel(), weights=counts, minlength=len(self.keys)).astype(np.int64)

    def duplicates(self, ids) -> dict:
        """Duplicates among the 63-bit IDs of all inputs (the others are invalid already, and a text dump's
        numbers past 19 digits all read as one). Sorts ``ids`` in place: the last use of the order received."""
        np = self.np
        # Timsort takes long runs in its stride (a loader's dump is mostly ascending), but needs up to half the
        # array again as scratch; the in-place quicksort is as fast on shuffled IDs.
        ids.sort(kind="stable" if self.descents < len(ids) // 16 else "quicksort")
        ids = ids[np.searchsorted(ids, 0) :]
        same = ids[1:] == ids[:-1]
        extra = int(np.count_nonzero(same))
        repeated = ids[1:][same]
        distinct_repeated = 0
        examples = []
        if extra:
            distinct_repeated = 1 + int(np.count_nonzero(repeated[1:] != repeated[:-1]))
            shown = np.unique(repeated[: self.examples * 64])[: self.examples]
            copies = np.searchsorted(ids, shown, side="right") - np.searchsorted(ids, shown, side="left")
            examples = [{"id": int(i), "copies": int(c)} for i, c in zip(shown, copies, strict=True)]
        return {"count": extra, "ids": distinct_repeated, "distinct": len(ids) - extra, "examples": examples}


class _PureChecker(_Checks):
    """The checks of :class:`_Checker` in plain Python, one ID at a time, for a host without NumPy: the same
    counts and summary. The examples are the first of each kind in input order (the vectorised checker's may be
    others when there are more than ``--examples``)."""

    def __init__(self, layout: Layout, args: argparse.Namespace, now_ms: int) -> None:
        super().__init__(layout, args, now_ms)
        self.counts: dict[int, int] = {}

    def _note(self, into: list, entry: dict) -> None:
        if len(into) < self.examples:
            into.append(entry)

    def check_input(self, ids, name: str) -> None:
        layout = self.layout
        time_shift, max_ms, epoch_ms = layout.time_shift, layout.max_ms, layout.epoch_ms
        worker_shift, key_mask = layout.worker_shift, (1 << self.key_bits) - 1
        future_ms, since, time_from, time_to = self.future_ms, self.since, self.time_from, self.time_to
        ranged = time_from is not None or time_to is not None
        shard_bits = layout.shard_bits
        last: dict[int, int] = {}  # order carries over nothing between inputs
        counts = self.counts
        low = high = None
        for position, id_ in enumerate(ids, 1):
            if id_ < 0:
                self.invalid["not_63_bit"] += 1
                self.invalid_ids += 1
                reason = "not a 63-bit ID (negative, or 2^63 and above)"
                self._note(self.invalid_examples, {"input": name, "position": position, "id": id_, "reason": reason})
                continue
            unix_ms = ((id_ >> time_shift) & max_ms) + epoch_ms
            if low is None or unix_ms < low:
                low = unix_ms
            if high is None or unix_ms > high:
                high = unix_ms
            reasons = []
            if unix_ms > future_ms:
                reasons.append(("future", "from the future"))
            if since is not None and unix_ms < since:
                reasons.append(("before_since", "before --since"))
            if shard_bits:
                region = (id_ >> layout.region_shift) & layout.max_region
                worker = (id_ >> worker_shift) & layout.max_worker
                if id_ >> layout.shard_shift != layout.shard_of(region, worker):
                    reasons.append(("shard", "shard field disagrees with its worker ID"))
            if reasons:
                self.invalid_ids += 1
                for kind, why in reasons:
                    self.invalid[kind] += 1
                    self._note(self.invalid_examples, {"input": name, "position": position, "id": id_, "reason": why})
            if ranged and (
                (time_from is not None and unix_ms < time_from) or (time_to is not None and unix_ms >= time_to)
            ):
                self.outside += 1
                self._note(self.outside_examples, {"input": name, "position": position, "id": id_})
            key = (id_ >> worker_shift) & key_mask
            if self.order:
                before = last.get(key)
                if before is not None and id_ < before:
                    self.out_of_order += 1
                    self._note(self.order_examples, {"input": name, "position": position, "id": id_, "after": before})
                last[key] = id_
            counts[key] = counts.get(key, 0) + 1
        if low is not None:
            self.earliest = low if self.earliest is None else min(self.earliest, low)
            self.latest = high if self.latest is None else max(self.latest, high)
        self.keys = sorted(counts)
        self.key_counts = [counts[k] for k in self.keys]

    def duplicates(self, ids) -> dict:
        extra = distinct_repeated = distinct = 0
        examples = []
        for id_, copies in itertools.groupby(sorted(i for i in ids if i >= 0)):
            copies = sum(1 for _ in copies)
            distinct += 1
            if copies > 1:
                extra += copies - 1
                distinct_repeated += 1
                if len(examples) < self.examples:
                    examples.append({"id": id_, "copies": copies})
        return {"count": extra, "ids": distinct_repeated, "distinct": distinct, "examples": examples}


# -- reporting -----------------------------------------------------------------------------------------------------


def _describe(layout: Layout, id_: int) -> dict:
    if id_ < 0:
        return {"id": str(id_)}
    fields = layout.decompose(id_)
    out = fields.to_dict(shard=bool(layout.shard_bits))
    return out


def _fields(layout: Layout, id_: int) -> str:
    if id_ < 0:
        return f"{id_}"
    d = layout.decompose(id_)
    shard = f"shard={d.shard} " if layout.shard_bits else ""
    return f"{id_} ({format_unix_ms(d.unix_ms)} {shard}region={d.region} worker={d.worker} sequence={d.sequence})"


def _summary(layout: Layout, checker: _Checks, dups: dict, inputs: list, total: int, seconds: float) -> dict:
    order = {name: k for k, (name, *_rest) in reversed(list(enumerate(inputs)))}

    def located(entries: list) -> list:
        out = []
        for e in sorted(entries, key=lambda e: (order[e["input"]], e["position"])):
            item = {"input": e["input"], "position": e["position"], **_describe(layout, e["id"])}
            if "after" in e:
                item["after"] = str(e["after"])
            if "reason" in e:
                item["reason"] = e["reason"]
            out.append(item)
        return out

    workers = [
        {"region": int(k) >> layout.worker_bits, "worker": int(k) & layout.max_worker, "ids": int(c)}
        for k, c in zip(checker.keys[:JSON_WORKERS], checker.key_counts[:JSON_WORKERS], strict=True)
    ]
    span = None
    if checker.earliest is not None:
        span = {
            "first": format_unix_ms(checker.earliest),
            "last": format_unix_ms(checker.latest),
            "first_unix_ms": checker.earliest,
            "last_unix_ms": checker.latest,
        }
    problems = dups["count"] + checker.invalid_ids + checker.out_of_order + checker.outside
    return {
        "ok": problems == 0,
        "layout": layout.to_dict(),
        "inputs": [{"name": n, "format": f, "ids": end - start} for n, f, start, end in inputs],
        "ids": total,
        "distinct": dups["distinct"],
        "duplicates": {
            "count": dups["count"],
            "ids": dups["ids"],
            "examples": [{**_describe(layout, e["id"]), "copies": e["copies"]} for e in dups["examples"]],
        },
        "invalid": {"count": checker.invalid_ids, **checker.invalid, "examples": located(checker.invalid_examples)},
        "out_of_order": (
            {"count": checker.out_of_order, "examples": located(checker.order_examples)} if checker.order else None
        ),
        "outside_range": (
            {
                "count": checker.outside,
                "from": None if checker.time_from is None else format_unix_ms(checker.time_from),
                "to": None if checker.time_to is None else format_unix_ms(checker.time_to),
                "examples": located(checker.outside_examples),
            }
            if checker.time_from is not None or checker.time_to is not None
            else None
        ),
        "time_span": span,
        "worker_ids": {"count": len(checker.keys), "ids": workers},
        "seconds": round(seconds, 3),
    }


def _print_text(layout: Layout, s: dict, out) -> None:
    def line(text: str = "") -> None:
        out.write(text + "\n")

    def at(e: dict) -> str:
        return f"#{e['position']:,} of {e['input']}"

    def example_id(e: dict) -> str:
        return _fields(layout, int(e["id"]))

    for i in s["inputs"]:
        line(f"{i['name']}: {i['ids']:,} IDs ({i['format']})")
    line(f"layout: {layout.describe()}")
    line(f"IDs read: {s['ids']:,}")
    line(f"distinct: {s['distinct']:,}")
    d = s["duplicates"]
    copies = f" extra {_plural(d['count'], 'copy', 'copies')} of {d['ids']:,} {_plural(d['ids'], 'ID')}"
    line(f"duplicates: {d['count']:,}" + (copies if d["count"] else ""))
    for e in d["examples"]:
        line(f"  {example_id(e)} x{e['copies']}")
    inv = s["invalid"]
    reasons = [
        ("not_63_bit", "not a 63-bit ID"),
        ("future", "from the future"),
        ("before_since", "before --since"),
        ("shard", "wrong shard"),
    ]
    detail = ", ".join(f"{label} {inv[k]:,}" for k, label in reasons if inv[k])
    line(f"invalid: {inv['count']:,}" + (f" ({detail})" if detail else ""))
    for e in inv["examples"]:
        line(f"  {at(e)}: {example_id(e)}: {e['reason']}")
    if s["out_of_order"] is None:
        line("out of order: not checked (--no-order)")
    else:
        line(f"out of order: {s['out_of_order']['count']:,}")
        for e in s["out_of_order"]["examples"]:
            line(f"  {at(e)}: {example_id(e)} after {e['after']}")
    r = s["outside_range"]
    if r is not None:
        line(f"outside [{r['from'] or '-'}, {r['to'] or '-'}): {r['count']:,}")
        for e in r["examples"]:
            line(f"  {at(e)}: {example_id(e)}")
    span = s["time_span"]
    if span:
        seconds = (span["last_unix_ms"] - span["first_unix_ms"]) / 1000
        line(f"time span: {span['first']} .. {span['last']} ({seconds:,.3f} s)")
    w = s["worker_ids"]
    shown = " ".join(f"{x['region']}/{x['worker']}:{x['ids']:,}" for x in w["ids"][:LISTED_WORKERS])
    more = " ..." if w["count"] > LISTED_WORKERS else ""
    line(f"worker IDs seen: {w['count']:,}" + (f" (region/worker:IDs {shown}{more})" if w["count"] else ""))
    line("OK" if s["ok"] else "PROBLEMS FOUND")


def _plural(count: int, one: str, many: str | None = None) -> str:
    return one if count == 1 else many or one + "s"


def run(args: argparse.Namespace, layout: Layout) -> int:
    np = _numpy()
    if args.examples < 0:
        raise ConfigError("--examples must be 0 or more")
    if not args.future_margin >= 0:
        raise ConfigError("--future-margin must be 0 or more seconds")
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    checker = _Checker(np, layout, args, now_ms) if np is not None else _PureChecker(layout, args, now_ms)
    names = args.inputs
    if not names:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("verify: give FILEs, or - to read stdin")
        names = ["-"]
    ids, inputs = _load(np, names, args.format, layout)
    for name, _fmt, start, end in inputs:
        checker.check_input(ids[start:end], name)
    dups = checker.duplicates(ids)
    del ids
    summary = _summary(layout, checker, dups, inputs, sum(e - s for _, _, s, e in inputs), time.monotonic() - started)
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_text(layout, summary, sys.stdout)
    sys.stdout.flush()
    return 0 if summary["ok"] else 1
