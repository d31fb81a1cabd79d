"""The asyncio client: the same sans-I/O core as the blocking client, on zmq.asyncio.

One DEALER socket per client and one reader task that hands each reply to the
request waiting for it (by request id), so any number of tasks can reserve at
once. A request with no reply within ``timeout_s`` resets the socket (and with
it every request still on it: those are asked again on the new one), so a
stale reply can never answer a newer request. Runs on any asyncio loop;
:func:`run` uses uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import zmq
import zmq.asyncio

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


class _FastProtocol(asyncio.Protocol):
    """A connection to a node's fast port: each body that arrives goes to its waiter."""

    def __init__(self, client: AsyncClient, where: tuple[str, int], endpoint: str) -> None:
        self.client = client
        self.where = where
        #: The ZeroMQ endpoint of the node whose fast port this is (as it was when the
        #: connection was begun: another task may move the client while it connects).
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.frames = protocol.Stream(protocol.MAX_REPLY_BYTES)
        #: Requests sent on this connection, by request id: they go with it.
        self.waiters: dict[int, asyncio.Future] = {}
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.frames.feed(data)
        except SnowfenceError:
            self.transport.close()  # garbled: nothing after it can be read
            return
        match, waiters = self.client._core.match, self.waiters
        for body in bodies:
            matched = match(body)
            if matched is None:
                continue
            future = waiters.pop(matched[0].request_id, None)
            if future is not None and not future.done():
                future.set_result(matched)

    def connection_lost(self, exc) -> None:
        self.lost = True
        self.client._fast_lost(self)

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()
        self.release()

    def release(self) -> None:
        """Tell each request still waiting on this connection that it is gone."""
        for future in self.waiters.values():
            if not future.done():
                future.set_result(_LOST)
        self.waiters.clear()


#: A waiter's result when its request went on a fast connection that closed under it.
_LOST = ("lost", None)
#: A waiter's result when its deadline came first (see ``_reserve``).
_EXPIRED = ("expired", None)
_DONTWAIT = int(zmq.DONTWAIT)
_POLLOUT = int(zmq.POLLOUT)


class _Failed:
    """A waiter's result when the socket monitor said its connection can carry nothing
    (the connection or the handshake was refused): ``error`` says why, ``link`` is the
    connection's (the client has moved on from it when it is no longer the current one)."""

    __slots__ = ("error", "link")

    def __init__(self, error: SnowfenceError, link: Link) -> None:
        self.error = error
        self.link = link


_stream = protocol.encode_stream


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(_EXPIRED)


#: The longest a client waits for a node's greeting (see :func:`node_mechanism`).
GREETING_TIMEOUT_S = 0.5


async def node_mechanism(endpoint: str, timeout_s: float) -> str | None:
    """The security mechanism the ZeroMQ node at ``endpoint`` names in its greeting
    (``NULL``, ``CURVE``), asked on a connection of its own; None if it cannot be told
    within ``timeout_s`` (as :func:`snowfence.clients.blocking.node_mechanism`)."""
    where = greeting_address(endpoint)
    if where is None:
        return None
    kind, address = where

    async def ask() -> bytes:
        if kind == "ipc":
            reader, writer = await asyncio.open_unix_connection(address)
        else:
            reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(GREETING_START)
            greeting = b""
            while len(greeting) < GREETING_BYTES:
                chunk = await reader.read(GREETING_BYTES - len(greeting))
                if not chunk:
                    break
                greeting += chunk
            return greeting
        finally:
            writer.close()

    try:
        return greeting_mechanism(await asyncio.wait_for(ask(), timeout_s))
    except (OSError, TimeoutError):
        return None


