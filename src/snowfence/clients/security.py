"""CURVE keys for clients: encrypt and authenticate the connection to a broker.

Keys are ZeroMQ certificate files as ``snowfence keygen`` writes them
(``NAME.key`` holds the public key, ``NAME.key_secret`` both). A client needs
the broker's public key; its own key pair is read from a file when the broker
keeps an allow-list, or made up for the session when it does not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.utils import z85


def _z85_key(key: bytes, where: str) -> bytes:
    try:
        if len(key) == 40 and len(z85.decode(key)) == 32:
            return key
    except (ValueError, KeyError, TypeError):
        pass
    raise ValueError(f"{where} is not a CURVE key (40 Z85 characters)")


def _load_certificate(path: str, what: str) -> tuple[bytes, bytes | None]:
    """The keys of a certificate file, with one clear error for anything wrong with it."""
    if not os.path.exists(path):
        raise ValueError(f"cannot read the {what} {path}: no such file")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError, IndexError):
        raise ValueError(f"{path} is not a key certificate (make one with `snowfence keygen`)") from None
    _z85_key(public, f"the public key in {path}")
    if secret is not None:
        _z85_key(secret, f"the secret key in {path}")
    return public, secret


def load_public_key(key: str | bytes | os.PathLike) -> bytes:
    """A Z85 public key, given as the key itself or a certificate file."""
    if isinstance(key, bytes) and len(key) == 40:
        return _z85_key(key, "the server key")
    if isinstance(key, str) and len(key) == 40 and not os.path.exists(key):
        return _z85_key(key.encode(), "the server key")
    public, _ = _load_certificate(os.fspath(key), "server key certificate")
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
            public, secret = _load_certificate(os.fspath(client_key), "client key certificate")
            if secret is None:
                raise ValueError(f"{client_key} holds no secret key; give the .key_secret file")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
