"""What ``serve`` checks before it binds anything or says it is serving.

:class:`~snowfence.config.Config` validates what holds for every process that
reads the settings, workers included. These checks are about this start, on
this host, now, so they run once, where ``serve`` starts (and in
``check-config``), not in the config: a worker re-validates its config under a
clock that may have stepped since.

- The epoch must be in the past: before it no ID can be minted, and a node
  would wait, never ready, as if the clock had been set back.
- The layout must not end (``epoch + 2**time_bits`` ms) within
  ``min_layout_years_left`` years, and never be past its end: a node that
  starts then runs out of milliseconds with no warning but this.
- The state directory must be usable: a node that announced "serving" and then
  halted because its workers cannot write there looks, to a service manager,
  like one that crashed.
- So must the journal directory (``journal_dir``), which the workers write
  before their first claim.
- ``bind`` is one endpoint.
- No other home (another state directory, or an etcd cluster) serves this node's
  region on this host (see ``store/home.py``; ``serve`` then holds its own).
- The layout must be the one the store recorded, if it recorded one (read
  without writing; etcd not answering is left to the workers), and in etcd
  mode the region must not be another cluster's (:func:`check_region`).
- The CURVE key and allow-list must be readable (the broker reads them again
  when it sets CURVE up), and etcd mode needs the etcd extra installed.
- A node needs the server extra installed (:func:`require_server`); a client
  install (``pip install snowfence``) has only pyzmq and orjson.

:func:`warnings` names settings that work but quietly do less than meant.
"""

from __future__ import annotations

import os
import time

from ..config import Config, missing_modules
from ..errors import ConfigError, EtcdUnavailable, LayoutMismatch, StateDirError
from ..ids import MS_PER_YEAR, format_unix_ms
from ..store import home, read_genesis, read_region_claims
from ..store.filesystems import KERNEL_FILESYSTEMS, filesystem_type
from ..store.genesis import Genesis
from . import auth
from .membership import WILDCARD_HOSTS

#: The top-level modules of the ``server`` extra a node cannot run without: the broker's
#: /metrics and its HTTP door. (setproctitle is in the extra too, but a node runs without
#: it, with the short process name only; uvloop is for the asyncio client.)
SERVER_MODULES = ("prometheus_client", "httptools")


def require_server() -> None:
    """A ConfigError naming the extra when the server's dependencies are not installed.

    ``pip install snowfence`` is a client install; a node needs ``pip install
    'snowfence[server]'``. Looks, without importing, so that it can run before
    the broker's modules (which import them) are imported.
    """
    missing = missing_modules(SERVER_MODULES)
    if missing:
        raise ConfigError(
            f"a node needs the server extra, which is not installed (no {', '.join(missing)}): "
            "pip install 'snowfence[server]'"
        )


def check(config: Config, *, create: bool = True) -> None:
    """Raise :class:`ConfigError` (or :class:`StateDirError`) for what would keep this node from serving.

    ``create``: make the state directory if it is missing and prove it writable by
    writing to it (``serve``); without it nothing on disk is touched (``check-config``).
    """
    require_server()
    check_epoch(config)
    check_layout_end(config)
    check_bind(config)
    home.check(config)  # before anything is made on disk
    check_state_dir(config.state_dir, create=create)
    check_state_dir(config.journal_path, create=create, what="journal directory")
    if config.curve_secret_key:
        auth.load_server_key(config.curve_secret_key)
    if config.curve_allow:
        auth.check_allow_list(config.curve_allow)
    if not config.embedded:
        from ..etcd.client import require_client

        require_client()  # here, not in every worker after the node started
    check_layout(config)
    check_region(config)


def check_bind(config: Config) -> None:
    """``bind`` is one endpoint: a node binds one (libzmq would take a list for a device name)."""
    parts = [p for p in config.bind.replace(" ", ",").split(",") if p]
    if len(parts) > 1:
        raise ConfigError(
            f"bind {config.bind!r} names {len(parts)} endpoints; a node binds one: run a node for each, "
            "and give clients every node's endpoint (or let them discover the cluster's nodes)"
        )


def recorded_layout(config: Config) -> Genesis | None:
    """The genesis record the store holds, read without writing anything; None if there is
    none yet, or if etcd does not answer (or no client can be had here: the TLS files of the
    pod, say): the workers check the layout when they reach etcd, and say why they cannot.
    One that cannot be read is refused by the store, in its own words."""
    try:
        return read_genesis(config)
    except EtcdUnavailable:
        return None


def _refuse_as_the_store_does(config: Config) -> None:
    """The store's own ``check_layout`` (through ``open_store``), for a record it refuses: it
    raises before it writes anything (a record that differs, or cannot be read)."""
    from ..store import open_store

    store = open_store(config, journal=False)
    try:
        store.check_layout(config.layout)
    finally:
        store.close()


def check_layout(config: Config) -> None:
    """Refuse a layout other than the one the store recorded, with the store's own words.
    A store with no record yet takes this node's at its first claim; etcd not answering is
    left to the workers, which wait for it."""
    recorded = recorded_layout(config)
    if recorded is None or recorded.layout == config.layout:
        return
    _refuse_as_the_store_does(config)
    raise LayoutMismatch(  # not reached: the store refuses a layout that differs
        f"the store recorded layout [{recorded.layout.describe()}] but this node is configured for "
        f"[{config.layout.describe()}]"
    )


