"""The etcd store's records read without a store: the genesis (layout) record, parsed as the
store parses it, for ``store.read_genesis``.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from ...config import Config
from ...errors import ConfigError, EtcdUnavailable, LayoutMismatch, SnowfenceError
from ...etcd.client import Connection, etcd_call
from ..genesis import Genesis


def parse_genesis(value: bytes, cluster: str) -> Genesis:
    """The genesis record of ``cluster`` as its layout record holds it; LayoutMismatch if unreadable."""
    try:
        return Genesis.from_dict(orjson.loads(value))
    except (orjson.JSONDecodeError, TypeError, ValueError, SnowfenceError) as exc:
        raise LayoutMismatch(f"the layout recorded for cluster {cluster!r} is unreadable: {exc}") from None


def read_genesis(config: Config, build_client: Callable[[], object] | None = None) -> Genesis | None:
    """The genesis record of the cluster ``config`` names, read without writing anything;
    None if there is none yet. EtcdUnavailable if etcd does not answer, or if no client can
    be built here (TLS files unreadable, say); LayoutMismatch if the record is unreadable."""
    try:
        connection = Connection(config, build_client)
        try:
            value = _layout_record(connection)
        finally:
            connection.close()
    except ConfigError as exc:
        raise EtcdUnavailable(f"no etcd client can be built here: {exc}") from None
    return None if value is None else parse_genesis(value, config.cluster)


def _layout_record(connection: Connection) -> bytes | None:
    value, _ = connection.client.get(connection.keys.layout())
    return value


_layout_record = etcd_call(_layout_record)
