"""The fast-path policy: when a reservation goes to a node's fast TCP port rather than
over ZeroMQ, and what a failure there means.

A client learns each node's fast port from NODES answers (:meth:`FastPath.learn`) and
asks a node it has not heard one from (:meth:`FastPath.unknown`). A reservation goes
to the port only when it fits one request (:func:`fits_one_request`), only to the node
the port was learnt from, never with CURVE (the port has none), and not for
``FAST_RETRY_S`` after the port failed (refused, closed the connection, or let a
request time out): the client uses ZeroMQ meanwhile (:meth:`FastPath.failed`). Both
clients ask :class:`FastPath` before every reservation and obey what it says; they
only open, use and close the connection.
"""

from __future__ import annotations

from ... import protocol

#: The longest a client waits to connect to a node's fast port before it uses ZeroMQ instead.
FAST_CONNECT_TIMEOUT_S = 1.0
#: How long a client leaves a fast port alone after it failed (refused, closed, timed out).
FAST_RETRY_S = 30.0

#: What :meth:`FastPath.choose` says when the fast connection open now will do.
KEEP = "keep"


def fits_one_request(n: int, chunk: int) -> bool:
    """Whether a reservation of ``n`` IDs, asked for in requests of at most ``chunk``, is a
    single request: the only kind that goes to the fast port."""
    return n <= chunk and n <= protocol.MAX_BLOCK


def port_or_none(port: object) -> int | None:
    """A TCP port from a NODES answer (input: anything else is no port)."""
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port <= 65535 else None


def host_of(endpoint: str) -> str:
    """The host of a ``tcp://host:port`` endpoint (an IPv6 address without its brackets)."""
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


class FastPath:
    """What a client knows of the nodes' fast ports, and where each reservation goes.

    ``endpoint`` in every call is the ZeroMQ endpoint the client uses now; ``encrypted``
    whether it uses CURVE. Nothing here opens a connection or reads a clock.
    """

    __slots__ = ("ports", "asked", "off_until_ns")

    def __init__(self) -> None:
        #: The fast ports of the nodes the last NODES answer listed, by endpoint (None: it has none).
        self.ports: dict[str, int | None] = {}
        #: The endpoint last asked for its fast port (NODES), so that it is asked once.
        self.asked: str | None = None
        #: Until when (monotonic ns) the fast port is left alone after a failure; 0: not.
        self.off_until_ns = 0

    def unknown(self, endpoint: str, encrypted: bool) -> bool:
        """Whether the node at ``endpoint`` may have a fast port this client has not asked about."""
        return not encrypted and endpoint not in self.ports and self.asked != endpoint and endpoint.startswith("tcp://")

    def learn(self, answer: dict, endpoint: str) -> None:
        """Take the fast ports from a NODES answer: each listed node's, and the answering
        node's own (``fast_port`` at the top: the port of the node as this client reached it
        at ``endpoint``)."""
        ports: dict[str, int | None] = {}
        for n in answer.get("nodes") or ():
            eps = n.get("endpoints") if isinstance(n, dict) else None
            if isinstance(eps, list) and eps and isinstance(eps[0], str):
                ports[eps[0]] = port_or_none(n.get("fast_port"))
        ports[endpoint] = port_or_none(answer.get("fast_port"))
        self.ports = ports

    def route(self, endpoint: str, n: int, chunk: int, now_ns: int, encrypted: bool) -> tuple[str, int] | None:
        """Where to send a reservation of ``n`` IDs (in requests of at most ``chunk``) on the
        fast port, or None to use ZeroMQ: only a reservation that fits one request, only to
        the node the port was learnt from, never with CURVE, and not while the port is left
        alone after a failure."""
        port = self.ports.get(endpoint)
        if self.off_until_ns and now_ns >= self.off_until_ns:
            self.off_until_ns = 0
        if port is None or not fits_one_request(n, chunk) or now_ns < self.off_until_ns or encrypted:
            return None
        return host_of(endpoint), port

    def still(self, endpoint: str, conn_endpoint: str, conn_port: int, n: int, chunk: int) -> bool:
        """Whether a reservation of ``n`` goes to the fast connection open now (to
        ``conn_port`` of the node at ``conn_endpoint``): :meth:`route`, without building
        the answer."""
        return (
            conn_endpoint == endpoint
            and fits_one_request(n, chunk)
            and self.ports.get(endpoint) == conn_port
            and not self.off_until_ns
        )

    def choose(self, endpoint: str, conn, n: int, chunk: int, now_ns: int, encrypted: bool):
        """For one turn of a reservation of ``n`` (in requests of at most ``chunk``): ``KEEP``
        to use the fast connection open now (``conn``: anything with ``where``, its (host,
        port), and ``endpoint``; None when none is open or usable), the (host, port) to open
        one to, or None to use ZeroMQ."""
        if not self.ports:
            return None
        route = self.route(endpoint, n, chunk, now_ns, encrypted)
        if route is None:
            return None
        if conn is not None and conn.where == route and conn.endpoint == endpoint:
            return KEEP
        return route

    def failed(self, endpoint: str, now_ns: int) -> None:
        """The fast port of the node at ``endpoint`` failed (refused, closed the connection,
        or let a request time out): ZeroMQ for ``FAST_RETRY_S``, and the port asked for
        again (a node that restarted with ``auto`` has another)."""
        self.off_until_ns = now_ns + int(FAST_RETRY_S * 1e9)
        self.ports.pop(endpoint, None)
        self.asked = None

    @staticmethod
    def connect_timeout_s(timeout_s: float) -> float:
        """The longest wait for a fast connection to open, for a client whose timeout is ``timeout_s``."""
        return min(timeout_s, FAST_CONNECT_TIMEOUT_S)
