"""The broker's routing decisions: no sockets, no clock of its own.

Requests from clients go to a worker in rotation, round robin, as long as the
worker has room. Room is bounded twice: at most ``worker_credits`` requests,
and at most ``worker_queue_ms`` of minting time (IDs) per worker ID the worker
holds, so a newcomer never waits behind more than about that much of someone
else's pipeline. When no worker has room, a request waits in its connection's
queue, and the connections with work waiting take turns by IDs
(:mod:`snowfence.broker.fair`). Each connection may have at most
``max_inflight_per_client`` requests accepted and unanswered; beyond that it is
answered ``overloaded`` with a hint of when to ask again.

A worker answers its WORK frames in the order it got them, so the core keeps
per worker the (connection, count, workers that refused it before) of what it
sent there, in order, and a reply or refusal ends the oldest. A refusal (fenced, clock unsafe, reservation
expired) comes back with the original request, which goes to another worker,
never back to one that refused it, before the client gets the refusal
(``MAX_TRIES`` workers at most). A refusal that is not retriable (``bad_request``:
a causal token from a shard above every worker ID of that worker) goes to every
other worker in rotation before the client gets it.

Workers report their state (the STATE frame) every heartbeat and on change; a
worker not ready, or silent for ``heartbeat_timeout_s``, is out of rotation.
All timing here is monotonic.

The sockets are the doors' (``broker/doors/``: the ZeroMQ front, the fast port, the
HTTP door); so is the framing of a client's message. Whoever drives a
:class:`Routing` (the node, a test, a simulator) gives it two send functions and a
clock::

    to_client(meta, addr, reply) -> None    one reply to a client connection
    to_worker(ident, frame) -> bool         one frame to a worker; False if its socket is gone
    clock() -> int                          monotonic ns, read where the decisions need it
    core = Routing(config, to_client, to_worker, clock=clock)

and feeds it what arrives, each call returning once its output has gone out:

``requests(batch)``, ``request(meta, addr, body)``
    client requests, each ``(meta, addr, body)`` (``meta``:
    :data:`~snowfence.protocol.META_DELIMITED` if it came after an empty
    delimiter), in the order they came; ``request`` is the batch of one. The
    one intake of every adapter (the ZeroMQ frontend passes the requests of
    one turn of its reads, the fast port those of one read, the simulator one
    at a time): it counts each request, sends a plain RESERVE to :meth:`admit`
    and the rest to :meth:`slow_request`.
``bad_request(meta, addr, err)``
    a client message that is not one request (the adapter's framing); not
    counted among the requests.
``on_worker(ident, frame)``
    one frame from a worker: REPLY, REFUSED or STATE (``protocol.encode_*``
    build them); then :meth:`schedule` once per batch of them.
``tick(now_ns)``
    heartbeats out, silent workers out of rotation, idle connections dropped.
``forget_pid(pid, why)``, ``forget(ident, why)``
    a worker process is gone.
``stop_accepting()``, ``broadcast(frame)``, ``veto``
    the node stops; or its clock must not be trusted (``veto`` set to why).
``mint_own(mint, max_ids)``
    the broker's own worker ID (``broker/own.py``) answers plain requests of
    up to ``max_ids`` IDs when ``mint(n)`` can at once; otherwise they go on.

and reads: :meth:`status` (STATUS), :attr:`heard` (for the supervisor),
:attr:`counters`, :attr:`links`, :attr:`rotation`, :attr:`fair`,
:attr:`queued_ns` (for the metrics); the ZeroMQ front asks its :attr:`gate`
(``broker/gate.py``) which requests to drop before the intake.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import __version__, latency, protocol
from ..clock import pending_verdict
from ..config import Config
from ..errors import BadRequest, ClockUnsafe, Overloaded, SnowfenceError, Unavailable, WatermarkUnavailable
from ..logs import event
from ..refusals import refusal_for
from .fair import Conn, FairQueue
from .gate import Gate

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger("snowfence.broker")

#: How many workers may refuse one request before the client gets the refusal.
MAX_TRIES = 3
#: Broker and worker time one request takes besides its minting (measured: ~20 us),
#: for the retry-after hint of ``overloaded``.
REQUEST_COST_US = 20
#: At most one log line per this long about STATE frames that could not be read.
BAD_STATE_LOG_INTERVAL_NS = 10_000_000_000
#: Bounds of that hint.
RETRY_AFTER_MIN_MS = 1
RETRY_AFTER_MAX_MS = 1000

#: Sends one reply to a client connection: ``(meta, addr, reply)``.
ToClient = Callable[[int, bytes, bytes], None]
#: Sends one frame to a worker: ``(ident, frame)``; False if its socket is gone.
ToWorker = Callable[[bytes, bytes], bool]
#: Why nothing can be placed now: the counter it is counted under, and the error.
Unplaceable = tuple[str, SnowfenceError]

_META_TRIES = protocol.META_TRIES
_META_DELIMITED = protocol.META_DELIMITED
_REPLY = protocol.REPLY
_REFUSED = protocol.REFUSED
_STATE = protocol.STATE
_split_routed = protocol.split_routed
_encode_work = protocol.encode_work
_encode_block = protocol.encode_block
_plain_reserve = protocol.plain_reserve
_AFTER_SIZE = protocol.RESERVE_AFTER_SIZE
#: The workers that refused a request no worker has refused yet.
_NONE_REFUSED: tuple[bytes, ...] = ()


def _not_retriable(error_reply: bytes) -> bool:
    """Whether a worker's refusal (an ERROR reply) is not retriable: about the request itself
    (a causal token none of that worker's worker IDs can sort after), not about the worker."""
    try:
        error = protocol.decode_reply(error_reply).error
    except BadRequest:
        return False
    return error is not None and not error.retriable


class Link:
    """The router's view of one worker process."""

    __slots__ = (
        "ident",
        "slot",
        "pid",
        "capacity",
        "id_budget",
        "ids_per_ms",
        "sent",
        "sent_ids",
        "written_off",
        "ready",
        "seen_ns",
        "status",
        "silent",
    )

    def __init__(self, ident: bytes, now_ns: int) -> None:
        self.ident = ident
        self.slot = -1
        self.pid = 0
        #: Requests that may be queued here at once.
        self.capacity = 1
        #: IDs that may be queued here at once (``worker_queue_ms`` of minting).
        self.id_budget = 1
        #: IDs this worker mints per millisecond when busy (its ready worker IDs' sequences).
        self.ids_per_ms = 0
        #: (connection, count, the workers that refused it before) of each request
        #: sent here and not yet answered, oldest first.
        self.sent: deque[tuple[bytes, int, tuple[bytes, ...]]] = deque()
        self.sent_ids = 0
        #: How many of the oldest in ``sent`` were given up on when the worker fell
        #: silent (their connections no longer count them); if it speaks again it
        #: answers them first.
        self.written_off = 0
        self.ready = False
        self.seen_ns = now_ns
        self.status = protocol.WorkerState()
        self.silent = False

    @property
    def outstanding(self) -> int:
        return len(self.sent)


class Routing:
    """Which worker gets each request, and what every client is answered.

    ``describe_broker()`` gives the broker's part of STATUS; ``live_pids`` are the
    worker processes still running (the supervisor's: a STATE a worker sent just
    before it died must not bring it back); ``metrics`` sees every STATE and every
    worker forgotten. ``wall_clock`` is read only to answer TIME and for the years left of the
    layout in STATUS."""

    def __init__(
        self,
        config: Config,
        to_client: ToClient,
        to_worker: ToWorker,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        wall_clock: Callable[[], int] = time.time_ns,
        describe_broker: Callable[[], dict] | None = None,
        live_pids: set[int] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.to_client = to_client
        self.to_worker = to_worker
        self._clock = clock
        self._wall_clock = wall_clock
        self.links: dict[bytes, Link] = {}
        self.rotation: list[Link] = []
        #: Whether any worker has been in rotation since the node started: until then a
        #: refusal says the node is starting, so a client that came too early knows to wait.
        self.ever_ready = False
        self._rr = 0
        #: Client connections seen lately; those with nothing in flight are dropped at
        #: the next heartbeat (not at once: a client with one request in flight at a
        #: time would otherwise cost a new entry per request).
        self.conns: dict[bytes, Conn] = {}
        #: Requests waiting for a worker with room, by connection.
        self.fair = FairQueue()
        #: False once a placement found no worker with room, until one answers or
        #: changes state: a saturated node does not scan its workers for every request.
        self._room = True
        self.accepting = True
        #: Set while the node must not mint at all (its clock disagrees with its peers).
        self.veto: str | None = None
        #: Why no claim may count on this node's clock (None: a majority of the cluster
        #: vouches for it): pending until its peers have been heard once, then the peers'
        #: verdict (see ``clock_verdict``); told to every worker, which claims no worker ID
        #: while it is set.
        self._verdict: str | None = pending_verdict(config)
        self._describe_broker = describe_broker or (lambda: {})
        #: The answer to NODES (the broker sets it: the cluster's membership as it sees it).
        self.describe_nodes: Callable[[], dict] = lambda: {"cluster": None, "nodes": []}
        #: The node's watermark (``broker/watermark.py``; the broker sets it): WATERMARK
        #: answers its last promise, ``promised_ms``. None: the node answers none.
        self.watermark = None
        self.live_pids = live_pids
        #: When each worker process (pid) was last heard from (monotonic ns). Written
        #: here only; the supervisor reads it (its ``tick``'s argument) to kill a
        #: worker silent for too long. An entry goes when its process is known gone.
        self.heard: dict[int, int] = {}
        self._ids_per_ms_per_worker_id = 1 << config.layout.sequence_bits
        self._queue_ms = config.worker_queue_ms
        self._heartbeat_ns = int(config.heartbeat_interval_s * 1e9)
        self._timeout_ns = int(config.heartbeat_timeout_s * 1e9)
        self._next_ping_ns = 0
        self.counters = {
            "requests": 0,
            "replies": 0,
            "retried": 0,
            "refused": 0,
            "unavailable": 0,
            "bad_request": 0,
            "overloaded": 0,
            "bad_state": 0,
            "state_unknown_keys": 0,
            "minted_here": 0,
            "ids_here": 0,
            # WATERMARK requests answered with the last promise, and with none yet.
            "watermark": 0,
            "watermark_unavailable": 0,
        }
        #: Which ZeroMQ clients' requests are dropped before the intake (revoked keys,
        #: impostors), counted in ``counters``: the ZeroMQ front asks it of each.
        self.gate = Gate(self.counters)
        self._next_bad_state_log_ns = 0
        self.max_inflight = config.max_inflight_per_client
        #: The broker's own minting (:meth:`mint_own`): plain requests of up to
        #: ``_own_max`` IDs, answered without a worker when it can.
        self._mint_own: Callable[[int], tuple[int, int] | None] | None = None
        self._own_max = 0
        self.metrics = metrics
        #: How long requests waited here for a worker with room, by kind (index: has a
        #: causal token), one observation each time one is sent to a worker.
        self.queued_ns = latency.by_kind()
        #: The bucket counts of plain requests' waits, whose first is 0 s (the intake's).
        self._waited_zero = self.queued_ns[0].counts

    # -- clients ----------------------------------------------------------------------

    def requests(self, batch: Sequence[tuple[int, bytes, bytes]]) -> None:
        """Client requests, each ``(meta, addr, body)`` as the adapter framed it, in the
        order they came: the intake every adapter calls.

        Each is counted; a plain RESERVE goes to :meth:`admit`, and one minted here
        or sent to a worker at once is counted as having waited 0 s; any other
        request goes to :meth:`slow_request`."""
        self.counters["requests"] += len(batch)
        admit = self.admit
        at_once = 0
        for meta, addr, body in batch:
            plain = _plain_reserve(body)
            if plain is None:
                self.slow_request(meta, addr, body)
            elif admit(meta, addr, body, plain[1], plain[0]):
                at_once += 1
        if at_once:
            self._waited_zero[0] += at_once

    def request(self, meta: int, addr: bytes, body: bytes) -> None:
        """One client request: :meth:`requests` of one."""
        self.requests([(meta, addr, body)])

    def bad_request(self, meta: int, addr: bytes, err: BadRequest) -> None:
        self.counters["bad_request"] += 1
        self.to_client(meta, addr, protocol.encode_error(err.request_id or 0, err))

    def slow_request(self, meta: int, addr: bytes, body: bytes) -> None:
        """Any request but a plain RESERVE: read it in full, then answer or admit it."""
        try:
            request = protocol.decode_request(body)
        except BadRequest as err:
            self.bad_request(meta, addr, err)
            return
        if request.type == protocol.STATUS:
            self.to_client(meta, addr, protocol.encode_status_reply(request.request_id, self.status()))
        elif request.type == protocol.TIME:
            now = self._wall_clock()
            self.to_client(meta, addr, protocol.encode_time_reply(request.request_id, now, self._wall_clock()))
        elif request.type == protocol.NODES:
            self.to_client(meta, addr, protocol.encode_nodes_reply(request.request_id, self.describe_nodes()))
        elif request.type == protocol.WATERMARK:
            self.to_client(meta, addr, self.watermark_reply(request.request_id))
        elif self.admit(meta, addr, body, request.count):
            self.queued_ns[request.after is not None].counts[0] += 1

    def watermark_reply(self, request_id: int) -> bytes:
        """The node's last promise (see store/watermark.py), at once: no store call."""
        promised = 0 if self.watermark is None else self.watermark.promised_ms
        if not promised:
            why = (
                "this node answers no WATERMARK (watermark_interval_s is 0, or its store cannot be opened)"
                if self.watermark is None
                else "no watermark has been promised yet: the node is starting, or its store is away"
            )
            self.counters["watermark_unavailable"] += 1
            return protocol.encode_error(request_id, WatermarkUnavailable(why))
        self.counters["watermark"] += 1
        layout = self.config.layout
        return protocol.encode_watermark_reply(request_id, promised + layout.epoch_ms, promised << layout.time_shift)

    def mint_own(self, mint: Callable[[int], tuple[int, int] | None], max_ids: int) -> None:
        """Let the broker answer plain requests of up to ``max_ids`` IDs itself: ``mint(n)``
        returns ``(first, count)`` minted at once, or None (never waiting), and the
        request then goes to a worker as any other."""
        self._mint_own = mint
        self._own_max = max_ids if mint is not None else 0

    def admit(self, meta: int, addr: bytes, body: bytes, count: int, request_id: int | None = None) -> bool:
        """Take a new RESERVE of ``count`` IDs and decide where it goes.

        This is the one place a request's destination is decided: ``overloaded``
        at once, the broker's own minter (a plain request, ``request_id`` given, of
        up to ``broker_mint_max_ids``; see :meth:`mint_own`), a worker now, or its
        connection's queue (from which :meth:`schedule` places it, or
        :meth:`refuse_waiting` answers it). A request with a causal token or other
        options (``request_id`` None) always goes to a worker.

        True if it was minted here or went to a worker at once; the caller counts
        it as having waited 0 s, so that the common case reads no clock."""
        conn = self.conns.get(addr)
        if conn is None:
            conn = self.conns[addr] = Conn(addr)
        elif conn.inflight >= self.max_inflight:
            self.overloaded(meta, addr, body, conn)
            return False
        if request_id is not None and count <= self._own_max and self.veto is None and self.accepting:
            minted = self._mint_own(count)
            if minted is not None:
                first, got = minted
                counters = self.counters
                counters["minted_here"] += 1
                counters["ids_here"] += got
                self.to_client(meta, addr, _encode_block(request_id, first, got))
                return True
        conn.inflight += 1
        conn.ids += count
        if not self.fair and self.veto is None and self.accepting:
            link = self.pick(count)
            if link is not None and self.send_work(link, meta, addr, body, count):
                return True
        self.place_or_queue(conn, meta, body, count)
        return False

    def place_or_queue(
        self,
        conn: Conn,
        meta: int,
        body: bytes,
        count: int,
        refusers: tuple[bytes, ...] = _NONE_REFUSED,
        refusal: bytes = b"",
    ) -> None:
        """Queue an accepted request, then let the fair queue place what it can; or
        answer it at once, if no request can be placed now (:meth:`unplaceable`).

        A retry (``refusers``: the workers that refused it; ``refusal``: the error
        reply of the last one) goes to the front of its connection's queue."""
        why = self.unplaceable()
        if why is not None:
            self.refuse(meta, conn.addr, body, count, why)
            return
        self.fair.push(conn, (meta, body, count, self._clock(), refusers, refusal), front=bool(refusers))
        if self._room:
            self.schedule()

    def unplaceable(self) -> Unplaceable | None:
        """Why no request can go to a worker, nor wait for one, now: the counter its
        refusal counts under and the error it is answered with; None while
        requests may wait for room.

        The one rule for a new request, a retry and the requests already waiting."""
        if not self.accepting:
            return "unavailable", Unavailable("the server is shutting down")
        if self.veto is not None:
            return "refused", ClockUnsafe(self.veto)
        if not self.rotation:
            return "unavailable", self.why_none_ready()
        return None

    def refuse(self, meta: int, addr: bytes, body: bytes, count: int, why: Unplaceable) -> None:
        """Answer an accepted request with the error of ``why``, without a worker."""
        counter, err = why
        self.counters[counter] += 1
        self.to_client(meta, addr, protocol.encode_error(protocol.request_id_of(body), err))
        self.done(addr, count)

    def schedule(self) -> None:
        """Place waiting requests at workers with room, connections taking turns by IDs."""
        if not self.fair:
            return
        why = self.unplaceable()
        if why is not None:
            self.refuse_waiting(why)
            return
        self.fair.serve(self._place)

    def _place(
        self,
        conn: Conn,
        meta: int,
        body: bytes,
        count: int,
        queued_ns: int,
        refusers: tuple[bytes, ...],
        refusal: bytes,
    ) -> bool:
        while True:
            link = self.pick(count, refusers)
            if link is None:
                if refusers and not self._another_worker(refusers):
                    # Every worker in rotation refused it while it waited: the last refusal stands.
                    self.counters["bad_request" if _not_retriable(refusal) else "refused"] += 1
                    self.to_client(meta, conn.addr, refusal)
                    self.done(conn.addr, count)
                    return True
                # Until a worker answers or changes state. A retry that waits for a
                # worker other than its refusers holds up the connections behind it
                # as long, even if a refuser has room.
                self._room = False
                return False
            if self.send_work(link, meta, conn.addr, body, count, refusers):
                # Only a RESERVE with a causal token has the longer body.
                self.queued_ns[len(body) == _AFTER_SIZE].observe(self._clock() - queued_ns)
                return True

    def refuse_waiting(self, why: Unplaceable) -> None:
        """No request can be placed now: answer every waiting one, so its client tries elsewhere."""
        for conn, meta, body, count, *_ in self.fair.drain():
            self.refuse(meta, conn.addr, body, count, why)

    def pick(self, count: int, refusers: tuple[bytes, ...] = _NONE_REFUSED) -> Link | None:
        """The next worker in rotation with room for ``count`` more IDs, round robin,
        other than the ``refusers`` of a retry.

        A worker with nothing queued always has room, whatever the budget."""
        rotation = self.rotation
        n = len(rotation)
        for _ in range(n):
            self._rr += 1
            if self._rr >= n:
                self._rr = 0
            link = rotation[self._rr]
            if (
                len(link.sent) < link.capacity
                and (not link.sent_ids or link.sent_ids + count <= link.id_budget)
                and not (refusers and link.ident in refusers)
            ):
                return link
        return None

    def _another_worker(self, refusers: tuple[bytes, ...]) -> bool:
        """Whether a worker in rotation has not refused this request yet."""
        return any(link.ident not in refusers for link in self.rotation)

    def send_work(
        self,
        link: Link,
        meta: int,
        addr: bytes,
        body: bytes,
        count: int,
        refusers: tuple[bytes, ...] = _NONE_REFUSED,
    ) -> bool:
        """Send a request to ``link``; False (and the link forgotten) if its socket is gone."""
        if not self.to_worker(link.ident, _encode_work(meta, addr, body)):
            self.forget(link.ident, "its socket is gone")
            return False
        link.sent.append((addr, count, refusers))
        link.sent_ids += count
        return True

    def done(self, addr: bytes, count: int) -> None:
        """A request of ``addr`` for ``count`` IDs got its final answer."""
        conn = self.conns.get(addr)
        if conn is None:
            return
        conn.inflight -= 1
        conn.ids -= count

    def overloaded(self, meta: int, addr: bytes, body: bytes, conn: Conn) -> None:
        self.counters["overloaded"] += 1
        err = Overloaded(f"more than {self.max_inflight} requests in flight on this connection")
        err.retry_after_ms = self.retry_after_ms(conn)
        self.to_client(meta, addr, protocol.encode_error(protocol.request_id_of(body), err))

    def retry_after_ms(self, conn: Conn) -> int:
        """About when ``conn`` will have room again: the time to serve what it has in
        flight at its share of the node (the node split between the connections
        with work in flight), by IDs or by requests, whichever is longer."""
        ids_per_ms = sum(link.ids_per_ms for link in self.rotation) or self._ids_per_ms_per_worker_id
        workers = max(1, len(self.rotation))
        sharers = max(1, self.active_connections())
        by_ids = conn.ids * sharers / ids_per_ms
        by_requests = conn.inflight * sharers * REQUEST_COST_US / 1000 / workers
        return min(RETRY_AFTER_MAX_MS, max(RETRY_AFTER_MIN_MS, math.ceil(max(by_ids, by_requests))))

    def active_connections(self) -> int:
        """Connections with requests accepted and not yet answered."""
        return sum(1 for conn in self.conns.values() if conn.inflight > 0)

    def readiness(self) -> tuple[bool, str]:
        """What /readyz says: ready while a worker is in rotation, the node takes requests and
        its clock is not refused; otherwise why not (the veto, or why no worker is ready)."""
        if self.rotation and self.accepting and self.veto is None:
            return True, "ready"
        if self.veto:
            return False, self.veto
        why = self.why_none_ready()
        code = getattr(why, "code", None)
        return False, f"{code}: {why}" if code else str(why)

    def why_none_ready(self) -> SnowfenceError:
        """The most telling reason no worker is in rotation, as the error to answer with."""
        error = refusal_for(
            (h.state for link in self.links.values() for h in link.status.held),
            (link.status.reason for link in self.links.values()),
        )
        if not self.ever_ready:
            return type(error)(f"the node is starting: {error}")
        return error

    # -- workers ----------------------------------------------------------------------

    def on_worker(self, ident: bytes, frame: bytes) -> None:
        """One frame from the worker whose socket is ``ident``: a REPLY, a REFUSED or
        a STATE (anything else is ignored). Call :meth:`schedule` after a batch of
        them: a reply makes room for what waits."""
        kind = frame[0] if frame else 0
        link = self.links.get(ident)
        if kind == _REPLY:
            meta, addr, reply = _split_routed(frame)
            self.counters["replies"] += 1
            self.to_client(meta, addr, reply)
            sent = self._answered(link, addr)
            if sent is not None:
                conn = self.conns.get(addr)  # done(), inlined: this is the hot path
                if conn is not None:
                    conn.inflight -= 1
                    conn.ids -= sent[1]
        elif kind == _REFUSED:
            meta, addr, rest = _split_routed(frame)
            self.on_refused(ident, meta, addr, rest, self._answered(link, addr))
        elif kind == _STATE:
            self.on_state(ident, link, frame)

    def _answered(self, link: Link | None, addr: bytes) -> tuple[bytes, int, tuple[bytes, ...]] | None:
        """The worker answered its oldest request: free its room. What was sent
        (connection, count, refusers), or None if it was already written off (the
        worker had fallen silent, or was forgotten)."""
        if link is None or not link.sent:
            return None
        sent = link.sent.popleft()
        link.sent_ids -= sent[1]
        self._room = True
        if link.written_off:
            link.written_off -= 1
            return None
        if sent[0] != addr:
            # Not the answer to the oldest request: one sent before this link was
            # made (a worker forgotten and heard again). Already written off.
            link.sent.appendleft(sent)
            link.sent_ids += sent[1]
            return None
        return sent

    def on_refused(
        self, ident: bytes, meta: int, addr: bytes, rest: bytes, sent: tuple[bytes, int, tuple[bytes, ...]] | None
    ) -> None:
        """Worker ``ident`` refused a request (``sent``: what it was, None if written
        off): another worker that has not refused it gets it, or the client gets
        the refusal.

        A refusal that is not retriable is about the request, not the worker: none of
        its worker IDs can honour the request's causal token (a token from a shard above
        theirs). It stays in rotation, and the request goes to every other worker in
        rotation in turn, not counted among the ``MAX_TRIES``, so that whether a token is
        honoured never depends on which worker took it first."""
        request, error_reply = protocol.split_refused(rest)
        elsewhere = _not_retriable(error_reply)
        tries = (meta & _META_TRIES) + (not elsewhere)
        if sent is not None:
            count = sent[1]
            refusers = (*sent[2], ident)
            conn = self.conns.get(addr)
            if (
                conn is not None
                and self.accepting
                and (elsewhere or tries < MAX_TRIES)
                and self._another_worker(refusers)
            ):
                self.counters["retried"] += 1
                self.place_or_queue(conn, (meta & _META_DELIMITED) | tries, request, count, refusers, error_reply)
                return
        self.counters["bad_request" if elsewhere else "refused"] += 1
        self.to_client(meta, addr, error_reply)
        if sent is not None:
            self.done(addr, sent[1])

    def on_state(self, ident: bytes, link: Link | None, frame: bytes) -> None:
        try:
            state = protocol.decode_state(frame)
        except protocol.BadState as exc:
            # Only our own workers reach the backend: a bad STATE is a bug or a
            # version mix. The worker keeps its previous state (or stays unknown).
            self._bad_state("bad_state", link, f"ignored a STATE: {exc}")
            return
        if state.unknown:
            # A worker of another version (a package upgraded under a running broker):
            # what this version knows of its STATE is used, the rest named.
            self._bad_state(
                "state_unknown_keys", link, f"a STATE has keys this version does not know: {', '.join(state.unknown)}"
            )
        now_ns = self._clock()
        if link is None:
            if self.live_pids is not None and state.pid not in self.live_pids:
                return
            link = self.links[ident] = Link(ident, now_ns)
            event(
                log,
                "worker_connected",
                f"worker slot {state.slot} pid {state.pid} connected",
                slot=state.slot,
                pid=state.pid,
            )
            self.send_worker(ident, protocol.encode_clock(self._verdict))
            if self.links.get(ident) is not link:
                return  # its socket is gone (a last STATE read after its process died): forgotten
        link.seen_ns = now_ns
        link.status = state
        if self.metrics is not None:
            self.metrics.observe(ident, state)
        link.slot = state.slot
        link.pid = state.pid
        self.heard[link.pid] = now_ns
        link.capacity = max(1, state.credits)
        link.ids_per_ms = max(1, state.ready_ids) * self._ids_per_ms_per_worker_id
        link.id_budget = max(1, int(link.ids_per_ms * self._queue_ms))
        if link.silent:
            link.silent = False
            event(log, "worker_heard", f"worker slot {link.slot} pid {link.pid} is heard from again", slot=link.slot)
        self._set_ready(link, state.ready)
        self._room = True
        if self.fair:
            self.schedule()

    def _bad_state(self, counter: str, link: Link | None, what: str) -> None:
        """Count a STATE that was not as this version writes it; log it at most every 10 s."""
        self.counters[counter] += 1
        now_ns = self._clock()
        if now_ns >= self._next_bad_state_log_ns:
            self._next_bad_state_log_ns = now_ns + BAD_STATE_LOG_INTERVAL_NS
            who = f"worker slot {link.slot} pid {link.pid}" if link is not None else "an unknown worker"
            event(log, counter, f"{who}: {what}", level=logging.WARNING)

    def _set_ready(self, link: Link, ready: bool) -> None:
        ready = ready and not link.silent
        if ready == link.ready:
            return
        link.ready = ready
        if ready:
            self.rotation.append(link)
            self.ever_ready = True
        else:
            self.rotation.remove(link)
        event(
            log,
            "rotation",
            f"worker slot {link.slot} pid {link.pid} {'joins' if ready else 'leaves'} rotation",
            slot=link.slot,
            pid=link.pid,
            in_rotation=ready,
            workers_in_rotation=len(self.rotation),
        )

    def forget(self, ident: bytes, why: str) -> None:
        """Drop the link of worker ``ident``; what it had queued is lost to its clients' retries."""
        link = self.links.pop(ident, None)
        if link is None:
            return
        if self.metrics is not None:
            self.metrics.forget(ident)
        self._lose_requests(link)
        if link.ready:
            link.ready = False
            self.rotation.remove(link)
        event(
            log,
            "worker_forgotten",
            f"worker slot {link.slot} pid {link.pid} removed: {why}",
            slot=link.slot,
            pid=link.pid,
        )

    def _lose_requests(self, link: Link) -> None:
        """Whatever ``link`` had queued is lost to its clients' retries: it no longer
        counts against their in-flight limits."""
        for addr, count, _ in list(link.sent)[link.written_off :]:
            self.done(addr, count)
        link.written_off = len(link.sent)

    def forget_pid(self, pid: int, why: str) -> None:
        """Worker process ``pid`` is gone (the supervisor reaped it)."""
        self.heard.pop(pid, None)
        for ident, link in list(self.links.items()):
            if link.pid == pid:
                self.forget(ident, why)

    def tick(self, now_ns: int) -> None:
        """Heartbeats out; silent workers out of rotation."""
        if now_ns < self._next_ping_ns:
            return
        if now_ns - self._next_ping_ns > self._timeout_ns:
            # The broker itself was paused; its workers' silence is its own.
            for link in self.links.values():
                link.seen_ns = max(link.seen_ns, now_ns - self._heartbeat_ns)
        self._next_ping_ns = now_ns + self._heartbeat_ns
        self.conns = {a: c for a, c in self.conns.items() if c.inflight > 0 or c.queue or c.listed}
        for ident, link in list(self.links.items()):
            if (
                link.silent
                and now_ns - link.seen_ns > 3 * self._timeout_ns
                and (self.live_pids is None or link.pid not in self.live_pids)
            ):
                # Its process is gone (or unknown to us). One still running keeps its
                # link, with the requests it owes in order, until the supervisor
                # kills it: if it speaks again, its answers must match.
                self.heard.pop(link.pid, None)
                self.forget(ident, "silent for too long")
                continue
            if not link.silent and now_ns - link.seen_ns > self._timeout_ns:
                link.silent = True
                event(
                    log,
                    "worker_silent",
                    f"worker slot {link.slot} pid {link.pid} is silent; out of rotation",
                    level=logging.WARNING,
                    slot=link.slot,
                    pid=link.pid,
                )
                self._set_ready(link, False)
                self._lose_requests(link)
            self.send_worker(ident, protocol.PING_FRAME)
        if self.fair:
            self.schedule()

    def send_worker(self, ident: bytes, frame: bytes) -> None:
        """A control frame to a worker; one whose socket is gone is forgotten."""
        if not self.to_worker(ident, frame):
            self.forget(ident, "its socket is gone")

    def stop_accepting(self) -> None:
        """Answer new and waiting requests with ``unavailable`` from now on."""
        self.accepting = False
        self.schedule()  # which now answers whatever waits

    @property
    def clock_verdict(self) -> str | None:
        return self._verdict

    @clock_verdict.setter
    def clock_verdict(self, why: str | None) -> None:
        """Why no claim may count on this node's clock (None: they may). Its workers are
        told on every change, and each new one when it connects."""
        if why != self._verdict:
            self._verdict = why
            self.broadcast(protocol.encode_clock(why))

    def broadcast(self, frame: bytes) -> None:
        for ident in list(self.links):
            self.send_worker(ident, frame)

    # -- status -----------------------------------------------------------------------

    def status(self) -> dict:
        workers = []
        for link in sorted(self.links.values(), key=lambda link: (link.slot, link.pid)):
            st = link.status
            base = {
                "slot": link.slot,
                "pid": link.pid,
                "in_rotation": link.ready,
                "silent": link.silent,
                "outstanding": link.outstanding,
                "reason": st.reason,
                "counters": st.counters,
                "passed_over": st.passed_over,
                "store_problem": st.store_problem,
            }
            if not st.held:
                workers.append({"worker_id": None, "state": "silent" if link.silent else st.state, **base})
            for h in st.held:
                workers.append({**h.to_dict(), "state": "silent" if link.silent else h.state, **base})
        return {
            "version": protocol.VERSION,
            "software_version": __version__,
            "broker": {
                **self._describe_broker(),
                "counters": self.counters,
                "workers_in_rotation": len(self.rotation),
                "connections": self.active_connections(),
                "waiting": len(self.fair),
            },
            "layout": self.config.layout.to_dict(),
            "layout_end": self.config.layout.lifetime(self._wall_clock() // 1_000_000),
            "region": self.config.region,
            "workers": workers,
        }
