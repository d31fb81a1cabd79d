"""The blocking client: a DEALER socket driven by the sans-I/O core.

Requests are pipelined: ``reserve(1_000_000)`` keeps up to ``window`` requests
in flight. A request that gets no reply within ``timeout_s`` is given up on and
the socket is closed and reopened on the next endpoint (the Lazy Pirate
pattern), so no stale reply can ever be read as the answer to a newer request.
Retriable errors are retried with back-off; anything else is raised at once.
"""

from __future__ import annotations

import itertools
import operator
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator

import zmq
import zmq.backend

from .. import protocol
from ..errors import SnowfenceError
from ..ids import IdRange, Layout
from .core import (
    GREETING_BYTES,
    GREETING_START,
    KEEP,
    Block,
    ClientBase,
    Link,
    Pending,
    Prefetch,
    PrefetchDepth,
    ReserveJob,
    ReserveRound,
    StatusRound,
    Watermark,
    close_dealer,
    fresh,
    greeting_address,
    greeting_mechanism,
    monitor_event,
    open_dealer,
)

# The wait for a reply is a blocking recv with a receive timeout (the GIL released),
# not Socket.poll, which builds a Poller for every call; and pyzmq's Cython methods
# are called directly, without the Python wrappers. Both are on every round trip.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_RCVTIMEO = int(zmq.RCVTIMEO)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_stream = protocol.encode_stream
#: What :meth:`Client._reserve_fast` got when its fast connection closed under its request.
_LOST = ("lost", None)


def _recv_within(sock: zmq.Socket, timeout_ms: int, timeouts: dict) -> bytes | None:
    """The next message on ``sock`` within ``timeout_ms``, or None."""
    if timeouts.get(sock) != timeout_ms:
        sock.setsockopt(_RCVTIMEO, timeout_ms)
        timeouts[sock] = timeout_ms
    try:
        return _recv(sock)
    except zmq.Again:
        return None


def _pending(sock: zmq.Socket) -> bool:
    """Whether another message is waiting on ``sock`` (without an exception for no)."""
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)


