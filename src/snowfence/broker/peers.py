"""Clock offsets to the other nodes of a cluster, NTP style, over the client protocol.

Every ``interval_s`` the broker sends each peer a TIME request stamped with its
own wall clock (t1); the peer answers with its wall clock when it received the
request (t2) and when it replied (t3); the answer arrives at t4. Then::

    offset = ((t2 - t1) + (t3 - t4)) / 2     how far the peer is ahead of us
    delay  = (t4 - t1) - (t3 - t2)           the round trip, which bounds the error

The peers are a static list (``--peers``) and, in etcd mode, every other node
registered in the cluster's membership (:mod:`snowfence.broker.membership`),
so no list is needed. With a bound set (``max_peer_offset_ms``), a node whose clock disagrees with a
majority of the whole cluster (itself included: with one peer nobody can tell
who is wrong, with two the odd one out can) by more than the bound, allowing
for half the round trip, leaves rotation and says why. Peers that stopped
answering do not vote.

A second, stricter verdict is told to the workers: a node claims no worker ID
unless a majority of the cluster (itself included) agrees with its clock. Every
claim counts on the clock bound (a quarantine, or a mark an etcd restore no
journal saw took back), and where nobody can tell who is wrong (two nodes apart,
a split) neither side can vouch for its clock: both keep minting with the worker
IDs they hold, and claim again once a majority agrees.
"""

from __future__ import annotations

import itertools
import time

import zmq

from .. import protocol

STALE_AFTER_INTERVALS = 3


class PeerClocks:
    def __init__(self, ctx: zmq.Context, peers: list[str], *, interval_s: float, bound_ms: int, curve=None) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.bound_ns = bound_ms * 1_000_000
        self._ctx = ctx
        self._curve = curve
        self.sockets: dict[zmq.Socket, str] = {}
        #: endpoint -> (offset_ns, delay_ns, measured at monotonic ns)
        self.offsets: dict[str, tuple[int, int, int]] = {}
        self._sent: dict[int, tuple[zmq.Socket, int, int]] = {}
        self._ids = itertools.count(1)
        self._next_ns = 0
        self.veto: str | None = None
        #: Set while no majority of the cluster agrees with this clock: no claims (see :func:`verdicts`).
        self.claim_veto: str | None = None
        #: Rounds sent: the first verdict is the one judged when the second round goes out,
        #: on the answers to the first (no peers at all: nothing to disagree with).
        self.rounds = 0
        self.set_peers(peers)

    def set_peers(self, peers: list[str]) -> None:
        """Measure against exactly ``peers`` from now on (a node's membership changes).
        Closes the sockets of peers that left: the caller's epoll set lets go of them first."""
        wanted = list(dict.fromkeys(peers))
        have = {ep: sock for sock, ep in self.sockets.items()}
        if set(wanted) == set(have):
            return
        for endpoint, sock in have.items():
            if endpoint not in wanted:
                del self.sockets[sock]
                self.offsets.pop(endpoint, None)  # a node that left does not vote
                sock.close(0)
        for endpoint in wanted:
            if endpoint in have:
                continue
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 4)  # a peer that is down must not pile requests up
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if self._curve is not None:
                self._curve.apply(sock)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError:
                sock.close(0)  # an endpoint libzmq will not take: that peer does not vote
                continue
            self.sockets[sock] = endpoint

    def tick(self, now_ns: int) -> None:
        if now_ns < self._next_ns:
            return
        self._next_ns = now_ns + self.interval_ns
        self._sent.clear()  # answers to older rounds no longer count
        self.rounds += 1
        for sock in self.sockets:
            rid = next(self._ids)
            try:
                sock.send(protocol.encode_time(rid), zmq.NOBLOCK)
            except zmq.Again:
                continue  # not connected: the peer does not vote
            self._sent[rid] = (sock, time.time_ns(), time.monotonic_ns())
        self.judge(now_ns)

    def on_readable(self, sock: zmq.Socket) -> None:
        while True:
            try:
                body = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            t4, t4_mono = time.time_ns(), time.monotonic_ns()
            try:
                reply = protocol.decode_reply(body)
            except Exception:
                continue
            sent = self._sent.get(reply.request_id)
            if sent is None or sent[0] is not sock:
                continue  # not this peer's request: the peer it went to may still answer it
            del self._sent[reply.request_id]
            if reply.times is None:
                continue
            _, t1, t1_mono = sent
            t2, t3 = reply.times
            # The offset needs our wall clock; our side of the round trip is a
            # duration, measured on the monotonic clock.
            round_trip = (t4_mono - t1_mono) - (t3 - t2)
            self.offsets[self.sockets[sock]] = ((t2 - t1 + t3 - t4) // 2, round_trip, t4_mono)

    @property
    def judged(self) -> bool:
        """Whether :attr:`veto` is a verdict yet (the peers have had one round to answer)."""
        return self.rounds >= 2

    def judge(self, now_ns: int) -> str | None:
        """A reason to leave rotation, or None (and :attr:`claim_veto`, the workers' verdict)."""
        self.veto, self.claim_veto = verdicts(self.offsets, now_ns, self.bound_ns, self.interval_ns)
        return self.veto

    def describe(self) -> dict:
        return {ep: {"offset_s": o / 1e9, "delay_s": d / 1e9} for ep, (o, d, _) in self.offsets.items()}

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(0)


def verdicts(
    offsets: dict[str, tuple[int, int, int]], now_ns: int, bound_ns: int, interval_ns: int
) -> tuple[str | None, str | None]:
    """The node's verdicts from its peers' offsets (endpoint -> (offset, round trip, measured
    at monotonic ns)): a reason to leave rotation (a majority of the cluster, this node
    included, disagrees with it) and a reason to claim no worker ID (no majority agrees
    with it: also two nodes apart, or a cluster split in halves). None: no reason."""
    if not bound_ns:
        return None, None
    fresh = {ep: o for ep, o in offsets.items() if now_ns - o[2] < STALE_AFTER_INTERVALS * interval_ns}
    disagree = {ep: o for ep, o in fresh.items() if abs(o[0]) - o[1] // 2 > bound_ns}
    if not disagree:
        return None, None
    worst = max(disagree.items(), key=lambda kv: abs(kv[1][0]))
    why = (
        f"clock disagrees with {len(disagree)} of {len(fresh)} peers by more than "
        f"{bound_ns // 1_000_000} ms ({worst[0]}: {worst[1][0] / 1e6:+.1f} ms)"
    )
    cluster = len(fresh) + 1
    agree = cluster - len(disagree)  # itself included
    rotation = why if len(disagree) * 2 > cluster else None
    claims = why if agree * 2 <= cluster else None
    if claims and not rotation:
        claims += ": no majority of the cluster vouches for this clock (nor for the others)"
    return rotation, claims
