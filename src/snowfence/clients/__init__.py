"""Clients: a sans-I/O core and the transports built on it."""

from .aio import AsyncClient
from .blocking import Client
from .core import Block, Watermark, as_array, as_numpy

__all__ = ["AsyncClient", "Block", "Client", "Watermark", "as_array", "as_numpy"]
