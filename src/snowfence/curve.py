"""CURVE keys, read and checked in one place for the broker and its clients alike.

Keys are ZeroMQ certificate files as ``snowfence keygen`` writes them
(``NAME.key`` holds the public key, ``NAME.key_secret`` both). A client needs
the broker's public key; its own key pair is read from a file when the broker
keeps an allow-list, or made up for the session when it does not. A broker
reads its key pair (``broker/auth.py``), and talks to its peers as a client of
the same key pair. Every problem with a key is a ValueError that names the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.utils import z85


def z85_key(key: bytes, where: str) -> bytes:
    """``key`` if it is a CURVE key in Z85 (40 characters for 32 bytes); ValueError naming ``where``."""
    try:
        if len(key) == 40 and len(z85.decode(key)) == 32:
            return key
    except (ValueError, KeyError, TypeError):
        pass
    raise ValueError(f"{where} is not a CURVE key (40 Z85 characters)")


def load_certificate(path: str, what: str) -> tuple[bytes, bytes | None]:
    """The keys of a certificate file (no secret key in a public one), with one clear error for
    anything wrong with it; ``what`` names the file's part in the error."""
    if not os.path.exists(path):
        raise ValueError(f"cannot read the {what} {path}: no such file")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError, IndexError):
        raise ValueError(f"{path} is not a CURVE key certificate (make one with `snowfence keygen`)") from None
    z85_key(public, f"the public key in {path}")
    if secret is not None:
        z85_key(secret, f"the secret key in {path}")
    return public, secret


def load_key_pair(path: str | os.PathLike, what: str) -> tuple[bytes, bytes]:
    """The (public, secret) keys of a secret certificate file."""
    public, secret = load_certificate(os.fspath(path), what)
    if secret is None:
        raise ValueError(f"{path} holds no secret key; give the .key_secret file")
    return public, secret


def load_public_key(key: str | bytes | os.PathLike) -> bytes:
    """A Z85 public key, given as the key itself or a certificate file."""
    if isinstance(key, bytes) and len(key) == 40:
        return z85_key(key, "the server key")
    if isinstance(key, str) and len(key) == 40 and not os.path.exists(key):
        return z85_key(key.encode(), "the server key")
    public, _ = load_certificate(os.fspath(key), "server key certificate")
    return public


@dataclass(frozen=True)
class Curve:
    """What a client socket needs for CURVE."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def for_client(cls, server_key, client_key: str | os.PathLike | None = None) -> Curve:
        """Raises ValueError, naming the file, for a key that is missing, unreadable or not a key."""
        server_public = load_public_key(server_key)
        if client_key is None:
            public, secret = zmq.curve_keypair()
        else:
            public, secret = load_key_pair(client_key, "client key certificate")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
