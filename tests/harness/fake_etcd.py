"""An in-memory etcd: the simulator's server, and a client onto it for unit tests.

:class:`EtcdServer` keeps one etcd cluster's state: revisions, ``create_revision``,
transactions with compares, leases that lapse on the time its ``world`` gives
(``world.T``, in ns). The simulator (``tests/sim/sim.py``) reaches it through
its own client, which adds a network and faults; :class:`DirectClient` reaches
it straight, for unit tests of the real ``EtcdStore``, and breaks calls where a
test asks it to. ``tests/sim/test_fake_etcd.py`` runs the same script against a
real etcd and against both clients: what the store code sees must not differ.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

NS = 1_000_000_000


class RpcError(Exception):
    """What the client library raises for a failed call (its gRPC errors)."""


@dataclass
class KV:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class Meta:
    """The client library's KVMetadata (with the response's header, as it has)."""

    __slots__ = ("key", "create_revision", "mod_revision", "version", "lease_id", "response_header")

    def __init__(self, key: str, kv: KV, header=None) -> None:
        self.key = key.encode()
        self.create_revision = kv.create_revision
        self.mod_revision = kv.mod_revision
        self.version = kv.version
        self.lease_id = kv.lease
        self.response_header = header


def _compare_target(compare, kv: KV | None):
    from pyetcd import transactions as tx

    if isinstance(compare, tx.Create):
        return kv.create_revision if kv else 0
    if isinstance(compare, tx.Mod):
        return kv.mod_revision if kv else 0
    if isinstance(compare, tx.Version):
        return kv.version if kv else 0
    if isinstance(compare, tx.Value):
        return kv.value if kv else None
    raise RpcError(f"unsupported compare {compare!r}")


class EtcdServer:
    """One etcd cluster's state, linearizable: revisions, create_revision, leases on true time.

    ``world`` gives the time (``T``, ns) and a seeded ``rng``; ``marks_dirty`` is set on every write.
    """

    MEMBERS = 3

    def __init__(self, world) -> None:
        self.world = world
        self.rev = 1
        self.kv: dict[str, KV] = {}
        #: lease id -> [granted ttl s, expiry (true ns), keys]
        self.leases: dict[int, list] = {}
        self.next_lease = 0x7A00_0000 + world.rng.randrange(1 << 16)
        self.down: set[int] = set()
        self.leader = 0
        #: etcd's cluster ID, in every response's header.
        self.cluster_id = world.rng.getrandbits(63)

    def header(self):
        """A response header: the cluster's ID and the revision the response was read at."""
        return SimpleNamespace(cluster_id=self.cluster_id, member_id=self.leader, revision=self.rev, raft_term=1)

    def _range(self, key: str, range_end: str | None) -> list[str]:
        if range_end is None:
            return [key] if key in self.kv else []
        return [k for k in sorted(self.kv) if key <= k < range_end]

    # -- leases on simulated time
    def expire(self) -> None:
        now = self.world.T
        dead = [lid for lid, v in self.leases.items() if v[1] <= now]
        for lid in dead:
            self._drop_lease(lid)

    def _drop_lease(self, lid: int) -> None:
        _, _, keys = self.leases.pop(lid)
        deleted = False
        for key in sorted(keys):
            kv = self.kv.get(key)
            if kv is not None and kv.lease == lid:
                if not deleted:
                    self.rev += 1
                    deleted = True
                del self.kv[key]
                self.world.marks_dirty = True

    def member_down(self, m: int) -> None:
        self.down.add(m)
        if m == self.leader:
            up = [i for i in range(self.MEMBERS) if i not in self.down]
            if up:
                self._elect(up[0])

    def member_up(self, m: int) -> None:
        self.down.discard(m)
        if self.leader in self.down:
            self._elect(m)

    def _elect(self, m: int) -> None:
        # A new leader renews every lease to its full TTL (etcd's lease extension on election).
        self.expire()
        self.leader = m
        for v in self.leases.values():
            v[1] = max(v[1], self.world.T + v[0] * NS)

    def has_quorum(self) -> bool:
        return len(self.down) * 2 < self.MEMBERS

    # -- the API
    def grant(self, ttl: int):
        self.expire()
        self.next_lease += 1 + self.world.rng.randrange(7)
        lid = self.next_lease
        self.leases[lid] = [ttl, self.world.T + ttl * NS, set()]
        return SimpleNamespace(id=lid, ttl=ttl)

    def keepalive(self, lid: int):
        self.expire()
        lease = self.leases.get(lid)
        if lease is None:
            return SimpleNamespace(ID=lid, TTL=0)
        lease[1] = self.world.T + lease[0] * NS
        return SimpleNamespace(ID=lid, TTL=lease[0])

    def lease_info(self, lid: int):
        """etcd's LeaseTimeToLive: whole seconds left (-1 for a lease that is gone) and the granted TTL."""
        self.expire()
        lease = self.leases.get(lid)
        if lease is None:
            return SimpleNamespace(ID=lid, TTL=-1, grantedTTL=0)
        return SimpleNamespace(ID=lid, TTL=(lease[1] - self.world.T) // NS, grantedTTL=lease[0])

    def revoke(self, lid: int) -> None:
        self.expire()
        if lid not in self.leases:
            raise RpcError("NOT_FOUND: etcdserver: requested lease not found")
        self._drop_lease(lid)

    def get_prefix(self, prefix: str, keys_only: bool = False):
        self.expire()
        header = self.header()
        return [
            (b"" if keys_only else kv.value, Meta(k, kv, header))
            for k, kv in sorted(self.kv.items())
            if k.startswith(prefix)
        ]

    def txn(self, compare, success, failure):
        from pyetcd import transactions as tx

        self.expire()
        ok = True
        for c in compare:
            have = _compare_target(c, self.kv.get(c.key))
            want = c.value
            if have is None:
                # etcd: a comparison of the value of a key that does not exist always fails.
                hold = False
            elif c.op == tx.etcdrpc.Compare.EQUAL:
                hold = have == want
            elif c.op == tx.etcdrpc.Compare.NOT_EQUAL:
                hold = have != want
            elif c.op == tx.etcdrpc.Compare.LESS:
                hold = have < want
            elif c.op == tx.etcdrpc.Compare.GREATER:
                hold = have > want
            else:
                raise RpcError("INVALID_ARGUMENT: compare without an operator")
            if not hold:
                ok = False
                break
        ops = success if ok else failure
        for op in ops:
            if isinstance(op, tx.Put) and op.lease and op.lease not in self.leases:
                raise RpcError("NOT_FOUND: etcdserver: requested lease not found")
        writes = any(isinstance(op, (tx.Put, tx.Delete)) for op in ops)
        rev = self.rev + 1 if writes else self.rev
        responses = []
        for op in ops:
            if isinstance(op, tx.Put):
                old = self.kv.get(op.key)
                if old is not None and old.lease in self.leases:
                    self.leases[old.lease][2].discard(op.key)
                value = op.value if isinstance(op.value, bytes) else str(op.value).encode()
                self.kv[op.key] = KV(
                    value, old.create_revision if old else rev, rev, (old.version if old else 0) + 1, op.lease or 0
                )
                if op.lease:
                    self.leases[op.lease][2].add(op.key)
                responses.append(SimpleNamespace(kind="put"))
                self.world.marks_dirty = True
            elif isinstance(op, tx.Delete):
                for key in self._range(op.key, op.range_end):
                    self.kv.pop(key, None)
                responses.append(SimpleNamespace(kind="delete"))
                self.world.marks_dirty = True
            elif isinstance(op, tx.Get):
                header = SimpleNamespace(cluster_id=self.cluster_id, member_id=self.leader, revision=rev, raft_term=1)
                responses.append(
                    [(self.kv[k].value, Meta(k, self.kv[k], header)) for k in self._range(op.key, op.range_end)]
                )
            else:
                raise RpcError(f"unsupported operation {op!r}")
        self.rev = rev
        return ok, responses

    # -- what operators do to an etcd
    def put_key(self, key: str, value: bytes) -> None:
        """``etcdctl put`` (no lease)."""
        from pyetcd import transactions as tx

        self.txn([], [tx.Put(key, value)], [])

    def delete_prefix(self, prefix: str) -> int:
        """``etcdctl del --prefix``: the keys go, whoever held them; their leases stay."""
        self.expire()
        keys = [k for k in self.kv if k.startswith(prefix)]
        for key in keys:
            del self.kv[key]
        if keys:
            self.rev += 1
            self.world.marks_dirty = True
        return len(keys)

    def snapshot(self) -> tuple:
        """``etcdctl snapshot save``: the keys, their revisions and the leases, as of now."""
        self.expire()
        kv = {k: KV(v.value, v.create_revision, v.mod_revision, v.version, v.lease) for k, v in self.kv.items()}
        leases = {lid: [v[0], v[1], set(v[2])] for lid, v in self.leases.items()}
        return self.rev, kv, leases

    def restore(self, snapshot: tuple, bump: int = 0) -> set[int]:
        """``etcdutl snapshot restore`` (``--bump-revision`` if ``bump``) and the cluster
        restarted on it: keys, revisions and leases go back; the new leader renews every
        lease to its full TTL. Returns the leases that were granted since the snapshot."""
        rev, kv, leases = snapshot
        lost = set(self.leases) - set(leases)
        self.kv = {k: KV(v.value, v.create_revision, v.mod_revision, v.version, v.lease) for k, v in kv.items()}
        self.leases = {lid: [v[0], self.world.T + v[0] * NS, set(v[2])] for lid, v in leases.items()}
        self.rev = rev + bump
        self.world.marks_dirty = True
        return lost

    def delete_key(self, key: str) -> bool:
        """An operator's ``etcdctl del``: the key goes, whoever held it."""
        self.expire()
        kv = self.kv.pop(key, None)
        if kv is None:
            return False
        if kv.lease in self.leases:
            self.leases[kv.lease][2].discard(key)
        self.rev += 1
        self.world.marks_dirty = True
        return True


class ServerTime:
    """What :class:`EtcdServer` needs of a world: the time (ns, from ``now_ns``), a seeded rng."""

    def __init__(self, now_ns: Callable[[], int], seed: int = 0) -> None:
        self._now_ns = now_ns
        self.rng = random.Random(seed)
        self.marks_dirty = False

    @property
    def T(self) -> int:  # noqa: N802 (the simulator's name for true time)
        return self._now_ns()


class DirectClient:
    """The surface of pyetcd's MultiEndpointEtcd3Client that the etcd package uses, onto a server.

    No network and no time passing, but every request is first built by the
    library itself (its protobuf messages), so what it would refuse (a key that
    is None, operations that are not a list) is refused here too. ``calls`` records ``(member, call)`` of every
    call, the member being the one ``_current_endpoint_label`` names. ``fail``
    makes the next call (of one kind, with ``on``) raise: before it reaches the
    server, or (``after=True``) after the server applied it, as when a reply is
    lost on the way back.
    """

    def __init__(self, server: EtcdServer, labels: tuple[str, ...] = ("127.0.0.1:2379",)) -> None:
        from pyetcd.client import MultiEndpointEtcd3Client, Transactions

        #: The library's client, never connected: only its request builders are used.
        self._library = object.__new__(MultiEndpointEtcd3Client)
        self.server = server
        self.transactions = Transactions()
        self.endpoints = {label: SimpleNamespace(last_failed=0) for label in labels}
        self._current_endpoint_label = labels[0]
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        #: Called with the call's kind just before it reaches the server: another
        #: client's calls made there land between this one's.
        self.before: Callable[[str], None] | None = None
        #: (call kind or None for any, the error, raised after applying it)
        self._faults: list[tuple[str | None, Exception, bool]] = []

    def fail(self, error: Exception, on: str | None = None, after: bool = False, times: int = 1) -> None:
        self._faults += [(on, error, after)] * times

    def _call(self, what: str, fn):
        if self.closed:
            raise ValueError("Cannot invoke RPC on closed channel!")  # what grpc says
        self.calls.append((self._current_endpoint_label, what))
        if self.before is not None:
            self.before(what)
        fault = next((f for f in self._faults if f[0] in (None, what)), None)
        if fault is not None:
            self._faults.remove(fault)
            if not fault[2]:
                raise fault[1]
        result = fn()
        if fault is not None:
            raise fault[1]
        return result

    def transaction(self, compare, success=None, failure=None):
        for c in compare:
            c.build_message()
        self._library._ops_to_requests(success)
        self._library._ops_to_requests(failure)
        return self._call("txn", lambda: self.server.txn(compare, success, failure))

    def lease(self, ttl, lease_id=None):
        return self._call("lease_grant", lambda: self.server.grant(ttl))

    def refresh_lease(self, lease_id):
        yield self._call("keepalive", lambda: self.server.keepalive(lease_id))

    def revoke_lease(self, lease_id):
        return self._call("lease_revoke", lambda: self.server.revoke(lease_id))

    def get_lease_info(self, lease_id):
        return self._call("lease_time_to_live", lambda: self.server.lease_info(lease_id))

    def get_prefix(self, key_prefix, keys_only=False, **kwargs):
        self._library._build_get_range_request(key_prefix)
        return self._call("range", lambda: self.server.get_prefix(key_prefix, keys_only))

    def get(self, key, **kwargs):
        found = self._call("range", lambda: self.server.get_prefix(key))
        for value, meta in found:
            if meta.key == key.encode():
                return value, meta
        return None, None

    def put(self, key, value, lease=None, prev_kv=False):
        self._library._build_put_request(key, value, lease, prev_kv)
        tx = self.transactions
        return self._call("put", lambda: self.server.txn([], [tx.put(key, value, lease)], []))

    def delete(self, key, prev_kv=False, return_response=False):
        self._library._build_delete_request(key)
        return self._call("delete_range", lambda: self.server.delete_key(key))

    def close(self):
        self.closed = True
