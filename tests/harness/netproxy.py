"""A TCP proxy on loopback that a test can sever: a network partition in a box.

Each proxy listens on a port the kernel picks (bound before anyone is told
about it, so there is no race) and forwards to one target. ``sever()`` turns it
into a black hole: connections stay open but nothing passes, so the other side
sees calls time out, as across a real partition, rather than fail fast.
``heal()`` closes the black-holed connections and forwards again. A proxy may
be made before its target exists (so the target can be told the proxy's
address) and pointed at it with ``forward_to()``.
"""

from __future__ import annotations

import selectors
import socket
import threading


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.severed = False
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def forward_to(self, target_host: str, target_port: int) -> None:
        """Connections accepted from now on go to this target."""
        with self._lock:
            self.target = (target_host, target_port)

    def sever(self) -> None:
        with self._lock:
            self.severed = True

    def heal(self) -> None:
        with self._lock:
            self.severed = False
            for sock in list(self._pairs):
                self._drop(sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._thread.join(5)
        for sock in list(self._pairs):
            self._drop(sock)
        self.listener.close()
        self._selector.close()

    def _drop(self, sock: socket.socket) -> None:
        other = self._pairs.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._pairs.pop(s, None)
            try:
                self._selector.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            for key, _ in self._selector.select(0.05):
                with self._lock:
                    sock = key.fileobj
                    if sock is self.listener:
                        self._accept()
                    elif sock in self._pairs:
                        self._forward(sock)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=1.0)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(True)
            s.settimeout(1.0)
            self._selector.register(s, selectors.EVENT_READ)
        self._pairs[client] = upstream
        self._pairs[upstream] = client

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        if self.severed:
            return  # the black hole
        try:
            self._pairs[sock].sendall(data)
        except OSError:
            self._drop(sock)
