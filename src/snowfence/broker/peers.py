"""Clock offsets to the other nodes of a cluster, NTP style, over the client protocol,
and the verdict on this node's clock drawn from them.

Every ``interval_s`` the broker sends each peer a TIME request stamped with its
own wall clock (t1); the peer answers with its wall clock when it received the
request (t2) and when it replied (t3); the answer arrives at t4. Then::

    offset = ((t2 - t1) + (t3 - t4)) / 2     how far the peer is ahead of us
    delay  = (t4 - t1) - (t3 - t2)           the round trip, which bounds the error

A peer whose request could not be sent yet (its connection is not up: the
sockets take no message for a peer they are not connected to) is tried again at
every turn of the loop until the next round, so a node just started hears its
peers as soon as it can reach them, not a round later.

The peers are a static list (``--peers``) and, in etcd mode, every other node
registered in the cluster's membership (:mod:`snowfence.broker.membership`),
so no list is needed.

The verdict (:class:`ClockJudge`), with a bound set (``max_peer_offset_ms``):

* **pending** from the start until a majority of the cluster (this node and its
  known members) vouches for the clock: members that answered at least once, with
  offsets within the bound (allowing for half the round trip). Nothing is claimed
  meanwhile.
* **vouched**: claims count on this clock. From then on the peers answering
  lately vote (one that stopped answering does not).
* **alone**: no other member is registered, or none answered within
  ``wait_s`` (the bounded wait): nobody can judge the clock, and the node says so.
* **vetoed**: no majority of the cluster (itself included) agrees with the clock.
  That covers a clock a majority disagrees with, and the clocks of two nodes (or
  two halves of a cluster) apart by more than the bound, where nobody can tell
  which is wrong: each side is vetoed. A vetoed node leaves rotation, claims
  nothing and lets go of the worker IDs it holds.
* **unvouched**: the bounded wait is over, some members answered, but no majority
  vouches yet (too few answered): refused by name, as vetoed, until one does.
* **unbounded**: no bound set (0): offsets are only measured.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import zmq

from .. import protocol
from ..clock import PENDING_VERDICT

STALE_AFTER_INTERVALS = 3
#: How long a node waits for a majority of its known members to answer before it takes
#: a verdict without them (alone if none answered; refused by name if too few did).
FIRST_VERDICT_WAIT_INTERVALS = 5

PENDING, VOUCHED, ALONE = "pending", "vouched", "alone"
VETOED, UNVOUCHED, UNBOUNDED = "vetoed", "unvouched", "unbounded"
#: Every state a verdict can be in (the label values of ``snowfence_clock_verdict``).
STATES = (PENDING, VOUCHED, ALONE, VETOED, UNVOUCHED, UNBOUNDED)


@dataclass(frozen=True)
class Verdict:
    """The node's clock as its peers see it."""

    state: str
    #: A reason to leave rotation because a majority of the cluster disagrees, or None.
    rotation: str | None
    #: Why no claim may count on this clock and nothing is minted (None: they may):
    #: :data:`~snowfence.clock.PENDING_VERDICT` while pending, a reason by name otherwise.
    claims: str | None
    #: What the state means here, in words (for the log and STATUS).
    reason: str
    #: Members answering lately whose clocks agree with this one.
    vouching: int = 0
    #: Members that answered at least once.
    answered: int = 0
    #: The other members known (the static peers and the registered nodes).
    members: int = 0

    @property
    def refused(self) -> bool:
        """Out of rotation and no claims, by name (vetoed, or unvouched after the wait)."""
        return self.state in (VETOED, UNVOUCHED)

    def to_dict(self) -> dict:
        return {
            "state": self.state,
            "reason": self.reason,
            "refusal": self.claims if self.refused else None,
            "vouching": self.vouching,
            "answered": self.answered,
            "members": self.members,
        }


def vouches(offset: tuple[int, int, int], bound_ns: int) -> bool:
    """Whether a peer's offset (offset, round trip, measured at) agrees with this clock."""
    return abs(offset[0]) - offset[1] // 2 <= bound_ns


