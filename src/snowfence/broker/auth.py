"""The server half of CURVE: the broker's key pair, who may talk to it, and what it
says about those it turns away.

:class:`CurveServer` is the one place the broker reads its CURVE settings: it
loads the server key pair (``curve_secret_key``), makes the client-facing socket
a CURVE server, starts the ZAP handler for ``curve_allow``, watches the socket
for failed handshakes, and gives the peer-clock sockets the client side (nodes
of a cluster share the server key pair).

ZeroMQ drops a connection that fails CURVE without a word to either side: the
client only times out. So the broker watches for two kinds of denial, counts
them (``snowfence_curve_denials_total``) and logs them, at most one line per
``DENIAL_LOG_INTERVAL_S`` with the number left out:

- ``not_allowed``: a client whose handshake worked but whose public key is not
  in the ``curve_allow`` directory. The ZAP handler (:class:`Gatekeeper`) sees
  its key, logged as a fingerprint, and its address.
- ``handshake``: a client that does not speak CURVE, or encrypts for another
  server key. libzmq reports these on a socket monitor (:class:`HandshakeWatch`)
  before any key or address is known to it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter

import zmq
from zmq.auth.certs import load_certificates
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from ..config import Config
from ..curve import Curve, load_key_pair
from ..errors import ConfigError
from ..logs import event

log = logging.getLogger("snowfence.auth")

DENIAL_LOG_INTERVAL_S = 10.0


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a CURVE public key (raw 32 bytes or Z85)."""
    raw = z85.decode(public_key) if len(public_key) == 40 else public_key
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


class Denials:
    """Counts denials by reason; lets through one log line per interval (thread-safe)."""

    def __init__(self, interval_s: float = DENIAL_LOG_INTERVAL_S) -> None:
        self.counts: Counter = Counter()
        self._interval_ns = int(interval_s * 1e9)
        self._next_log_ns = 0
        self._unlogged = 0
        self._lock = threading.Lock()

    def deny(self, reason: str, message: str, **fields) -> None:
        now_ns = time.monotonic_ns()
        with self._lock:
            self.counts[reason] += 1
            if now_ns < self._next_log_ns:
                self._unlogged += 1
                return
            self._next_log_ns = now_ns + self._interval_ns
            unlogged, self._unlogged = self._unlogged, 0
        if unlogged:
            message += f" ({unlogged} more denied since the last such line)"
        event(log, "curve_denied", message, level=logging.WARNING, reason=reason, unlogged=unlogged, **fields)


def _listing(allow_dir: str) -> tuple:
    """What says the allow-list changed: the directory's ``*.key`` files with their
    inodes, sizes and modification times (OSError if the directory cannot be read)."""
    with os.scandir(allow_dir) as entries:
        found = []
        for entry in entries:
            if entry.name.endswith(".key"):
                st = entry.stat()
                found.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


class Gatekeeper(ThreadAuthenticator):
    """The ZAP handler: CURVE clients whose public keys are in ``allow_dir`` get in.

    With ``poll_s``, a thread looks at the directory that often and takes a changed
    list at once (for connections made from then on), logging each change once; a
    list that cannot be read leaves the last one in force."""

    def __init__(self, ctx: zmq.Context, allow_dir: str, denials: Denials, poll_s: float = 0.0) -> None:
        super().__init__(ctx, log=logging.getLogger("snowfence.auth.zap"))
        self.allow_dir = allow_dir
        self.denials = denials
        self.poll_s = poll_s
        self._peer = ""
        self._listing: tuple | None = None
        self._failed: str | None = None
        #: Keys that were on the list and are no longer (Z85): for whoever wants to stop
        #: serving a connection made before its key was taken off.
        self.revoked: frozenset[bytes] = frozenset()
        self._ever: set[bytes] = set()
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        try:
            self._listing = _listing(self.allow_dir)
        except OSError:
            self._listing = None
        self.configure_curve(domain="*", location=self.allow_dir)
        self._ever.update(self.certs.get("*", {}))
        if self.poll_s > 0:
            self._poller = threading.Thread(target=self._poll, name="snowfence-curve-allow", daemon=True)
            self._poller.start()

    def stop(self) -> None:
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join(2)
            self._poller = None
        super().stop()

    def _poll(self) -> None:
        while not self._stop_polling.wait(self.poll_s):
            self.reload()

    def reload(self) -> bool:
        """Read the directory again if it changed; True if the list of keys was replaced."""
        try:
            listing = _listing(self.allow_dir)
            if listing == self._listing:
                return False
            keys = load_certificates(self.allow_dir)
        except Exception as exc:  # noqa: BLE001 - any unreadable file: the old list stays
            why = f"{type(exc).__name__}: {exc}"
            self._listing = None  # the next list that can be read is taken and logged
            if why != self._failed:
                self._failed = why
                event(
                    log,
                    "curve_allow_unreadable",
                    f"CURVE: cannot read the allow-list {self.allow_dir} ({why}); the last one read stays in force",
                    level=logging.ERROR,
                    allow_dir=self.allow_dir,
                    error=why,
                )
            return False
        self._failed = None
        self._listing = listing
        old = self.certs.get("*", {})
        added = sum(1 for key in keys if key not in old)
        removed = sum(1 for key in old if key not in keys)
        self.certs["*"] = keys  # one assignment: the ZAP handler sees the old list or the new
        self._ever.update(keys)
        self.revoked = frozenset(key for key in self._ever if key not in keys)
        event(
            log,
            "curve_allow_reloaded",
            f"CURVE: allow-list {self.allow_dir} read again: {len(keys)} keys, {added} added, {removed} removed",
            allow_dir=self.allow_dir,
            keys=len(keys),
            added=added,
            removed=removed,
        )
        return True

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # ZAP request frames: version, request id, domain, address, identity, mechanism, credentials.
        self._peer = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
        allowed, reason = await super()._authenticate_curve(domain, client_key)
        if not allowed:
            peer = self._peer or "a local (ipc) client"
            key = fingerprint(client_key)
            self.denials.deny(
                "not_allowed",
                f"CURVE: turned away {peer}: client key {key} is not in {self.allow_dir}",
                peer=peer,
                key_fingerprint=key,  # the key itself never: a log is no place to copy keys from
            )
        return allowed, reason


