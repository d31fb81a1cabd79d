"""systemd's readiness protocol (sd_notify) without libsystemd: one datagram per message.

With ``Type=notify`` systemd passes the address of a Unix datagram socket in
``NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace) and waits for
``READY=1`` before it counts the service as started; ``STOPPING=1`` tells it a
stop has begun, ``STATUS=`` is the line ``systemctl status`` shows. Anywhere
else the variable is unset and :class:`Notifier` does nothing.

The broker takes the variable out of its environment when it reads it, as
``sd_notify(unset_environment=1)`` does, so its workers do not inherit it: only
the main process speaks for the service.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

from ..logs import event

log = logging.getLogger("snowfence.broker")

ENV = "NOTIFY_SOCKET"


def _address(value: str) -> str | None:
    """The socket address systemd gave; None for one this module does not speak (vsock:, relative)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


class Notifier:
    """Sends sd_notify messages to the service manager, if there is one."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        given = environ.pop(ENV, "")
        self.address = _address(given)
        if given and self.address is None:
            event(
                log, "notify_unsupported", f"{ENV}={given!r} is not a Unix socket; not notifying", level=logging.WARNING
            )

    def notify(self, **fields: str) -> bool:
        """Send ``KEY=value`` lines (``notify(READY="1", STATUS="...")``); False if nobody listens."""
        if self.address is None:
            return False
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:
            event(
                log, "notify_failed", f"cannot notify the service manager: {exc.strerror or exc}", level=logging.WARNING
            )
            return False
        return True
