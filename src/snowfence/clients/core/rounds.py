"""Rounds: how a reservation is split, what a partial grant means, which errors are
retried and after what back-off, when a timeout gives up and when the connection is
reset (:class:`ReserveJob`, :class:`ReserveRound`); how often STATUS (or NODES) is asked
again (:class:`StatusRound`)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from ... import protocol
from ...errors import BadRequest, Overloaded, SnowfenceError
from .blocks import Block, Watermark, check_after, check_count
from .client import DEFAULT_RETRIES, DEFAULT_WINDOW, ClientBase
from .inflight import Pending

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
#: A job's retries while a time budget (``retry_for_s``) decides instead of a count.
_UNCOUNTED = 1 << 62


@dataclass
class ReserveJob:
    """The plan for ``reserve(n)``: split into requests of at most MAX_BLOCK, keep
    up to ``window`` in flight, ask again for what a partial grant left out, and
    re-send what timed out or was refused with a retriable error."""

    n: int
    window: int = DEFAULT_WINDOW
    retries: int = DEFAULT_RETRIES
    after: int | None = None
    #: The most IDs one request asks for.
    chunk: int = protocol.MAX_BLOCK
    blocks: list[Block] = field(default_factory=list)
    #: IDs not yet asked for (or to be asked for again).
    unasked: int = 0
    inflight: int = 0
    #: Failed attempts that count against ``retries``.
    attempts: int = 0
    #: Timeouts that moved the job to an endpoint it had not found unresponsive (not counted).
    failovers: int = 0
    last_error: SnowfenceError | None = None
    _chunks: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.unasked = check_count(self.n)
        self.after = check_after(self.after)

    @property
    def done(self) -> bool:
        return self.unasked == 0 and self.inflight == 0

    def to_send(self) -> list[int]:
        """Counts of the requests to send now."""
        out = []
        while self.unasked and self.inflight < self.window:
            count = min(self.unasked, self.chunk)
            self.unasked -= count
            self.inflight += 1
            out.append(count)
        return out

    def on_block(self, asked: int, block: Block) -> None:
        self.inflight -= 1
        self.blocks.append(block)
        self.unasked += asked - block.count

    def requeue(self, asked: int) -> None:
        """A request was dropped with its socket: ask again, without counting a failure."""
        self.inflight -= 1
        self.unasked += asked

    def on_lost(self, asked: int, error: SnowfenceError) -> bool:
        """A request timed out or was refused retriably: ask again, if attempts remain.

        Returns False when the job has used up its retries (the caller raises
        ``last_error``).
        """
        self.requeue(asked)
        self.attempts += 1
        self.last_error = error
        return self.attempts <= self.retries

    def on_timeout(self, asked: list[int], error: SnowfenceError, counted: bool = True) -> bool:
        """Requests (of these counts) went unanswered together: ask again, if attempts
        remain. One attempt for them all: a pipelined round that times out is one
        failure of the connection, not one per request in flight. A timeout that is
        not ``counted`` (a failover to another endpoint) uses up no retry."""
        for count in asked:
            self.requeue(count)
        self.last_error = error
        if not counted:
            self.failovers += 1
            return True
        self.attempts += 1
        return self.attempts <= self.retries

    def on_overloaded(self, asked: int, error: SnowfenceError) -> bool:
        """The server holds as many of this connection's requests as it will: keep
        no more in flight than it has, and ask again for this one later. Counts as a
        failed attempt only when none of ours is in flight (no progress to wait for)."""
        self.requeue(asked)
        self.last_error = error
        if self.inflight:
            self.window = max(1, min(self.window, self.inflight))
            return True
        self.attempts += 1
        return self.attempts <= self.retries

    def backoff_s(self) -> float:
        """Delay before re-sending after the latest failure: exponential, jittered."""
        base = min(BACKOFF_MIN_S * 2 ** max(self.attempts - 1, 0), BACKOFF_MAX_S)
        return base * random.uniform(0.5, 1.0)

    def result(self) -> list[Block]:
        return sorted(self.blocks, key=lambda b: b.first)


def apply_reply(job: ReserveJob, pending: Pending, reply: protocol.Reply) -> float:
    """Feed one matched reply to its job.

    Returns 0, or the back-off (seconds) to wait before asking again after a
    retriable refusal; raises the error when it is not retriable or the job has
    no retries left.
    """
    if reply.type == protocol.BLOCK:
        job.on_block(pending.count, Block(reply.first, reply.count))
        return 0.0
    err = reply.error or SnowfenceError(f"unexpected reply type 0x{reply.type:02x} to RESERVE")
    if isinstance(err, Overloaded):
        if not job.on_overloaded(pending.count, err):
            raise err
        # The server's hint, when it gave one, is when it expects room for us.
        return err.retry_after_ms / 1000 if err.retry_after_ms else job.backoff_s()
    if not err.retriable or not job.on_lost(pending.count, err):
        raise err
    return job.backoff_s()


class ReserveRound:
    """One ``reserve(n)`` on a client: its requests on the wire, and what a reply, a
    timeout, a refusal or a reset under it means for them.

    The client's loop: send :meth:`requests`, wait until :meth:`deadline_ns` for
    replies and feed each to :meth:`on_reply` (or :meth:`on_dropped` for a
    request whose socket was reset under it), then call :meth:`settle`, which says
    whether to reset the connection (to the next endpoint) and how long to sleep.
    Errors that end the reservation are raised from these calls; the client then
    calls :meth:`abandon`. ``started_ns`` is when the call began.
    """

    def __init__(self, client: ClientBase, job: ReserveJob, started_ns: int = 0) -> None:
        self.client = client
        self.job = job
        #: This round's requests on the wire, by request id.
        self.waiting: dict[int, Pending] = {}
        #: Endpoints that let this call's requests time out.
        self.unresponsive: set[str] = set()
        #: When the call last got a reply (or began), for the message it gives up with.
        self.replied_ns = started_ns
        self.started_ns = started_ns
        self._replied = False
        self._backoff_s = 0.0
        if client._retry_for_ns is not None:
            job.retries = _UNCOUNTED  # the time budget decides (see :meth:`_out_of_time`)

    @property
    def done(self) -> bool:
        return self.job.done

    def requests(self, now_ns: int) -> list[tuple[Pending, bytes]]:
        """The requests to send now, each with its deadline set."""
        out = []
        deadline_ns = now_ns + self.client._timeout_ns
        for count in self.job.to_send():
            pending, frame = self.client._core.reserve(count, deadline_ns, self.job, self.job.after)
            self.waiting[pending.request_id] = pending
            out.append((pending, frame))
        return out

    def deadline_ns(self, now_ns: int) -> int:
        """Until when to wait for replies."""
        return min((p.deadline_ns for p in self.waiting.values()), default=now_ns)

    def on_reply(self, pending: Pending, reply: protocol.Reply) -> None:
        """A reply to one of this round's requests (raises what ends the reservation)."""
        if self.waiting.pop(pending.request_id, None) is None:
            return
        self._replied = True
        self._backoff_s = max(self._backoff_s, apply_reply(self.job, pending, reply))

    def on_dropped(self, pending: Pending) -> None:
        """The request's socket was reset (by another request's timeout): ask again."""
        if self.waiting.pop(pending.request_id, None) is not None:
            self.job.requeue(pending.count)

    def settle(self, now_ns: int) -> tuple[bool, float]:
        """After a wait: (reset the connection?, seconds to sleep before going on).

        A request past its deadline is a failed attempt; the connection is reset
        and the round's other requests are asked again at once on the next
        endpoint (nothing more can come on the old socket). While the call knows
        an endpoint that has not let it time out, the timeout is a failover and
        uses up no retry: a node that died costs a call one timeout, whatever
        ``retries`` is. If no endpoint has ever replied, the round gives up after
        one timeout per endpoint. After a retriable refusal the round backs off,
        and with other endpoints to try it moves on to the next, except after
        ``overloaded``: that server is up and has said when to come back.
        """
        client, job = self.client, self.job
        backoff, self._backoff_s = self._backoff_s, 0.0
        if backoff and self._out_of_time(now_ns) and not (isinstance(job.last_error, Overloaded) and job.inflight):
            raise job.last_error
        if self._replied:
            self._replied = False
            self.replied_ns = now_ns
            client.directory.answered()
        expired = [p for p in self.waiting.values() if p.deadline_ns <= now_ns]
        if expired:
            for p in expired:
                del self.waiting[p.request_id]
            client._core.abandon(expired)
            silent = client._never_answered()
            if silent is not None:
                raise silent
            self._timed_out([p.count for p in expired], now_ns)
            self._requeue_all()
            return True, 0.0
        if backoff and len(client.endpoints) > 1 and not isinstance(job.last_error, Overloaded):
            self._requeue_all()
            return True, backoff
        return False, backoff

    def _timed_out(self, counts: list[int], now_ns: int) -> None:
        """Requests of ``counts`` (none: a NODES request asked before the round's own)
        went unanswered on the current endpoint: a failover while another endpoint is
        untried, else a failed attempt; raises when the call gives up."""
        client, job = self.client, self.job
        endpoint = client.endpoint
        how = client._timeout_note()
        self.unresponsive.add(endpoint)
        counted = not client.directory.untried(self.unresponsive)
        error = client._timeout(endpoint=endpoint, how=how)
        if not job.on_timeout(counts, error, counted) or (counted and self._out_of_time(now_ns)):
            tries = job.attempts + job.failovers
            raise client._timeout(endpoint=endpoint, tries=tries, quiet_ns=now_ns - self.replied_ns, how=how)

    def discovery_timed_out(self, now_ns: int) -> None:
        """The NODES request asked before the round's requests got no reply: the endpoint
        failed, as for a request of the round (the client has reset and moved on); raises
        when the call gives up. So asking for the nodes never adds a timeout to a call's bound."""
        silent = self.client._never_answered()
        if silent is not None:
            raise silent
        self._timed_out([], now_ns)

    def on_failed(self, error: SnowfenceError, now_ns: int) -> float:
        """The connection to the current endpoint cannot carry requests, for the reason
        ``error`` names (the connection or the handshake was refused): every request on it
        is asked again. At once on another endpoint while one is untried by this call;
        then, for a retriable ``error``, after a back-off (the seconds returned) while
        retries (or the time budget) last. Raises ``error`` when the call gives up, and at
        once when no endpoint has ever replied (unless the client waits for its server)
        or when asking again cannot help. The client resets its connection after this."""
        client, job = self.client, self.job
        self._requeue_all()
        self.unresponsive.add(client.endpoint)
        job.last_error = error
        if client.directory.untried(self.unresponsive):
            job.failovers += 1
            return 0.0
        if not error.retriable or not (client._core.heard or client.wait_for_server):
            raise client._gave_up(error)
        job.attempts += 1
        if job.attempts > job.retries or self._out_of_time(now_ns):
            raise client._gave_up(error)
        return job.backoff_s()

    def _out_of_time(self, now_ns: int) -> bool:
        """Whether the client's time budget (``retry_for_s``) for this call has run out."""
        return self.client._may_retry(self.started_ns, now_ns) is False

    def adopt(self, pending: Pending) -> None:
        """Make the request sent for all of the job's IDs before the round began (on the
        one-request path, see :meth:`ClientBase._one_request`) the round's own, as if it had
        sent it; what came of it is then fed in as for any of its requests."""
        self.job.to_send()  # all n in the one request already sent
        pending.job = self.job
        self.waiting[pending.request_id] = pending

    def connection_lost(self) -> None:
        """The connection the round's requests went on closed (the fast port's): nothing
        on it will be answered; ask again for all of it, on whatever the client uses next."""
        self._requeue_all()

    def _requeue_all(self) -> None:
        self.client._core.abandon(list(self.waiting.values()))
        for p in self.waiting.values():
            self.job.requeue(p.count)
        self.waiting.clear()

    def abandon(self) -> list[Pending]:
        """The reservation ended early: forget its requests (returned, for the client's own records)."""
        gone = list(self.waiting.values())
        self.client._core.abandon(gone)
        self.waiting.clear()
        return gone


