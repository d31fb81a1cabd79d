"""Clients: a sans-I/O core and the transports built on it."""

from .blocking import Client
from .core import Block

__all__ = ["Block", "Client"]
