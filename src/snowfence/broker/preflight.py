"""What ``serve`` checks before it binds anything or says it is serving.

:class:`~snowfence.config.Config` validates what holds for every process that
reads the settings, workers included. These checks are about this start, on
this host, now, so they run once, where ``serve`` starts (and in
``check-config``), not in the config: a worker re-validates its config under a
clock that may have stepped since.

- The epoch must be in the past: before it no ID can be minted, and a node
  would wait, never ready, as if the clock had been set back.
- The state directory must be usable: a node that announced "serving" and then
  halted because its workers cannot write there looks, to a service manager,
  like one that crashed.
- The CURVE key and allow-list must be readable (the broker reads them again
  when it sets CURVE up), and etcd mode needs the etcd extra installed.

:func:`warnings` names settings that work but quietly do less than meant.
"""

from __future__ import annotations

import os
import time

from ..config import Config
from ..errors import ConfigError, StateDirError
from ..ids import format_unix_ms
from . import auth
from .membership import WILDCARD_HOSTS


def check(config: Config, *, create: bool = True) -> None:
    """Raise :class:`ConfigError` (or :class:`StateDirError`) for what would keep this node from serving.

    ``create``: make the state directory if it is missing and prove it writable by
    writing to it (``serve``); without it nothing on disk is touched (``check-config``).
    """
    check_epoch(config)
    check_state_dir(config.state_dir, create=create)
    if config.curve_secret_key:
        auth.load_server_key(config.curve_secret_key)
    if config.curve_allow:
        auth.check_allow_list(config.curve_allow)
    if not config.embedded:
        from ..etcd.client import require_client

        require_client()  # here, not in every worker after the node started


def check_epoch(config: Config, now_ms: int | None = None) -> None:
    epoch_ms = config.layout.epoch_ms
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if epoch_ms > now_ms:
        raise ConfigError(
            f"epoch {format_unix_ms(epoch_ms)} is in the future (the clock says {format_unix_ms(now_ms)}): "
            "no ID can be minted before it; give an epoch in the past (the default is 2026-01-01T00:00:00Z), "
            "and the same one to every node of the cluster"
        )


def check_state_dir(path: str, *, create: bool = True) -> None:
    if create:
        probe = os.path.join(path, f".writable.{os.getpid()}")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError as exc:
            raise StateDirError(f"state directory {path} is not usable: {exc.strerror or exc}") from None
        return
    # Without touching anything: the directory, or the nearest parent it would be made in.
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise StateDirError(f"state directory {path} is not usable: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "it" if existing == os.path.abspath(path) else f"{existing}, where it would be made,"
        raise StateDirError(f"state directory {path} is not usable: {what} is not writable")


def warnings(config: Config) -> list[tuple[str, str]]:
    """(event name, message) for each setting that works but does less than an operator would expect."""
    found = []
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
