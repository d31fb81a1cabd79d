"""The router's sockets around the routing core: real ZeroMQ sockets on inproc://
endpoints stand in for a client and a worker, and the test turns the crank
(on_frontend, on_backend) itself. What the core decides is tested without
sockets in test_routing.py; this is only the wiring."""

from __future__ import annotations

import itertools
import select

import zmq

from snowfence import protocol
from snowfence.broker.main import open_doors
from snowfence.broker.routing import Routing
from snowfence.config import Config

_names = itertools.count()


def recv_all(sock: zmq.Socket) -> list[list[bytes]]:
    """Every message waiting at ``sock`` (a short wait for the first)."""
    out = []
    while sock.poll(200 if not out else 20):
        out.append(sock.recv_multipart())
    return out


def test_frames_in_and_out_and_a_multi_frame_request_is_refused_with_bad_request():
    ctx = zmq.Context()
    n = next(_names)
    config = Config(bind=f"inproc://front-{n}")
    _, router, fast, http = open_doors(ctx, config, f"inproc://back-{n}")
    assert fast is None and http is None  # an ipc:// or inproc:// bind has neither
    socks = []

    def socket(kind: int, endpoint: str, identity: bytes | None = None) -> zmq.Socket:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        if identity:
            s.setsockopt(zmq.IDENTITY, identity)
        s.connect(endpoint)
        socks.append(s)
        return s

    def pump() -> None:
        for _ in range(5):
            router.on_frontend()
            router.on_backend()

    try:
        worker = socket(zmq.DEALER, f"inproc://back-{n}", identity=b"w0")
        worker.send(protocol.encode_state(protocol.WorkerState(slot=0, pid=1000, ready=True, ready_ids=1, credits=32)))
        pump()
        assert [link.pid for link in router.core.rotation] == [1000]
        client = socket(zmq.DEALER, config.bind)
        client.send(protocol.encode_reserve(1, 5))  # one body frame
        client.send_multipart([b"", protocol.encode_reserve(2, 6)])  # after an empty delimiter, as REQ sends
        client.send_multipart([b"", protocol.encode_reserve(3, 7), b"more"])
        pump()

        # The worker gets WORK frames carrying each request, its return address and framing.
        frames = [frame for [frame] in recv_all(worker)]
        assert frames[0] == protocol.encode_clock(None)  # first, the clock's verdict
        work = [protocol.split_routed(frame) for frame in frames[1:]]
        assert [(meta, protocol.plain_reserve(body)) for meta, _, body in work] == [
            (0, (1, 5)),
            (protocol.META_DELIMITED, (2, 6)),
        ]
        # The request of three frames was answered at once, delimited as it came.
        [[empty, refused]] = recv_all(client)
        error = protocol.decode_reply(refused).error
        assert empty == b"" and error.code == "bad_request" and router.core.counters["bad_request"] == 1

        for meta, addr, body in work:
            rid, count = protocol.plain_reserve(body)
            worker.send(protocol.encode_reply(meta, addr, protocol.encode_block(rid, rid << 30, count)))
        pump()
        replies = recv_all(client)
        assert [len(parts) for parts in replies] == [1, 2]  # the delimiter comes back with its reply
        blocks = [protocol.decode_reply(parts[-1]) for parts in replies]
        assert [(b.request_id, b.first, b.count) for b in blocks] == [(1, 1 << 30, 5), (2, 2 << 30, 6)]
        assert router.core.active_connections() == 0

        # A worker whose socket is gone: the send says so, it does not raise.
        assert router.to_worker(b"nobody", protocol.PING_FRAME) is False
        assert router.to_worker(b"w0", protocol.PING_FRAME) is True
        assert recv_all(worker) == [[protocol.PING_FRAME]]
    finally:
        for s in socks:
            s.close(0)
        router.close()
        ctx.term()


