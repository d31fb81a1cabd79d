"""The storage layer: the lease store interface, genesis records, the journal, and the
two stores (files under a state directory, and etcd). ``open_store`` builds the one a
configuration names; everything that holds a worker ID opens its store there, and
``read_genesis`` (and, in etcd, ``read_region_claims``) reads its records without opening it."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import Config
from .base import Lease, Store
from .genesis import Genesis
from .journal import Journal

__all__ = ["Lease", "Store", "journal_name", "open_journal", "open_store", "read_genesis", "read_region_claims"]


def journal_name(config: Config) -> str:
    """The journal file of an etcd cluster, in the node's state directory."""
    return f"etcd-{config.cluster}"


def open_journal(config: Config, journal: bool = True) -> Journal | None:
    """The journal a store of ``config`` is opened with: this node's (in ``journal_path``),
    named for the store. The one rule for both stores, decided here and nowhere else:

    - the file store always has it: its state directory is the node's own, and every read of
      it is checked against the journal (``journal=False`` changes nothing);
    - the etcd store has it unless ``journal`` is False (an operator's command, run away
      from the node's state directory, reads the store with no journal), and a mark that
      went back there means the whole store did (only a restore gives a key an older
      revision)."""
    if config.embedded:
        return Journal(config.journal_path, "embedded")
    return Journal(config.journal_path, journal_name(config), marks_store_wide=True) if journal else None


def open_store(
    config: Config,
    *,
    journal: bool = True,
    wall_ns: Callable[[], int] = time.time_ns,
    mono_ns: Callable[[], int] = time.monotonic_ns,
    etcd_client: Callable[[], object] | None = None,
) -> Store:
    """The lease store the configuration names, opened with every setting the node
    accepts, and this node's journal of it (:func:`open_journal`: ``journal=False``
    opens the etcd store with none, as an operator's command run away from the node's
    state directory reads it).

    Every holder opens its store here: the workers, the broker's own worker ID,
    ``snowfence accept-restore`` and the simulator, which passes its clocks and
    ``etcd_client`` (what builds the etcd client library's client)."""
    if config.embedded:
        from .files import FileStore

        return FileStore(
            config.state_dir,
            config.layout,
            config.region,
            journal=open_journal(config, journal),
            allow_unsafe_filesystem=config.allow_unsafe_filesystem,
            window_ms=config.store_window_ms,
            max_ahead_ms=config.max_ahead_ms,
            wall_ns=wall_ns,
        )
    from .etcd import EtcdStore

    return EtcdStore(
        config,
        mono_ns=mono_ns,
        wall_ns=wall_ns,
        journal=open_journal(config, journal),
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


def read_region_claims(config: Config, *, etcd_client: Callable[[], object] | None = None):
    """The region claims of the etcd the configuration names (``etcd/regions.py``), read
    without opening a store or writing anything; None in embedded mode, which has none.
    Raises as :func:`read_genesis` does."""
    if config.embedded:
        return None
    from .etcd import read_region_claims as read_etcd

    return read_etcd(config, etcd_client)
