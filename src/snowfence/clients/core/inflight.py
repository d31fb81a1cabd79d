"""The request table: the requests a client has on the wire (:class:`Core`), each a
:class:`Pending`, and which of them a reply answers."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from ... import protocol
from ...errors import SnowfenceError


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

    def watermark(self, deadline_ns: int, job: object = None) -> tuple[Pending, bytes]:
        rid = next(self._ids)
        pending = Pending(rid, protocol.WATERMARK, 0, deadline_ns, job)
        self.inflight[rid] = pending
        return pending, protocol.encode_watermark(rid)

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

    def abandon(self, pendings) -> None:
        for p in pendings:
            self.inflight.pop(p.request_id, None)