class StatusRound:
    """One ``status()`` (or ``nodes()``): asked again after a timeout, up to the
    client's retries; as in :meth:`ReserveRound.settle`, a timeout that moves the
    call to an endpoint it has not found unresponsive uses up no retry."""

    def __init__(self, client: ClientBase, what: str = "status", started_ns: int = 0) -> None:
        self.client = client
        self.what = what
        self.started_ns = started_ns
        self.attempts = 0
        self.failovers = 0
        self.unresponsive: set[str] = set()
        self.endpoint = client.endpoint

    @property
    def discovers_first(self) -> bool:
        """Whether the call asks for the cluster's nodes first, when that is due (not when
        its own request is NODES)."""
        return self.what != "nodes"

    def request(self, now_ns: int) -> tuple[Pending, bytes]:
        self.endpoint = self.client.endpoint
        ask = getattr(self.client._core, self.what)  # status, nodes or watermark
        return ask(now_ns + self.client._timeout_ns)

    def on_reply(self, reply: protocol.Reply):
        self.client.directory.answered()
        if reply.error is not None:
            raise reply.error
        if self.what == "watermark":
            if reply.watermark is None:
                raise BadRequest(f"the server answered a watermark request with reply type 0x{reply.type:02x}")
            return Watermark(*reply.watermark)
        answer = reply.nodes if self.what == "nodes" else reply.status
        if answer is None:
            raise BadRequest(f"the server answered a {self.what} request with reply type 0x{reply.type:02x}")
        return answer

    def on_lost(self, now_ns: int, timed_out: bool = True, how: str = "") -> None:
        """No reply (the client has reset its connection); raises when it is time to give
        up. ``how``: what the connection's monitor said (:meth:`Link.silence`)."""
        if timed_out:
            silent = self.client._never_answered()
            if silent is not None:
                raise silent
            self.unresponsive.add(self.endpoint)
            if self.client.directory.untried(self.unresponsive):
                self.failovers += 1
                return
        self.attempts += 1
        if self._gives_up(now_ns):
            tries = self.attempts + self.failovers
            raise self.client._timeout(
                f"{self.what} reply", self.endpoint, tries=tries, quiet_ns=now_ns - self.started_ns, how=how
            )

    def on_failed(self, error: SnowfenceError, now_ns: int) -> float:
        """The connection cannot carry the request, for the reason ``error`` names: as
        :meth:`ReserveRound.on_failed` (the back-off to wait is returned; raises when the
        call gives up)."""
        client = self.client
        self.unresponsive.add(self.endpoint)
        if client.directory.untried(self.unresponsive):
            self.failovers += 1
            return 0.0
        if not error.retriable or not (client._core.heard or client.wait_for_server):
            raise client._gave_up(error)
        self.attempts += 1
        if self._gives_up(now_ns):
            raise client._gave_up(error)
        return min(BACKOFF_MIN_S * 2 ** (self.attempts - 1), BACKOFF_MAX_S) * random.uniform(0.5, 1.0)

    def _gives_up(self, now_ns: int) -> bool:
        budget = self.client._may_retry(self.started_ns, now_ns)
        return self.attempts > self.client.retries if budget is None else not budget
