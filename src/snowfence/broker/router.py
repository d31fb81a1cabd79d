"""The broker's ROUTER loop: clients in front, workers behind.

Requests from the frontend go to a worker in rotation, round robin, as long as
the worker has room. Room is bounded twice: at most ``worker_credits``
requests, and at most ``worker_queue_ms`` of minting time (IDs) per worker ID
the worker holds, so a newcomer never waits behind more than about that much
of someone else's pipeline. When no worker has room, a request waits in its
connection's queue, and the connections with work waiting take turns by IDs
(:mod:`snowfence.broker.fair`). Each connection may have at most
``max_inflight_per_client`` requests accepted and unanswered; beyond that it is
answered ``overloaded`` with a hint of when to ask again.

A worker answers its WORK frames in the order it got them, so the router keeps
per worker the (connection, count) of what it sent there, in order, and a
reply or refusal ends the oldest. A refusal (fenced, clock unsafe, reservation
expired) comes back with the original request, which the router sends to
another worker before it answers with the error.

Workers report their state (the STATE frame) every heartbeat and on change; a
worker not ready, or silent for ``heartbeat_timeout_s``, is out of rotation.
All timing here is monotonic.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable

import zmq
import zmq.backend

from .. import __version__, latency, protocol
from ..config import Config
from ..errors import BadRequest, ClockUnsafe, ConfigError, Overloaded, SnowfenceError, Unavailable
from ..logs import event
from ..refusals import refusal_for
from .auth import CurveServer
from .fair import Conn, FairQueue
from .metrics import Metrics

log = logging.getLogger("snowfence.broker")

#: Messages taken from one socket per wake-up before the other gets a turn.
BATCH = 256
#: Frames larger than this are dropped by libzmq before they reach Python.
MAX_FRAME_BYTES = 64 * 1024
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

_META_TRIES = protocol.META_TRIES
_META_DELIMITED = protocol.META_DELIMITED

# The hot path calls libzmq through pyzmq's Cython socket methods directly: the
# Python-level wrappers of zmq.Socket roughly double the cost of a send or recv
# (0.61 against 0.29 us for one send+recv pair, measured on this design's
# machine), and reading RCVMORE as a socket option costs 0.9-2 us where a
# zero-copy Frame's ``more`` costs about 0.5 us.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_REPLY = protocol.REPLY
_REFUSED = protocol.REFUSED
_STATE = protocol.STATE
_split_routed = protocol.split_routed
_encode_work = protocol.encode_work
_plain_reserve = protocol.plain_reserve
_AFTER_SIZE = protocol.RESERVE_AFTER_SIZE
_mono = time.monotonic_ns


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
        #: (connection, count) of each request sent here and not yet answered, oldest first.
        self.sent: deque[tuple[bytes, int]] = deque()
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


class Router:
    def __init__(
        self,
        ctx: zmq.Context,
        config: Config,
        backend_endpoint: str,
        describe_broker: Callable[[], dict] | None = None,
        live_pids: set[int] | None = None,
        metrics: Metrics | None = None,
        heard: dict[int, int] | None = None,
        curve: CurveServer | None = None,
    ) -> None:
        self.config = config
        self.frontend = ctx.socket(zmq.ROUTER)
        self.backend = ctx.socket(zmq.ROUTER)
        #: The socket file of an ipc:// frontend: libzmq leaves it behind, close() removes it.
        self._ipc_path: str | None = None
        try:
            self._setup_sockets(config, backend_endpoint, curve)
        except BaseException:
            # An open socket would keep ctx.term() waiting forever: close both first.
            self.close()
            raise
        self._init_state(config, describe_broker, live_pids, metrics, heard)

    def _setup_sockets(self, config: Config, backend_endpoint: str, curve: CurveServer | None) -> None:
        if curve is not None:
            curve.serve_on(self.frontend)
        elif config.curve_secret_key:
            raise ValueError("curve_secret_key is set: the router needs the CurveServer that read it")
        self.frontend.setsockopt(zmq.LINGER, 500)
        self.frontend.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.frontend.setsockopt(zmq.SNDHWM, 100_000)
        self.frontend.setsockopt(zmq.RCVHWM, 100_000)
        self.backend.setsockopt(zmq.LINGER, 0)
        self.backend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.backend.setsockopt(zmq.SNDHWM, 0)
        self.backend.setsockopt(zmq.RCVHWM, 0)
        self.backend.bind(backend_endpoint)
        try:
            self.frontend.bind(config.bind)
        except zmq.ZMQError as exc:
            raise ConfigError(f"cannot bind {config.bind}: {zmq.strerror(exc.errno)}") from None
        bound = self.endpoint()
        if bound.startswith("ipc://") and not bound.startswith("ipc://@"):  # @: abstract, no file
            self._ipc_path = bound.removeprefix("ipc://")

    def _init_state(self, config: Config, describe_broker, live_pids, metrics, heard) -> None:
        self.links: dict[bytes, Link] = {}
        self.rotation: list[Link] = []
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
        self._describe_broker = describe_broker or (lambda: {})
        #: The answer to NODES (the broker sets it: the cluster's membership as it sees it).
        self.describe_nodes: Callable[[], dict] = lambda: {"cluster": None, "nodes": []}
        #: Worker processes still running (kept by the supervisor). A STATE frame a
        #: worker sent just before it died can arrive after it was reaped; it must not
        #: bring the dead worker back.
        self.live_pids = live_pids
        #: When each worker process (pid) was last heard from (monotonic ns), for the supervisor.
        self.heard = heard if heard is not None else {}
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
        }
        self._next_bad_state_log_ns = 0
        self.max_inflight = config.max_inflight_per_client
        self.metrics = metrics
        #: How long requests waited here for a worker with room, by kind (index: has a
        #: causal token), one observation each time one is sent to a worker.
        self.queued_ns = latency.by_kind()

    def endpoint(self) -> str:
        return self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- clients ----------------------------------------------------------------------

    def on_frontend(self) -> None:
        front = self.frontend
        counters = self.counters
        # Plain RESERVEs sent to a worker at once: they waited 0 s, counted after the batch.
        at_once = 0
        for _ in range(BATCH):
            try:
                addr = _recv(front, _NOBLOCK)
            except zmq.Again:
                break
            # A ROUTER always delivers at least one frame after the identity.
            frame = _recv(front, 0, False)
            body = frame.bytes
            meta = 0
            if frame.more and not body:
                frame = _recv(front, 0, False)
                body = frame.bytes
                meta = _META_DELIMITED
            if frame.more:
                while _recv(front, 0, False).more:
                    pass
                counters["bad_request"] += 1
                self.to_client(
                    meta,
                    addr,
                    protocol.encode_error(
                        0, BadRequest("a request is one body frame, optionally after one empty delimiter")
                    ),
                )
                continue
            counters["requests"] += 1
            plain = _plain_reserve(body)
            if plain is not None:
                if self.admit(meta, addr, body, plain[1]):
                    at_once += 1
            else:
                self.slow_request(meta, addr, body)
        if at_once:
            self.queued_ns[0].counts[0] += at_once

    def slow_request(self, meta: int, addr: bytes, body: bytes) -> None:
        try:
            request = protocol.decode_request(body)
        except BadRequest as err:
            self.counters["bad_request"] += 1
            self.to_client(meta, addr, protocol.encode_error(err.request_id, err))
            return
        if request.type == protocol.STATUS:
            self.to_client(meta, addr, protocol.encode_status_reply(request.request_id, self.status()))
        elif request.type == protocol.TIME:
            now = time.time_ns()
            self.to_client(meta, addr, protocol.encode_time_reply(request.request_id, now, time.time_ns()))
        elif request.type == protocol.NODES:
            self.to_client(meta, addr, protocol.encode_nodes_reply(request.request_id, self.describe_nodes()))
        elif self.admit(meta, addr, body, request.count):
            self.queued_ns[request.after is not None].counts[0] += 1

    def admit(self, meta: int, addr: bytes, body: bytes, count: int) -> bool:
        """Take a new RESERVE of ``count`` IDs: to a worker now, or into its connection's queue.

        True if it went to a worker at once; the caller counts it as having waited
        0 s, so that the common case reads no clock."""
        conn = self.conns.get(addr)
        if conn is None:
            conn = self.conns[addr] = Conn(addr)
        elif conn.inflight >= self.max_inflight:
            self.overloaded(meta, addr, body, conn)
            return False
        conn.inflight += 1
        conn.ids += count
        if not self.fair and self.veto is None and self.accepting:
            link = self.pick(count)
            if link is not None and self.send_work(link, meta, addr, body, count):
                return True
        self.place_or_queue(conn, meta, body, count)
        return False

    def place_or_queue(self, conn: Conn, meta: int, body: bytes, count: int, retry: bool = False) -> None:
        """Queue an accepted request, then let the fair queue place what it can."""
        if not self.accepting:
            self.answer_now(meta, conn.addr, body, count, Unavailable("the server is shutting down"))
        elif self.veto is not None:
            self.counters["refused"] += 1
            self.answer_now(meta, conn.addr, body, count, ClockUnsafe(self.veto))
        elif not self.rotation:
            self.counters["unavailable"] += 1
            self.answer_now(meta, conn.addr, body, count, self.why_none_ready())
        else:
            self.fair.push(conn, (meta, body, count, _mono()), front=retry)
            if self._room:
                self.schedule()

    def schedule(self) -> None:
        """Place waiting requests at workers with room, connections taking turns by IDs."""
        if not self.fair:
            return
        if not self.rotation or self.veto is not None or not self.accepting:
            self.refuse_waiting()
            return
        self.fair.serve(self._place)

    def _place(self, conn: Conn, meta: int, body: bytes, count: int, queued_ns: int) -> bool:
        while True:
            link = self.pick(count)
            if link is None:
                self._room = False  # until a worker answers or changes state
                return False
            if self.send_work(link, meta, conn.addr, body, count):
                # Only a RESERVE with a causal token has the longer body.
                self.queued_ns[len(body) == _AFTER_SIZE].observe(_mono() - queued_ns)
                return True

    def refuse_waiting(self) -> None:
        """No request can be placed now: answer every waiting one, so its client tries elsewhere."""
        for conn, meta, body, count, _ in self.fair.drain():
            if not self.accepting:
                self.counters["unavailable"] += 1
                err: SnowfenceError = Unavailable("the server is shutting down")
            elif self.veto is not None:
                self.counters["refused"] += 1
                err = ClockUnsafe(self.veto)
            else:
                self.counters["unavailable"] += 1
                err = self.why_none_ready()
            self.answer_now(meta, conn.addr, body, count, err)

    def send_work(self, link: Link, meta: int, addr: bytes, body: bytes, count: int) -> bool:
        """Send a request to ``link``; False (and the link forgotten) if its socket is gone."""
        try:
            _send(self.backend, link.ident, _SNDMORE)
            _send(self.backend, _encode_work(meta, addr, body))
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.forget(link.ident, "its socket is gone")
            return False
        link.sent.append((addr, count))
        link.sent_ids += count
        return True

    def answer_now(self, meta: int, addr: bytes, body: bytes, count: int, err: SnowfenceError) -> None:
        """Answer an accepted request with an error, without a worker."""
        self.to_client(meta, addr, protocol.encode_error(protocol.request_id_of(body), err))
        self.done(addr, count)

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

    def pick(self, count: int) -> Link | None:
        """The next worker in rotation with room for ``count`` more IDs, round robin.

        A worker with nothing queued always has room, whatever the budget."""
        rotation = self.rotation
        n = len(rotation)
        for _ in range(n):
            self._rr += 1
            if self._rr >= n:
                self._rr = 0
            link = rotation[self._rr]
            if len(link.sent) < link.capacity and (not link.sent_ids or link.sent_ids + count <= link.id_budget):
                return link
        return None

    def why_none_ready(self) -> SnowfenceError:
        """The most telling reason no worker is in rotation, as the error to answer with."""
        return refusal_for(
            (h.state for link in self.links.values() for h in link.status.held),
            (link.status.reason for link in self.links.values()),
        )

    def to_client(self, meta: int, addr: bytes, reply: bytes) -> None:
        front = self.frontend
        _send(front, addr, _SNDMORE)
        if meta & _META_DELIMITED:
            _send(front, b"", _SNDMORE)
        _send(front, reply)

    # -- workers ----------------------------------------------------------------------

    def on_backend(self) -> None:
        back = self.backend
        links = self.links
        counters = self.counters
        to_client = self.to_client
        for _ in range(BATCH):
            try:
                ident = _recv(back, _NOBLOCK)
            except zmq.Again:
                break
            # Only our own workers reach this private ipc endpoint, and they send
            # exactly one frame after the identity.
            frame = _recv(back)
            kind = frame[0] if frame else 0
            link = links.get(ident)
            if kind == _REPLY:
                meta, addr, reply = _split_routed(frame)
                counters["replies"] += 1
                to_client(meta, addr, reply)
                count = self._answered(link, addr)
                if count:
                    self.done(addr, count)
            elif kind == _REFUSED:
                meta, addr, rest = _split_routed(frame)
                self.on_refused(meta, addr, rest, self._answered(link, addr))
            elif kind == _STATE:
                self.on_state(ident, link, frame)
        if self.fair:
            self.schedule()

    def _answered(self, link: Link | None, addr: bytes) -> int:
        """The worker answered its oldest request: free its room. The count that
        request asked for, or 0 if it was already written off (the worker had
        fallen silent, or was forgotten)."""
        if link is None or not link.sent:
            return 0
        sent_to, count = link.sent.popleft()
        link.sent_ids -= count
        self._room = True
        if link.written_off:
            link.written_off -= 1
            return 0
        if sent_to != addr:
            # Not the answer to the oldest request: one sent before this link was
            # made (a worker forgotten and heard again). Already written off.
            link.sent.appendleft((sent_to, count))
            link.sent_ids += count
            return 0
        return count

    def on_refused(self, meta: int, addr: bytes, rest: bytes, count: int) -> None:
        request, error_reply = protocol.split_refused(rest)
        tries = (meta & _META_TRIES) + 1
        conn = self.conns.get(addr) if count else None
        if conn is not None and self.accepting and tries < MAX_TRIES and self.rotation:
            self.counters["retried"] += 1
            self.place_or_queue(conn, (meta & _META_DELIMITED) | tries, request, count, retry=True)
        else:
            self.counters["refused"] += 1
            self.to_client(meta, addr, error_reply)
            if count:
                self.done(addr, count)

    def on_state(self, ident: bytes, link: Link | None, frame: bytes) -> None:
        try:
            state = protocol.decode_state(frame)
        except protocol.BadState as exc:
            # Only our own workers reach the backend: a bad STATE is a bug or a
            # version mix. The worker keeps its previous state (or stays unknown).
            self.counters["bad_state"] += 1
            now_ns = time.monotonic_ns()
            if now_ns >= self._next_bad_state_log_ns:
                self._next_bad_state_log_ns = now_ns + BAD_STATE_LOG_INTERVAL_NS
                who = f"worker slot {link.slot} pid {link.pid}" if link is not None else "an unknown worker"
                event(log, "bad_state", f"ignored a STATE from {who}: {exc}", level=logging.WARNING)
            return
        now_ns = time.monotonic_ns()
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

    def _set_ready(self, link: Link, ready: bool) -> None:
        ready = ready and not link.silent
        if ready == link.ready:
            return
        link.ready = ready
        if ready:
            self.rotation.append(link)
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
        for addr, count in list(link.sent)[link.written_off :]:
            self.done(addr, count)
        link.written_off = len(link.sent)

    def forget_pid(self, pid: int, why: str) -> None:
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
        try:
            self.backend.send(ident, zmq.SNDMORE | zmq.NOBLOCK)
            self.backend.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            self.forget(ident, "its socket is gone")

    def stop_accepting(self) -> None:
        """Answer new and waiting requests with ``unavailable`` from now on."""
        self.accepting = False
        self.refuse_waiting()

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
            "region": self.config.region,
            "workers": workers,
        }

    def close(self) -> None:
        self.frontend.close()
        self.backend.close()
        if self._ipc_path is not None:
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass
            self._ipc_path = None
