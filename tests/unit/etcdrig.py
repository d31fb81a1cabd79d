"""An in-memory etcd for the unit tests of the etcd package, on a fake clock.

The real ``EtcdStore``/``EtcdLease`` and ``Cluster`` talk to
``fake_etcd.EtcdServer`` (the simulator's etcd, checked against a real one by
``tests/sim/test_fake_etcd.py``) through ``fake_etcd.DirectClient``, which can
fail calls on demand. Leases lapse on the fake clock.
"""

from __future__ import annotations

import orjson
from fake_etcd import DirectClient, EtcdServer, ServerTime
from fakeclock import FakeClock

from snowfence.config import Config
from snowfence.etcd.cluster import Cluster
from snowfence.store.etcd import EtcdStore
from snowfence.store.genesis import Genesis

LAYOUT = dict(time_bits=53, region_bits=2, worker_bits=2, sequence_bits=6)  # worker IDs 0..3
PREFIX = "/snowfence/unit/"
TTL_S = 10
NOW_MS = 1_000_000
AHEAD_MS = 5_000


def config(**overrides) -> Config:
    values = dict(
        etcd=("http://127.0.0.1:2379",),
        cluster="unit",
        region=1,
        lease_ttl_s=TTL_S,
        keepalive_interval_s=2.0,
        fence_after_s=5.0,
        reservation_window_s=5.0,
        max_ahead_ms=1000,
        etcd_timeout_s=1.0,
        workers=1,
        **LAYOUT,
    )
    values.update(overrides)
    return Config(**values)


class Etcd:
    """One in-memory etcd, the fake clock its leases lapse on, and stores and cluster views onto it."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.server = EtcdServer(ServerTime(self.clock.mono_ns))
        self.clients: list[DirectClient] = []
        # A store that has been in use for a while, upgraded from an older release's
        # layout record (so marks without a store ID are its own) and long past any
        # quarantine: the setting most tests need. Tests of new stores delete it.
        self.genesis = Genesis(Config(**LAYOUT).layout, "ab" * 16, window_ms=5_000, legacy=True)
        self.put("layout", self.genesis.to_dict())

    def store(self, labels=("127.0.0.1:2379",), **overrides) -> EtcdStore:
        store = EtcdStore(config(**overrides), mono_ns=self.clock.mono_ns)
        store.connection._build_client = lambda: self._client(labels)
        return store

    def cluster(self, labels=("127.0.0.1:2379",), **overrides) -> Cluster:
        cluster = Cluster(config(**overrides))
        cluster._build_client = lambda: self._client(labels)
        return cluster

    def _client(self, labels) -> DirectClient:
        client = DirectClient(self.server, labels)
        self.clients.append(client)
        return client

    def value(self, key: str):
        self.server.expire()
        kv = self.server.kv.get(PREFIX + key)
        return None if kv is None else kv.value

    def json(self, key: str):
        value = self.value(key)
        return None if value is None else orjson.loads(value)

    def put(self, key: str, value) -> None:
        """An operator's ``etcdctl put`` (no lease)."""
        from pyetcd.client import Transactions

        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        self.server.txn([], [Transactions().put(PREFIX + key, raw)], [])

    def delete(self, key: str) -> None:
        """An operator's ``etcdctl del``."""
        assert self.server.delete_key(PREFIX + key)

    def mark(self, worker_id: int, region: int = 1):
        found = self.json(f"marks/{region}/{worker_id}")
        return None if found is None else found["reserved_until_ms"]

    def claimed(self, region: int = 1) -> set[int]:
        start = f"{PREFIX}workers/{region}/"
        self.server.expire()
        return {int(k.rsplit("/", 1)[1]) for k in self.server.kv if k.startswith(start)}

    def elapse_s(self, s: float) -> None:
        self.clock.advance_ms(s * 1000)


def claim(store, preferred=None, holder="h", now_ms=NOW_MS, ahead_ms=AHEAD_MS):
    return store.claim(preferred, holder, now_ms, ahead_ms)
