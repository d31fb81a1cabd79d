"""Worker-ID leases in etcd, and the time high-water mark next to them.

Keys, under ``/snowfence/<cluster>/``::

    layout                        the cluster's ID layout (JSON), written by the first node
    nodes/<node>                  a live node's entry (endpoints, region, worker IDs...), under its own lease
    regions/<region>              a region number this cluster's nodes use (no lease: it stays)
    workers/<region>/<worker>     the claim: holder (JSON), attached to a 10 s lease
    marks/<region>/<worker>       {"reserved_until_ms", "token", "holder"}: no lease, it outlives owners

A claim is one transaction: ``create_revision(claim) == 0 -> put(claim, lease),
get(claim), get(mark)``. The claim key's ``create_revision`` is the fencing
token; every later write (extending or lowering the mark, releasing) is a
transaction guarded by ``create_revision(claim) == token``, so an owner that
lost its lease, even one that was paused and does not know it yet, can write
nothing.

Every etcd call has a deadline (``etcd_timeout_s``) and every error of the
client library is translated here, once, into :class:`EtcdUnavailable` or
:class:`LeaseLost`. The client is created inside the worker process (gRPC
channels do not survive fork) and rebuilt after repeated failures, which also
renews an expired authentication token.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote, urlsplit

import orjson

from ..config import Config
from ..errors import ConfigError, EtcdUnavailable, LayoutMismatch, LeaseLost, SnowfenceError
from ..ids import Layout
from .lease import Lease, Store

log = logging.getLogger("snowfence.etcd")

#: Consecutive failed calls after which the client (channels, auth token) is rebuilt.
REBUILD_AFTER_FAILURES = 3


def _etcd_call(method):
    """The one boundary where etcd client errors become snowfence errors.

    Every method that calls etcd is wrapped, as ``name = _etcd_call(name)`` right
    after its body rather than with ``@``: mutation testing (mutmut) leaves
    decorated functions out, and these are the ones that matter most.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        store = self if isinstance(self, EtcdStore) else self._store
        try:
            result = method(self, *args, **kwargs)
        except SnowfenceError:
            raise
        except Exception as exc:  # grpc.RpcError, the library's own exceptions, ValueError from a dead channel
            store._failed(exc)
            raise EtcdUnavailable(f"etcd call {method.__name__} failed: {_describe(exc)}") from None
        store._succeeded()
        return result

    return wrapper


