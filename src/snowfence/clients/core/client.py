"""What both clients are made of, and every choice they make between waits
(:class:`ClientBase`): the settings the constructor takes, the request table, the
directory, the fast-path policy, when to ask for NODES and when a move may close the
connection, which call takes the one-request path, and the errors a call gives up with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ... import protocol
from ...errors import ConnectionRefused, SnowfenceError, Timeout
from .blocks import Block
from .directory import DISCOVER_TIMEOUT_S, Directory
from .fastpath import FastPath
from .handshake import Link
from .inflight import Core, Pending

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_RETRIES = 5
#: Requests one reservation keeps in flight at once.
DEFAULT_WINDOW = 32
#: The longest timeout a client takes: ZeroMQ polls in int32 milliseconds.
MAX_TIMEOUT_S = 1_000_000.0

_BLOCK = protocol.BLOCK
_MAX_BLOCK = protocol.MAX_BLOCK


class ClientBase:
    """What both clients keep that no socket touches, and what they decide: endpoints
    and whose turn it is (:attr:`directory`), timeout and retry settings, the request
    table (:attr:`_core`), the fast-path policy (:attr:`fast_path`), and CURVE keys.
    A client's transport reports what happened (a reply, a timeout, a connection that
    closed) and does what the methods here and the rounds say; it opens its DEALER
    socket with :func:`snowfence.clients.core.open_dealer`.

    Its constructor is both clients': ``context`` is a ``zmq.Context`` for
    :class:`~snowfence.Client` and a ``zmq.asyncio.Context`` for
    :class:`~snowfence.AsyncClient` (default: the shared instance); a client
    keeps what its transport needs in :meth:`_init_transport`.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        window: int = DEFAULT_WINDOW,
        context=None,
        server_key: str | bytes | None = None,
        client_key: str | None = None,
        wait_for_server: bool = False,
        discover: bool = True,
        region: int | None = None,
        retry_for_s: float | None = None,
    ) -> None:
        seeds = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        seeds = [protocol.with_scheme(endpoint) for endpoint in seeds]  # host:port is tcp://host:port
        if not seeds:
            raise ValueError("at least one endpoint is needed")
        if region is not None and (isinstance(region, bool) or not isinstance(region, int) or region < 0):
            raise ValueError(f"region must be a region number, got {region!r}")
        #: Where requests go: the seeds, and with ``discover`` the nodes the cluster reports.
        self.directory = Directory(seeds, discover=discover, region=region)
        for endpoint in seeds:
            problem = protocol.endpoint_problem(endpoint)
            if problem:
                raise ValueError(problem)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be positive and at most {MAX_TIMEOUT_S:,.0f}, got {timeout_s}")
        if retries < 0 or window < 1:
            raise ValueError("retries must be >= 0 and window >= 1")
        if retry_for_s is not None and (
            isinstance(retry_for_s, bool)
            or not isinstance(retry_for_s, (int, float))
            or not 0 < retry_for_s <= MAX_TIMEOUT_S
        ):
            raise ValueError(
                f"retry_for_s must be a positive number of seconds, at most {MAX_TIMEOUT_S:,.0f}, got {retry_for_s!r}"
            )
        self.timeout_s = timeout_s
        self.retries = retries
        #: With a time budget, a call retries what may succeed later (refusals, timeouts, a
        #: node not yet listening) until ``retry_for_s`` has passed since it began, whatever
        #: ``retries`` says; None: ``retries`` counts.
        self.retry_for_s = retry_for_s
        self._retry_for_ns = None if retry_for_s is None else int(retry_for_s * 1e9)
        self.window = window
        self._timeout_ns = int(timeout_s * 1e9)
        self._discover_timeout_ns = int(min(timeout_s, DISCOVER_TIMEOUT_S) * 1e9)
        self._core = Core()
        self.resets = 0
        #: Timeouts in a row while no endpoint has ever replied.
        self._silent_timeouts = 0
        #: Retry (up to ``retries``) even while no endpoint has ever replied: for a
        #: client that starts before its server does. Off: give up after one
        #: timeout per endpoint, saying that no server answered.
        self.wait_for_server = wait_for_server or retry_for_s is not None
        #: Where an answer to NODES said to go while other requests were in flight.
        self._move_later: str | None = None
        if server_key is not None:
            from ...curve import Curve

            #: CURVE settings when the broker encrypts (``server_key``: its public key or certificate file).
            self.curve = Curve.for_client(server_key, client_key)
        else:
            self.curve = None
        #: The ZeroMQ context the transport opens its sockets on (None: its default).
        self._ctx = context
        #: When a reservation goes to a node's fast port, and what a failure there means.
        self.fast_path = FastPath()
        #: The transport's connection to the current node's fast port, while one is open
        #: (anything with ``where``, its (host, port), and ``endpoint``).
        self._fast = None
        #: Set by ``close()``: a closed client refuses every call rather than opening its connections again.
        self._closed = False
        self._init_transport()

    def _check_open(self) -> None:
        if self._closed:
            raise SnowfenceError("the client is closed: open a new one")

    def _init_transport(self) -> None:
        """What the transport keeps (its socket, its waiters); called last by the constructor."""

    def _close_connections(self) -> None:
        """Close the transport's socket and fast connection, with whatever is still on them."""

    def _reset(self, rotate: bool, now_ns: int = 0) -> None:
        """Drop the connection: nothing on it will be answered. With ``rotate`` its endpoint
        failed at ``now_ns`` (see :meth:`_forget_connection`), and a fast connection open then
        failed with it (see :meth:`FastPath.failed`)."""
        if rotate and self._fast is not None:
            self.fast_path.failed(self.endpoint, now_ns)
        self._close_connections()
        self._forget_connection(rotate)

    def _connection_failed(self, round_, error: SnowfenceError, now_ns: int) -> float:
        """A request of ``round_`` (a :class:`ReserveRound` or :class:`StatusRound`) found its
        connection refused, or its handshake failed: the round decides whether the call goes on
        and after how many seconds (``on_failed``, which raises when it does not), and the
        connection goes either way (a refused one stays refused)."""
        try:
            return round_.on_failed(error, now_ns)
        finally:
            self._reset(rotate=True, now_ns=now_ns)

    @property
    def endpoints(self) -> list[str]:
        return self.directory.endpoints

    @property
    def endpoint(self) -> str:
        """Where requests go now."""
        return self.directory.current

    def _new_link(self, endpoint: str) -> Link:
        """What the monitor of a socket opened to ``endpoint`` is to be fed to."""
        return Link(endpoint, self.curve is not None)

    def _may_retry(self, started_ns: int, now_ns: int) -> bool | None:
        """With a time budget (``retry_for_s``): whether a call that began at ``started_ns``
        may still retry at ``now_ns``; None when ``retries`` counts instead."""
        if self._retry_for_ns is None:
            return None
        return now_ns - started_ns < self._retry_for_ns

    def _discovery(self, now_ns: int) -> tuple[Pending, bytes] | None:
        """Before a call: make the move an earlier answer asked for, once no request in
        flight can still be answered; then the NODES request to send, when it is time to
        ask (None otherwise).

        Not before any broker has answered: until then a call says that no server
        answered rather than wait for NODES first. Raises the directory's
        :class:`StoreConflict` once two stores answered for one region."""
        if self.directory.conflict is not None:
            raise self.directory.conflict
        if self._move_later is not None and not self._core.answerable(now_ns):
            target, self._move_later = self._move_later, None
            if target in self.endpoints and target != self.endpoint:
                self._switch_to(target)
        if not self._core.heard:
            return None
        due = self.directory.due(now_ns)
        if not due and not self._fast_unknown():
            return None
        if due:
            self.directory.asked(now_ns)
        self.fast_path.asked = self.endpoint
        return self._core.nodes(now_ns + self._discover_timeout_ns)

    def _discovery_wanted(self, now_ns: int) -> bool:
        """Whether :meth:`_discovery` would do anything now (cheap: checked on every call)."""
        if self._move_later is not None:
            return True
        return self._core.heard and (self.directory.due(now_ns) or self._fast_unknown())

    def _discovered(self, reply: protocol.Reply | None) -> str | None:
        """Take the reply to :meth:`_discovery`'s request (None when there was none in
        time: the client has reset, as after any timeout), and move where it says.

        The move closes the connection, and with it every request still on it: while
        other requests are in flight (another task's, on the asyncio client), it waits
        for them, until a later call finds none. Returns the endpoint moved to now, if
        any. Discovery never fails a call."""
        if reply is None or reply.nodes is None:
            return None
        self.directory.answered()
        self.directory.note_homes(reply.nodes)
        self.fast_path.learn(reply.nodes, self.endpoint)
        if not self.directory.discover:
            return None
        target = self.directory.learn(reply.nodes)
        if target is None:
            return None
        if self._core.inflight:
            self._move_later = target
            return None
        self._switch_to(target)
        return target

    # -- the fast port (the policy is :class:`FastPath`'s) ----------------------------------

    @property
    def _fast_ports(self) -> dict[str, int | None]:
        """The fast ports known, by endpoint (:attr:`FastPath.ports`)."""
        return self.fast_path.ports

    @_fast_ports.setter
    def _fast_ports(self, ports: dict[str, int | None]) -> None:
        self.fast_path.ports = ports

    @property
    def _fast_asked(self) -> str | None:
        """The endpoint last asked for its fast port (:attr:`FastPath.asked`)."""
        return self.fast_path.asked

    @_fast_asked.setter
    def _fast_asked(self, endpoint: str | None) -> None:
        self.fast_path.asked = endpoint

    def _fast_unknown(self) -> bool:
        """Whether the current node may have a fast port this client has not asked about."""
        return self.fast_path.unknown(self.endpoint, self.curve is not None)

    def _fast_choice(self, conn, n: int, chunk: int, now_ns: int):
        """For a turn of a round: ``KEEP`` the open fast connection ``conn`` (None: none is
        open, or it is closing), open one to the (host, port) returned, or None for ZeroMQ
        (see :meth:`FastPath.choose`)."""
        return self.fast_path.choose(self.endpoint, conn, n, chunk, now_ns, self.curve is not None)

    def _fast_failed(self, now_ns: int) -> None:
        """The current node's fast port failed: ZeroMQ for a while (see :meth:`FastPath.failed`)."""
        self.fast_path.failed(self.endpoint, now_ns)

    def _fast_connect_timeout_s(self) -> float:
        """The longest wait for a fast connection to open."""
        return self.fast_path.connect_timeout_s(self.timeout_s)

    def _one_request(self, conn, n: int, after: int | None, now_ns: int) -> bool:
        """Whether ``reserve(n, after=after)`` takes the one-request path on the fast
        connection open now (``conn``): one request sent at once, its answer returned when
        it is the whole grant (:meth:`_whole_grant`), anything else handed to a round as if
        the round had sent it (:meth:`ReserveRound.adopt`). Only a plain count that the fast
        path takes on that connection, without a causal token, and not when discovery is
        due: a round does what those need."""
        return (
            after is None
            and n.__class__ is int
            and 0 < n
            and self.fast_path.still(self.endpoint, conn.endpoint, conn.where[1], n, _MAX_BLOCK)
            and not self._discovery_wanted(now_ns)
        )

    def _whole_grant(self, reply: protocol.Reply, n: int) -> list[Block] | None:
        """The blocks of a one-request reservation of ``n`` when ``reply`` grants all of it
        (the endpoint answered); None when a round is to take it from there."""
        if reply.type == _BLOCK and reply.count == n:
            self.directory.answered()
            return [Block(reply.first, n)]
        return None

    def _switch_to(self, endpoint: str) -> None:
        """Close the connection (nothing failed) and use ``endpoint`` from the next one on."""
        self._reset(rotate=False)
        self._move_to(endpoint)

    def _move_to(self, endpoint: str) -> None:
        """Use ``endpoint`` from the next connection on (the caller closed the old one)."""
        self.directory.current = endpoint

    def _timeout(
        self, what: str = "reply", endpoint: str | None = None, tries: int = 0, quiet_ns: int = 0, how: str = ""
    ) -> Timeout:
        """The error for a request that went unanswered on ``endpoint`` (the current one);
        with ``tries``, the one a call gives up with after that many failed attempts and
        ``quiet_ns`` without a reply; ``how``: what the connection's monitor adds
        (:meth:`Link.silence`)."""
        text = f"no {what} from {endpoint or self.endpoint} within {self.timeout_s} s"
        if tries:
            text += (
                f" (the timeout of each attempt); gave up after {tries} failed attempt{'s' if tries > 1 else ''},"
                f" {quiet_ns / 1e9:.1f} s without a reply"
            )
        return Timeout(text + how)

    def _timeout_note(self) -> str:
        """What the transport's monitor says about the connection that let a request time out."""
        return ""

    def _never_answered(self) -> Timeout | None:
        """After a timeout: the error to give up with when no endpoint has ever replied
        and each has had one timeout; None to retry as usual.

        Retrying a server that never answered only multiplies the wait: it is down,
        or the address (or the CURVE key) is wrong.
        """
        if self._core.heard or self.wait_for_server:
            return None
        self._silent_timeouts += 1
        if self._silent_timeouts < len(self.endpoints):
            return None
        where = ", ".join(self.endpoints)
        text = f"no endpoint ever replied (each tried for {self.timeout_s} s): is snowfence serve running at {where}?"
        return Timeout(text + self._timeout_note())

    def _gave_up(self, error: SnowfenceError) -> SnowfenceError:
        """The error a call gives up with after ``error`` (a refusal of the connection or
        of the handshake) on the last endpoint it tried: with several endpoints, a refused
        connection names them all."""
        if isinstance(error, ConnectionRefused) and len(self.endpoints) > 1:
            where = ", ".join(self.endpoints)
            return ConnectionRefused(
                f"no endpoint accepted a connection and answered ({error}): is snowfence serve running at {where}?"
            )
        return error

    def _forget_connection(self, rotate: bool) -> None:
        """The socket is going: nothing on it will be answered. With ``rotate`` its
        endpoint failed, and the next connection goes where :meth:`Directory.failed` says."""
        self._core.abandon(list(self._core.inflight.values()))
        if rotate:
            self.directory.failed()
        self.resets += 1
