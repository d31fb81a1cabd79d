"""The storage layer: the lease store interface, genesis records, the journal, and the
two stores (files under a state directory, and etcd). ``open_store`` builds the one a
configuration names; everything that holds a worker ID opens its store there, and
``read_genesis`` reads its genesis record without opening it."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import Config
from .base import Lease, Store
from .genesis import Genesis

__all__ = ["Lease", "Store", "journal_name", "open_store", "read_genesis"]


def journal_name(config: Config) -> str:
    """The journal file of an etcd cluster, in the node's state directory."""
    return f"etcd-{config.cluster}"


def open_store(
    config: Config,
    *,
    journal: bool = True,
    wall_ns: Callable[[], int] = time.time_ns,
    mono_ns: Callable[[], int] = time.monotonic_ns,
    etcd_client: Callable[[], object] | None = None,
) -> Store:
    """The lease store the configuration names, opened with every setting the node
    accepts, and this node's journal of it (``journal=False``: none, as an operator's
    command run away from the node's state directory reads the store).

    Every holder opens its store here: the workers, the broker's own worker ID,
    ``snowfence accept-restore`` and the simulator, which passes its clocks and
    ``etcd_client`` (what builds the etcd client library's client)."""
    from .journal import Journal

    if config.embedded:
        from .files import FileStore

        return FileStore(
            config.state_dir,
            config.layout,
            config.region,
            allow_unsafe_filesystem=config.allow_unsafe_filesystem,
            window_ms=config.store_window_ms,
            max_ahead_ms=config.max_ahead_ms,
            wall_ns=wall_ns,
            journal=Journal(config.journal_path, "embedded") if journal else None,
        )
    from .etcd import EtcdStore

    return EtcdStore(
        config,
        mono_ns=mono_ns,
        wall_ns=wall_ns,
        journal=Journal(config.journal_path, journal_name(config), marks_store_wide=True) if journal else None,
        build_client=etcd_client,
    )


def read_genesis(config: Config, *, etcd_client: Callable[[], object] | None = None) -> Genesis | None:
    """The genesis record of the store the configuration names, read without writing
    anything (no store is opened: no directory made, no journal, nothing claimed); None if
    it has none yet. A record the store cannot read raises the store's own error (the one
    its ``check_layout`` raises); etcd not answering raises EtcdUnavailable."""
    if config.embedded:
        from .files import read_genesis as read_file

        return read_file(config.state_dir)
    from .etcd import read_genesis as read_etcd

    return read_etcd(config, etcd_client)