def test_the_frontend_and_the_fast_port_hand_every_request_to_the_cores_one_intake(monkeypatch):
    import socket as pysocket

    intake = Routing.requests
    seen: list[tuple[int, bytes, bytes]] = []

    def spy(core, batch):
        seen.extend(batch)
        intake(core, batch)

    monkeypatch.setattr(Routing, "requests", spy)
    ctx = zmq.Context()
    n = next(_names)
    _, router, fast, http = open_doors(
        ctx, Config(bind="tcp://127.0.0.1:*", fast_bind="auto", http_bind="off"), f"inproc://back-{n}"
    )
    assert fast is not None and http is None
    socks: list[zmq.Socket] = []

    def dealer(endpoint: str, identity: bytes | None = None) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if identity:
            s.setsockopt(zmq.ROUTING_ID, identity)
        s.connect(endpoint)
        socks.append(s)
        return s

    def pump() -> None:
        for _ in range(10):
            router.on_frontend()
            router.on_backend()
            readable, _, _ = select.select([fast.listen_fd, *fast.by_fd], [], [], 0.01)
            for fd in readable:
                fast.on_event(fd, select.EPOLLIN)

    plain = None
    try:
        worker = dealer(f"inproc://back-{n}", identity=b"w0")
        worker.send(protocol.encode_state(protocol.WorkerState(slot=0, pid=1000, ready=True, ready_ids=1, credits=32)))
        pump()
        zclient = dealer(router.endpoint())
        zclient.send(protocol.encode_reserve(1, 5))
        zclient.send(protocol.encode_status(2))
        plain = pysocket.create_connection(("127.0.0.1", fast.port), timeout=5)
        pump()
        plain.sendall(b"".join(protocol.encode_stream(protocol.encode_reserve(rid, 7)) for rid in (3, 4)))
        # A ZeroMQ peer posing as the fast connection: refused by the frontend, never the core's.
        dealer(router.endpoint(), identity=next(iter(fast.by_addr))).send(protocol.encode_reserve(5, 1))
        pump()

        assert sorted(protocol.request_id_of(body) for _, _, body in seen) == [1, 2, 3, 4]
        fast_addrs = {addr for _, addr, body in seen if protocol.request_id_of(body) > 2}
        assert len(fast_addrs) == 1 and fast_addrs <= set(fast.by_addr)
        counters = router.core.counters
        assert counters["requests"] == 4 and counters["bad_request"] == 1 and counters["impostors"] == 1
        work = [protocol.split_routed(frame) for [frame] in recv_all(worker)[1:]]  # after the clock's verdict
        assert sorted(protocol.plain_reserve(body) for _, _, body in work) == [(1, 5), (3, 7), (4, 7)]
        assert router.core.queued_ns[0].counts[0] == 3  # each sent to the worker at once: waited 0 s
        [[status]] = recv_all(zclient)
        assert protocol.decode_reply(status).request_id == 2
    finally:
        if plain is not None:
            plain.close()
        for s in socks:
            s.close(0)
        fast.close()
        router.close()
        ctx.term()


def test_the_loops_epoll_set_sees_zeromq_messages_by_their_descriptor_and_plain_ones_by_theirs():
    import socket as pysocket

    from snowfence.broker.main import _EVENTS, _POLLIN, Readiness, _get

    ctx = zmq.Context()
    n = next(_names)
    inbox, outbox = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    inbox.bind(f"inproc://ready-{n}")
    outbox.connect(f"inproc://ready-{n}")
    plain_r, plain_w = pysocket.socketpair()
    ready = Readiness()
    try:
        ready.add_zmq(inbox)
        ready.watch(plain_r.fileno(), select.EPOLLIN)
        assert not _get(inbox, _EVENTS) & _POLLIN  # nothing there yet (reading EVENTS clears the descriptor)
        outbox.send(b"one")
        outbox.send(b"two")
        fired = dict(ready.poll(1.0))
        assert set(fired) <= set(ready.zmq_fds) and fired, "a message wakes the loop by ZMQ_FD"
        assert _get(inbox, _EVENTS) & _POLLIN and inbox.recv() == b"one"
        # The receive took the descriptor's edge: the second message is there, and only
        # the socket's events say so. This is why the loop reads them after any receive.
        assert dict(ready.poll(0)).keys().isdisjoint(ready.zmq_fds)
        assert _get(inbox, _EVENTS) & _POLLIN and inbox.recv() == b"two"
        plain_w.send(b"x")
        assert dict(ready.poll(1.0)) == {plain_r.fileno(): select.EPOLLIN}
        ready.watch(plain_r.fileno(), select.EPOLLIN | select.EPOLLOUT)  # again: modified, not registered twice
        assert select.EPOLLOUT & dict(ready.poll(1.0))[plain_r.fileno()]
        ready.unwatch(plain_r.fileno())
        ready.remove_zmq(inbox)
        assert not ready.zmq_fds and ready.poll(0) == []
    finally:
        ready.close()
        plain_r.close()
        plain_w.close()
        inbox.close(0)
        outbox.close(0)
        ctx.term()
