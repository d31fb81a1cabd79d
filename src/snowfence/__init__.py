"""snowfence: 64-bit, time-ordered IDs that are never issued twice.

The clients are imported when first named (``snowfence.Client``, ``from snowfence import
Client``): a node's broker and worker processes import this package too, and need none of
them (nor asyncio, which the asyncio client brings).
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from .clients import AsyncClient, Block, Client, Watermark, as_array, as_numpy

__version__ = "0.1.0"

_CLIENTS = frozenset({"AsyncClient", "Block", "Client", "Watermark", "as_array", "as_numpy"})


def __getattr__(name: str):
    if name in _CLIENTS:
        from . import clients

        return getattr(clients, name)
    raise AttributeError(f"module 'snowfence' has no attribute {name!r}")


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
