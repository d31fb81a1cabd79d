"""The broker's ROUTER sockets: clients in front, workers behind.

:class:`ZmqFront` owns the two sockets (binding, CURVE, frame and queue limits,
the ipc:// socket file), takes each client message apart into its one request
and receives what workers send; every decision is the routing core's
(:class:`snowfence.broker.routing.Routing`), which requests it drops unanswered too
(its gate, ``broker/gate.py``: revoked CURVE keys, impostors), and it answers through
this module's :meth:`ZmqFront.to_client` and :meth:`ZmqFront.to_worker`.
"""

from __future__ import annotations

import os

import zmq
import zmq.backend

from ... import protocol
from ...config import Config
from ...errors import BadRequest, ConfigError
from ..auth import CurveServer
from ..routing import Routing

#: Messages taken from one socket per wake-up before the other gets a turn.
BATCH = 256
#: Frames larger than this are dropped by libzmq before they reach Python.
MAX_FRAME_BYTES = 64 * 1024

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
_SNDMORE_NOBLOCK = _SNDMORE | _NOBLOCK
#: What a send to a worker whose socket is gone fails with (ROUTER_MANDATORY).
_GONE = (zmq.EHOSTUNREACH, zmq.EAGAIN)


class ZmqFront:
    """The frontend and backend ROUTER sockets, handing what arrives to a :class:`Routing`
    core (``core``, given by :meth:`serve`)."""

    def __init__(
        self,
        ctx: zmq.Context,
        config: Config,
        backend_endpoint: str,
        curve: CurveServer | None = None,
    ) -> None:
        self.config = config
        self.core: Routing | None = None
        #: Set on every send on a ZeroMQ socket outside the loop's reads of them (the loop
        #: reads and clears it: it must then look at the sockets' events again).
        self.zmq_used = False
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

    def serve(self, core: Routing) -> None:
        """Hand clients' requests and workers' frames to ``core`` from now on."""
        self.core = core

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

    def endpoint(self) -> str:
        return self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- clients ----------------------------------------------------------------------

    def on_frontend(self) -> None:
        """Up to ``BATCH`` client messages, each one request: to the core's intake
        (:meth:`Routing.requests`) as soon as it is read. Handing it several at once
        held a neighbour's single ID back behind a pipeline's reads (its p50 beside one
        went from 0.15 to 0.18 ms in benchmarks/isolation.py); one at a time costs no
        throughput that benchmarks/broker_vs_proxy.py can tell apart."""
        front = self.frontend
        core = self.core
        requests = core.requests
        admits = core.gate.admits
        allow_list = core.gate.allow_list
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
            # The connection's CURVE key is read only while the allow-list has revoked keys:
            # a microsecond a message otherwise spent for nothing.
            key = frame.get("User-Id").encode() if allow_list.revoked else None
            if not admits(addr, key):  # the core's gate (broker/gate.py): dropped, unanswered
                while frame.more:
                    frame = _recv(front, 0, False)
                continue
            if frame.more:
                while _recv(front, 0, False).more:
                    pass
                core.bad_request(
                    meta, addr, BadRequest("a request is one body frame, optionally after one empty delimiter")
                )
                continue
            requests(((meta, addr, body),))

    def to_client(self, meta: int, addr: bytes, reply: bytes) -> None:
        """One reply to a ZeroMQ client (``addresses.Doors`` sends the others' elsewhere)."""
        front = self.frontend
        self.zmq_used = True
        _send(front, addr, _SNDMORE)
        if meta & _META_DELIMITED:
            _send(front, b"", _SNDMORE)
        _send(front, reply)

    # -- workers ----------------------------------------------------------------------

    def on_backend(self) -> None:
        """Up to ``BATCH`` frames from workers: to the core."""
        back = self.backend
        on_worker = self.core.on_worker
        for _ in range(BATCH):
            try:
                ident = _recv(back, _NOBLOCK)
            except zmq.Again:
                break
            # Only our own workers reach this private ipc endpoint, and they send
            # exactly one frame after the identity.
            on_worker(ident, _recv(back))
        self.core.schedule()

    def to_worker(self, ident: bytes, frame: bytes) -> bool:
        """Send ``frame`` to the worker whose socket is ``ident``; False if it is gone.

        Never blocks: the backend has no high-water mark, so a send fails only
        for a worker that has disconnected."""
        back = self.backend
        self.zmq_used = True
        try:
            _send(back, ident, _SNDMORE_NOBLOCK)
            _send(back, frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno not in _GONE:
                raise
            return False
        return True

    def close(self) -> None:
        self.frontend.close()
        self.backend.close()
        if self._ipc_path is not None:
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass
            self._ipc_path = None