def check_region(config: Config) -> None:
    """Refuse, in the store's own words (LayoutMismatch), a region another cluster of this etcd
    claims, or claims of other widths, before the node binds or says anything: its workers
    would refuse it at their first claim, after the node said it serves. Read without
    writing; etcd not answering is left to the workers. (Two clusters' first starts at once
    both pass here: the claim's transaction refuses one of them.)"""
    try:
        claims = read_region_claims(config)
    except EtcdUnavailable:
        return
    if claims is not None:
        claims.check(config.region, config.cluster, config.layout)


def check_epoch(config: Config, now_ms: int | None = None) -> None:
    epoch_ms = config.layout.epoch_ms
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if epoch_ms > now_ms:
        raise ConfigError(
            f"epoch {format_unix_ms(epoch_ms)} is in the future (the clock says {format_unix_ms(now_ms)}): "
            "no ID can be minted before it; give an epoch in the past (the default is 2026-01-01T00:00:00Z), "
            "and the same one to every node of the cluster"
        )


def check_layout_end(config: Config, now_ms: int | None = None) -> None:
    """Refuse a layout that has ended, or ends within ``min_layout_years_left`` years."""
    layout = config.layout
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    end = format_unix_ms(layout.end_unix_ms)
    way_out = (
        "give more time_bits or a later epoch (a store keeps the layout it recorded: a new layout needs a new "
        "state directory or cluster, and its IDs need not sort above the old ones)"
    )
    if layout.end_unix_ms <= now_ms:
        raise ConfigError(f"the layout ended at {end} ({layout.time_bits} time bits): no ID can be minted; {way_out}")
    minimum = config.min_layout_years_left
    if layout.end_unix_ms - now_ms < minimum * MS_PER_YEAR:
        raise ConfigError(
            f"the layout ends at {end}, {layout.years_left(now_ms):.2f} years from now, fewer than "
            f"min_layout_years_left {minimum:g}: {way_out}, or lower min_layout_years_left (0: refuse only an "
            "ended layout)"
        )


def check_state_dir(path: str, *, create: bool = True, what: str = "state directory") -> None:
    if create:
        probe = os.path.join(path, f".writable.{os.getpid()}")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError as exc:
            raise StateDirError(f"{what} {path} is not usable: {exc.strerror or exc}") from None
        return
    # Without touching anything: the directory, or the nearest parent it would be made in.
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise StateDirError(f"{what} {path} is not usable: {existing} is not a directory")
    where = "it" if existing == os.path.abspath(path) else f"{existing}, where it would be made,"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StateDirError(f"{what} {path} is not usable: {where} is not writable")
    # Root passes os.access anywhere; serve's mkdir and probe file still fail on these.
    kernel = KERNEL_FILESYSTEMS.get(filesystem_type(existing))
    if kernel or os.statvfs(existing).f_flag & os.ST_RDONLY:
        on = f"the kernel's {kernel} filesystem" if kernel else "a read-only filesystem"
        raise StateDirError(f"{what} {path} is not usable: {where} is on {on}, where nothing can be written")


def etcd_version_problem(version: str) -> str | None:
    """Why an etcd server of ``version`` is unsafe to run snowfence on; None if it is not known to be.

    etcd 3.5.0 to 3.5.4 panic when the deadline of a read-only transaction passes while it
    is applied (etcd issue 14110, fixed in 3.5.5). snowfence reads the store in read-only
    transactions with a deadline (``--etcd-timeout-s``); a fleet's load on a 3-member
    cluster of 3.5.1 took every member down at once (benchmarks/fleet.py).
    """
    try:
        major, minor, patch = (int(part) for part in version.split("-")[0].split(".")[:3])
    except ValueError:
        return None
    if (major, minor) == (3, 5) and patch < 5:
        return (
            f"etcd {version} crashes when a read-only transaction's deadline passes while it is applied "
            "(etcd issue 14110, fixed in 3.5.5): under load, snowfence's reads can take every member down "
            "at once; upgrade etcd to 3.5.5 or later"
        )
    return None


def _server_version(connection) -> str:
    return connection.client.status().version


def etcd_warnings(config: Config) -> list[tuple[str, str]]:
    """(event name, message) for an etcd server known to be unsafe (asked of the member this
    node reaches first); nothing if etcd does not answer (the workers say why)."""
    if config.embedded:
        return []
    from ..etcd.client import Connection, etcd_call

    try:
        connection = Connection(config)
    except ConfigError:
        return []
    try:
        version = etcd_call(_server_version)(connection)
    except (EtcdUnavailable, ConfigError):
        return []
    finally:
        connection.close()
    problem = etcd_version_problem(str(version))
    return [("etcd_version_unsafe", problem)] if problem else []


def warnings(config: Config) -> list[tuple[str, str]]:
    """(event name, message) for each setting that works but does less than an operator would
    expect, and for an etcd server known to be unsafe."""
    found = etcd_warnings(config)
    host = config.bind.partition("://")[2].rpartition(":")[0]
    if not config.embedded and not config.advertise and config.bind.startswith("tcp://") and host in WILDCARD_HOSTS:
        found.append(
            (
                "nothing_advertised",
                f"this node binds the wildcard {config.bind} and advertises no endpoint in etcd: clients will not "
                "discover it and its peers will not measure its clock; set --advertise tcp://ADDRESS:PORT "
                "(in Kubernetes from the pod's IP, status.podIP)",
            )
        )
    return found
