"""snowfence: 64-bit, time-ordered IDs that are never issued twice."""

from .clients import Block, Client
from .errors import (
    BadRequest,
    ClockUnsafe,
    Fenced,
    ReservationExpired,
    SnowfenceError,
    Timeout,
    Unavailable,
)
from .ids import DEFAULT_LAYOUT, Decoded, Layout, decode

__version__ = "0.1.0"

__all__ = [
    "BadRequest",
    "Block",
    "Client",
    "ClockUnsafe",
    "DEFAULT_LAYOUT",
    "Decoded",
    "Fenced",
    "Layout",
    "ReservationExpired",
    "SnowfenceError",
    "Timeout",
    "Unavailable",
    "decode",
]