def _describe(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return f"{exc.code().name}: {details()}"
        except Exception:
            pass
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class EtcdLease(Lease):
    """A worker ID claimed in etcd, held by a lease with a TTL."""

    expires = True

    def __init__(
        self, store: EtcdStore, lease_id: int, worker_id: int, token: int, mark_ms: int, ttl_s: int, holder: str
    ) -> None:
        super().__init__(store.region, worker_id, token, mark_ms)
        self._store = store
        self.lease_id = lease_id
        self.holder = holder
        self.claim_key = store.claim_key(worker_id)
        self.mark_key = store.mark_key(worker_id)
        self.ttl_s = ttl_s
        self._ttl_at_ns = store.mono_ns()

    def _guard(self):
        return self._store.client.transactions.create(self.claim_key) == self.token

    def _mark_value(self, mark_ms: int) -> bytes:
        return orjson.dumps(
            {
                "reserved_until_ms": mark_ms,
                "reserved_until_unix_ms": mark_ms + self._store.layout.epoch_ms,
                "token": self.token,
                "holder": self.holder,
            }
        )

    def refresh(self) -> None:
        ttl = None
        for response in self._store.client.refresh_lease(self.lease_id):
            ttl = response.TTL
        if ttl is None or ttl <= 0:
            raise LeaseLost(f"lease {self.lease_id:x} of worker ID {self.worker_id} has expired")
        self.ttl_s = ttl
        self._ttl_at_ns = self._store.mono_ns()

    refresh = _etcd_call(refresh)

    def extend(self, until_ms: int) -> None:
        tx = self._store.client.transactions
        ok, _ = self._store.client.transaction(
            compare=[self._guard()],
            success=[tx.put(self.mark_key, self._mark_value(until_ms))],
            failure=[],
        )
        if not ok:
            raise LeaseLost(f"worker ID {self.worker_id} is no longer held with token {self.token}")
        self.reserved_until_ms = until_ms

    extend = _etcd_call(extend)

    def release(self, last_used_ms: int) -> None:
        if self.released:
            return
        try:
            self._release(max(last_used_ms, self.claimed_mark_ms))
        finally:
            self.released = True

    def _release(self, mark_ms: int) -> None:
        client = self._store.client
        tx = client.transactions
        success = [tx.delete(self.claim_key)]
        if mark_ms < self.reserved_until_ms:
            success.insert(0, tx.put(self.mark_key, self._mark_value(mark_ms)))
        ok, _ = client.transaction(compare=[self._guard()], success=success, failure=[])
        if ok:
            self.reserved_until_ms = min(self.reserved_until_ms, mark_ms)
        client.revoke_lease(self.lease_id)

    _release = _etcd_call(_release)

    def abandon(self) -> None:
        # Nothing to close locally; the lease lapses in etcd on its own.
        self.released = True

    def remaining_s(self) -> float | None:
        return round(self.ttl_s - (self._store.mono_ns() - self._ttl_at_ns) / 1e9, 3)

    def describe(self) -> dict:
        return {**super().describe(), "store": "etcd", "lease_id": f"{self.lease_id:x}", "lease_ttl_s": self.ttl_s}


#: The etcd client's top-level modules, from the ``etcd`` extra.
CLIENT_MODULES = ("pyetcd", "grpc", "google.protobuf")


def require_client() -> None:
    """A ConfigError naming the extra when the etcd client is not installed.

    It is an optional dependency (``pip install 'snowfence[etcd]'``): clients,
    ``decode`` and embedded mode never need it. Looks, without importing.
    """
    import importlib.util

    missing = []
    for name in CLIENT_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ConfigError(
            f"etcd mode needs the etcd client, which is not installed (no {', '.join(missing)}): "
            "pip install 'snowfence[etcd]'"
        )


class EtcdStore(Store):
    """Leases on the worker IDs of one region of one cluster."""

    skips_far_marks = True

    def __init__(self, config: Config, mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        require_client()
        self.config = config
        #: The monotonic clock a lease's remaining TTL is counted on (tests pass a fake one).
        self.mono_ns = mono_ns
        self.layout = config.layout
        self.region = self.layout.check_region(config.region)
        self.prefix = f"/snowfence/{config.cluster}/"
        self.timeout_s = config.etcd_timeout_s
        self.endpoints = [_parse_endpoint(url) for url in config.etcd]
        if any(secure for _, _, secure in self.endpoints) and not config.etcd_ca:
            raise ConfigError("https etcd endpoints need etcd_ca (the CA certificate file)")
        self._client = None
        self._failures = 0
        self._claim_lease: tuple[int, int] | None = None

    # -- the client ------------------------------------------------------------------------

    def _current_client(self):
        if self._client is None:
            self._client = self._build_client()
        return self._client

    #: The etcd client, built on first use and again after :meth:`_rebuild`.
    client = property(_current_client)

    def _build_client(self):
        import grpc
        from pyetcd.client import Endpoint, MultiEndpointEtcd3Client

        creds = None
        if self.config.etcd_ca:
            try:

                def read(path):
                    with open(path, "rb") as f:
                        return f.read()

                creds = grpc.ssl_channel_credentials(
                    read(self.config.etcd_ca),
                    read(self.config.etcd_key) if self.config.etcd_key else None,
                    read(self.config.etcd_cert) if self.config.etcd_cert else None,
                )
            except OSError as exc:
                raise ConfigError(f"cannot read etcd TLS files: {exc}") from None
        endpoints = [
            Endpoint(host, port, secure=secure, creds=creds if secure else None, time_retry=0.5)
            for host, port, secure in self.endpoints
        ]
        random.shuffle(endpoints)  # spread the nodes of a cluster over its members
        return MultiEndpointEtcd3Client(
            endpoints=endpoints,
            timeout=self.timeout_s,
            user=self.config.etcd_user or None,
            password=self.config.etcd_password or None,
            failover=True,
        )

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        text = str(exc).lower()
        client = self._client
        if client is not None and client.endpoints:
            # Move on to the next member, round robin, so a retry never goes back to
            # the one that just failed. The library's own failure marks count wall-clock
            # time, and after a step back they could lock every member out for hours:
            # clear them; our back-off paces the retries. (A private attribute: the
            # library is pinned to one version.)
            labels = list(client.endpoints)
            for endpoint in client.endpoints.values():
                endpoint.last_failed = 0
            current = client._current_endpoint_label
            nxt = labels[(labels.index(current) + 1) % len(labels)] if current in labels else labels[0]
            client._current_endpoint_label = nxt
        if self._failures >= REBUILD_AFTER_FAILURES or "auth" in text or "token" in text:
            self._rebuild()

    def _succeeded(self) -> None:
        self._failures = 0

    def _rebuild(self) -> None:
        client, self._client = self._client, None
        self._failures = 0
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def close(self) -> None:
        self._rebuild()

    # -- keys ----------------------------------------------------------------------------

    def claim_key(self, worker_id: int) -> str:
        return f"{self.prefix}workers/{self.region}/{worker_id}"

    def mark_key(self, worker_id: int) -> str:
        return f"{self.prefix}marks/{self.region}/{worker_id}"

    # -- Store ---------------------------------------------------------------------------

    def check_layout(self, layout: Layout) -> None:
        client = self.client
        tx = client.transactions
        key = self.prefix + "layout"
        ours = orjson.dumps(layout.to_dict())
        ok, responses = client.transaction(
            compare=[tx.create(key) == 0],
            success=[tx.put(key, ours)],
            failure=[tx.get(key)],
        )
        if ok:
            log.info("recorded layout for cluster %s: %s", self.config.cluster, layout.describe())
            return
        try:
            recorded = Layout.from_dict(orjson.loads(responses[0][0][0]))
        except (IndexError, orjson.JSONDecodeError, TypeError, ValueError, SnowfenceError) as exc:
            raise LayoutMismatch(
                f"the layout recorded for cluster {self.config.cluster!r} is unreadable: {exc}"
            ) from None
        if recorded != layout:
            raise LayoutMismatch(
                f"cluster {self.config.cluster!r} uses layout [{recorded.describe()}] but this node is "
                f"configured for [{layout.describe()}]; IDs from two layouts could collide, so this node "
                "will not start"
            )

    check_layout = _etcd_call(check_layout)

    def taken(self) -> set[int]:
        prefix = f"{self.prefix}workers/{self.region}/"
        out = set()
        for _, meta in self.client.get_prefix(prefix, keys_only=True):
            try:
                out.add(int(meta.key.decode().rsplit("/", 1)[1]))
            except ValueError:
                continue
        return out

    taken = _etcd_call(taken)

    def candidates(self) -> Iterator[int]:
        taken = self.taken()
        return iter([w for w in range(self.layout.max_worker + 1) if w not in taken])

    def claim(self, preferred: int | None, holder: str, now_ms: int, max_ahead_ms: int) -> EtcdLease | None:
        # One lease serves all the claim attempts of this call; if none succeeds
        # it is revoked (or lapses by itself within its TTL).
        self._claim_lease = self._grant()
        lease = None
        try:
            lease = super().claim(preferred, holder, now_ms, max_ahead_ms)
        finally:
            lease_id, _ = self._claim_lease
            self._claim_lease = None
            if lease is None:
                self._revoke_quietly(lease_id)
        return lease

    def _grant(self) -> tuple[int, int]:
        lease = self.client.lease(self.config.lease_ttl_s)
        return lease.id, lease.ttl

    _grant = _etcd_call(_grant)

    def _revoke_quietly(self, lease_id: int) -> None:
        try:
            self._revoke(lease_id)
        except EtcdUnavailable:
            pass  # it lapses by itself within the TTL

    def _revoke(self, lease_id: int) -> None:
        self.client.revoke_lease(lease_id)

    _revoke = _etcd_call(_revoke)

    def _mark_ms(self, mark: dict) -> int:
        """A mark's ``reserved_until_ms``, if it is one we could have written.

        Raises ValueError (or KeyError, TypeError) for anything else."""
        ms = mark["reserved_until_ms"]
        if type(ms) is not int or not 0 <= ms <= self.layout.max_ms:
            raise ValueError(f"reserved_until_ms is {ms!r}")
        return ms

    def try_claim(self, worker_id: int, holder: str, max_mark_ms: int | None) -> EtcdLease | None:
        lease_id, ttl = self._claim_lease
        client = self.client
        tx = client.transactions
        claim_key, mark_key = self.claim_key(worker_id), self.mark_key(worker_id)
        ok, responses = client.transaction(
            compare=[tx.create(claim_key) == 0],
            success=[
                tx.put(claim_key, orjson.dumps({"holder": holder}), lease_id),
                tx.get(claim_key),
                tx.get(mark_key),
            ],
            failure=[],
        )
        if not ok:
            return None
        token = responses[1][0][1].create_revision
        mark_ms = 0
        if responses[2]:
            try:
                mark_ms = self._mark_ms(orjson.loads(responses[2][0][0]))
            except (KeyError, TypeError, ValueError):  # orjson's errors are ValueErrors
                # A mark we cannot read could hide a later timestamp: give the ID back.
                log.warning("mark of worker ID %d is unreadable; passing over it", worker_id)
                mark_ms = None
        if mark_ms is None or (max_mark_ms is not None and mark_ms > max_mark_ms):
            client.transaction(compare=[tx.create(claim_key) == token], success=[tx.delete(claim_key)], failure=[])
            return None
        return EtcdLease(self, lease_id, worker_id, token, mark_ms, ttl, holder)

    try_claim = _etcd_call(try_claim)

    def describe(self) -> dict:
        return {"store": "etcd", "cluster": self.config.cluster, "endpoints": list(self.config.etcd)}

    def census(self) -> list[dict]:
        """Every worker ID of the cluster that has a claim or a mark, in any region.

        A worker ID with a mark but no claim is retired: free to claim, but a new
        owner mints nothing until its clock has passed the mark (the mark makes the
        old idea of a tombstone quarantine exact). One whose mark cannot be read is
        ``unreadable`` (a claim passes it over), or held with no ``mark_ms``; keys
        that name no region and worker ID are left out.
        """
        client = self.client
        entries: dict[tuple[int, int], dict] = {}
        for value, meta in client.get_prefix(self.prefix + "marks/"):
            place = _place(meta.key, self.prefix + "marks/")
            if place is None:
                continue
            region, worker = place
            try:
                mark = orjson.loads(value)
                entry = {
                    "state": "retired",
                    "mark_ms": self._mark_ms(mark),
                    "mark_token": mark.get("token"),
                    "last_holder": mark.get("holder"),
                }
            except (KeyError, TypeError, ValueError, AttributeError):  # orjson's errors are ValueErrors
                entry = {"state": "unreadable", "mark_ms": None}
            entries[place] = {"region": region, "worker_id": worker, **entry}
        for value, meta in client.get_prefix(self.prefix + "workers/"):
            place = _place(meta.key, self.prefix + "workers/")
            if place is None:
                continue
            region, worker = place
            entry = entries.setdefault(place, {"region": region, "worker_id": worker, "mark_ms": None})
            try:
                holder = orjson.loads(value).get("holder")
            except (ValueError, AttributeError):
                holder = None
            info = client.get_lease_info(meta.lease_id) if meta.lease_id else None
            entry.update(
                {
                    "state": "held",
                    "holder": holder,
                    "token": meta.create_revision,
                    "lease_id": f"{meta.lease_id:x}",
                    "lease_remaining_s": info.TTL if info is not None else None,
                    "renewed_ago_s": (info.grantedTTL - info.TTL) if info is not None and info.TTL >= 0 else None,
                }
            )
        return [entries[k] for k in sorted(entries)]

    census = _etcd_call(census)

    # -- node membership (the broker's, not a worker's) ----------------------------------

    def node_key(self, name: str) -> str:
        return f"{self.prefix}nodes/{quote(name, safe='')}"

    def grant_lease(self, ttl_s: int) -> int:
        return self.client.lease(ttl_s).id

    grant_lease = _etcd_call(grant_lease)

    def refresh_lease(self, lease_id: int) -> bool:
        """Renew a lease; False if it has expired."""
        ttl = None
        for response in self.client.refresh_lease(lease_id):
            ttl = response.TTL
        return ttl is not None and ttl > 0

    refresh_lease = _etcd_call(refresh_lease)

    def put_node(self, name: str, entry: dict, lease_id: int) -> None:
        self.client.put(self.node_key(name), orjson.dumps(entry), lease=lease_id)

    put_node = _etcd_call(put_node)

    def remove_node(self, name: str, lease_id: int) -> None:
        self.client.delete(self.node_key(name))
        self.client.revoke_lease(lease_id)

    remove_node = _etcd_call(remove_node)

    def nodes(self) -> list[dict]:
        """The live nodes' entries (each under its node's lease), by name; unreadable ones left out."""
        out = []
        for value, _ in self.client.get_prefix(self.prefix + "nodes/"):
            try:
                entry = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("node"), str):
                eps = entry.get("endpoints")
                if not isinstance(eps, list) or not all(isinstance(ep, str) for ep in eps):
                    entry["endpoints"] = []  # unusable: listed, but nobody connects to it
                out.append(entry)
        return sorted(out, key=lambda e: e["node"])

    nodes = _etcd_call(nodes)

    def record_region(self, region: int, node: str) -> None:
        """Note that this cluster has nodes of ``region`` (no lease: the record stays)."""
        key = f"{self.prefix}regions/{region}"
        tx = self.client.transactions
        self.client.transaction(
            compare=[tx.create(key) == 0], success=[tx.put(key, orjson.dumps({"first_node": node}))], failure=[]
        )

    record_region = _etcd_call(record_region)

    def regions(self) -> list[int]:
        """The region numbers this cluster's nodes have used."""
        out = set()
        for _, meta in self.client.get_prefix(self.prefix + "regions/", keys_only=True):
            try:
                out.add(int(meta.key.decode().rsplit("/", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    regions = _etcd_call(regions)


def _place(key: bytes, prefix: str) -> tuple[int, int] | None:
    """The region and worker ID of ``<prefix><region>/<worker>``; None for any other key."""
    try:
        rest = key.decode()
    except UnicodeDecodeError:
        return None
    parts = rest[len(prefix) :].split("/") if rest.startswith(prefix) else []
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _parse_endpoint(url: str) -> tuple[str, int, bool]:
    unusable = ConfigError(f"etcd endpoint {url!r} must look like http://host:port or https://host:port")
    try:
        parts = urlsplit(url)  # ValueError: a bracketed host that does not close
        port = parts.port  # ValueError: not a number, or out of range
    except ValueError:
        raise unusable from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port:
        raise unusable
    return parts.hostname, port, parts.scheme == "https"
