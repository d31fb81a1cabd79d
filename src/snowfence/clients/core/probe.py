"""Whether a tcp:// endpoint refuses connections, asked before a socket is opened to it.

ZeroMQ reconnects silently: a DEALER connected to a port nothing listens on queues
the request and the client would wait a whole timeout before moving on. A plain TCP
connect learns the same in one round trip (a reset), so a client asks it first and
skips a refusing endpoint at once, as redis-cli or etcdctl do.
"""

from __future__ import annotations

import socket

#: The longest a probe waits for an answer. Only a refusal counts: a probe that times
#: out (a slow or silent host) leaves the endpoint to ZeroMQ and the client's timeout.
PROBE_TIMEOUT_S = 0.25


def refused(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when ``endpoint`` is tcp:// and its host refused a TCP connection just now;
    False for any other scheme, an answer, a timeout or a host that cannot be resolved."""
    if not endpoint.startswith("tcp://"):
        return False
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        return False
    try:
        with socket.create_connection((host, number), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
