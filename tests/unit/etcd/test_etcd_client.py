"""The etcd connection on an in-memory etcd: every client error becomes one snowfence
error, the client moves on to the next member after a failure and is rebuilt after
repeated ones, and how the client library's client is built from the settings.
"""

from __future__ import annotations

import pytest
from etcdrig import NOW_MS, PREFIX, claim, config
from fake_etcd import RpcError

from snowfence.errors import ConfigError, EtcdUnavailable, LeaseLost
from snowfence.etcd import client as client_mod
from snowfence.etcd import client as client_module
from snowfence.etcd.client import REBUILD_AFTER_FAILURES
from snowfence.store.etcd import EtcdStore

# -- errors from etcd ---------------------------------------------------------------------------


class GrpcLikeError(Exception):
    """Shaped as grpc's errors: ``code()`` and ``details()``."""

    def __init__(self, code: str, details, broken: bool = False) -> None:
        super().__init__("<_InactiveRpcError of RPC that terminated>")
        self._code, self._details, self._broken = code, details, broken

    def code(self):
        if self._broken:
            raise RuntimeError("no status")
        return type("StatusCode", (), {"name": self._code})()

    def details(self):
        return self._details


def test_every_client_error_becomes_etcd_unavailable_with_its_status_and_details(etcd):
    store = etcd.store()
    lease = claim(store)
    store.client.fail(GrpcLikeError("DEADLINE_EXCEEDED", "Deadline Exceeded"))
    with pytest.raises(EtcdUnavailable) as caught:
        lease.extend(NOW_MS)
    assert str(caught.value) == "etcd call extend failed: DEADLINE_EXCEEDED: Deadline Exceeded"
    store.client.fail(GrpcLikeError("UNKNOWN", "x", broken=True))
    with pytest.raises(EtcdUnavailable) as caught:
        lease.refresh()
    assert str(caught.value) == "etcd call refresh failed: GrpcLikeError: <_InactiveRpcError of RPC that terminated>"
    store.client.fail(ConnectionResetError())
    with pytest.raises(EtcdUnavailable) as caught:
        store.taken()
    assert str(caught.value) == "etcd call _read_region failed: ConnectionResetError"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_lost_lease_is_reported_as_lost_not_as_etcd_failing(etcd):
    store = etcd.store()
    lease = claim(store)
    etcd.delete("workers/1/0")
    for _ in range(REBUILD_AFTER_FAILURES + 1):
        with pytest.raises(LeaseLost):
            lease.extend(NOW_MS)
    assert len(etcd.clients) == 1  # answers, not failures: the client is kept


def test_the_client_moves_to_the_next_member_after_each_failure_and_clears_the_librarys_marks(etcd):
    labels = ("m0:2379", "m1:2379", "m2:2379")
    store = etcd.store(labels=labels)
    client = store.client
    client._current_endpoint_label = "m1:2379"
    for endpoint in client.endpoints.values():
        endpoint.last_failed = 12345.0
    seen = []
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        client.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
        seen.append(client._current_endpoint_label)
    assert seen == ["m2:2379", "m0:2379"]
    assert all(endpoint.last_failed == 0 for endpoint in client.endpoints.values())
    client._current_endpoint_label = "elsewhere:1"  # a member the client does not list
    client.fail(RpcError("UNAVAILABLE"))
    store.connection._succeeded()
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert client._current_endpoint_label == "m0:2379"


def later(monkeypatch, seconds: float) -> None:
    """The connection's monotonic clock, ``seconds`` on."""
    now = client_module._mono_ns()
    monkeypatch.setattr(client_module, "_mono_ns", lambda: now + int(seconds * 1e9))