def run(main: Awaitable):
    """``asyncio.run`` on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class AsyncClient(ClientBase):
    """Reserve IDs from snowfence brokers from asyncio code.

    Same names as :class:`snowfence.Client`: ``await reserve(n)``, ``ids()`` (an
    async iterator), ``await status()``, ``await nodes()``, ``await layout()``, ``await
    bounds(start, end)``; use ``async with``.
    Discovery (``discover``, ``region``) as for :class:`snowfence.Client`.
    """

    def _init_transport(self) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        #: The socket's monitor, the task that reads it, and what its events said of the
        #: connection (the last socket's, until the next opens).
        self._monitor: zmq.asyncio.Socket | None = None
        self._watcher: asyncio.Task | None = None
        self._watch = Link(self.endpoint, self.curve is not None)
        self._waiters: dict[int, asyncio.Future] = {}
        self._closed = False
        #: The connection to the current node's fast port, and the one being opened.
        self._fast: _FastProtocol | None = None
        self._fast_opening: asyncio.Future | None = None
        #: The nodes' layout, once asked (:meth:`layout`).
        self._layout: Layout | None = None

    # -- transport ----------------------------------------------------------------------

    def _socket(self) -> zmq.asyncio.Socket:
        if self._closed:
            self._check_open()
        if self._sock is None:
            endpoint = self.endpoint
            self._sock, self._monitor = open_dealer(self._ctx, self.curve, endpoint)
            self._watch = self._new_link(endpoint)
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read(self._sock))
            self._watcher = loop.create_task(self._watch_monitor(self._monitor, self._watch))
        return self._sock

    async def _watch_monitor(self, monitor: zmq.asyncio.Socket, link: Link) -> None:
        """Feed the monitor's events to ``link``; when one says the connection can carry
        nothing (refused), every request waiting on the socket learns why at once."""
        try:
            while True:
                error = link.feed(*monitor_event(await monitor.recv_multipart()))
                if error is not None and link.unclear:
                    error = link.learn_mechanism(
                        await node_mechanism(link.endpoint, min(self.timeout_s, GREETING_TIMEOUT_S))
                    )
                if error is not None and link is self._watch:
                    self._fail_waiters(_Failed(error, link))
        except (asyncio.CancelledError, zmq.ZMQError):
            pass

    def _fail_waiters(self, failed: _Failed) -> None:
        for future in self._waiters.values():
            if not future.done():
                future.set_result(failed)
        self._waiters.clear()

    def _timeout_note(self) -> str:
        return self._watch.silence()

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """Hand each reply to the request waiting for it; drop stale ones."""
        try:
            while True:
                body = await sock.recv()
                matched = self._core.match(body)
                if matched is None:
                    continue
                future = self._waiters.pop(matched[0].request_id, None)
                if future is not None and not future.done():
                    future.set_result(matched)
        except (asyncio.CancelledError, zmq.ZMQError):
            pass

    async def _open_fast(self, route: tuple[str, int]) -> _FastProtocol | None:
        """A fast connection to ``route`` (host, port), where :meth:`ClientBase._fast_choice`
        said to open one; None (ZeroMQ) if it cannot be opened. Tasks that ask while it
        opens wait for it."""
        if self._fast_opening is not None:
            return await asyncio.shield(self._fast_opening)
        loop = asyncio.get_running_loop()
        self._fast_opening = opening = loop.create_future()
        try:
            self._close_fast()
            try:
                endpoint = self.endpoint
                _, proto = await asyncio.wait_for(
                    loop.create_connection(lambda: _FastProtocol(self, route, endpoint), *route),
                    self._fast_connect_timeout_s(),
                )
            except (OSError, TimeoutError):
                self._fast_failed(time.monotonic_ns())
                proto = None
            if proto is not None and self._closed:  # closed while it connected
                proto.close()
                proto = None
            self._fast = proto
            opening.set_result(proto)
            return proto
        finally:
            if not opening.done():
                opening.set_result(None)
            self._fast_opening = None

    def _fast_lost(self, proto: _FastProtocol) -> None:
        """A fast connection closed (the broker closed it, or it was reset): its requests
        are asked again on ZeroMQ, which the client uses for a while (see :meth:`FastPath.failed`)."""
        proto.release()
        if self._fast is proto:
            self._fast = None
            self._fast_failed(time.monotonic_ns())

    def _close_fast(self) -> None:
        if self._fast is not None:
            fast, self._fast = self._fast, None
            fast.close()

    def _close_connections(self) -> None:
        """Close the socket and the fast connection with everything still on them; the
        waiters learn they are gone."""
        self._close_fast()
        for future in self._waiters.values():
            if not future.done():
                future.set_result(None)
        self._waiters.clear()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._sock is not None:
            close_dealer(self._sock, self._monitor)
            self._sock = self._monitor = None

    async def _ask(self, pending: Pending, frame: bytes) -> asyncio.Future:
        """Send one request; the future its reply (or what else ended it) will be set on.
        The send never waits past the request's deadline: a DEALER with no connection to
        send on (a refused handshake leaves it so) would wait for ever."""
        future = asyncio.get_running_loop().create_future()
        sock = self._socket()
        if self._watch.error is not None:
            future.set_result(_Failed(self._watch.error, self._watch))
            return future
        self._waiters[pending.request_id] = future
        try:
            await sock.send(frame, _DONTWAIT)
        except zmq.Again:
            await self._send_late(sock, frame, future, pending.deadline_ns)
        return future

    async def _send_late(self, sock: zmq.asyncio.Socket, frame: bytes, future: asyncio.Future, deadline_ns: int):
        """Wait for room to send ``frame`` until ``deadline_ns`` at most, or until the request
        has ended (``future``: refused, reset); what happens to it then is its future's."""
        while not future.done() and sock is self._sock:
            left_ms = (deadline_ns - time.monotonic_ns()) // 1_000_000
            if left_ms <= 0:
                return  # the request times out, as if unanswered
            room = asyncio.ensure_future(sock.poll(left_ms, _POLLOUT))
            try:
                await asyncio.wait((room, future), return_when=asyncio.FIRST_COMPLETED)
            finally:
                room.cancel()
            if future.done() or sock is not self._sock:
                return
            # A poll that ran out of time ends in zmq.Again: no room yet.
            if room.done() and not room.cancelled() and room.exception() is None and room.result():
                try:
                    await sock.send(frame, _DONTWAIT)
                    return
                except zmq.Again:
                    pass

    # -- public API ---------------------------------------------------------------------

    async def reserve(self, n: int, *, after: int | None = None) -> list[Block]:
        """Reserve ``n`` IDs: blocks, in ID order, whose counts sum to ``n``. A count that is
        not an integer is a ``TypeError``, one below 1 a ``ValueError``; a closed client refuses."""
        if self._closed:
            self._check_open()
        fast = self._fast
        if fast is not None:
            return await self._reserve_fast(fast, n, after)
        return await self._reserve(n, after=after)

    async def _reserve_fast(self, fast: _FastProtocol, n: int, after: int | None = None) -> list[Block]:
        """``reserve(n)`` while a fast connection is open, on the one-request path when
        :meth:`ClientBase._one_request` says so: one request sent at once and, when its
        answer is the whole grant, returned at once. Anything else (another answer, none
        in time, the connection closing under it) :meth:`_reserve` takes from there, as if
        its own round had sent the request; any other call goes there from the start.

        The common case of a single ID is all this does: building a round for it costs
        about as much as the rest of the round trip in Python."""
        now = time.monotonic_ns()
        if fast.lost or not self._one_request(fast, n, after, now):
            return await self._reserve(n, after=after)
        pending, frame = self._core.reserve(n, now + self._timeout_ns)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        fast.waiters[pending.request_id] = future
        fast.transport.write(_stream(frame))
        timer = loop.call_later(self.timeout_s, _expire, future)
        resets = self.resets
        try:
            await future
        except BaseException:
            fast.waiters.pop(pending.request_id, None)
            self._core.abandon((pending,))
            raise
        finally:
            timer.cancel()
        matched = future.result()
        if matched is not None and matched is not _LOST and matched is not _EXPIRED:
            blocks = self._whole_grant(matched[1], n)
            if blocks is not None:
                return blocks
        return await self._reserve(n, sent=(pending, self._expired_or_reset(matched, resets)))

    async def _reserve(
        self,
        n: int,
        *,
        after: int | None = None,
        chunk: int = protocol.MAX_BLOCK,
        sent: tuple[Pending, object] | None = None,
    ) -> list[Block]:
        """``reserve(n)`` in rounds (see :class:`ReserveRound`). ``sent``: the request
        :meth:`_reserve_fast` sent for all ``n`` IDs, with what its future ended with."""
        job = ReserveJob(n, window=self.window, retries=self.retries, after=after, chunk=chunk)
        started_ns = time.monotonic_ns()
        round_ = ReserveRound(self, job, started_ns)
        waiting: dict[asyncio.Future, Pending] = {}
        loop = asyncio.get_running_loop()
        try:
            if sent is None:
                if self._discovery_wanted(started_ns):  # checked here: a coroutine per call costs
                    if await self._discover():
                        round_.discovery_timed_out(time.monotonic_ns())
            else:
                pending, matched = sent
                round_.adopt(pending)
                expired = self._outcome(round_, pending, matched)
                await self._settle(round_, waiting, pending.deadline_ns if expired else 0)
            while not round_.done:
                fast = self._fast
                now = time.monotonic_ns()
                choice = self._fast_choice(None if fast is None or fast.lost else fast, n, chunk, now)
                if choice is None:
                    fast = None
                elif choice is not KEEP:
                    fast = await self._open_fast(choice)
                    now = time.monotonic_ns()
                for pending, frame in round_.requests(now):
                    if fast is not None and not fast.lost:  # _ask, inline
                        future = loop.create_future()
                        fast.waiters[pending.request_id] = future
                        fast.transport.write(_stream(frame))
                    else:
                        future = await self._ask(pending, frame)
                    waiting[future] = pending
                deadline_ns = round_.deadline_ns(now)
                timeout_s = max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9)
                if len(waiting) == 1:
                    # One request: await its future itself, with a timer that ends it at the
                    # deadline. asyncio.wait (or wait_for) would add a waiter, and a turn of
                    # the loop, to every round trip.
                    (future,) = waiting
                    resets = self.resets
                    if not future.done():
                        timer = loop.call_later(timeout_s, _expire, future)
                        try:
                            await future
                        finally:
                            timer.cancel()
                    ended = [(waiting.pop(future), self._expired_or_reset(future.result(), resets))]
                else:
                    done, _ = await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
                    ended = [(waiting.pop(future), future.result()) for future in done]
                expired = False
                failed = None
                for pending, matched in ended:
                    if matched.__class__ is _Failed:
                        round_.on_dropped(pending)
                        failed = matched
                    else:
                        expired |= self._outcome(round_, pending, matched)
                if failed is not None:
                    await self._failed(round_, waiting, failed)
                else:
                    await self._settle(round_, waiting, deadline_ns if expired else 0)
        except BaseException:
            round_.abandon()
            self._forget_waiters(waiting)
            raise
        return job.result()

    async def _failed(self, round_: ReserveRound, waiting: dict, failed: _Failed) -> None:
        """A request of the round found its connection refused: the round decides (see
        :meth:`ReserveRound.on_failed`), and the connection goes, unless another task has
        already moved the client on from it (the round's requests then go on the next)."""
        if failed.link is not self._watch:
            return
        now_ns = time.monotonic_ns()
        try:
            sleep_s = round_.on_failed(failed.error, now_ns)
        finally:  # as _connection_failed, but the round's own waiters are forgotten before the
            # reset answers every waiter left with None (a reset under it, to a round)
            self._forget_waiters(waiting)
            self._reset(rotate=True, now_ns=now_ns)
        if sleep_s:
            await asyncio.sleep(sleep_s)

    def _expired_or_reset(self, matched, resets: int):
        """A future its timer ended (``_EXPIRED``) whose connection another task reset
        before this one resumed: its socket went, as for any request the reset dropped
        (None), so the timeout is not this endpoint's again (counted twice, it would send
        the client back to the endpoint that just failed)."""
        if matched is _EXPIRED and self.resets != resets:
            return None
        return matched

    def _outcome(self, round_: ReserveRound, pending: Pending, matched) -> bool:
        """What a request's future ended with, to its round; True if it was its deadline."""
        if matched is None:  # the socket was reset under it
            round_.on_dropped(pending)
        elif matched is _LOST:  # its fast connection closed: asked again
            round_.on_dropped(pending)
            self._core.abandon((pending,))
        elif matched is _EXPIRED:  # its deadline came: settle() takes it from here
            return True
        else:
            round_.on_reply(*matched)
        return False

    async def _settle(self, round_: ReserveRound, waiting: dict, expired_deadline_ns: int) -> None:
        """After a wait: reset the connection and back off as :meth:`ReserveRound.settle` says.
        A deadline that expired a request is at least "now" for it, whatever the clock
        read a moment ago (the timer may fire a hair early)."""
        now_ns = max(time.monotonic_ns(), expired_deadline_ns)
        reset, sleep_s = round_.settle(now_ns)
        if reset:
            self._forget_waiters(waiting)
            self._reset(rotate=True, now_ns=now_ns)
        if sleep_s:
            await asyncio.sleep(sleep_s)

    def _forget_waiters(self, waiting: dict[asyncio.Future, Pending]) -> None:
        fast = self._fast.waiters if self._fast is not None else {}
        for pending in waiting.values():
            self._waiters.pop(pending.request_id, None)
            fast.pop(pending.request_id, None)
        waiting.clear()

    async def status(self) -> dict:
        """The broker's view of itself and its workers."""
        return await self._ask_json("status")

    async def layout(self) -> Layout:
        """The layout of the IDs the nodes mint (STATUS's ``layout``), asked once and kept."""
        if self._layout is None:
            self._layout = Layout.from_dict((await self.status())["layout"])
        return self._layout

    async def bounds(self, start, end=None, *, closed: bool = False) -> tuple[IdRange, ...]:
        """:meth:`snowfence.Layout.bounds` in the nodes' layout: per shard, the lowest and
        highest ID that can carry a time, or the range ``[start, end)`` (``closed``: end included)."""
        return (await self.layout()).bounds(start, end, closed=closed)

    async def watermark(self) -> Watermark:
        """The cluster's watermark W (:class:`~snowfence.clients.core.Watermark`): no ID
        carrying a millisecond before ``W.unix_ms`` is minted, by any node, after this call
        returns it. A pipeline that has seen every ID minted so far below ``W.lowest`` (per
        shard: ``W.ids(layout)``) may close its window there. It lags the wall clock by
        about the lease renewal interval plus the node's ``watermark_interval_s``. Raises
        ``WatermarkUnavailable`` (retriable) while the node has promised none yet."""
        return await self._ask_json("watermark")

    async def nodes(self) -> dict:
        """The cluster's live nodes as the broker sees them: ``{"cluster", "nodes": [...]}``."""
        return await self._ask_json("nodes")

    async def _discover(self) -> bool:
        """Ask for the cluster's nodes when it is time to (other tasks' requests on the
        socket keep it where it is until they are done: see the core). Never fails the call;
        True when the request went unanswered (the client has reset and moved on, as for
        any request): the caller counts that against its call."""
        ask = self._discovery(time.monotonic_ns())
        if ask is None:
            return False
        pending, frame = ask
        future = await self._ask(pending, frame)
        try:
            matched = await asyncio.wait_for(future, max(0.0, (pending.deadline_ns - time.monotonic_ns()) / 1e9))
        except TimeoutError:
            # As for any request: the endpoint failed, and the socket goes with what is on it.
            self._waiters.pop(pending.request_id, None)
            self._reset(rotate=True, now_ns=time.monotonic_ns())
            return True
        if matched.__class__ is _Failed:  # refused: the call's own request learns why
            self._core.abandon((pending,))
            if matched.link is self._watch:
                self._reset(rotate=False)
            return False
        self._discovered(None if matched is None else matched[1])
        return False

    async def _ask_json(self, what: str) -> dict:
        round_ = StatusRound(self, what, time.monotonic_ns())
        if round_.discovers_first and await self._discover():
            round_.on_lost(time.monotonic_ns(), how=self._timeout_note())
        while True:
            pending, frame = round_.request(time.monotonic_ns())
            future = await self._ask(pending, frame)
            try:
                matched = await asyncio.wait_for(future, max(0.0, (pending.deadline_ns - time.monotonic_ns()) / 1e9))
            except TimeoutError:
                self._waiters.pop(pending.request_id, None)
                now_ns = time.monotonic_ns()
                how = self._timeout_note()
                self._reset(rotate=True, now_ns=now_ns)
                round_.on_lost(now_ns, how=how)
                continue
            if matched is None:  # the socket was reset under it
                round_.on_lost(time.monotonic_ns(), timed_out=False)
                continue
            if matched.__class__ is _Failed:  # refused: the round decides, then the connection goes
                self._core.abandon((pending,))
                if matched.link is self._watch:
                    sleep_s = self._connection_failed(round_, matched.error, time.monotonic_ns())
                    if sleep_s:
                        await asyncio.sleep(sleep_s)
                continue
            return round_.on_reply(matched[1])

    async def ids(
        self, batch: int = protocol.MAX_BLOCK, prefetch: int = 64, max_age_s: float | None = 1.0
    ) -> AsyncIterator[int]:
        """An endless async iterator of IDs that keeps blocks in hand (see ``Client.ids``).

        A background task refills the blocks; the number kept adapts to the
        consumer between 1 and ``prefetch``. No ID is handed out more than
        ``max_age_s`` after the client asked for its block, checked at each ID
        (None: nothing checked or dropped).
        """
        prefetched = Prefetch(PrefetchDepth(batch, prefetch, max_age_s))
        wanted = asyncio.Event()
        arrived = asyncio.Event()

        async def refill() -> None:
            try:
                while True:
                    while not prefetched.wanted():
                        wanted.clear()
                        await wanted.wait()
                    asked_ns = time.monotonic_ns()  # before the blocks are minted: their age counts from here
                    got = await self._reserve(prefetched.wanted(), chunk=batch)
                    prefetched.add(got, asked_ns)
                    arrived.set()
            except SnowfenceError as exc:
                prefetched.error = exc
                arrived.set()

        task = asyncio.get_running_loop().create_task(refill())
        clock = time.monotonic_ns
        try:
            while True:
                taken = prefetched.take(clock())
                wanted.set()  # room for a block, or the consumer starved: the refill goes on
                if taken is None:
                    arrived.clear()
                    await arrived.wait()
                    continue
                ids, deadline_ns = taken
                for id_ in ids if deadline_ns is None else fresh(ids, deadline_ns, clock):
                    yield id_
        finally:
            task.cancel()

    async def close(self) -> None:
        self._reset(rotate=False)
        self._closed = True

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
