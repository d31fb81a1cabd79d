"""The sans-I/O heart of both clients: request ids, framing, matching, planning.

Nothing here waits on a socket or reads a clock; the blocking and asyncio clients feed
it reply bodies and the monotonic time, and do what it says. That keeps the
rules in one place: how a large reservation is split, what a partial grant
means, which errors are retried and after what back-off, when a timeout gives
up, when the connection is reset (:class:`ReserveRound`), how often STATUS is
asked again (:class:`StatusRound`), which endpoints there are, when to ask the
cluster for them, which one to go to when the current one fails and when a
move may close the connection (:class:`Directory`, :meth:`ClientBase._discovery`),
how many blocks ``ids()`` keeps in hand and which it hands out
(:class:`PrefetchDepth`, :class:`Prefetch`), and what the constructor takes
(:class:`ClientBase`). The two clients differ only in how they wait; the one
thing here that touches a socket is how both open theirs (``_dealer``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .. import protocol
from ..errors import BadRequest, Overloaded, SnowfenceError, Timeout

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_RETRIES = 5
#: Requests one reservation keeps in flight at once.
DEFAULT_WINDOW = 32
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
#: How often a client asks for the cluster's nodes (NODES), besides on connect and after a failure.
DISCOVER_EVERY_S = 5.0
#: The longest a NODES request may take before the client carries on without the answer.
DISCOVER_TIMEOUT_S = 1.0
#: The longest a client waits to connect to a node's fast port before it uses ZeroMQ instead.
FAST_CONNECT_TIMEOUT_S = 1.0
#: How long a client leaves a fast port alone after it failed (refused, closed, timed out).
FAST_RETRY_S = 30.0


class Block:
    """IDs ``first .. first+count-1``: minted by one worker within one millisecond."""

    __slots__ = ("first", "count")

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def range(self) -> range:
        return range(self.first, self.first + self.count)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.first + self.count))

    def __len__(self) -> int:
        return self.count

    def __contains__(self, id_: object) -> bool:
        return isinstance(id_, int) and self.first <= id_ < self.first + self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Block) and (self.first, self.count) == (other.first, other.count)

    def __hash__(self) -> int:
        return hash((self.first, self.count))

    def __repr__(self) -> str:
        return f"Block(first={self.first}, count={self.count})"


def check_count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise BadRequest(f"count must be an integer, not {type(n).__name__}")
    if n < 1:
        raise BadRequest(f"count must be at least 1, got {n}")
    return n


def check_after(after: object) -> int | None:
    """A causal token is an ID: an integer 0 .. 2**63-1 (or None for none)."""
    if after is None:
        return None
    if isinstance(after, bool) or not isinstance(after, int):
        raise BadRequest(f"after must be an ID (an integer), not {type(after).__name__}")
    if not 0 <= after < 1 << 63:
        raise BadRequest(f"after must be an ID, 0 .. 2**63-1, got {after}")
    return after


#: The longest timeout a client takes: ZeroMQ polls in int32 milliseconds.
MAX_TIMEOUT_S = 1_000_000.0


@dataclass
class Pending:
    """A request on the wire."""

    request_id: int
    kind: int
    count: int
    deadline_ns: int
    job: object = None


class Core:
    """Frames requests and matches replies for one client.

    Request ids increase by one from a random start, so a reply to a request
    that was given up on (or one meant for an earlier socket) never matches a
    newer request: :meth:`match` drops it.
    """

    def __init__(self) -> None:
        self._ids = itertools.count(random.getrandbits(40) + 1)
        self.inflight: dict[int, Pending] = {}
        #: Whether anything ever came back: a server of some kind is there.
        self.heard = False

    def reserve(
        self, count: int, deadline_ns: int, job: object = None, after: int | None = None
    ) -> tuple[Pending, bytes]:
        rid = next(self._ids)
        pending = Pending(rid, protocol.RESERVE, count, deadline_ns, job)
        self.inflight[rid] = pending
        return pending, protocol.encode_reserve(rid, count, after)

    def status(self, deadline_ns: int, job: object = None) -> tuple[Pending, bytes]:
        rid = next(self._ids)
        pending = Pending(rid, protocol.STATUS, 0, deadline_ns, job)
        self.inflight[rid] = pending
        return pending, protocol.encode_status(rid)

    def nodes(self, deadline_ns: int, job: object = None) -> tuple[Pending, bytes]:
        rid = next(self._ids)
        pending = Pending(rid, protocol.NODES, 0, deadline_ns, job)
        self.inflight[rid] = pending
        return pending, protocol.encode_nodes(rid)

    def match(self, body: bytes) -> tuple[Pending, protocol.Reply] | None:
        """The request a reply answers, or None for a stale, unknown or garbled reply."""
        self.heard = True
        try:
            reply = protocol.decode_reply(body)
        except SnowfenceError:
            return None
        pending = self.inflight.pop(reply.request_id, None)
        if pending is None:
            return None
        if reply.type == protocol.BLOCK and not 0 < reply.count <= pending.count:
            # A server must never grant more than asked; treat it as a broken reply.
            self.inflight[reply.request_id] = pending
            return None
        return pending, reply

    def expired(self, now_ns: int) -> list[Pending]:
        return [p for p in self.inflight.values() if p.deadline_ns <= now_ns]

    def answerable(self, now_ns: int) -> bool:
        """Whether a request in flight may still be answered (one is not past its deadline)."""
        return any(p.deadline_ns > now_ns for p in self.inflight.values())

    def next_deadline_ns(self) -> int | None:
        return min((p.deadline_ns for p in self.inflight.values()), default=None)

    def abandon(self, pendings) -> None:
        for p in pendings:
            self.inflight.pop(p.request_id, None)


class Directory:
    """The endpoints a client uses, which one it uses now, and where it goes when that
    one fails: the seeds it was given and, with discovery, the nodes the brokers
    report in answer to NODES.

    The client asks on connect, again after a failure, and every
    ``DISCOVER_EVERY_S``. The endpoints it uses are the nodes in rotation, those
    of its own ``region`` first when it was told which that is, then the nodes
    listed but out of rotation (they may be back by the time they are needed),
    then the seeds it was given that no answer lists (a seed may be a load
    balancer, or down for now). Its first answer sends it to a node picked at
    random among the preferred ones, so clients given the same seed spread over
    the cluster; a node that appears later is new capacity, and a client moves to
    it when it learns of it. A node that leaves the answer is left when the
    client next moves. Without ``discover`` the list is the seeds.

    When the current endpoint fails (:meth:`failed`), the client moves to the
    endpoint that failed longest ago, one that has not failed first, in list
    order after the failed one. A dead node stays listed until its membership
    lease lapses, and a node cut off from its clients but not from etcd stays
    listed for good; so a failure is remembered until that endpoint answers
    again, and the random picks above avoid an endpoint that failed while
    another will do.
    """

    def __init__(self, seeds: list[str], *, discover: bool, region: int | None, rng: random.Random | None = None):
        self.seeds = list(seeds)
        self.discover = discover
        self.region = region
        self.endpoints = list(seeds)
        #: Where the client sends its requests now.
        self.current = self.endpoints[0]
        #: The preferred endpoints as of the last answer (own region, or all).
        self.preferred: list[str] = []
        #: Every endpoint an answer has listed in rotation; None before the first answer.
        self.seen: set[str] | None = None
        #: Endpoints that failed and have not answered since, with the order of their
        #: failures (higher: later).
        self.failures: dict[str, int] = {}
        self._failure_count = itertools.count(1)
        self._next_ns = 0
        self._rng = rng or random.Random()

    def due(self, now_ns: int) -> bool:
        return self.discover and now_ns >= self._next_ns

    def asked(self, now_ns: int) -> None:
        self._next_ns = now_ns + int(DISCOVER_EVERY_S * 1e9)

    def on_failure(self) -> None:
        """Something failed: learn the cluster again at the next chance."""
        self._next_ns = 0

    def failed(self) -> str:
        """The current endpoint let a request time out or refused it: remember that,
        learn the cluster again at the next chance, and move on. Returns the
        endpoint moved to (the same one when it is the only one)."""
        self.on_failure()
        self.failures[self.current] = next(self._failure_count)
        eps = self.endpoints
        start = eps.index(self.current) + 1 if self.current in eps else 0
        self.current = min(eps[start:] + eps[:start], key=lambda ep: self.failures.get(ep, 0))
        return self.current

    def answered(self) -> None:
        """The current endpoint replied: it is no longer one that failed."""
        if self.failures:
            self.failures.pop(self.current, None)

    def untried(self, unresponsive: set[str]) -> bool:
        """Whether an endpoint is known that is not among ``unresponsive``."""
        return any(ep not in unresponsive for ep in self.endpoints)

    def learn(self, answer: dict) -> str | None:
        """Take a NODES answer; the endpoint to move to, or None to stay on the current one."""
        nodes = [n for n in answer.get("nodes") or () if isinstance(n, dict)]
        usable = []
        for n in nodes:
            eps = n.get("endpoints")
            if isinstance(eps, list) and eps and isinstance(eps[0], str) and not protocol.endpoint_problem(eps[0]):
                usable.append(n)
        serving = [n for n in usable if n.get("in_rotation", True)] or usable
        if not serving:
            return None  # nothing to go by: keep what we have
        mine = [n for n in serving if self.region is not None and n.get("region") == self.region]
        preferred = [n["endpoints"][0] for n in (mine or serving)]
        others = [n["endpoints"][0] for n in serving if n["endpoints"][0] not in preferred]
        listed = set(preferred) | set(others)
        resting = [ep for ep in dict.fromkeys(n["endpoints"][0] for n in usable) if ep not in listed]
        known = listed | set(resting)
        self.endpoints = [*preferred, *others, *resting, *(s for s in self.seeds if s not in known)]
        self.preferred = preferred
        self.failures = {ep: n for ep, n in self.failures.items() if ep in self.endpoints}
        first, seen = self.seen is None, self.seen or set()
        self.seen = seen | listed
        new = [ep for ep in preferred if ep not in seen]
        if first:
            target = self._pick(preferred)
        elif new:
            target = self._pick(new)
        elif self.current not in listed:
            target = self._pick(preferred)  # it left: go on, and not all to the same one
        else:
            return None
        return None if target == self.current else target

    def _pick(self, candidates: list[str]) -> str:
        """One of ``candidates`` at random among those that have not failed, else the one that failed longest ago."""
        fine = [ep for ep in candidates if ep not in self.failures]
        return self._rng.choice(fine) if fine else min(candidates, key=self.failures.__getitem__)


def _port_or_none(port: object) -> int | None:
    """A TCP port from a NODES answer (input: anything else is no port)."""
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port <= 65535 else None


class ClientBase:
    """What both clients keep that no socket touches: endpoints and whose turn it
    is, timeout and retry settings, the request-id core, and CURVE keys; and the
    one way both open their DEALER socket (:meth:`_dealer`).

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
    ) -> None:
        seeds = [endpoints] if isinstance(endpoints, str) else list(endpoints)
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
        self.timeout_s = timeout_s
        self.retries = retries
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
        self.wait_for_server = wait_for_server
        #: Where an answer to NODES said to go while other requests were in flight.
        self._move_later: str | None = None
        if server_key is not None:
            from ..curve import Curve

            #: CURVE settings when the broker encrypts (``server_key``: its public key or certificate file).
            self.curve = Curve.for_client(server_key, client_key)
        else:
            self.curve = None
        #: The ZeroMQ context the transport opens its sockets on (None: its default).
        self._ctx = context
        #: The fast ports of the nodes the last NODES answer listed, by endpoint (None: it
        #: has none), the endpoint last asked, and until when the fast port is left alone
        #: after a failure (see :meth:`_fast_route`).
        self._fast_ports: dict[str, int | None] = {}
        self._fast_asked: str | None = None
        self._fast_off_until_ns = 0
        self._init_transport()

    def _init_transport(self) -> None:
        """What the transport keeps (its socket, its waiters); called last by the constructor."""

    def _dealer(self):
        """A DEALER socket as both clients open one: on their context, no linger, CURVE when
        the broker encrypts, connected to the endpoint in use."""
        import zmq

        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.endpoint)
        return sock

    def _reset(self, rotate: bool) -> None:
        """Drop the connection: nothing on it will be answered (a transport closes its socket
        first). With ``rotate`` its endpoint failed (see :meth:`_forget_connection`)."""
        self._forget_connection(rotate)

    @property
    def endpoints(self) -> list[str]:
        return self.directory.endpoints

    @property
    def endpoint(self) -> str:
        """Where requests go now."""
        return self.directory.current

    def _discovery(self, now_ns: int) -> tuple[Pending, bytes] | None:
        """Before a call: make the move an earlier answer asked for, once no request in
        flight can still be answered; then the NODES request to send, when it is time to
        ask (None otherwise).

        Not before any broker has answered: until then a call says that no server
        answered rather than wait for NODES first."""
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
        self._fast_asked = self.endpoint
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
        self._learn_fast(reply.nodes)
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

    # -- the fast port -------------------------------------------------------------------

    def _fast_unknown(self) -> bool:
        """Whether the current node may have a fast port this client has not asked about."""
        endpoint = self.endpoint
        return (
            self.curve is None
            and endpoint not in self._fast_ports
            and self._fast_asked != endpoint
            and endpoint.startswith("tcp://")
        )

    def _learn_fast(self, answer: dict) -> None:
        """Take the fast ports from a NODES answer: each listed node's, and the answering
        node's own (``fast_port`` at the top: the port of the node as this client reached it)."""
        ports: dict[str, int | None] = {}
        for n in answer.get("nodes") or ():
            eps = n.get("endpoints") if isinstance(n, dict) else None
            if isinstance(eps, list) and eps and isinstance(eps[0], str):
                ports[eps[0]] = _port_or_none(n.get("fast_port"))
        ports[self.endpoint] = _port_or_none(answer.get("fast_port"))
        self._fast_ports = ports

    def _fast_route(self, n: int, chunk: int, now_ns: int) -> tuple[str, int] | None:
        """Where to send a reservation of ``n`` IDs (in requests of at most ``chunk``) on the
        fast port, or None to use ZeroMQ: only a reservation that fits one request, only to
        the node the port was learned from, never with CURVE (the port has none), and not
        while the port is left alone after a failure."""
        port = self._fast_ports.get(self.endpoint)
        if self._fast_off_until_ns and now_ns >= self._fast_off_until_ns:
            self._fast_off_until_ns = 0
        if (
            port is None
            or n > chunk
            or n > protocol.MAX_BLOCK
            or now_ns < self._fast_off_until_ns
            or self.curve is not None
        ):
            return None
        host = self.endpoint[len("tcp://") :].rpartition(":")[0]
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return host, port

    def _fast_still(self, endpoint: str, port: int, n: int, chunk: int) -> bool:
        """Whether a reservation of ``n`` goes to the fast connection open now (to ``port``
        of the node at ``endpoint``): :meth:`_fast_route`, without building the answer."""
        return (
            endpoint == self.endpoint
            and n <= chunk
            and n <= protocol.MAX_BLOCK
            and self._fast_ports.get(endpoint) == port
            and not self._fast_off_until_ns
        )

    def _fast_failed(self, now_ns: int) -> None:
        """The fast port failed (refused, closed the connection, or let a request time
        out): ZeroMQ for ``FAST_RETRY_S``, and the port asked for again (a node that
        restarted with ``auto`` has another)."""
        self._fast_off_until_ns = now_ns + int(FAST_RETRY_S * 1e9)
        self._fast_ports.pop(self.endpoint, None)
        self._fast_asked = None

    def _switch_to(self, endpoint: str) -> None:
        """Close the connection (nothing failed) and use ``endpoint`` from the next one on."""
        self._reset(rotate=False)
        self._move_to(endpoint)

    def _move_to(self, endpoint: str) -> None:
        """Use ``endpoint`` from the next connection on (the caller closed the old one)."""
        self.directory.current = endpoint

    def _timeout(self, what: str = "reply", endpoint: str | None = None, tries: int = 0, quiet_ns: int = 0) -> Timeout:
        """The error for a request that went unanswered on ``endpoint`` (the current one);
        with ``tries``, the one a call gives up with after that many failed attempts and
        ``quiet_ns`` without a reply."""
        text = f"no {what} from {endpoint or self.endpoint} within {self.timeout_s} s"
        if tries:
            text += (
                f" (the timeout of each attempt); gave up after {tries} failed attempt{'s' if tries > 1 else ''},"
                f" {quiet_ns / 1e9:.1f} s without a reply"
            )
        if self.curve is not None:
            text += (
                " (CURVE is on: a wrong server key, or a client key not on the broker's allow-list, "
                "also looks like this)"
            )
        return Timeout(text)

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
        if self.curve is not None:
            text += " CURVE is on: check the server key, and that this client's key is on the broker's allow-list."
        return Timeout(text)

    def _forget_connection(self, rotate: bool) -> None:
        """The socket is going: nothing on it will be answered. With ``rotate`` its
        endpoint failed, and the next connection goes where :meth:`Directory.failed` says."""
        self._core.abandon(list(self._core.inflight.values()))
        if rotate:
            self.directory.failed()
        self.resets += 1


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
    def granted(self) -> int:
        return sum(b.count for b in self.blocks)

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
        self._replied = False
        self._backoff_s = 0.0

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
            endpoint = client.endpoint
            self.unresponsive.add(endpoint)
            counted = not client.directory.untried(self.unresponsive)
            if not job.on_timeout([p.count for p in expired], client._timeout(endpoint=endpoint), counted):
                tries = job.attempts + job.failovers
                raise client._timeout(endpoint=endpoint, tries=tries, quiet_ns=now_ns - self.replied_ns)
            self._requeue_all()
            return True, 0.0
        if backoff and len(client.endpoints) > 1 and not isinstance(job.last_error, Overloaded):
            self._requeue_all()
            return True, backoff
        return False, backoff

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

    def request(self, now_ns: int) -> tuple[Pending, bytes]:
        self.endpoint = self.client.endpoint
        ask = self.client._core.nodes if self.what == "nodes" else self.client._core.status
        return ask(now_ns + self.client._timeout_ns)

    def on_reply(self, reply: protocol.Reply) -> dict:
        self.client.directory.answered()
        if reply.error is not None:
            raise reply.error
        answer = reply.nodes if self.what == "nodes" else reply.status
        if answer is None:
            raise BadRequest(f"the server answered a {self.what} request with reply type 0x{reply.type:02x}")
        return answer

    def on_lost(self, now_ns: int, timed_out: bool = True) -> None:
        """No reply (the client has reset its connection); raises when it is time to give up."""
        if timed_out:
            silent = self.client._never_answered()
            if silent is not None:
                raise silent
            self.unresponsive.add(self.endpoint)
            if self.client.directory.untried(self.unresponsive):
                self.failovers += 1
                return
        self.attempts += 1
        if self.attempts > self.client.retries:
            tries = self.attempts + self.failovers
            raise self.client._timeout(
                f"{self.what} reply", self.endpoint, tries=tries, quiet_ns=now_ns - self.started_ns
            )