class ClockJudge:
    """The verdict on this node's clock from its peers' offsets. No sockets and no clock of
    its own: the broker (and the simulator) give it what was measured and the time."""

    def __init__(self, *, bound_ns: int, interval_ns: int, wait_ns: int, started_ns: int) -> None:
        self.bound_ns = bound_ns
        self.interval_ns = interval_ns
        self.wait_ns = wait_ns
        self.started_ns = started_ns
        #: Whether a first verdict was given (vouched, or alone): the peers answering lately vote.
        self.settled = False

    def judge(
        self,
        offsets: dict[str, tuple[int, int, int]],
        members: Collection[str],
        answered: Collection[str],
        complete: bool,
        now_ns: int,
    ) -> Verdict:
        """``offsets``: endpoint -> (offset, round trip, measured at monotonic ns);
        ``members``: the other members known; ``answered``: those that answered at least
        once; ``complete``: whether the members are known yet (the membership was read)."""
        n = len(members)
        if not self.bound_ns:
            return Verdict(UNBOUNDED, None, None, "no bound on the peers' offsets: only measured", members=n)
        rotation, claims = verdicts(offsets, now_ns, self.bound_ns, self.interval_ns)
        stale_ns = STALE_AFTER_INTERVALS * self.interval_ns
        fresh = [o for o in offsets.values() if now_ns - o[2] < stale_ns]
        agreeing = sum(1 for o in fresh if vouches(o, self.bound_ns))
        heard = len(set(answered) & set(members))
        counts = {"vouching": agreeing, "answered": heard, "members": n}
        if self.settled:
            if claims:
                return Verdict(VETOED, rotation, claims, claims, **counts)
            if not fresh:
                why = "no other member answered lately" if n else "no other member"
                why = f"alone, not judged: {why}"
                return Verdict(ALONE, None, None, why, **counts)
            return Verdict(VOUCHED, None, None, f"{agreeing} of {len(fresh)} members answering vouch", **counts)
        # The first verdict: a majority of the whole cluster as known (this node and its
        # members), not of those that happened to answer.
        needed = (n + 1) // 2
        if n and agreeing >= needed:
            self.settled = True
            return Verdict(VOUCHED, None, None, f"{agreeing} of {n} other members vouch", **counts)
        if complete and not n:
            self.settled = True
            return Verdict(ALONE, None, None, "alone, not judged: no other member is registered", **counts)
        if claims and n - (len(fresh) - agreeing) < needed:  # no majority can vouch any more
            return Verdict(VETOED, rotation, claims, claims, **counts)
        waited_s = self.wait_ns / 1e9
        if now_ns - self.started_ns < self.wait_ns:
            return Verdict(
                PENDING,
                rotation,
                PENDING_VERDICT,
                f"waiting up to {waited_s:g} s for {needed} of {n} members",
                **counts,
            )
        if not heard:
            self.settled = True
            why = f"none of the {n} other members answered within {waited_s:g} s" if n else "no other member known"
            return Verdict(ALONE, None, None, f"alone, not judged: {why}", **counts)
        why = (
            f"no majority of the cluster vouches for this clock: {agreeing} of {n} other members do "
            f"({heard} answered within {waited_s:g} s), {needed} must"
        )
        return Verdict(UNVOUCHED, None, why, why, **counts)


