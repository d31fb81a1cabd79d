"""Fair sharing of a saturated node between client connections.

The routing core places a request at a worker at once when one has room. When none
has, the request waits here, in a queue of its own connection, and the
connections with work waiting take turns by deficit round robin weighed by IDs
(Shreedhar and Varghese's DRR): at each turn a connection earns ``QUANTUM`` IDs
of credit and sends requests while its credit covers them. A bulk loader with a
thousand blocks queued and a pipeline asking for one ID then alternate, one
block's worth each, instead of the pipeline waiting behind the whole backlog;
two greedy connections get equal shares of IDs whatever their request sizes.

A connection that had nothing waiting is served before those that have used a
turn, so a client asking now and then does not wait for a turn another has
already begun.

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

    __slots__ = ("addr", "inflight", "ids", "queue", "deficit", "turn", "listed")

    def __init__(self, addr: bytes) -> None:
        self.addr = addr
        #: Requests accepted and not yet answered (waiting here or at a worker).
        self.inflight = 0
        #: IDs those requests ask for.
        self.ids = 0
        #: Requests waiting for a worker: (meta, body, count, ...); the routing core may add
        #: fields of its own after the count (when it queued the request).
        self.queue: deque[tuple] = deque()
        #: IDs it may still send in its turn (deficit round robin).
        self.deficit = 0
        #: Whether its turn has begun (it was given its quantum).
        self.turn = False
        #: Whether it is on one of the fair queue's lists.
        self.listed = False


class FairQueue:
    """Connections with requests waiting, served in turns of ``QUANTUM`` IDs.

    As in FQ-CoDel, a connection that had nothing waiting goes on a list of new
    connections, served before the others: a client that asks now and then (a
    pipeline wanting one block) is next in line, not behind the turn a greedy
    connection has already begun. A connection that empties its queue in its
    turn goes to the back of the others' list rather than leave, so asking
    again at once does not make it new again: connections that keep one
    request waiting take their turns with everyone and cannot shut the others
    out. A connection leaves the lists when its turn comes round and it has
    nothing waiting.
    """

    def __init__(self, quantum: int = QUANTUM) -> None:
        self.quantum = quantum
        #: Connections that had nothing waiting when their request came.
        self.new: deque[Conn] = deque()
        #: Connections that have had a turn (some may have nothing waiting now).
        self.old: deque[Conn] = deque()
        #: Requests waiting, over all connections.
        self.waiting = 0

    def __bool__(self) -> bool:
        return self.waiting > 0

    def __len__(self) -> int:
        return self.waiting

    def push(self, conn: Conn, item: tuple, front: bool = False) -> None:
        """Queue a request; ``front`` for one that was already its connection's turn (a retry)."""
        if not conn.listed:
            conn.listed = True
            conn.deficit = 0
            conn.turn = False
            self.new.append(conn)
        if front:
            conn.queue.appendleft(item)
        else:
            conn.queue.append(item)
        self.waiting += 1

    def serve(self, place: Callable[..., bool]) -> None:
        """Hand waiting requests to ``place(conn, meta, body, count, ...)`` (the
        fields of the item pushed) in fair order until it returns False (no worker
        has room for that request)."""
        new, old = self.new, self.old
        while self.waiting:
            line = new if new else old
            conn = line[0]
            if not conn.queue:
                line.popleft()
                if conn.turn or line is new:
                    # It emptied its queue in its turn: to the back of the others, so
                    # asking again at once does not make it a newcomer again.
                    conn.turn = False
                    old.append(conn)
                else:
                    # Its turn came round and it had nothing waiting: it leaves.
                    conn.listed = False
                    conn.deficit = 0  # an idle connection saves up no credit
                continue
            if not conn.turn:
                conn.deficit += self.quantum
                conn.turn = True
            item = conn.queue[0]
            count = item[2]
            c = count if count > MIN_COST_IDS else MIN_COST_IDS
            if conn.deficit < c:
                # Its turn is used up; what is left of its credit carries over.
                line.popleft()
                conn.turn = False
                old.append(conn)
                continue
            if not place(conn, *item):
                return
            conn.queue.popleft()
            conn.deficit -= c
            self.waiting -= 1

    def drain(self) -> list[tuple]:
        """Take every waiting request out, in queue order per connection: ``(conn, *item)``."""
        out = []
        for conn in (*self.new, *self.old):
            while conn.queue:
                out.append((conn, *conn.queue.popleft()))
            conn.deficit = 0
            conn.turn = False
            conn.listed = False
        self.new.clear()
        self.old.clear()
        self.waiting = 0
        return out
