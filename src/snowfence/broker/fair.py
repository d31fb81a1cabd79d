"""Fair sharing of a saturated node between client connections.

The router places a request at a worker at once when one has room. When none
has, the request waits here, in a queue of its own connection, and the
connections with work waiting take turns by deficit round robin weighed by IDs
(Shreedhar and Varghese's DRR): at each turn a connection earns ``QUANTUM`` IDs
of credit and sends requests while its credit covers them. A bulk loader with a
thousand blocks queued and a pipeline asking for one ID then alternate, one
block's worth each, instead of the pipeline waiting behind the whole backlog;
two greedy connections get equal shares of IDs whatever their request sizes.

A request costs at least ``MIN_COST_IDS``: a request carries work of its own
(two hops, a minter call) besides its IDs, so a stream of single-ID requests
cannot take 4,096 turns for each block another connection gets.

Nothing here touches a socket or a clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

#: IDs a connection may send per turn: one full block of the default layout.
QUANTUM = 4096
#: The least a request costs, in IDs (about one request's broker and worker time
#: in minting time of the default layout: ~16 us of 4,096 IDs per ms).
MIN_COST_IDS = 64


class Conn:
    """One client connection's share: what it has in flight and what waits."""

    __slots__ = ("addr", "inflight", "ids", "queue", "deficit")

    def __init__(self, addr: bytes) -> None:
        self.addr = addr
        #: Requests accepted and not yet answered (waiting here or at a worker).
        self.inflight = 0
        #: IDs those requests ask for.
        self.ids = 0
        #: Requests waiting for a worker: (meta, body, count).
        self.queue: deque[tuple[int, bytes, int]] = deque()
        self.deficit = 0


def cost(count: int) -> int:
    return count if count > MIN_COST_IDS else MIN_COST_IDS


class FairQueue:
    """Connections with requests waiting, served in turns of ``QUANTUM`` IDs."""

    def __init__(self, quantum: int = QUANTUM) -> None:
        self.quantum = quantum
        #: Connections with requests waiting; the first one is having its turn.
        self.active: deque[Conn] = deque()
        #: Whether the first connection's turn has begun (it has been given its quantum).
        self._turn = False

    def __bool__(self) -> bool:
        return bool(self.active)

    def __len__(self) -> int:
        """Requests waiting, over all connections."""
        return sum(len(c.queue) for c in self.active)

    def push(self, conn: Conn, item: tuple[int, bytes, int], front: bool = False) -> None:
        """Queue a request; ``front`` for one that was already its connection's turn (a retry)."""
        if not conn.queue:
            self.active.append(conn)
        if front:
            conn.queue.appendleft(item)
        else:
            conn.queue.append(item)

    def serve(self, place: Callable[[Conn, int, bytes, int], bool]) -> None:
        """Hand waiting requests to ``place(conn, meta, body, count)`` in fair order
        until it returns False (no worker has room for that request)."""
        active = self.active
        while active:
            conn = active[0]
            if not self._turn:
                conn.deficit += self.quantum
                self._turn = True
            meta, body, count = conn.queue[0]
            c = count if count > MIN_COST_IDS else MIN_COST_IDS
            if conn.deficit < c:
                # Its turn is used up; what is left of its credit carries over.
                active.rotate(-1)
                self._turn = False
                continue
            if not place(conn, meta, body, count):
                return
            conn.queue.popleft()
            conn.deficit -= c
            if not conn.queue:
                conn.deficit = 0  # an idle connection saves up no credit
                active.popleft()
                self._turn = False

    def drain(self) -> list[tuple[Conn, int, bytes, int]]:
        """Take every waiting request out, in queue order per connection."""
        out = []
        for conn in self.active:
            while conn.queue:
                meta, body, count = conn.queue.popleft()
                out.append((conn, meta, body, count))
            conn.deficit = 0
        self.active.clear()
        self._turn = False
        return out
