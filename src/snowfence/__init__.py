"""snowfence: 64-bit, time-ordered IDs that are never issued twice."""

from .clients import AsyncClient, Block, Client, Watermark, as_array, as_numpy
from .errors import (
    BadRequest,
    ClockUnsafe,
    Fenced,
    ReservationExpired,
    SnowfenceError,
    Timeout,
    Unavailable,
    WatermarkUnavailable,
)
from .ids import DEFAULT_LAYOUT, Decoded, IdRange, Layout, decode, from_base32, to_base32

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "as_array",
    "as_numpy",
    "BadRequest",
    "Block",
    "Client",
    "ClockUnsafe",
    "DEFAULT_LAYOUT",
    "Decoded",
    "Fenced",
    "IdRange",
    "Layout",
    "ReservationExpired",
    "SnowfenceError",
    "Timeout",
    "Unavailable",
    "Watermark",
    "WatermarkUnavailable",
    "decode",
    "from_base32",
    "to_base32",
]