def test_after_repeated_failures_the_client_is_rebuilt_and_a_success_resets_the_count(etcd, monkeypatch):
    store = etcd.store()
    first = store.client
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        first.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert store.taken() == set()  # a success: the count starts again
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        first.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert store.client is first and not first.closed
    first.fail(RpcError("UNAVAILABLE"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert len(etcd.clients) == 1  # a new one on the next call
    assert store.taken() == set() and len(etcd.clients) == 2 and store.client is etcd.clients[1]
    assert not first.closed  # other threads' calls in flight on it end by their deadline first
    later(monkeypatch, 2 * store.connection.timeout_s + 0.1)
    assert store.taken() == set() and first.closed


def test_calls_in_flight_on_a_rebuilt_client_neither_fail_by_its_closing_nor_count_against_the_new_one(
    etcd, monkeypatch
):
    # Under a fleet's load, a rebuild closed the client under the calls other keepers had in
    # flight on it; they failed ("Channel closed!"), and their failures rebuilt the new
    # client in turn: every worker ID of a worker stopped renewing.
    store = etcd.store()
    first = store.client
    in_flight = store.connection.generation  # a keeper's call, sent on the first client
    for _ in range(REBUILD_AFTER_FAILURES):
        first.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert store.taken() == set() and len(etcd.clients) == 2
    assert not first.closed and first.get_prefix("/") is not None  # the call in flight still goes through
    for _ in range(REBUILD_AFTER_FAILURES):  # and its failure, had it failed, says nothing of the new one
        store.connection._failed(RpcError("UNAVAILABLE"), in_flight)
    assert store.taken() == set() and len(etcd.clients) == 2 and not etcd.clients[1].closed
    later(monkeypatch, 2 * store.connection.timeout_s + 0.1)
    store.taken()
    assert first.closed and not etcd.clients[1].closed


def test_a_rebuilt_client_starts_its_own_count_of_failures(etcd, monkeypatch):
    store = etcd.store()
    store.client.fail(RpcError("UNAUTHENTICATED"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        store.client.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert len(etcd.clients) == 2 and not etcd.clients[1].closed
    store.client.fail(RpcError("UNAVAILABLE"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    later(monkeypatch, 2 * store.connection.timeout_s + 0.1)
    store.taken()
    assert etcd.clients[1].closed


def test_a_client_that_cannot_be_built_is_an_etcd_failure_and_is_tried_again(etcd):
    store = etcd.store()
    build = store.connection._build_client
    attempts = []

    def refused():
        attempts.append(1)
        if len(attempts) == 1:
            raise RpcError("UNAVAILABLE: authentication: connection refused")
        return build()

    store.connection._build_client = refused
    with pytest.raises(EtcdUnavailable, match="_read_region failed: RpcError: UNAVAILABLE"):
        store.taken()
    assert store.taken() == set() and len(attempts) == 2


@pytest.mark.parametrize(
    "text", ["UNAUTHENTICATED: unknown user", "INVALID_ARGUMENT: etcdserver: invalid auth token", "bad token"]
)
def test_an_authentication_error_rebuilds_the_client_at_once(etcd, text):
    store = etcd.store()
    store.taken()
    store.client.fail(RpcError(text))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    store.taken()
    assert len(etcd.clients) == 2
    store.close()
    assert etcd.clients[0].closed and etcd.clients[1].closed


def test_a_client_that_will_not_close_is_dropped_all_the_same(etcd):
    store = etcd.store()
    client = store.client

    def refuse():
        raise RuntimeError("channel already closed")

    client.close = refuse
    store.close()
    assert store.taken() == set() and store.client is not client
    store.close()
    store.close()  # nothing built in between: nothing to close
    assert etcd.clients[1].closed


def test_a_dead_channel_is_an_etcd_failure_too(etcd):
    store = etcd.store()
    store.client.closed = True  # grpc raises ValueError on a closed channel
    with pytest.raises(EtcdUnavailable, match="ValueError: Cannot invoke RPC on closed channel"):
        store.taken()


# -- configuration ------------------------------------------------------------------------------


def test_endpoints_are_parsed_into_host_port_and_tls(etcd):
    urls = ("http://127.0.0.1:2379", "https://etcd-1.example:2380", "HTTP://[::1]:2379/")
    store = etcd.store(etcd=urls, etcd_ca="ca.pem")
    members = [("127.0.0.1", 2379, False), ("etcd-1.example", 2380, True), ("[::1]", 2379, False)]
    assert store.connection.endpoints == members
    assert store.prefix == PREFIX and store.region == 1 and store.connection.timeout_s == 1.0
    assert store.describe() == {"store": "etcd", "cluster": "unit", "endpoints": list(urls)}
    cluster = etcd.cluster(etcd=urls, etcd_ca="ca.pem")
    assert cluster.endpoints == members and cluster.prefix == PREFIX


def test_without_the_client_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(client_mod, "CLIENT_MODULES", ("pyetcd", "snowfence_no_such_module", "no_such_pkg.sub", "."))
    with pytest.raises(ConfigError) as caught:
        EtcdStore(config())
    assert str(caught.value) == (
        "etcd mode needs the etcd client, which is not installed (no snowfence_no_such_module, no_such_pkg.sub, .): "
        "pip install 'snowfence[etcd]'"
    )
    monkeypatch.setattr(client_mod, "CLIENT_MODULES", ("pyetcd", "grpc"))
    client_mod.require_client()


class Recorded:
    """Stands in for a class of the client library: records how it was built."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def test_the_client_is_built_over_every_endpoint_with_the_deadline_and_credentials(monkeypatch, tmp_path):
    import sys

    import grpc

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda *files: ("creds", *files))
    for name in ("ca", "key", "cert"):
        (tmp_path / name).write_bytes(name.encode())
    store = EtcdStore(
        config(
            etcd=("http://a:1", "https://b:2", "http://c:3"),
            etcd_ca=str(tmp_path / "ca"),
            etcd_key=str(tmp_path / "key"),
            etcd_cert=str(tmp_path / "cert"),
            etcd_user="u",
            etcd_password="p",
            etcd_timeout_s=0.75,
        )
    )
    client = store.client
    assert store.client is client  # built once
    assert client.kwargs.keys() == {"endpoints", "timeout", "user", "password", "failover"}
    assert (client.kwargs["timeout"], client.kwargs["user"], client.kwargs["password"]) == (0.75, "u", "p")
    assert client.kwargs["failover"] is True
    endpoints = sorted((e.args, e.kwargs) for e in client.kwargs["endpoints"])
    creds = ("creds", b"ca", b"key", b"cert")
    assert endpoints == [
        (("a", 1), {"secure": False, "creds": None, "time_retry": 0.5}),
        (("b", 2), {"secure": True, "creds": creds, "time_retry": 0.5}),
        (("c", 3), {"secure": False, "creds": None, "time_retry": 0.5}),
    ]
    plain = EtcdStore(config(etcd=("http://a:1",))).client
    assert plain.kwargs["user"] is None and plain.kwargs["password"] is None  # no authentication
    (host_port,) = [e.args for e in plain.kwargs["endpoints"]]
    assert host_port == ("a", 1)


def test_the_client_is_built_with_ca_only_tls(monkeypatch, tmp_path):
    import sys

    import grpc

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda *files: ("creds", *files))
    (tmp_path / "ca").write_bytes(b"ca")
    client = EtcdStore(config(etcd=("https://b:2",), etcd_ca=str(tmp_path / "ca"))).client
    (endpoint,) = client.kwargs["endpoints"]
    assert endpoint.kwargs["creds"] == ("creds", b"ca", None, None)


def test_unreadable_tls_files_are_a_config_error(tmp_path):
    store = EtcdStore(config(etcd=("https://b:2",), etcd_ca=str(tmp_path / "missing-ca.pem")))
    with pytest.raises(ConfigError, match="cannot read etcd TLS files: .*missing-ca.pem"):
        store.taken()


def test_each_client_starts_with_the_members_in_a_random_order(monkeypatch):
    import sys

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    store = EtcdStore(config(etcd=("http://a:1", "http://b:2", "http://c:3")))
    orders = {tuple(e.args[0] for e in store.connection._build_client().kwargs["endpoints"]) for _ in range(40)}
    assert len(orders) > 1
