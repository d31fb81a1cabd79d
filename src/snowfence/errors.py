"""Every error snowfence raises or sends, each with its wire ``code``.

An error that crosses the wire is identified by its ``code`` string alone; the
client turns the code back into the same class with :func:`from_code`. The
``retriable`` flag is what clients and the broker consult to decide whether
asking again (elsewhere, or later) can succeed; nothing matches on messages.
"""

from __future__ import annotations


class SnowfenceError(Exception):
    """Base of every snowfence error."""

    code = "internal"
    retriable = False
    #: The request an error answers, when it was read far enough to know (see protocol).
    request_id: int | None = None
    #: A server's hint (``overloaded``): milliseconds to wait before asking again.
    retry_after_ms: int | None = None

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__.strip().splitlines()[0])

    @property
    def message(self) -> str:
        return str(self.args[0])

    def to_wire(self) -> dict:
        wire = {"code": self.code, "message": self.message, "retriable": self.retriable}
        if self.retry_after_ms is not None:
            wire["retry_after_ms"] = self.retry_after_ms
        return wire


# -- bad input: asking again unchanged cannot succeed ------------------------------


class BadRequest(SnowfenceError):
    """The request is malformed or asks for something out of range."""

    code = "bad_request"


class UnsupportedVersion(BadRequest):
    """The request speaks a protocol version this server does not."""

    code = "unsupported_version"


class FrameTooLarge(BadRequest):
    """The request frame is larger than the server accepts."""

    code = "frame_too_large"


class TokenAhead(SnowfenceError):
    """The causal token is further ahead of this worker's clock than it may follow."""

    code = "token_ahead"
    retriable = True


# -- refusals by a worker's minter: another worker (or a moment later) may succeed ---


class Refused(SnowfenceError):
    """A worker refused to mint because a guard could not be confirmed."""

    code = "refused"
    retriable = True


class Fenced(Refused):
    """The worker has not renewed its worker-ID lease recently enough to mint."""

    code = "fenced"


class ClockUnsafe(Refused):
    """The wall clock stepped back further than the worker may wait out."""

    code = "clock_unsafe"


class ReservationExpired(Refused):
    """The clock has passed the time high-water mark the worker has persisted."""

    code = "reservation_expired"


# -- the service as a whole ----------------------------------------------------------


class Unavailable(SnowfenceError):
    """No worker can serve the request right now."""

    code = "unavailable"
    retriable = True


class StoreConflict(SnowfenceError):
    """Two nodes answer for one region from two stores (two homes): their IDs may repeat each other's."""

    code = "store_conflict"


class Timeout(Unavailable):
    """No reply arrived within the client's timeout."""

    code = "timeout"


class ConnectionRefused(Unavailable):
    """The node's address refused the connection: nothing listens there now."""

    code = "connection_refused"


# -- what a client learns about the connection itself; raised by the client, never sent ---
#
# A client names the cause it can know, rather than time out: each kind of trouble with
# how a client reaches its nodes is a subclass of ClientSideError with a ``code`` of its own
# and a ``retriable`` flag saying whether asking again unchanged can succeed.


class ClientSideError(SnowfenceError):
    """The client cannot use a node as it is set up to."""

    code = "client_error"


class HandshakeRefused(ClientSideError):
    """The node refused this client's connection in the ZeroMQ handshake (CURVE)."""

    code = "handshake_refused"


class KeyRefused(HandshakeRefused):
    """The node refused this client's key (CURVE): it is not on the node's allow-list."""

    code = "key_refused"


class CurveRequired(HandshakeRefused):
    """The node uses CURVE: give server_key (the node's public key)."""

    code = "curve_required"


class CurveNotUsed(HandshakeRefused):
    """The node does not use CURVE: drop server_key."""

    code = "curve_not_used"


class ServerKeyWrong(HandshakeRefused):
    """The node dropped this client's CURVE handshake: server_key is not the node's public key."""

    code = "server_key_wrong"


class Overloaded(SnowfenceError):
    """Too many requests in flight on this connection."""

    code = "overloaded"
    retriable = True


class InternalError(SnowfenceError):
    """The server failed in a way it did not expect."""

    code = "internal"


# -- local errors: configuration and boot; never sent on the wire ---------------------


class ConfigError(SnowfenceError):
    """The configuration is invalid."""

    code = "config_error"


class LayoutMismatch(ConfigError):
    """The configured ID layout differs from the one the cluster already uses."""

    code = "layout_mismatch"


class RegionHeld(ConfigError):
    """This node's region is served on this host from another home (state directory or etcd cluster)."""

    code = "region_held"


class StateDirError(ConfigError):
    """The state directory cannot be used."""

    code = "state_dir_error"


class WorkerIdUnusable(StateDirError):
    """A worker ID's state in the state directory cannot be trusted; it is passed over."""

    code = "worker_id_unusable"


class StateDirBusy(SnowfenceError):
    """Another process held the state directory's lock too long; try again."""

    code = "state_dir_busy"
    retriable = True


class LeaseLost(SnowfenceError):
    """The worker-ID lease is gone: expired, revoked, or taken over."""

    code = "lease_lost"
    retriable = True


class StoreWentBack(SnowfenceError):
    """The store has forgotten or gone back on what this node saw it hold; claims wait for an operator."""

    code = "store_went_back"
    retriable = True


class WatermarkRecordUnreadable(SnowfenceError):
    """The store's watermark record is not one snowfence wrote: no watermark is promised
    past it until an operator deletes it (claims meanwhile wait out a quarantine)."""

    code = "watermark_record_unreadable"


class WatermarkUnavailable(SnowfenceError):
    """No watermark has been promised yet (the node is starting, or its store is away)."""

    code = "watermark_unavailable"
    retriable = True


class EtcdUnavailable(SnowfenceError):
    """etcd did not answer within the deadline."""

    code = "etcd_unavailable"
    retriable = True


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


_BY_CODE: dict[str, type[SnowfenceError]] = {c.code: c for c in _subclasses(SnowfenceError)}
_BY_CODE["internal"] = InternalError


def from_code(code: str, message: str = "", retriable: bool | None = None) -> SnowfenceError:
    """The error for a wire ``code``; an unknown code keeps its code and flag."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message or None)
    err = SnowfenceError(message or f"server error {code!r}")
    err.code = code
    err.retriable = bool(retriable)
    return err
