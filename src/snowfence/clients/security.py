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


def load_public_key(key: str | bytes | os.PathLike) -> bytes:
    """A Z85 public key, given as the key itself or a certificate file."""
    if isinstance(key, bytes) and len(key) == 40:
        return key
    if isinstance(key, str) and len(key) == 40 and not os.path.exists(key):
        return key.encode()
    public, _ = zmq.auth.load_certificate(os.fspath(key))
    return public


@dataclass(frozen=True)
class Curve:
    """What a client socket needs for CURVE."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def for_client(cls, server_key, client_key: str | os.PathLike | None = None) -> Curve:
        server_public = load_public_key(server_key)
        if client_key is None:
            public, secret = zmq.curve_keypair()
        else:
            public, secret = zmq.auth.load_certificate(os.fspath(client_key))
            if secret is None:
                raise ValueError(f"{client_key} holds no secret key; give the .key_secret file")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