class PeerClocks:
    def __init__(
        self,
        ctx: zmq.Context,
        peers: list[str],
        *,
        interval_s: float,
        bound_ms: int,
        curve=None,
        complete: bool = True,
        wait_s: float | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.bound_ns = bound_ms * 1_000_000
        self._ctx = ctx
        self._curve = curve
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self.sockets: dict[zmq.Socket, str] = {}
        #: endpoint -> (offset_ns, delay_ns, measured at monotonic ns)
        self.offsets: dict[str, tuple[int, int, int]] = {}
        #: The members that answered at least once (while they are members).
        self.answered: set[str] = set()
        #: Whether the members are known yet (the static list is; the membership, once read).
        self.complete = complete
        self._sent: dict[int, tuple[zmq.Socket, int, int]] = {}
        #: Peers whose request of this round is still to be sent (not connected yet).
        self._unsent: list[zmq.Socket] = []
        self._ids = itertools.count(1)
        self._next_ns = 0
        self._changed = True
        #: When the verdict must be taken again because an offset that counts goes stale.
        self._stale_ns = 1 << 62
        wait_ns = int((interval_s * FIRST_VERDICT_WAIT_INTERVALS if wait_s is None else wait_s) * 1e9)
        self.judging = ClockJudge(
            bound_ns=self.bound_ns, interval_ns=self.interval_ns, wait_ns=wait_ns, started_ns=mono_ns()
        )
        self.verdict = Verdict(PENDING, None, PENDING_VERDICT if self.bound_ns else None, "not judged yet")
        #: Rounds sent.
        self.rounds = 0
        self.set_peers(peers, complete)

    @property
    def veto(self) -> str | None:
        """A reason to leave rotation because a majority disagrees with this clock, or None."""
        return self.verdict.rotation

    @property
    def claim_veto(self) -> str | None:
        """Why no claim may count on this clock (pending, or refused by name), or None."""
        return self.verdict.claims

    @property
    def judged(self) -> bool:
        """Whether the verdict is one (no longer pending)."""
        return self.verdict.state != PENDING

    def set_peers(self, peers: list[str], complete: bool = True) -> None:
        """Measure against exactly ``peers`` from now on (a node's membership changes);
        ``complete``: the list is the whole membership (False before it was first read).
        Closes the sockets of peers that left: the caller's epoll set lets go of them first."""
        if complete != self.complete:
            self.complete = complete
            self._changed = True
        wanted = list(dict.fromkeys(peers))
        have = {ep: sock for sock, ep in self.sockets.items()}
        if set(wanted) == set(have):
            return
        self._changed = True
        for endpoint, sock in have.items():
            if endpoint not in wanted:
                del self.sockets[sock]
                self.offsets.pop(endpoint, None)  # a node that left does not vote
                self.answered.discard(endpoint)
                if sock in self._unsent:
                    self._unsent.remove(sock)
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
            self._unsent.append(sock)  # measured this round, not a round later

    def tick(self, now_ns: int) -> None:
        """A turn of the broker's loop: a new round when due, the requests not sent yet
        tried again, and the verdict taken again when something changed (or is pending)."""
        if now_ns >= self._next_ns:
            self._next_ns = now_ns + self.interval_ns
            self._sent.clear()  # answers to older rounds no longer count
            self.rounds += 1
            self._unsent = list(self.sockets)
            self._changed = True  # offsets go stale with time
        if self._unsent:
            waiting = []
            for sock in self._unsent:
                rid = next(self._ids)
                try:
                    sock.send(protocol.encode_time(rid), zmq.NOBLOCK)
                except zmq.Again:
                    waiting.append(sock)  # not connected yet: tried again at the next turn
                    continue
                self._sent[rid] = (sock, self._wall_ns(), self._mono_ns())
            self._unsent = waiting
        if self._changed or not self.judging.settled or now_ns >= self._stale_ns:
            self._changed = False
            self.judge(now_ns)

    def on_readable(self, sock: zmq.Socket) -> None:
        while True:
            try:
                body = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            t4, t4_mono = self._wall_ns(), self._mono_ns()
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
            endpoint = self.sockets[sock]
            self.offsets[endpoint] = ((t2 - t1 + t3 - t4) // 2, round_trip, t4_mono)
            self.answered.add(endpoint)
            self._changed = True

    def judge(self, now_ns: int) -> str | None:
        """Take the verdict (:attr:`verdict`) again; a reason to leave rotation, or None."""
        self.verdict = self.judging.judge(
            self.offsets, list(self.sockets.values()), self.answered, self.complete, now_ns
        )
        stale_ns = STALE_AFTER_INTERVALS * self.interval_ns
        # Judged again when the first offset that counts now goes stale (it stops voting).
        self._stale_ns = min(
            (o[2] + stale_ns for o in self.offsets.values() if now_ns - o[2] < stale_ns), default=1 << 62
        )
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
    disagree = {ep: o for ep, o in fresh.items() if not vouches(o, bound_ns)}
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
