"""The etcd client library behind one boundary: the connection of one process to one cluster.

:class:`Connection` builds the library's client (every endpoint, TLS from
``etcd_ca``/``etcd_cert``/``etcd_key``, a user and password, the deadline of
every call, ``etcd_timeout_s``), moves on to the next member after a failed
call and rebuilds the client after repeated failures, which also renews an
expired authentication token. The client is built on first use, inside the
process that uses it (gRPC channels do not survive fork).

Every method that calls etcd is wrapped by :func:`etcd_call`, the one place
where the library's errors become :class:`~snowfence.errors.EtcdUnavailable`.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable

from ..config import Config, etcd_endpoint, missing_modules
from ..errors import ConfigError, EtcdUnavailable, SnowfenceError
from . import keys

#: Consecutive failed calls after which the client (channels, auth token) is rebuilt.
REBUILD_AFTER_FAILURES = 3

#: The monotonic clock a retired client's grace is counted on (tests replace it).
_mono_ns = time.monotonic_ns

#: The etcd client's top-level modules, from the ``etcd`` extra.
CLIENT_MODULES = ("pyetcd", "grpc", "google.protobuf")


def require_client() -> None:
    """A ConfigError naming the extra when the etcd client is not installed.

    It is an optional dependency (``pip install 'snowfence[etcd]'``): clients,
    ``decode`` and embedded mode never need it. Looks, without importing.
    """
    missing = missing_modules(CLIENT_MODULES)
    if missing:
        raise ConfigError(
            f"etcd mode needs the etcd client, which is not installed (no {', '.join(missing)}): "
            "pip install 'snowfence[etcd]'"
        )


def etcd_call(method):
    """The one boundary where etcd client errors become snowfence errors.

    Wraps a method of a :class:`Connection`, or of an object whose
    ``connection`` is one. Every method that calls etcd is wrapped, as
    ``name = etcd_call(name)`` right after its body rather than with ``@``:
    mutation testing (mutmut) leaves decorated functions out, and these are the
    ones that matter most.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        connection = self if isinstance(self, Connection) else self.connection
        generation = connection.generation
        try:
            result = method(self, *args, **kwargs)
        except SnowfenceError:
            raise
        except Exception as exc:  # grpc.RpcError, the library's own exceptions, ValueError from a dead channel
            connection._failed(exc, generation)
            raise EtcdUnavailable(f"etcd call {method.__name__} failed: {_describe(exc)}") from None
        connection._succeeded()
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


class Connection:
    """The etcd cluster ``config`` names, as one process talks to it, under its key prefix."""

    def __init__(self, config: Config, build_client: Callable[[], object] | None = None) -> None:
        require_client()
        self.config = config
        if build_client is not None:  # the simulator's and the tests' etcd
            self._build_client = build_client
        #: The cluster's keys (see :mod:`.keys`), every one under ``prefix``.
        self.keys = keys.ClusterKeys(config.cluster)
        self.prefix = self.keys.prefix
        self.timeout_s = config.etcd_timeout_s
        self.endpoints = [etcd_endpoint(url) for url in config.etcd]
        self._client = None
        self._failures = 0
        #: How many times the client was rebuilt: a call that fails on a client since retired
        #: says nothing of the current one, and does not count against it.
        self.generation = 0
        #: Clients rebuilt away from, each closed once the calls in flight on it (other
        #: threads': a worker's keepers share its connection) have had their deadline.
        self._retired: list[tuple[object, int]] = []
        self._retired_lock = threading.Lock()

    def _current_client(self):
        if self._retired:
            self._close_retired(_mono_ns())
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

    def _failed(self, exc: Exception, generation: int | None = None) -> None:
        if generation is not None and generation != self.generation:
            # A call on a client since rebuilt away from: under load, when the calls in
            # flight on the old client fail too, counting them rebuilt each new client in
            # turn, and closed it under the other threads' calls, which then failed too.
            return
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
        self.generation += 1
        if client is not None:
            # Not closed at once: other threads may have calls in flight on it, which
            # closing its channel would fail ("Channel closed!"); their deadline bounds them.
            with self._retired_lock:
                self._retired.append((client, _mono_ns() + int(self.timeout_s * 2e9)))

    def _close_retired(self, now_ns: int | None = None) -> None:
        """Close the retired clients whose grace has passed (``None``: every one)."""
        with self._retired_lock:  # the keepers of a worker share the connection
            due = [c for c, until_ns in self._retired if now_ns is None or now_ns >= until_ns]
            self._retired = [(c, u) for c, u in self._retired if c not in due]
        for client in due:
            try:
                client.close()
            except Exception:
                pass

    def close(self) -> None:
        self._rebuild()
        self._close_retired()