class PrefetchDepth:
    """How many blocks ``ids()`` keeps in hand: between 1 and ``depth``, doubling
    when the consumer had to wait and halving when a block went stale (older than
    ``max_age_s`` when its turn came; None keeps every block)."""

    def __init__(self, batch: int, depth: int, max_age_s: float | None) -> None:
        if not 1 <= batch <= protocol.MAX_BLOCK or depth < 1:
            raise ValueError(f"need 1 <= batch <= {protocol.MAX_BLOCK} and prefetch >= 1")
        self.batch = batch
        self.depth = depth
        self.target = min(2, depth)
        self.max_age_ns = None if max_age_s is None else int(max_age_s * 1e9)
        self.dropped = 0

    def starved(self) -> None:
        """The consumer found nothing in hand."""
        self.target = min(self.depth, self.target * 2)

    def stale(self, fetched_ns: int, now_ns: int) -> bool:
        """Whether a block fetched at ``fetched_ns`` is too old to hand out now (and is dropped)."""
        if self.max_age_ns is None or now_ns - fetched_ns <= self.max_age_ns:
            return False
        self.dropped += 1
        self.target = max(1, self.target // 2)
        return True

    def wanted_ids(self, in_hand: int) -> int:
        """IDs to reserve now with ``in_hand`` blocks held (0: enough)."""
        return max(0, self.target - in_hand) * self.batch


class Prefetch:
    """The blocks ``ids()`` keeps in hand, and what the refill left to say: both clients
    hold their blocks here and differ only in how the consumer and the refill wait
    for each other (a condition variable, or asyncio events).

    The consumer calls :meth:`take` and, when it gives None, waits for the refill
    to :meth:`add` blocks (or to fail: :meth:`take` then raises its error); the
    refill asks for :meth:`wanted` IDs whenever that is not 0.
    """

    def __init__(self, depth: PrefetchDepth) -> None:
        self.depth = depth
        #: (monotonic ns when fetched, the block's IDs), oldest first.
        self.blocks: deque[tuple[int, range]] = deque()
        #: Why the refill stopped, for the consumer to raise once the blocks in hand are used.
        self.error: SnowfenceError | None = None
        self.closed = False

    def take(self, now_ns: int) -> range | None:
        """The next block's IDs, passing over stale ones; None when none is in hand (the
        consumer waits, and the depth grows). Raises the refill's error, or ValueError
        once the client is closed, when nothing is left in hand."""
        while self.blocks:
            fetched_ns, ids = self.blocks.popleft()
            if not self.depth.stale(fetched_ns, now_ns):
                return ids
        if self.error is not None:
            raise self.error
        if self.closed:
            raise ValueError("the client was closed")
        self.depth.starved()
        return None

    def wanted(self) -> int:
        """IDs the refill should reserve now (0: enough in hand, or closed)."""
        return 0 if self.closed else self.depth.wanted_ids(len(self.blocks))

    def add(self, blocks: list[Block], now_ns: int) -> None:
        self.blocks.extend((now_ns, b.range()) for b in blocks)


def as_array(blocks: list[Block]):
    """All IDs of ``blocks`` as one flat ``array('q')`` (64-bit signed ints)."""
    import array

    out = array.array("q")
    for b in blocks:
        out.extend(range(b.first, b.first + b.count))
    return out


def as_numpy(blocks: list[Block]):
    """All IDs of ``blocks`` as one NumPy int64 array, built without Python ints."""
    import numpy as np

    if not blocks:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(b.first, b.first + b.count, dtype=np.int64) for b in blocks])
