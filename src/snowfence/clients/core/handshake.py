"""What a client's connection to a node is doing, from the ZeroMQ socket monitor's
events (:class:`Link`).

ZeroMQ hides its connections: a DEALER whose node refuses the connection, or refuses
its CURVE handshake, only stops answering (and, once a refused handshake's pipe is gone,
blocks the next send). The socket monitor says what happened, as events. Each client
opens its DEALER with a monitor (:func:`snowfence.clients.core.open_dealer`), feeds the
events to a :class:`Link`, and asks it why nothing came: a cause it can name (the
connection refused, the key refused, CURVE on one side only) ends the attempt at once
with a typed error, anything else waits out the timeout, whose message then says how
far the connection got.

The event numbers are libzmq's (``zmq_socket_monitor``); a unit test checks them
against the library's, so this module needs no ZeroMQ.
"""

from __future__ import annotations

from ...errors import (
    ConnectionRefused,
    CurveNotUsed,
    CurveRequired,
    HandshakeRefused,
    KeyRefused,
    ServerKeyWrong,
    SnowfenceError,
)

EVENT_CONNECTED = 0x0001
EVENT_CONNECT_RETRIED = 0x0004
EVENT_DISCONNECTED = 0x0200
EVENT_HANDSHAKE_FAILED_NO_DETAIL = 0x0800
EVENT_HANDSHAKE_SUCCEEDED = 0x1000
EVENT_HANDSHAKE_FAILED_PROTOCOL = 0x2000
EVENT_HANDSHAKE_FAILED_AUTH = 0x4000
#: The events a client's monitor asks for.
EVENTS = (
    EVENT_CONNECTED
    | EVENT_CONNECT_RETRIED
    | EVENT_DISCONNECTED
    | EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | EVENT_HANDSHAKE_SUCCEEDED
    | EVENT_HANDSHAKE_FAILED_PROTOCOL
    | EVENT_HANDSHAKE_FAILED_AUTH
)
#: HANDSHAKE_FAILED_PROTOCOL's value when one side speaks CURVE and the other does not.
PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH = 0x11000002

#: What a client sends to learn a node's security mechanism (:func:`greeting_mechanism`):
#: the start of a ZMTP 3 greeting, signature and major version, after which a ZeroMQ
#: peer sends the rest of its own greeting, its mechanism in it.
GREETING_START = b"\xff" + bytes(8) + b"\x7f\x03"
#: The length of a whole ZMTP 3 greeting.
GREETING_BYTES = 64


def greeting_mechanism(greeting: bytes) -> str | None:
    """The security mechanism (``NULL``, ``PLAIN``, ``CURVE``) a ZMTP 3 peer names in
    the greeting it sent (its first 32 bytes or more); None when it is not one."""
    if len(greeting) < 32 or greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
        return None
    name = greeting[12:32].rstrip(b"\0")
    return name.decode("ascii") if name.isalnum() and name.isascii() else None


def greeting_address(endpoint: str) -> tuple[str, object] | None:
    """Where to ask a node for its greeting: ("tcp", (host, port)) or ("ipc", path); None
    for any other transport."""
    if endpoint.startswith("ipc://"):
        return "ipc", endpoint[len("ipc://") :]
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        try:
            return "tcp", (host.strip("[]"), int(port))
        except ValueError:
            return None
    return None


class Link:
    """One DEALER's connection to the node at ``endpoint``, as its monitor tells it;
    ``encrypted``: whether the client speaks CURVE.

    :attr:`error` is why the connection cannot carry a request now (None: nothing known
    against it); :attr:`ready` whether a handshake has succeeded since the last failure,
    after which the client need not watch the monitor while it waits.
    """

    __slots__ = ("endpoint", "encrypted", "connected", "ready", "error", "_attempt_connected", "_unclear")

    def __init__(self, endpoint: str, encrypted: bool) -> None:
        self.endpoint = endpoint
        self.encrypted = encrypted
        #: Whether a TCP (or IPC) connection is up now, handshake or not.
        self.connected = False
        self.ready = False
        self.error: SnowfenceError | None = None
        #: Whether the current attempt to connect has connected (libzmq says CONNECT_RETRIED
        #: whenever it schedules another attempt: after a refused one, or a lost connection).
        self._attempt_connected = False
        self._unclear = False

    def feed(self, event: int, value: int) -> SnowfenceError | None:
        """Take one monitor event; returns :attr:`error` after it."""
        if event == EVENT_CONNECTED:
            self.connected = self._attempt_connected = True
        elif event == EVENT_HANDSHAKE_SUCCEEDED:
            self.ready = True
            self.error = None
            self._unclear = False
        elif event == EVENT_DISCONNECTED:
            self.connected = False
            self.ready = False
        elif event == EVENT_CONNECT_RETRIED:
            if not self._attempt_connected:
                self.connected = self.ready = False
                self.error = ConnectionRefused(
                    f"{self.endpoint} refused the connection: is snowfence serve running there?"
                )
            self._attempt_connected = False
        elif event & (EVENT_HANDSHAKE_FAILED_AUTH | EVENT_HANDSHAKE_FAILED_PROTOCOL | EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            self.ready = False
            self.error = self._refusal(event, value)
        return self.error

    @property
    def unclear(self) -> bool:
        """Whether the handshake failed without saying why (libzmq's "no detail": a wrong
        server key, or CURVE on one side only when the node closed first): the node's
        greeting tells which (:meth:`learn_mechanism`)."""
        return self._unclear

    def learn_mechanism(self, mechanism: str | None) -> SnowfenceError | None:
        """Take the mechanism the node's greeting named (None: it could not be read) for a
        handshake that failed without saying why; returns :attr:`error` after it."""
        self._unclear = False
        if mechanism == "NULL" and self.encrypted:
            self.error = CurveNotUsed(f"the node at {self.endpoint} does not use CURVE: drop server_key (--server-key)")
        elif mechanism == "CURVE" and not self.encrypted:
            self.error = self._curve_required()
        return self.error

    def _curve_required(self) -> CurveRequired:
        return CurveRequired(
            f"the node at {self.endpoint} uses CURVE: give server_key (--server-key, the node's public key)"
        )

    def _refusal(self, event: int, value: int) -> HandshakeRefused:
        where = self.endpoint
        if event == EVENT_HANDSHAKE_FAILED_AUTH:
            return KeyRefused(
                f"the node at {where} refused this client's key (status {value}): "
                "its public key is not on the node's allow-list (--curve-allow)"
            )
        if event == EVENT_HANDSHAKE_FAILED_PROTOCOL and value == PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if self.encrypted:
                return CurveNotUsed(f"the node at {where} does not use CURVE: drop server_key (--server-key)")
            return self._curve_required()
        self._unclear = event == EVENT_HANDSHAKE_FAILED_NO_DETAIL
        if self._unclear and self.encrypted:
            return ServerKeyWrong(
                f"the node at {where} dropped this client's CURVE handshake: server_key is not that node's public key"
            )
        return HandshakeRefused(f"the ZeroMQ handshake with {where} failed (event 0x{event:x}, 0x{value:x})")

    def silence(self) -> str:
        """What a timeout's message adds about how far the connection got: whether it
        connected and never finished the handshake (something that is not a snowfence
        node, or one that is stopped or swamped), or never connected at all."""
        if self.ready:
            if self.encrypted:
                return " (CURVE is on: a key taken off the node's allow-list while connected also looks like this)"
            return ""
        if self.connected:
            return (
                " (the connection was accepted, but the ZeroMQ handshake never finished: "
                "is it a snowfence node, and is it running rather than stopped?)"
            )
        return " (no connection was made)"