#: libzmq's ZMTP protocol error codes, as a person would put them.
_PROTOCOL_ERRORS = {
    getattr(zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000001): "the client does not use CURVE",
    getattr(zmq, "PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC", 0x11000002): (
        "the client encrypts for another server key (or sends garbage)"
    ),
}


class HandshakeWatch:
    """Watches the client socket for failed handshakes, from a thread of its own."""

    EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket, denials: Denials) -> None:
        self._ctx = ctx
        self._sock = sock
        self._endpoint = f"inproc://snowfence-handshakes-{id(self)}"
        self.denials = denials
        sock.monitor(self._endpoint, self.EVENTS)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snowfence-handshakes", daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        pair = self._ctx.socket(zmq.PAIR)
        pair.linger = 0
        pair.connect(self._endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not pair.poll(200):
                    continue
                msg = parse_monitor_message(pair.recv_multipart())
                if msg["event"] == zmq.EVENT_MONITOR_STOPPED:
                    return
                why = _PROTOCOL_ERRORS.get(msg["value"], f"handshake failed (ZMTP error 0x{msg['value']:x})")
                where = msg["endpoint"].decode("utf-8", "replace")
                self.denials.deny("handshake", f"CURVE: a client on {where} was turned away: {why}", endpoint=where)
        except zmq.ZMQError:
            return
        finally:
            pair.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.disable_monitor()  # the thread reads MONITOR_STOPPED and ends
        except zmq.ZMQError:
            pass
        self._thread.join(2)


def load_server_key(path: str) -> tuple[bytes, bytes]:
    """The (public, secret) key pair of the server certificate at ``path``; ConfigError names what is wrong."""
    try:
        return load_key_pair(path, "CURVE key")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_allow_list(path: str) -> None:
    if not os.path.isdir(path):
        raise ConfigError(f"curve_allow {path} is not a directory")


class CurveServer:
    """The broker's CURVE settings, read once (``ConfigError`` for a bad key file or
    allow-list), and what they set up; :meth:`close` stops what was started."""

    def __init__(self, ctx: zmq.Context, config: Config, denials: Denials) -> None:
        self._ctx = ctx
        self.denials = denials
        self.public: bytes | None = None
        self.secret: bytes | None = None
        self.gatekeeper: Gatekeeper | None = None
        self.handshakes: HandshakeWatch | None = None
        #: The second server key pair and where it is served (``curve_next_secret_key``).
        self.next_public: bytes | None = None
        self.next_secret: bytes | None = None
        self.next_bind = getattr(config, "curve_next_bind", "")
        if config.curve_secret_key:
            self.public, self.secret = load_server_key(config.curve_secret_key)
        next_key = getattr(config, "curve_next_secret_key", "")
        if next_key:
            self.next_public, self.next_secret = load_server_key(next_key)
        if config.curve_allow:
            # ZAP handler: only clients whose public keys are in the directory get in.
            check_allow_list(config.curve_allow)
            self.gatekeeper = Gatekeeper(ctx, config.curve_allow, denials, getattr(config, "curve_allow_poll_s", 0.0))
            self.gatekeeper.start()

    def serve_on(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (not yet bound) a CURVE server; no-op without a key.

        With a next key pair, ``sock`` is bound here to ``curve_next_bind`` under that
        key first: libzmq takes the keys an endpoint serves when it is bound, so the
        endpoint the caller binds next serves the first key pair (and stays the
        socket's last endpoint)."""
        if self.secret is None:
            return
        sock.curve_server = True
        if self.next_secret is not None:
            sock.curve_publickey = self.next_public
            sock.curve_secretkey = self.next_secret
            try:
                sock.bind(self.next_bind)
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot bind {self.next_bind}: {zmq.strerror(exc.errno)}") from None
            event(
                log,
                "curve_next_key",
                f"CURVE: the next server key {fingerprint(self.next_public)} is served on "
                f"{sock.getsockopt_string(zmq.LAST_ENDPOINT)}",
                bind=self.next_bind,
                key_fingerprint=fingerprint(self.next_public),
            )
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def watch(self, sock: zmq.Socket) -> None:
        """Count and log failed handshakes on ``sock`` (once it is a CURVE server)."""
        if self.secret is not None and self.handshakes is None:
            self.handshakes = HandshakeWatch(self._ctx, sock, self.denials)

    def for_peers(self) -> Curve | None:
        """The client side for other nodes of the cluster, which share this key pair."""
        if self.secret is None:
            return None
        return Curve(self.public, self.public, self.secret)

    def close(self) -> None:
        if self.handshakes is not None:
            self.handshakes.close()
            self.handshakes = None
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
            self.gatekeeper = None
