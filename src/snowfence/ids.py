"""The bit layout of an ID: compose, decompose, to_time. No I/O.

Default layout (widths and epoch are configurable; the four widths sum to 63)::

     63  62 ............................. 22  21 .. 19  18 ..... 12  11 ........ 0
     0 | milliseconds since 2026-01-01T00:00:00Z | region | worker  |  sequence
         41 bits (until 2095-09-07)             3 bits   7 bits     12 bits

Bit 63 stays 0, so every ID is a positive signed 64-bit integer. Within one
worker ID, IDs increase with time; the IDs a worker mints in one millisecond
form one contiguous integer range.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import asdict, dataclass
from typing import NamedTuple

from .errors import ConfigError

#: 2026-01-01T00:00:00Z in Unix milliseconds.
DEFAULT_EPOCH_MS = 1_767_225_600_000

#: Total width of the four fields; bit 63 is the sign bit and stays 0.
ID_BITS = 63


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
            raise ConfigError(f"layout widths must sum to {ID_BITS} (bit 63 stays 0), got {widths}={total}")

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


def decode(id_: int | str, layout: Layout = DEFAULT_LAYOUT) -> Decoded:
    """The fields of an ID given as an int or a decimal string."""
    if isinstance(id_, str):
        text = id_.strip()
        if not text.isdigit():
            raise ValueError(f"{id_!r} is not a snowfence ID (a non-negative 63-bit integer)")
        id_ = int(text)
    return layout.decompose(id_)