def node_mechanism(endpoint: str, timeout_s: float) -> str | None:
    """The security mechanism the ZeroMQ node at ``endpoint`` names in its greeting
    (``NULL``, ``CURVE``), asked on a connection of its own; None if it cannot be told
    within ``timeout_s``."""
    where = greeting_address(endpoint)
    if where is None:
        return None
    kind, address = where
    greeting = b""
    try:
        if kind == "ipc":
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            conn.connect(address)
        else:
            conn = socket.create_connection(address, timeout=timeout_s)
        with conn:
            conn.sendall(GREETING_START)
            while len(greeting) < GREETING_BYTES:
                chunk = conn.recv(GREETING_BYTES - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except OSError:
        pass
    return greeting_mechanism(greeting)


#: The longest a client waits for a node's greeting (see :func:`node_mechanism`).
GREETING_TIMEOUT_S = 0.5


_ids_of = operator.itemgetter(0)


class _Lost(Exception):
    """The connection can carry nothing now, for the reason ``error`` names (from the
    socket monitor: the connection or the handshake was refused)."""

    def __init__(self, error: SnowfenceError) -> None:
        super().__init__(str(error))
        self.error = error


class FastConnection:
    """A blocking TCP connection to a node's fast port: length-prefixed bodies both ways.

    The socket blocks in the kernel, bounded by SO_RCVTIMEO and SO_SNDTIMEO, rather than
    by Python's socket timeout, which polls before every send and receive: one system
    call per direction instead of two, on every round trip. An ``OSError`` from any
    method means the connection is gone (refused, reset, or closed by the broker)."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, timeout_s: float) -> None:
        self.where = (host, port)
        #: The ZeroMQ endpoint of the node whose fast port this is (set by the client).
        self.endpoint = ""
        self.sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        try:
            self.sock.settimeout(None)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(max(1, int(timeout_s * 1000))))
        except OSError:
            self.sock.close()
            raise
        self._frames = protocol.Stream(protocol.MAX_REPLY_BYTES)
        self._ready: deque[bytes] = deque()
        #: The receive timeout set now (ms; None: none yet, and the kernel's default is none).
        self._rcvtimeo_ms: int | None = None

    def send(self, body: bytes) -> None:
        self.sock.sendall(_stream(body))

    def recv_within(self, timeout_ms: int) -> bytes | None:
        """The next body within ``timeout_ms``, or None."""
        ready = self._ready
        if ready:
            return ready.popleft()
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
        while True:
            left_ms = -(-(deadline_ns - time.monotonic_ns()) // 1_000_000)
            if left_ms <= 0:
                return None
            # Set again only when it is off by more than a few ms (it may end a wait early,
            # never late; an early end goes round this loop again).
            if self._rcvtimeo_ms is None or not left_ms - _RCVTIMEO_SLACK_MS <= self._rcvtimeo_ms <= left_ms:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(left_ms))
                self._rcvtimeo_ms = left_ms
            try:
                self._take(self.sock.recv(_READ_BYTES))
            except BlockingIOError:  # SO_RCVTIMEO ran out
                continue
            if ready:
                return ready.popleft()

    def recv_ready(self) -> bytes | None:
        """A body that has already arrived, or None (never waits)."""
        if not self._ready:
            try:
                self._take(self.sock.recv(_READ_BYTES, socket.MSG_DONTWAIT))
            except BlockingIOError:
                return None
        return self._ready.popleft() if self._ready else None

    def _take(self, data: bytes) -> None:
        if not data:
            raise ConnectionResetError("the broker closed the fast connection")
        try:
            self._ready.extend(self._frames.feed(data))
        except SnowfenceError as exc:
            raise ConnectionResetError(f"a garbled frame on the fast port: {exc}") from None

    def close(self) -> None:
        self.sock.close()


#: Bytes asked of the kernel per read on a fast connection: a reply to a reservation is
#: 28 bytes (an error a few hundred); a larger buffer is allocated, then shrunk, on every read.
_READ_BYTES = 4096
#: How far the fast connection's receive timeout may be below the wait it bounds.
_RCVTIMEO_SLACK_MS = 5


def _timeval(ms: int) -> bytes:
    """A ``struct timeval`` of ``ms`` milliseconds, for SO_RCVTIMEO and SO_SNDTIMEO."""
    return struct.pack("@ll", ms // 1000, (ms % 1000) * 1000)


class Client(ClientBase):
    """Reserve IDs from one or more snowfence brokers.

    ``endpoints`` is one ZeroMQ endpoint or a list of them. ``timeout_s`` is the
    wait for the reply to each attempt, not for the whole call: after a timeout
    the attempt goes at once to another endpoint (see ``core.Directory``), and
    a call gives up after ``retries`` failed attempts beyond the first, not
    counting timeouts that moved it to an endpoint it had not yet found
    unresponsive. Safe to share between threads (calls take turns).
    While no endpoint has ever replied, a call gives up after one timeout per
    endpoint (no server is there, or the address or CURVE key is wrong);
    ``wait_for_server=True`` keeps retrying instead, for a server still starting.

    With ``discover`` (the default) the client asks the brokers for the
    cluster's nodes (NODES) on connect, after a failure and every few seconds,
    and fails over across all of them, nodes of its own ``region`` first when
    given; ``discover=False`` pins the list to ``endpoints``.
    """

    def _init_transport(self) -> None:
        if self._ctx is None:
            self._ctx = zmq.Context.instance()
        self._lock = threading.RLock()
        self._sock: zmq.Socket | None = None
        #: The socket's monitor, and what its events said of the connection (the last
        #: socket's, until the next opens).
        self._monitor: zmq.Socket | None = None
        self._watch = Link(self.endpoint, self.curve is not None)
        #: The connection to the current node's fast port, while there is one.
        self._fast: FastConnection | None = None
        self._prefetchers: list[Prefetcher] = []
        #: The receive timeout each socket has now (set only when it changes).
        self._rcvtimeo: dict = {}
        #: The nodes' layout, once asked (:meth:`layout`).
        self._layout: Layout | None = None

    # -- public API ---------------------------------------------------------------------

    def reserve(self, n: int, *, after: int | None = None) -> list[Block]:
        """Reserve ``n`` IDs: blocks, in ID order, whose counts sum to ``n``. A count that is
        not an integer is a ``TypeError``, one below 1 a ``ValueError``; a closed client refuses."""
        if self._closed:
            self._check_open()
        if self._fast is not None:
            return self._reserve_fast(n, after)
        return self._reserve(n, after=after)

    def _reserve_fast(self, n: int, after: int | None = None) -> list[Block]:
        """``reserve(n)`` while a fast connection is open, on the one-request path when
        :meth:`ClientBase._one_request` says so: one request sent at once and, when its
        answer is the whole grant, returned at once. Anything else (another answer, none
        in time, the connection closing under it) :meth:`_reserve` takes from there, as if
        its own round had sent the request; any other call goes there from the start.

        The common case of a single ID is all this does: a round (a job, its plan, its
        settling) costs about as much Python as the rest of the round trip."""
        with self._lock:
            fast = self._fast
            now = time.monotonic_ns()
            if fast is None or not self._one_request(fast, n, after, now):
                return self._reserve(n, after=after)
            core = self._core
            pending, frame = core.reserve(n, now + self._timeout_ns)
            outcome: tuple | None = None  # None: no reply in time
            try:
                fast.send(frame)
                left_ms = self._timeout_ns // 1_000_000
                while left_ms > 0:
                    body = fast.recv_within(left_ms)
                    if body is None:
                        break
                    matched = core.match(body)
                    if matched is not None and matched[0] is pending:
                        outcome = matched
                        break
                    left_ms = (pending.deadline_ns - time.monotonic_ns()) // 1_000_000
            except OSError:
                outcome = _LOST
            except BaseException:
                core.abandon((pending,))
                raise
            if outcome is not None and outcome is not _LOST:
                blocks = self._whole_grant(outcome[1], n)
                if blocks is not None:
                    return blocks
            return self._reserve(n, sent=(pending, outcome))

    def _reserve(
        self,
        n: int,
        *,
        after: int | None = None,
        chunk: int = protocol.MAX_BLOCK,
        sent: tuple[Pending, tuple | None] | None = None,
    ) -> list[Block]:
        """``reserve(n)`` in rounds (see :class:`ReserveRound`). ``sent``: the request
        :meth:`_reserve_fast` sent for all ``n`` IDs, with its reply (or ``_LOST``, or
        None for none in time)."""
        job = ReserveJob(n, window=self.window, retries=self.retries, after=after, chunk=chunk)
        with self._lock:
            round_ = ReserveRound(self, job, time.monotonic_ns())
            if sent is None and self._discover():
                round_.discovery_timed_out(time.monotonic_ns())
            self._run(round_, chunk, sent)
        return job.result()

    def ids(self, batch: int = protocol.MAX_BLOCK, prefetch: int = 64, max_age_s: float | None = 1.0) -> Iterator[int]:
        """An endless iterator of IDs that keeps blocks in hand.

        A background thread with its own socket refills the blocks. How many
        blocks it keeps adapts to the consumer, up to ``prefetch``: it doubles
        when the consumer had to wait and halves when a block grew stale. No ID
        is handed out more than ``max_age_s`` after the client asked for its
        block: checked at each ID, so also after a pause in the middle of a
        block (what went stale is dropped). ``max_age_s=None`` checks and drops
        nothing: the consumer's loop then runs over plain integer ranges, the
        fastest. The iterator is for one thread; each thread may call ``ids()``
        for its own. It stops refilling when the client is closed.
        """
        fetcher = Prefetcher(self, PrefetchDepth(batch, prefetch, max_age_s))
        self._prefetchers.append(fetcher)
        blocks = iter(fetcher.take, None)
        if max_age_s is None:
            # chain and map over iter(callable, sentinel): all in C, so each ID costs what
            # iterating a range costs; Python runs only once per block, in take().
            return itertools.chain.from_iterable(map(_ids_of, blocks))
        # One read of the monotonic clock per ID: what an exact max_age_s costs (see core.prefetch).
        clock = time.monotonic_ns
        return itertools.chain.from_iterable(fresh(ids, deadline_ns, clock) for ids, deadline_ns in blocks)

    def status(self) -> dict:
        """The broker's view of itself and its workers."""
        return self._ask_json("status")

    def layout(self) -> Layout:
        """The layout of the IDs the nodes mint (STATUS's ``layout``), asked once and kept."""
        if self._layout is None:
            self._layout = Layout.from_dict(self.status()["layout"])
        return self._layout

    def bounds(self, start, end=None, *, closed: bool = False) -> tuple[IdRange, ...]:
        """:meth:`snowfence.Layout.bounds` in the nodes' layout: per shard, the lowest and
        highest ID that can carry a time, or the range ``[start, end)`` (``closed``: end included)."""
        return self.layout().bounds(start, end, closed=closed)

    def watermark(self) -> Watermark:
        """The cluster's watermark W (:class:`~snowfence.clients.core.Watermark`): no ID
        carrying a millisecond before ``W.unix_ms`` is minted, by any node, after this call
        returns it. A pipeline that has seen every ID minted so far below ``W.lowest`` (per
        shard: ``W.ids(layout)``) may close its window there. It lags the wall clock by
        about the lease renewal interval plus the node's ``watermark_interval_s``. Raises
        ``WatermarkUnavailable`` (retriable) while the node has promised none yet."""
        return self._ask_json("watermark")

    def nodes(self) -> dict:
        """The cluster's live nodes as the broker sees them: ``{"cluster", "nodes": [...]}``."""
        return self._ask_json("nodes")

    def _ask_json(self, what: str) -> dict:
        self._check_open()
        with self._lock:
            round_ = StatusRound(self, what, time.monotonic_ns())
            if round_.discovers_first and self._discover():
                round_.on_lost(time.monotonic_ns(), how=self._timeout_note())
            while True:
                pending, frame = round_.request(time.monotonic_ns())
                try:
                    reply = self._await(pending, frame)
                except _Lost as lost:
                    self._core.abandon((pending,))
                    time.sleep(self._connection_failed(round_, lost.error, time.monotonic_ns()))
                    continue
                if reply is not None:
                    return round_.on_reply(reply)
                round_.on_lost(time.monotonic_ns(), how=self._timeout_note())

    def close(self) -> None:
        for fetcher in self._prefetchers:
            fetcher.close()
        self._prefetchers = []
        with self._lock:
            self._closed = True
            self._close_connections()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ----------------------------------------------------------------------

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._check_open()
            endpoint = self.endpoint
            self._sock, self._monitor = open_dealer(self._ctx, self.curve, endpoint)
            self._watch = self._new_link(endpoint)
            self._rcvtimeo = {}
        return self._sock

    def _drain(self) -> SnowfenceError | None:
        """Feed the monitor's events so far to the link; why the connection can carry
        nothing now (None: nothing known against it)."""
        monitor, watch = self._monitor, self._watch
        if monitor is not None:
            while _pending(monitor):
                watch.feed(*monitor_event(monitor.recv_multipart()))
            if watch.unclear:
                watch.learn_mechanism(node_mechanism(watch.endpoint, min(self.timeout_s, GREETING_TIMEOUT_S)))
        return watch.error

    def _timeout_note(self) -> str:
        self._drain()
        return self._watch.silence()

    def _send_by(self, sock: zmq.Socket, frame: bytes, deadline_ns: int) -> bool:
        """Send ``frame``, waiting for room until ``deadline_ns`` at most: False if none came
        (the request then times out as if unanswered). Raises :class:`_Lost` when the
        monitor says the connection can carry nothing (a refused handshake leaves a DEALER
        with nowhere to send)."""
        try:
            _send(sock, frame)
            return True
        except zmq.Again:
            pass
        while True:
            error = self._drain()
            if error is not None:
                raise _Lost(error)
            left_ms = (deadline_ns - time.monotonic_ns()) // 1_000_000
            if left_ms <= 0:
                return False
            ready = dict(zmq.zmq_poll([(sock, _POLLOUT), (self._monitor, _POLLIN)], left_ms))
            if ready.get(sock):
                try:
                    _send(sock, frame)
                    return True
                except zmq.Again:
                    pass

    def _check_link(self) -> None:
        """Before a send: raise :class:`_Lost` if the monitor has said since it was last read
        that the connection can carry nothing (a node that came back and refused the
        handshake, or is refusing connections). One check of the monitor when it has
        nothing new."""
        if _pending(self._monitor):
            error = self._drain()
            if error is not None:
                raise _Lost(error)

    def _recv(self, sock: zmq.Socket, timeout_ms: int) -> bytes | None:
        """The next message on ``sock`` within ``timeout_ms``, or None. Until a handshake has
        succeeded on the connection the monitor is watched too, and :class:`_Lost` raised
        as soon as it says the connection was refused; after that, a plain receive, and
        the monitor read when it ends without a message."""
        if self._watch.ready:
            body = _recv_within(sock, timeout_ms, self._rcvtimeo)
            if body is None:
                error = self._drain()
                if error is not None:
                    raise _Lost(error)
            return body
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
        monitor = self._monitor
        while True:
            error = self._drain()
            if error is not None:
                raise _Lost(error)
            left_ms = -(-(deadline_ns - time.monotonic_ns()) // 1_000_000)
            if self._watch.ready:
                return _recv_within(sock, left_ms, self._rcvtimeo) if left_ms > 0 else None
            if left_ms <= 0:
                return None
            ready = dict(zmq.zmq_poll([(sock, _POLLIN), (monitor, _POLLIN)], left_ms))
            if ready.get(sock):
                try:
                    return _recv(sock, _NOBLOCK)
                except zmq.Again:
                    pass

    def _discover(self) -> bool:
        """Ask the current broker for the cluster's nodes, when it is time to; never fails
        the call. True when the request went unanswered (the client has reset and moved
        on, as for any request): the caller counts that against its call."""
        ask = self._discovery(time.monotonic_ns())
        if ask is None:
            return False
        pending, frame = ask
        try:
            reply = self._await(pending, frame)
        except _Lost:  # the connection was refused: the call's own request learns why
            self._core.abandon((pending,))
            self._reset(rotate=False)
            return False
        self._discovered(reply)
        return reply is None

    def _fast_connection(self, n: int, chunk: int) -> FastConnection | None:
        """The connection to use for a turn of a reservation of ``n`` on the fast port,
        opened if need be; None for ZeroMQ (see :meth:`ClientBase._fast_choice`)."""
        now_ns = time.monotonic_ns()
        choice = self._fast_choice(self._fast, n, chunk, now_ns)
        if choice is None:
            return None
        if choice is KEEP:
            return self._fast
        self._close_fast()
        try:
            self._fast = FastConnection(*choice, self._fast_connect_timeout_s(), self.timeout_s)
            self._fast.endpoint = self.endpoint
        except OSError:
            self._fast_failed(now_ns)
            return None
        return self._fast

    def _fast_broke(self, round_: ReserveRound) -> None:
        """The fast connection closed or was reset under the round: ask again at once, on
        ZeroMQ while the fast port is left alone."""
        round_.connection_lost()
        self._close_fast()
        self._fast_failed(time.monotonic_ns())

    def _close_fast(self) -> None:
        if self._fast is not None:
            self._fast.close()
            self._fast = None

    def _close_connections(self) -> None:
        """Drop the socket (and any reply still on its way) and the fast connection; the
        next request reconnects."""
        self._close_fast()
        if self._sock is not None:
            self._drain()  # what the socket's monitor said, for the message of a timeout
            close_dealer(self._sock, self._monitor)
            self._sock = self._monitor = None

    def _await(self, pending: Pending, frame: bytes) -> protocol.Reply | None:
        """Send one request and wait for its reply; None (and a reset) if it timed out.
        Raises :class:`_Lost` when the connection was refused."""
        sock = self._socket()
        self._check_link()
        if not self._send_by(sock, frame, pending.deadline_ns):
            self._reset(rotate=True, now_ns=time.monotonic_ns())
            return None
        while True:
            left_ms = (pending.deadline_ns - time.monotonic_ns()) // 1_000_000
            body = self._recv(sock, left_ms) if left_ms > 0 else None
            if body is None:
                self._reset(rotate=True, now_ns=time.monotonic_ns())
                return None
            matched = self._core.match(body)
            if matched is not None and matched[0] is pending:
                return matched[1]

    def _run(
        self, round_: ReserveRound, chunk: int = protocol.MAX_BLOCK, sent: tuple[Pending, tuple | None] | None = None
    ) -> None:
        job = round_.job
        try:
            if sent is not None and self._take_over(round_, *sent):
                self._settle(round_)  # a refusal's back-off (or a timeout's reset) before asking again
            while not round_.done:
                fast = self._fast_connection(job.n, chunk)
                if fast is not None:
                    try:
                        self._turn_fast(round_, fast)
                    except OSError:
                        self._fast_broke(round_)
                        continue
                else:
                    try:
                        self._turn(round_)
                    except _Lost as lost:
                        time.sleep(self._connection_failed(round_, lost.error, time.monotonic_ns()))
                        continue
                self._settle(round_)
        except BaseException:
            round_.abandon()
            raise

    def _turn(self, round_: ReserveRound) -> None:
        """One turn of :meth:`_run` on ZeroMQ: send what is due, take what came back."""
        core, job = self._core, round_.job
        sock = self._socket()
        if _pending(self._monitor):  # _check_link, inline: once per turn of every reservation
            self._check_link()
        now = time.monotonic_ns()
        for pending, frame in round_.requests(now):
            if not self._send_by(sock, frame, pending.deadline_ns):
                break  # no room until the deadline: the requests time out, as if unanswered
        wait_ms = max(0, (round_.deadline_ns(now) - time.monotonic_ns()) // 1_000_000)
        body = self._recv(sock, wait_ms) if wait_ms else None
        if body is None and not wait_ms and _pending(sock):
            body = _recv(sock, _NOBLOCK)
        while body is not None:
            matched = core.match(body)
            if matched is not None and matched[0].job is job:
                round_.on_reply(*matched)
            body = _recv(sock, _NOBLOCK) if _pending(sock) else None

    def _settle(self, round_: ReserveRound) -> None:
        """After a wait: reset the connection and back off as :meth:`ReserveRound.settle` says."""
        now_ns = time.monotonic_ns()
        reset, sleep_s = round_.settle(now_ns)
        if reset:
            self._reset(rotate=True, now_ns=now_ns)
        if sleep_s:
            time.sleep(sleep_s)

    def _take_over(self, round_: ReserveRound, pending: Pending, outcome: tuple | None) -> bool:
        """Make the request :meth:`_reserve_fast` sent the round's own, with what came of it:
        a reply goes to the round; a closed connection asks again on ZeroMQ at once (as in
        :meth:`_run`); no reply in time leaves it waiting past its deadline. True when the
        round is to settle first (a refusal's back-off, a timeout's reset), as after any wait."""
        round_.adopt(pending)
        if outcome is _LOST:
            self._fast_broke(round_)
            return False
        if outcome is not None:
            round_.on_reply(*outcome)
        return True

    def _turn_fast(self, round_: ReserveRound, fast: FastConnection) -> None:
        """One turn of :meth:`_run` on the fast port: send what is due, take what came back."""
        core, job = self._core, round_.job
        now = time.monotonic_ns()
        for _, frame in round_.requests(now):
            fast.send(frame)
        wait_ms = max(0, (round_.deadline_ns(now) - now) // 1_000_000)
        body = fast.recv_within(wait_ms) if wait_ms else fast.recv_ready()
        while body is not None:
            matched = core.match(body)
            if matched is not None and matched[0].job is job:
                round_.on_reply(*matched)
            body = fast.recv_ready() if round_.waiting else None


class Prefetcher:
    """Blocks in hand for :meth:`Client.ids`, refilled by a background thread.

    The thread reserves through a client of its own (its own socket; ZeroMQ
    sockets are not for sharing between threads), so it never contends with
    the caller's requests. ``take`` is safe from any thread.
    """

    def __init__(self, client: Client, depth: PrefetchDepth) -> None:
        self.prefetch = Prefetch(depth)
        self._source = Client(
            client.endpoints,
            timeout_s=client.timeout_s,
            retries=client.retries,
            window=depth.depth,
            context=client._ctx,
            wait_for_server=client.wait_for_server,
            discover=client.directory.discover,
            region=client.directory.region,
            retry_for_s=client.retry_for_s,
        )
        self._source.curve = client.curve
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._refill, name="snowfence-prefetch", daemon=True)
        self._thread.start()

    def take(self) -> tuple[range, int | None]:
        """The next block's IDs and until when they may be handed out (see
        :meth:`Prefetch.take`); waits for one if none is in hand."""
        with self._cond:
            while True:
                taken = self.prefetch.take(time.monotonic_ns())
                self._cond.notify()  # room for a block, or the consumer starved: the refill goes on
                if taken is not None:
                    return taken
                self._cond.wait(1.0)

    def _refill(self) -> None:
        prefetch = self.prefetch
        try:
            while True:
                with self._cond:
                    while not prefetch.wanted() and not prefetch.closed:
                        self._cond.wait(1.0)
                    if prefetch.closed:
                        return
                    want = prefetch.wanted()
                asked_ns = time.monotonic_ns()  # before the blocks are minted: their age counts from here
                blocks = self._source._reserve(want, chunk=prefetch.depth.batch)
                with self._cond:
                    prefetch.add(blocks, asked_ns)
                    self._cond.notify_all()
        except SnowfenceError as exc:
            with self._cond:
                prefetch.error = exc
                self._cond.notify_all()
        finally:
            self._source.close()

    def close(self) -> None:
        with self._cond:
            self.prefetch.closed = True
            self._cond.notify_all()
        # A refill in flight ends by itself (reply or timeout); the thread is a
        # daemon and closes its socket on the way out.
        self._thread.join(1.0)
