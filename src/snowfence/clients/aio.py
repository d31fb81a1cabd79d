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
from .core import Block, ClientBase, Pending, Prefetch, PrefetchDepth, ReserveJob, ReserveRound, StatusRound


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
    async iterator), ``await status()``, ``await nodes()``; use ``async with``.
    Discovery (``discover``, ``region``) as for :class:`snowfence.Client`.
    """

    def _init_transport(self) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._waiters: dict[int, asyncio.Future] = {}
        self._closed = False

    # -- transport ----------------------------------------------------------------------

    def _socket(self) -> zmq.asyncio.Socket:
        if self._closed:
            raise SnowfenceError("the client is closed")
        if self._sock is None:
            self._sock = self._dealer()
            self._reader = asyncio.get_running_loop().create_task(self._read(self._sock))
        return self._sock

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

    def _reset(self, rotate: bool = True) -> None:
        """Close the socket with everything still on it; the waiters learn it is gone."""
        for future in self._waiters.values():
            if not future.done():
                future.set_result(None)
        self._waiters.clear()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        super()._reset(rotate)

    async def _ask(self, pending: Pending, frame: bytes) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters[pending.request_id] = future
        await self._socket().send(frame)
        return future

    # -- public API ---------------------------------------------------------------------

    async def reserve(self, n: int, *, after: int | None = None) -> list[Block]:
        """Reserve ``n`` IDs: blocks, in ID order, whose counts sum to ``n``."""
        return await self._reserve(n, after=after)

    async def _reserve(self, n: int, *, after: int | None = None, chunk: int = protocol.MAX_BLOCK) -> list[Block]:
        job = ReserveJob(n, window=self.window, retries=self.retries, after=after, chunk=chunk)
        round_ = ReserveRound(self, job, time.monotonic_ns())
        await self._discover()
        waiting: dict[asyncio.Future, Pending] = {}
        try:
            while not round_.done:
                now = time.monotonic_ns()
                for pending, frame in round_.requests(now):
                    waiting[await self._ask(pending, frame)] = pending
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=max(0.0, (round_.deadline_ns(now) - time.monotonic_ns()) / 1e9),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for future in done:
                    pending = waiting.pop(future)
                    matched = future.result()
                    if matched is None:  # the socket was reset under it
                        round_.on_dropped(pending)
                    else:
                        round_.on_reply(*matched)
                reset, sleep_s = round_.settle(time.monotonic_ns())
                if reset:
                    self._forget_waiters(waiting)
                    self._reset()
                if sleep_s:
                    await asyncio.sleep(sleep_s)
        except BaseException:
            round_.abandon()
            self._forget_waiters(waiting)
            raise
        return job.result()

    def _forget_waiters(self, waiting: dict[asyncio.Future, Pending]) -> None:
        for pending in waiting.values():
            self._waiters.pop(pending.request_id, None)
        waiting.clear()

    async def status(self) -> dict:
        """The broker's view of itself and its workers."""
        return await self._ask_json("status")

    async def nodes(self) -> dict:
        """The cluster's live nodes as the broker sees them: ``{"cluster", "nodes": [...]}``."""
        return await self._ask_json("nodes")

    async def _discover(self) -> None:
        """Ask for the cluster's nodes when it is time to (other tasks' requests on the
        socket keep it where it is until they are done: see the core). Never fails the call."""
        ask = self._discovery(time.monotonic_ns())
        if ask is None:
            return
        pending, frame = ask
        future = await self._ask(pending, frame)
        try:
            matched = await asyncio.wait_for(future, max(0.0, (pending.deadline_ns - time.monotonic_ns()) / 1e9))
        except TimeoutError:
            # As for any request: the endpoint failed, and the socket goes with what is on it.
            self._waiters.pop(pending.request_id, None)
            self._reset()
            return
        self._discovered(None if matched is None else matched[1])

    async def _ask_json(self, what: str) -> dict:
        round_ = StatusRound(self, what, time.monotonic_ns())
        if what != "nodes":
            await self._discover()
        while True:
            pending, frame = round_.request(time.monotonic_ns())
            future = await self._ask(pending, frame)
            try:
                matched = await asyncio.wait_for(future, self.timeout_s)
            except TimeoutError:
                self._waiters.pop(pending.request_id, None)
                self._reset()
                round_.on_lost(time.monotonic_ns())
                continue
            if matched is None:  # the socket was reset under it
                round_.on_lost(time.monotonic_ns(), timed_out=False)
                continue
            return round_.on_reply(matched[1])

    async def ids(
        self, batch: int = protocol.MAX_BLOCK, prefetch: int = 64, max_age_s: float | None = 1.0
    ) -> AsyncIterator[int]:
        """An endless async iterator of IDs that keeps blocks in hand (see ``Client.ids``).

        A background task refills the blocks; the number kept adapts to the
        consumer between 1 and ``prefetch``, and blocks older than ``max_age_s``
        when their turn comes are dropped.
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
                    got = await self._reserve(prefetched.wanted(), chunk=batch)
                    prefetched.add(got, time.monotonic_ns())
                    arrived.set()
            except SnowfenceError as exc:
                prefetched.error = exc
                arrived.set()

        task = asyncio.get_running_loop().create_task(refill())
        try:
            while True:
                ids = prefetched.take(time.monotonic_ns())
                wanted.set()  # room for a block, or the consumer starved: the refill goes on
                if ids is None:
                    arrived.clear()
                    await arrived.wait()
                    continue
                for id_ in ids:
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
