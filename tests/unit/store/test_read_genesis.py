"""``store.read_genesis``: the genesis record a store holds, read without opening the store
(what ``serve`` and ``check-config`` compare the node's layout with before anything starts).
It writes nothing, in either store, and refuses a record it cannot read in the store's words."""

from __future__ import annotations

import orjson
import pytest
from etcdrig import config as etcd_config
from fake_etcd import RpcError

from snowfence.config import Config
from snowfence.errors import ConfigError, EtcdUnavailable, LayoutMismatch, StateDirError
from snowfence.store import open_store, read_genesis


def files(root) -> dict:
    return {p: p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_an_embedded_store_with_no_record_reads_none_and_nothing_is_made(tmp_path):
    config = Config(state_dir=str(tmp_path / "state"))
    assert read_genesis(config) is None
    assert not (tmp_path / "state").exists()


def test_an_embedded_store_reads_the_record_its_store_wrote_and_changes_nothing(tmp_path):
    config = Config(state_dir=str(tmp_path / "state"), journal_dir=str(tmp_path / "journal"))
    store = open_store(config)
    store.check_layout(config.layout)
    store.close()
    before = files(tmp_path)
    assert read_genesis(config) == store.genesis
    assert files(tmp_path) == before


@pytest.mark.parametrize("recorded", [b"", b"{", b"[1]", orjson.dumps({"time_bits": "x"})])
def test_an_unreadable_embedded_record_is_refused_as_the_store_refuses_it(tmp_path, recorded):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "layout.json").write_bytes(recorded)
    config = Config(state_dir=str(tmp_path / "state"))
    with pytest.raises(StateDirError) as read:
        read_genesis(config)
    with pytest.raises(StateDirError) as opened:
        open_store(config).check_layout(config.layout)
    assert str(read.value) == str(opened.value) and "is unreadable" in str(read.value)
    assert (tmp_path / "state" / "layout.json").read_bytes() == recorded


def test_an_etcd_store_reads_the_layout_record_and_writes_nothing(etcd):
    before = etcd.server.rev
    assert read_genesis(etcd_config(), etcd_client=lambda: etcd._client(("127.0.0.1:2379",))) == etcd.genesis
    assert etcd.server.rev == before
    assert [what for _, what in etcd.clients[0].calls] == ["range"]  # one read, no lease, no transaction
    assert etcd.clients[0].closed


def test_an_etcd_store_with_no_layout_record_reads_none(etcd):
    assert etcd.server.delete_key("/snowfence/unit/layout")
    assert read_genesis(etcd_config(), etcd_client=lambda: etcd._client(("127.0.0.1:2379",))) is None


def test_an_unreadable_etcd_record_is_refused_as_the_store_refuses_it(etcd):
    etcd.put("layout", b"[]")
    with pytest.raises(LayoutMismatch, match="the layout recorded for cluster 'unit' is unreadable"):
        read_genesis(etcd_config(), etcd_client=lambda: etcd._client(("127.0.0.1:2379",)))
    assert etcd.value("layout") == b"[]"


def test_etcd_not_answering_or_no_client_to_be_had_is_etcd_unavailable(etcd):
    def failing():
        client = etcd._client(("127.0.0.1:2379",))
        client.fail(RpcError("unavailable"))
        return client

    with pytest.raises(EtcdUnavailable):
        read_genesis(etcd_config(), etcd_client=failing)

    def unbuildable():
        raise ConfigError("cannot read etcd TLS files: no such file")

    with pytest.raises(EtcdUnavailable, match="no etcd client can be built here: cannot read etcd TLS files"):
        read_genesis(etcd_config(), etcd_client=unbuildable)


def test_the_region_claims_are_read_without_writing_and_refused_as_the_store_refuses_them(etcd, tmp_path):
    from pyetcd.client import Transactions

    from snowfence.etcd import keys, regions
    from snowfence.store import read_region_claims

    assert read_region_claims(Config(state_dir=str(tmp_path / "state"))) is None  # embedded: none
    assert not (tmp_path / "state").exists()
    client = lambda: etcd._client(("127.0.0.1:2379",))  # noqa: E731
    assert read_region_claims(etcd_config(), etcd_client=client) == regions.RegionClaims()
    store = etcd.store()
    store.check_layout(store.layout)  # claims region 1 for cluster "unit"
    before = etcd.server.rev
    claims = read_region_claims(etcd_config(), etcd_client=client)
    assert claims.holder(1).cluster == "unit" and etcd.server.rev == before
    etcd.server.txn([], [Transactions().put(keys.REGION_CLAIMS, b"[]")], [])
    with pytest.raises(LayoutMismatch, match="the region claims /snowfence/region-claims are unreadable"):
        read_region_claims(etcd_config(), etcd_client=client)
