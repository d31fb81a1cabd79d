"""The bit layout of an ID: compose, decompose, to_time. No I/O.

Default layout (widths and epoch are configurable; the four widths sum to 63)::

     63  62 ............................. 22  21 .. 19  18 ..... 12  11 ........ 0
     0 | milliseconds since 2026-01-01T00:00:00Z | region | worker  |  sequence
         41 bits (until 2095-09-07)             3 bits   7 bits     12 bits

Bit 63 stays 0, so every ID is a positive signed 64-bit integer. Within one
worker ID, IDs increase with time; the IDs a worker mints in one millisecond
form one contiguous integer range.

The time inside an ID goes both ways: :meth:`Layout.to_time` reads it, and
:meth:`Layout.bounds` gives the lowest and highest ID that can carry a time or a
range of time (one range per shard), for queries such as ``WHERE id BETWEEN``.

Two other forms of an ID, both exact and order-keeping (see ``docs/GUIDE.md``, "ID
forms: UUIDv7 and base32"): :meth:`Layout.to_uuid` / :meth:`Layout.from_uuid`, an
RFC 9562 UUIDv7 whose timestamp is the ID's Unix millisecond, and :func:`to_base32` /
:func:`from_base32`, 13 characters of Crockford base32.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import uuid as _uuid
from dataclasses import asdict, dataclass
from typing import NamedTuple

from .errors import ConfigError

#: 2026-01-01T00:00:00Z in Unix milliseconds.
DEFAULT_EPOCH_MS = 1_767_225_600_000

#: Milliseconds in a year of 365.25 days: what "years left" of a layout counts in.
MS_PER_YEAR = 31_557_600_000

#: Total width of the four fields; bit 63 is the sign bit and stays 0.
ID_BITS = 63

_UNIX_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_MS = _dt.timedelta(milliseconds=1)
#: unix_ts_ms of a UUIDv7 is 48 bits.
_UUID_MS_LIMIT = 1 << 48

#: Crockford's base32 digits, in order (no I, L, O, U).
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Characters in the base32 form of an ID: 13 x 5 = 65 bits hold 63.
BASE32_WIDTH = 13
_CROCKFORD_VALUE = {c: i for i, c in enumerate(CROCKFORD)}
_CROCKFORD_VALUE.update({c.lower(): i for c, i in list(_CROCKFORD_VALUE.items())})
_CROCKFORD_VALUE.update({"I": 1, "i": 1, "L": 1, "l": 1, "O": 0, "o": 0})


def parse_epoch(value: str | int) -> int:
    """Unix milliseconds from an int, a decimal string, or an ISO-8601 time."""
    if isinstance(value, bool):
        raise ConfigError(f"epoch must be Unix milliseconds or an ISO-8601 time, not {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"epoch {value!r} is neither Unix milliseconds nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    return int(moment.timestamp() * 1000)


def format_unix_ms(unix_ms: int) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2026-12-01T01:08:36.123Z``."""
    moment = _dt.datetime.fromtimestamp(unix_ms / 1000, tz=_dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{unix_ms % 1000:03d}Z"


def _show_ms(unix_ms: int) -> str:
    """:func:`format_unix_ms`, or plain milliseconds for a time no datetime can hold."""
    try:
        return format_unix_ms(unix_ms)
    except (ValueError, OverflowError, OSError):
        return f"{unix_ms} ms"


class Decoded(NamedTuple):
    """The fields of one ID."""

    id: int
    unix_ms: int
    region: int
    worker: int
    sequence: int
    shard: int = 0

    @property
    def time(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self.unix_ms / 1000, tz=_dt.UTC)

    def to_dict(self, shard: bool = False) -> dict:
        """JSON-ready; the ID is a string because it does not fit a double. ``shard``: include it."""
        out = {
            "id": str(self.id),
            "unix_ms": self.unix_ms,
            "time": format_unix_ms(self.unix_ms),
            "region": self.region,
            "worker": self.worker,
            "sequence": self.sequence,
        }
        if shard:
            out["shard"] = self.shard
        return out


def unix_ms_of(value: int | str | _dt.datetime) -> int:
    """Unix milliseconds from an int, a decimal string, an aware datetime or ISO-8601 text.

    A time finer than a millisecond is truncated to the millisecond that holds it
    (rounded down), computed exactly (no float). ISO-8601 text without an offset
    is UTC, as for the epoch; a datetime without ``tzinfo`` is refused rather than
    guessed. Raises ``ValueError`` for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"a time is Unix milliseconds, an aware datetime or ISO-8601 text, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"datetime {value.isoformat()} has no time zone; give an aware datetime (e.g. UTC)")
        return (value - _UNIX_EPOCH) // _ONE_MS
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is neither Unix milliseconds nor an ISO-8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_dt.UTC)
        return (moment - _UNIX_EPOCH) // _ONE_MS
    raise ValueError(f"a time is Unix milliseconds, an aware datetime or ISO-8601 text, not {value!r}")


class IdRange(NamedTuple):
    """The IDs of one shard that carry a span of time: ``first`` to ``last``, both inclusive.

    ``start_ms`` and ``end_ms`` (Unix milliseconds, both inclusive) are the first and
    last millisecond of the span. Every ID minted in the span, in this shard, lies in
    ``first..last``, and no ID minted outside it does.
    """

    shard: int
    first: int
    last: int
    start_ms: int
    end_ms: int

    def holds(self, id_: int) -> bool:
        """Whether ``id_`` lies within ``first..last``."""
        return self.first <= id_ <= self.last

    def to_dict(self) -> dict:
        """JSON-ready; the IDs are strings because they do not fit a double."""
        return {
            "shard": self.shard,
            "first": str(self.first),
            "last": str(self.last),
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "start": _show_ms(self.start_ms),
            "end": _show_ms(self.end_ms),
        }


@dataclass(frozen=True, slots=True)
class Layout:
    """Widths of the ID's fields and the epoch its milliseconds count from."""

    epoch_ms: int = DEFAULT_EPOCH_MS
    time_bits: int = 41
    region_bits: int = 3
    worker_bits: int = 7
    sequence_bits: int = 12
    #: Optional high bits ahead of the timestamp: a hash of (region, worker), so
    #: writes spread over 2**shard_bits ranges of an index while each range stays
    #: time-ordered. 0 (the default) is the plain layout.
    shard_bits: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch_ms", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"layout {name} must be an integer, not {value!r}")
        if self.epoch_ms < 0:
            raise ConfigError(f"layout epoch must not be before 1970, got {self.epoch_ms} ms")
        if not 30 <= self.time_bits <= 61:
            raise ConfigError(f"time_bits must be 30..61, got {self.time_bits}")
        if not 0 <= self.region_bits <= 16:
            raise ConfigError(f"region_bits must be 0..16, got {self.region_bits}")
        if not 0 <= self.worker_bits <= 20:
            raise ConfigError(f"worker_bits must be 0..20, got {self.worker_bits}")
        if not 1 <= self.sequence_bits <= 22:
            raise ConfigError(f"sequence_bits must be 1..22, got {self.sequence_bits}")
        if not 0 <= self.shard_bits <= 8:
            raise ConfigError(f"shard_bits must be 0..8, got {self.shard_bits}")
        total = self.shard_bits + self.time_bits + self.region_bits + self.worker_bits + self.sequence_bits
        if total != ID_BITS:
            widths = f"{self.time_bits}+{self.region_bits}+{self.worker_bits}+{self.sequence_bits}"
            if self.shard_bits:
                widths = f"{self.shard_bits}+{widths}"
            off = abs(total - ID_BITS)
            bits = f"{off} bit{'s' if off > 1 else ''}"
            if total > ID_BITS:
                fix = f"{bits} too many: give time_bits {self.time_bits - off} (or take them from another width)"
            else:
                fix = f"{bits} short: give time_bits {self.time_bits + off} (or give them to another width)"
            raise ConfigError(f"layout widths must sum to {ID_BITS} (bit 63 stays 0), got {widths}={total}; {fix}")

    # Shifts and limits, derived. Properties keep the dataclass's fields exactly the
    # numbers that define a layout, which is what nodes compare.
    @property
    def worker_shift(self) -> int:
        return self.sequence_bits

    @property
    def region_shift(self) -> int:
        return self.sequence_bits + self.worker_bits

    @property
    def time_shift(self) -> int:
        return self.sequence_bits + self.worker_bits + self.region_bits

    @property
    def shard_shift(self) -> int:
        return self.time_shift + self.time_bits

    def shard_of(self, region: int, worker: int) -> int:
        """The shard of a worker ID: a few bits of a multiplicative hash of (region, worker)."""
        if not self.shard_bits:
            return 0
        key = (region << 20) | worker
        return ((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> (64 - self.shard_bits)

    @property
    def max_ms(self) -> int:
        """The last millisecond (since the epoch) an ID can carry."""
        return (1 << self.time_bits) - 1

    @property
    def max_region(self) -> int:
        return (1 << self.region_bits) - 1

    @property
    def max_worker(self) -> int:
        return (1 << self.worker_bits) - 1

    @property
    def max_sequence(self) -> int:
        return (1 << self.sequence_bits) - 1

    def check_region(self, region: int) -> int:
        if not isinstance(region, int) or isinstance(region, bool) or not 0 <= region <= self.max_region:
            raise ConfigError(
                f"region must be 0..{self.max_region} with {self.region_bits} region bits, got {region!r}"
            )
        return region

    def check_worker(self, worker: int) -> int:
        if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker <= self.max_worker:
            raise ConfigError(
                f"worker must be 0..{self.max_worker} with {self.worker_bits} worker bits, got {worker!r}"
            )
        return worker

    def compose(self, ms: int, region: int, worker: int, sequence: int) -> int:
        """The ID for ``ms`` milliseconds since the epoch and the other fields."""
        if not 0 <= ms <= self.max_ms:
            raise ValueError(f"ms {ms} is outside 0..{self.max_ms}")
        if not 0 <= region <= self.max_region:
            raise ValueError(f"region {region} is outside 0..{self.max_region}")
        if not 0 <= worker <= self.max_worker:
            raise ValueError(f"worker {worker} is outside 0..{self.max_worker}")
        if not 0 <= sequence <= self.max_sequence:
            raise ValueError(f"sequence {sequence} is outside 0..{self.max_sequence}")
        return (
            (self.shard_of(region, worker) << self.shard_shift)
            | (ms << self.time_shift)
            | (region << self.region_shift)
            | (worker << self.worker_shift)
            | sequence
        )

    def decompose(self, id_: int) -> Decoded:
        """The fields of an ID; the exact inverse of :meth:`compose`."""
        if isinstance(id_, bool) or not isinstance(id_, int) or not 0 <= id_ < (1 << ID_BITS):
            raise ValueError(f"{id_!r} is not a snowfence ID (a non-negative 63-bit integer)")
        ms = (id_ >> self.time_shift) & self.max_ms
        return Decoded(
            id=id_,
            unix_ms=ms + self.epoch_ms,
            region=(id_ >> self.region_shift) & self.max_region,
            worker=(id_ >> self.worker_shift) & self.max_worker,
            sequence=id_ & self.max_sequence,
            shard=id_ >> self.shard_shift,
        )

    def ms_of(self, id_: int) -> int:
        """Milliseconds since the epoch carried by an ID."""
        return (id_ >> self.time_shift) & self.max_ms

    def to_time(self, id_: int) -> _dt.datetime:
        """When an ID was minted, as an aware UTC datetime (millisecond precision)."""
        return self.decompose(id_).time

    @property
    def last_unix_ms(self) -> int:
        """The last Unix millisecond an ID of this layout can carry."""
        return self.epoch_ms + self.max_ms

    @property
    def end_unix_ms(self) -> int:
        """The layout's end: ``epoch_ms + 2**time_bits``, the first Unix millisecond no ID of it
        can carry. From then on a node cannot mint; a successor layout is the way on."""
        return self.epoch_ms + (1 << self.time_bits)

    def years_left(self, now_ms: int) -> float:
        """Years (of 365.25 days) from ``now_ms`` to :attr:`end_unix_ms`; negative once it has passed."""
        return (self.end_unix_ms - now_ms) / MS_PER_YEAR

    def lifetime(self, now_ms: int) -> dict:
        """The layout's end as STATUS carries it: ``end_unix_ms``, ``end`` (ISO-8601) and
        ``years_left`` at ``now_ms`` (two decimals; negative once it has passed)."""
        return {
            "end_unix_ms": self.end_unix_ms,
            "end": _show_ms(self.end_unix_ms),
            "years_left": round(self.years_left(now_ms), 2),
        }

    def bounds(
        self,
        start: int | str | _dt.datetime,
        end: int | str | _dt.datetime | None = None,
        *,
        closed: bool = False,
    ) -> tuple[IdRange, ...]:
        """The lowest and highest ID that can carry a time, or a range of time: one
        :class:`IdRange` per shard, in shard order, bounds inclusive.

        ``start`` and ``end`` are Unix milliseconds (int), aware datetimes or ISO-8601
        text (see :func:`unix_ms_of`; finer than a millisecond is rounded down). Alone,
        ``start`` names one millisecond. With ``end`` the range is half-open,
        ``[start, end)``, so that consecutive ranges (an hour, the next hour) share no
        ID; ``closed=True`` includes ``end``'s millisecond too.

        With ``shard_bits == 0`` there is one range. With shard bits, the shard sits
        above the timestamp, so a span of time is one range of IDs **per shard**
        (``2 ** shard_bits`` ranges; a query must OR them), and between them lie the
        other shards' IDs of every other time. Some shards may hold no worker ID at all;
        their range is still given, since which ones do depends on the workers.

        Nothing is clamped: a time before the epoch or after :attr:`last_unix_ms`
        (no ID can carry it), or an empty range, raises ``ValueError``. Pure: no clock,
        no I/O.
        """
        first_ms = unix_ms_of(start)
        if end is None:
            last_ms = first_ms
        else:
            last_ms = unix_ms_of(end) - (0 if closed else 1)
        for what, value in (("start", first_ms), ("end", last_ms + (0 if closed or end is None else 1))):
            if value < self.epoch_ms:
                raise ValueError(
                    f"{what} {_show_ms(value)} is before the layout's epoch {_show_ms(self.epoch_ms)}: no ID carries it"
                )
        for what, value in (("start", first_ms), ("end", last_ms)):
            if value > self.last_unix_ms:
                raise ValueError(
                    f"{what} {_show_ms(value)} is after the last millisecond an ID of this layout carries, "
                    f"{_show_ms(self.last_unix_ms)}"
                )
        if last_ms < first_ms:
            raise ValueError(
                f"the range {_show_ms(first_ms)} to {_show_ms(last_ms + (0 if closed else 1))} "
                f"({'closed' if closed else 'half-open: end excluded'}) holds no millisecond"
            )
        low, high = first_ms - self.epoch_ms, last_ms - self.epoch_ms
        below_time = (1 << self.time_shift) - 1
        return tuple(
            IdRange(
                shard=shard,
                first=(shard << self.shard_shift) | (low << self.time_shift),
                last=(shard << self.shard_shift) | (high << self.time_shift) | below_time,
                start_ms=first_ms,
                end_ms=last_ms,
            )
            for shard in range(1 << self.shard_bits)
        )

    # -- the UUIDv7 form ----------------------------------------------------------------

    @property
    def uuid_tag(self) -> int:
        """The 12 bits (``rand_a``) every UUID of this layout carries: the first three hex
        digits of the SHA-256 of ``epoch_ms=E,region_bits=R,sequence_bits=S,shard_bits=H,
        time_bits=T,worker_bits=W`` (:data:`UUID_TAG_FIELDS`, always these six). A UUID with
        another tag was made with another layout."""
        return _uuid_tag(self)

    def to_uuid(self, id_: int) -> _uuid.UUID:
        """The RFC 9562 UUIDv7 of an ID; :meth:`from_uuid` is its exact inverse.

        ::

            127 ........... 80  79..76  75 ...... 64  63 62  61 ....... k  k-1 ................ 0
            unix_ts_ms (48)   | 0111  |  tag (12)   |  10  |  zeros     | shard|region|worker|seq
            epoch + ms field   version  uuid_tag     variant  62-k bits   the ID's k low bits, with
                                                                           the shard moved down

        ``k = 63 - time_bits`` (the ID's bits other than its milliseconds); ``tag`` is
        :attr:`uuid_tag`. So the UUID sorts (as 128 bits, big-endian, or as its lowercase
        text) by (Unix millisecond, shard, region, worker, sequence). Without shard bits
        that is the IDs' order: ``a < b`` if and only if ``to_uuid(a) < to_uuid(b)``. With
        shard bits it is the IDs' order within one shard; across shards the UUIDs sort by
        time first (the IDs by shard first).

        Raises ``ValueError`` for what is not a 63-bit ID, and for an ID whose Unix
        millisecond does not fit the 48 bits of ``unix_ts_ms`` (after the year 10889).
        """
        if isinstance(id_, bool) or not isinstance(id_, int) or not 0 <= id_ < (1 << ID_BITS):
            raise ValueError(f"{id_!r} is not a snowfence ID (a non-negative 63-bit integer)")
        unix_ms = self.epoch_ms + self.ms_of(id_)
        if unix_ms >= _UUID_MS_LIMIT:
            raise ValueError(
                f"ID {id_} carries Unix millisecond {unix_ms}, past the last a UUIDv7 can carry ({_UUID_MS_LIMIT - 1})"
            )
        low = (id_ >> self.shard_shift) << self.time_shift | (id_ & ((1 << self.time_shift) - 1))
        return _uuid.UUID(int=unix_ms << 80 | 0x7 << 76 | self.uuid_tag << 64 | 0b10 << 62 | low)

    def from_uuid(self, value: _uuid.UUID | str) -> int:
        """The ID a UUID of :meth:`to_uuid` stands for, given as a :class:`uuid.UUID` or its
        text (``8-4-4-4-12`` hex, or 32 hex digits).

        Raises ``ValueError`` for a UUID this layout's :meth:`to_uuid` cannot have made:
        not version 7 or not the RFC 9562 variant, another layout's tag, a bit set that
        the layout leaves zero, or a time outside the layout's epoch..last millisecond.
        """
        if isinstance(value, str):
            try:
                value = _uuid.UUID(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a UUID") from None
        elif not isinstance(value, _uuid.UUID):
            raise ValueError(f"{value!r} is not a UUID")
        n = value.int
        if n >> 62 & 0b11 != 0b10:
            raise ValueError(f"UUID {value} is not a snowfence ID: its variant bits are not 10 (RFC 9562's)")
        if value.version != 7:
            raise ValueError(f"UUID {value} is not a snowfence ID: version {n >> 76 & 0xF}, not 7")
        tag = n >> 64 & 0xFFF
        if tag != self.uuid_tag:
            raise ValueError(
                f"UUID {value} is not a snowfence ID of this layout: it carries layout tag {tag:03x}, this layout's is "
                f"{self.uuid_tag:03x}"
            )
        k = ID_BITS - self.time_bits
        low = n & ((1 << 62) - 1)
        if low >> k:
            raise ValueError(
                f"UUID {value} is not a snowfence ID of this layout: bits are set that the layout leaves zero"
            )
        unix_ms = n >> 80
        if not self.epoch_ms <= unix_ms <= self.last_unix_ms:
            raise ValueError(
                f"UUID {value} is not a snowfence ID of this layout: it carries {_show_ms(unix_ms)}, "
                f"outside the layout's {_show_ms(self.epoch_ms)} to {_show_ms(self.last_unix_ms)}"
            )
        shard = low >> self.time_shift
        return (
            shard << self.shard_shift
            | (unix_ms - self.epoch_ms) << self.time_shift
            | (low & ((1 << self.time_shift) - 1))
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        """A short hash of the layout, carried by every mark: a mark of another layout is not ours."""
        canonical = ",".join(f"{k}={v}" for k, v in sorted(self.to_dict().items()))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        """The layout a store recorded with :meth:`to_dict`.

        Every field must be there: a record that leaves one out does not say which
        layout its IDs were minted with, and guessing the default could let two
        layouts' IDs collide. Only ``shard_bits`` may be missing, from records
        written before layouts had shard bits, when there were none.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"a layout is a JSON object, not {type(data).__name__}")
        required = ("epoch_ms", "time_bits", "region_bits", "worker_bits", "sequence_bits")
        fields = (*required, "shard_bits")
        unknown = set(data) - set(fields)
        if unknown:
            raise ConfigError(f"unknown layout fields: {', '.join(sorted(unknown))}")
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"layout fields missing: {', '.join(missing)}")
        return cls(**{k: data[k] for k in fields if k in data})

    def describe(self) -> str:
        shard = f"{self.shard_bits} shard, " if self.shard_bits else ""
        return (
            f"{shard}{self.time_bits} bits of ms since {format_unix_ms(self.epoch_ms)}, "
            f"{self.region_bits} region, {self.worker_bits} worker, {self.sequence_bits} sequence"
        )


DEFAULT_LAYOUT = Layout()


#: The fields the UUID layout tag hashes, in this order, whatever fields layouts gain later:
#: a tag must not change, or every UUID made before would stop reading.
UUID_TAG_FIELDS = ("epoch_ms", "region_bits", "sequence_bits", "shard_bits", "time_bits", "worker_bits")


@functools.lru_cache(maxsize=64)
def _uuid_tag(layout: Layout) -> int:
    text = ",".join(f"{name}={getattr(layout, name)}" for name in UUID_TAG_FIELDS)
    return int(hashlib.sha256(text.encode("ascii")).hexdigest()[:3], 16)


def decode(id_: int | str, layout: Layout = DEFAULT_LAYOUT) -> Decoded:
    """The fields of an ID given as an int or a decimal string."""
    if isinstance(id_, str):
        text = id_.strip()
        if not text.isdigit():
            raise ValueError(f"{id_!r} is not a snowfence ID (a non-negative 63-bit integer)")
        id_ = int(text)
    return layout.decompose(id_)


def to_base32(id_: int) -> str:
    """An ID as 13 characters of Crockford base32, uppercase and zero-padded, so that
    text order is ID order (the first character is 0..7: the 65 bits' top two, 64 and 63, are 0).
    The same for every layout. :func:`from_base32` is its exact inverse."""
    if isinstance(id_, bool) or not isinstance(id_, int) or not 0 <= id_ < (1 << ID_BITS):
        raise ValueError(f"{id_!r} is not a snowfence ID (a non-negative 63-bit integer)")
    return "".join(CROCKFORD[(id_ >> shift) & 31] for shift in range(5 * (BASE32_WIDTH - 1), -1, -5))


def from_base32(text: str) -> int:
    """The ID of a :func:`to_base32` form. Lowercase is read as uppercase, and Crockford's
    aliases I and L as 1, O as 0; anything else (a U, a hyphen, a space, another length,
    a value above 2**63 - 1) raises ``ValueError``."""
    if not isinstance(text, str) or len(text) != BASE32_WIDTH:
        raise ValueError(f"{text!r} is not a snowfence ID in base32 (13 Crockford base32 characters)")
    value = 0
    for char in text:
        digit = _CROCKFORD_VALUE.get(char)
        if digit is None:
            raise ValueError(f"{text!r} is not a snowfence ID in base32: {char!r} is not a Crockford base32 digit")
        value = value << 5 | digit
    if value >> ID_BITS:
        raise ValueError(
            f"{text!r} is not a snowfence ID in base32: above the largest ID (its first character is 0..7)"
        )
    return value
