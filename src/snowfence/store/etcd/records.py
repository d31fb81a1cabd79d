"""The etcd store's records read without a store, parsed as the store parses them: the
genesis (layout) record, for ``store.read_genesis``, and this etcd's region claims, for
``store.read_region_claims``.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from ...config import Config
from ...errors import ConfigError, EtcdUnavailable, LayoutMismatch, SnowfenceError
from ...etcd import regions
from ...etcd.client import Connection, etcd_call
from ...etcd.keys import REGION_CLAIMS
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
    value = _read(config, build_client, lambda keys: keys.layout())
    return None if value is None else parse_genesis(value, config.cluster)


def read_region_claims(config: Config, build_client: Callable[[], object] | None = None) -> regions.RegionClaims:
    """The region claims of the etcd ``config`` names (see :mod:`snowfence.etcd.regions`), read
    without writing anything; none if the key does not exist. EtcdUnavailable as
    :func:`read_genesis`; LayoutMismatch if the claims are unreadable."""
    return regions.parse(_read(config, build_client, lambda keys: REGION_CLAIMS))


def _read(config: Config, build_client, key_of) -> bytes | None:
    """One key's value (``key_of`` the cluster's keys), through a connection of its own."""
    try:
        connection = Connection(config, build_client)
        try:
            return _get(connection, key_of(connection.keys))
        finally:
            connection.close()
    except ConfigError as exc:
        raise EtcdUnavailable(f"no etcd client can be built here: {exc}") from None


def _get(connection: Connection, key: str) -> bytes | None:
    value, _ = connection.client.get(key)
    return value


_get = etcd_call(_get)
