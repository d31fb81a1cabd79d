"""One frozen, typed configuration for a node.

Each field is documented where it is defined and maps one to one onto a
command-line flag (``state_dir`` -> ``--state-dir``), an environment variable
(``SNOWFENCE_STATE_DIR``) and a key of the TOML file given by ``--config``.
Precedence: defaults < TOML file < environment < flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import ipaddress
import math
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .errors import ConfigError
from .ids import DEFAULT_EPOCH_MS, Layout, parse_epoch
from .protocol import endpoint_problem

ENV_PREFIX = "SNOWFENCE_"


def default_state_dir() -> str:
    """systemd's $STATE_DIRECTORY (StateDirectory=), else $XDG_STATE_HOME/snowfence."""
    systemd = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return systemd
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "snowfence")


def setting(default: Any, help: str, *, secret: bool = False, metavar: str | None = None) -> Any:
    """A config field with the documentation its flag and env var share."""
    return field(default=default, metadata={"help": help, "secret": secret, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """Everything a node needs to know; validated on construction."""

    # -- serving ------------------------------------------------------------------
    bind: str = setting("tcp://127.0.0.1:5555", "ZeroMQ endpoint the broker binds for clients.", metavar="ENDPOINT")
    fast_bind: str = setting(
        "auto",
        "HOST:PORT of the fast port: plain TCP beside the ZeroMQ endpoint, carrying the same requests and "
        "replies, each after its length, without ZeroMQ's I/O threads on either end. Clients learn it from "
        "NODES and send there each reservation that fits one request. auto (the default): the bind's host, "
        "on a port the system picks, when bind is tcp://; off: none. There is no fast port with CURVE "
        "(it carries no encryption).",
        metavar="HOST:PORT",
    )
    http_bind: str = setting(
        "auto",
        "HOST:PORT of the HTTP door: HTTP/1.1 and JSON (GET /v1/ids?count=N, /v1/status, ...; docs/HTTP.md) for "
        "curl and languages without ZeroMQ, admitted as every other request. auto (the default): the bind's host, "
        "on a port the system picks, when bind is tcp://; off: none. There is no HTTP door with CURVE (it has "
        "neither encryption nor authentication).",
        metavar="HOST:PORT",
    )
    workers: int = setting(
        0,
        "Worker processes to run; 0 means one per CPU this process may use (its affinity mask and cgroup quota).",
        metavar="N",
    )
    ids_per_worker: int = setting(
        1,
        "Worker IDs each worker process leases and mints from in turn. More than one trades worker-ID space "
        "for speed beyond 4,096 IDs per millisecond per process.",
        metavar="N",
    )
    max_inflight_per_client: int = setting(
        1024, "Requests one client connection may have in flight; beyond it, 'overloaded'.", metavar="N"
    )
    worker_credits: int = setting(
        32, "Requests the broker may queue at one worker, whatever their size (see worker_queue_ms).", metavar="N"
    )
    worker_queue_ms: float = setting(
        1.0,
        "Minting time the broker may queue at one worker, per worker ID it holds: at most this many "
        "milliseconds of IDs (4,096 per ms in the default layout) wait there, so a newcomer's request waits "
        "about this long behind anyone else's pipeline. Lower: less waiting, less slack to keep the layout's "
        "ceiling.",
        metavar="MS",
    )
    broker_mint_max_ids: int = setting(
        64,
        "Plain requests of up to this many IDs the broker answers itself, in one hop, from a worker ID of "
        "its own: leased, fenced and marked as any worker's, claimed once every worker of the node holds its "
        "own and only while another worker ID of the region stays free, and given back when none does "
        "(workers come first). 0: every request goes to a worker.",
        metavar="N",
    )
    watermark_interval_s: float = setting(
        1.0,
        "Seconds between the node's watermark rounds: each reads every worker ID's floor from the store and "
        "promises the lowest (WATERMARK answers the last promise at once). 0: the node answers no WATERMARK.",
        metavar="S",
    )

    # -- identity and layout ----------------------------------------------------------
    region: int = setting(0, "Region number stamped into every ID this node mints.", metavar="R")
    epoch: str = setting(str(DEFAULT_EPOCH_MS), "ID epoch: Unix milliseconds or an ISO-8601 UTC time.", metavar="TIME")
    time_bits: int = setting(41, "Bits of milliseconds since the epoch.", metavar="BITS")
    region_bits: int = setting(3, "Bits of region number.", metavar="BITS")
    worker_bits: int = setting(7, "Bits of worker ID.", metavar="BITS")
    sequence_bits: int = setting(12, "Bits of per-millisecond sequence.", metavar="BITS")
    shard_bits: int = setting(
        0,
        "High bits ahead of the timestamp holding a hash of the worker ID (0: none). The widths sum to 63, so "
        "take these bits from another one: --shard-bits 3 --time-bits 38.",
        metavar="BITS",
    )
    min_layout_years_left: float = setting(
        1.0,
        "serve refuses to start when the layout ends (epoch + 2^time_bits ms) in fewer years than this: time "
        "to plan a successor layout. 0: only a layout already past its end is refused.",
        metavar="YEARS",
    )

    # -- leases -----------------------------------------------------------------------
    state_dir: str = setting(
        default_state_dir(),
        "Directory for worker-ID locks and marks (embedded mode) and each worker's last worker ID.",
        metavar="DIR",
    )
    journal_dir: str = setting(
        "",
        "Directory of the node's journal: what it saw its store hold, so a store that forgets (keys deleted, a "
        "backup restored) is caught. Empty: <state_dir>/journal. On another disk, it outlives a wiped or restored "
        "state directory too.",
        metavar="DIR",
    )
    allow_unsafe_filesystem: bool = setting(
        False,
        "Run embedded mode on a state directory whose filesystem (NFS, FUSE, CIFS, ...) may not make flock "
        "exclusive across processes; refused by default.",
        metavar="BOOL",
    )
    etcd: tuple[str, ...] = setting(
        (),
        "etcd endpoints, comma-separated (http[s]://host:port; host:port is http); empty means embedded mode.",
        metavar="URLS",
    )
    cluster: str = setting("default", "Cluster name: the etcd key prefix /snowfence/<cluster>/.", metavar="NAME")
    etcd_ca: str = setting("", "CA certificate file for etcd TLS.", metavar="FILE")
    etcd_cert: str = setting("", "Client certificate file for etcd TLS.", metavar="FILE")
    etcd_key: str = setting("", "Client key file for etcd TLS.", metavar="FILE")
    etcd_user: str = setting("", "etcd user name (with --etcd-password).", metavar="USER")
    etcd_password: str = setting(
        "", "etcd password; prefer the environment or the config file to a flag.", secret=True, metavar="PASSWORD"
    )
    etcd_timeout_s: float = setting(1.0, "Deadline of every etcd call, in seconds.", metavar="S")
    lease_ttl_s: int = setting(10, "TTL of a worker-ID lease in etcd, in seconds.", metavar="S")
    keepalive_interval_s: float = setting(2.0, "Seconds between lease renewals (and mark extensions).", metavar="S")
    fence_after_s: float = setting(
        5.0, "A worker refuses (fenced) when no renewal sent within this many seconds succeeded.", metavar="S"
    )
    partition_minting: bool = setting(
        False,
        "Keep minting while cut off from etcd, until the reservation runs out, instead of fencing at "
        "fence_after_s. Pair it with a longer reservation_window_s: a dead owner's worker ID then stays unused "
        "for as long.",
        metavar="BOOL",
    )
    reservation_window_s: float = setting(
        5.0, "How far ahead of the wall clock the time high-water mark is extended, in seconds.", metavar="S"
    )
    max_reservation_window_s: float = setting(
        5.0,
        "The longest reservation_window_s any node of this store may use, in seconds: set it alike on every "
        "node (a node with a longer window will not start). A worker ID whose state the store forgot mints "
        "nothing for this long (plus max_clock_skew_ms in etcd mode), and so does a store that looks new (a first "
        "start, or a state directory made again under a node this one cannot see): a node nobody remembers may "
        "have reserved that far ahead. etcd records the highest with the region's claim.",
        metavar="S",
    )

    # -- clock ------------------------------------------------------------------------
    max_step_back_ms: int = setting(
        10, "Backward clock steps up to this many ms are waited out; larger ones refuse.", metavar="MS"
    )

    clock_policy: str = setting(
        "wait",
        "wait: wait out small steps back and full milliseconds; hlc: keep minting from a logical clock "
        "up to max_ahead_ms ahead of the wall clock, never waiting.",
        metavar="POLICY",
    )
    max_ahead_ms: int = setting(
        1000,
        "hlc: how far the logical clock (and a causal token) may run ahead of the wall clock: set it alike on "
        "every node of a directory (a worker ID whose holder let go unseen waits this long; a new store waits "
        "out max_reservation_window_s, which is longer).",
        metavar="MS",
    )
    max_clock_error_ms: int = setting(
        0,
        "Refuse while the kernel reports the clock unsynchronised or its maximum error above this many ms; "
        "0 turns the check off (many hosts report an unsynchronised clock).",
        metavar="MS",
    )
    forward_jump_ms: int = setting(
        1000,
        "A wall clock this many ms ahead of the monotonic clock's account is a forward jump: logged, counted.",
        metavar="MS",
    )
    refuse_forward_jumps: bool = setting(
        False, "Refuse (clock_unsafe) while the wall clock is ahead after a forward jump.", metavar="BOOL"
    )

    # -- security ---------------------------------------------------------------------------
    curve_secret_key: str = setting(
        "",
        "Server certificate with its secret key (from `snowfence keygen`): clients must use CURVE.",
        metavar="FILE",
    )
    curve_allow: str = setting(
        "",
        "Directory of client public-key certificates allowed to connect (with curve_secret_key); "
        "empty lets any client that knows the server key in.",
        metavar="DIR",
    )
    curve_allow_poll_s: float = setting(
        1.0,
        "Look at the curve_allow directory this often (seconds) and take a changed list of keys at once, "
        "for new connections (a key taken off is turned away within about this long); 0 reads it once, at start.",
        metavar="S",
    )
    curve_next_secret_key: str = setting(
        "",
        "A second server certificate with its secret key, served on curve_next_bind beside the first: clients "
        "move to its public key one by one before it replaces curve_secret_key (docs/OPERATIONS.md).",
        metavar="FILE",
    )
    curve_next_bind: str = setting(
        "", "ZeroMQ endpoint the broker binds for clients of curve_next_secret_key.", metavar="ENDPOINT"
    )

    peers: tuple[str, ...] = setting(
        (),
        "Other nodes' client endpoints, comma-separated: this node measures its clock offset to them.",
        metavar="EPS",
    )
    advertise: tuple[str, ...] = setting(
        (),
        "Client endpoints this node tells clients and peers about (NODES, its membership entry in etcd), "
        "comma-separated; by default the endpoint it bound, unless that is a wildcard.",
        metavar="EPS",
    )
    node_name: str = setting(
        "", "This node's name in the cluster's membership; by default its first advertised endpoint.", metavar="NAME"
    )
    max_clock_skew_ms: int = setting(
        1000,
        "The most any two nodes' wall clocks of one etcd cluster may differ (NTP keeps them within "
        "milliseconds; 1 s allows for a bad day). A worker ID whose state the store has forgotten is "
        "claimed only after its reservation window plus this much; embedded mode (one clock) ignores it.",
        metavar="MS",
    )
    max_peer_offset_ms: int = setting(
        -1,
        "Claim nothing until a majority of the cluster vouches for the clock within this; while no majority "
        "agrees with it, leave rotation and let the worker IDs held go (two nodes apart: both); -1 (the default) is "
        "half of max_clock_skew_ms, so that nodes in rotation are within max_clock_skew_ms of each other; "
        "0 only measures (the skew bound is then assumed).",
        metavar="MS",
    )

    # -- operations ---------------------------------------------------------------------
    metrics_bind: str = setting(
        "",
        "HOST:PORT for Prometheus metrics and health endpoints (/metrics, /livez, /readyz): 127.0.0.1:9464, "
        "[::1]:9464 (IPv6 in brackets), 0.0.0.0:9464 or :9464 for every IPv4 interface; empty is off.",
        metavar="HOST:PORT",
    )

    # -- processes ----------------------------------------------------------------------
    heartbeat_interval_s: float = setting(0.5, "Seconds between heartbeats of broker and workers.", metavar="S")
    heartbeat_timeout_s: float = setting(
        3.0, "A worker silent this long leaves rotation; a broker silent this long ends its workers.", metavar="S"
    )
    shutdown_timeout_s: float = setting(
        4.0, "Seconds workers get to drain and release on shutdown before they are killed.", metavar="S"
    )
    worker_kill_after_s: float = setting(
        30.0,
        "A worker silent this long (stopped, hung) is killed (SIGTERM, then SIGKILL) and its slot restarted.",
        metavar="S",
    )
    loop_stall_s: float = setting(
        5.0,
        "A worker whose minting loop has not turned for this long gives up its worker IDs from the inside: "
        "its keep-alive stops renewing, it fences, and a file lock is let go.",
        metavar="S",
    )

    # -- logs ---------------------------------------------------------------------------
    log_level: str = setting("info", "debug, info, warning or error.", metavar="LEVEL")
    log_format: str = setting("text", "text, or json for one JSON object per event.", metavar="FORMAT")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _coerce(f, getattr(self, f.name)))
        for name in WORD_SETTINGS:  # DEBUG, Json and HLC mean what they say
            object.__setattr__(self, name, getattr(self, name).strip().lower())
        layout = self.layout  # validates widths and epoch
        layout.check_region(self.region)
        problem = endpoint_problem(self.bind, bind=True) or _bind_host_problem(self.bind)
        if problem:
            raise ConfigError(f"bind: {problem}")
        for peer in self.peers:
            if endpoint_problem(peer):
                raise ConfigError(f"peers: {endpoint_problem(peer)}")
        for endpoint in self.advertise:
            if endpoint_problem(endpoint):
                raise ConfigError(f"advertise: {endpoint_problem(endpoint)}")
        if not self.node_name.isprintable() or len(self.node_name) > 200:
            raise ConfigError("node_name must be printable and at most 200 characters")
        if self.workers < 0 or self.workers > layout.max_worker + 1:
            raise ConfigError(f"workers must be 0..{layout.max_worker + 1}, got {self.workers}")
        if not 1 <= self.ids_per_worker <= layout.max_worker + 1:
            raise ConfigError(f"ids_per_worker must be 1..{layout.max_worker + 1}, got {self.ids_per_worker}")
        if self.worker_count * self.ids_per_worker > layout.max_worker + 1:
            raise ConfigError(
                f"{self.worker_count} workers x {self.ids_per_worker} worker IDs each need more than the "
                f"{layout.max_worker + 1} worker IDs a region has with {layout.worker_bits} worker bits"
            )
        if not 0 <= self.min_layout_years_left <= 100:
            raise ConfigError(f"min_layout_years_left must be 0..100, got {self.min_layout_years_left:g}")
        if self.max_inflight_per_client < 1:
            raise ConfigError(f"max_inflight_per_client must be at least 1, got {self.max_inflight_per_client}")
        if not 1 <= self.worker_credits <= 1024:
            raise ConfigError(f"worker_credits must be 1..1024, got {self.worker_credits}")
        if not 0 <= self.broker_mint_max_ids <= 4096:
            raise ConfigError(f"broker_mint_max_ids must be 0..4096, got {self.broker_mint_max_ids}")
        if not 0 <= self.watermark_interval_s <= 3600:
            raise ConfigError(f"watermark_interval_s must be 0..3600, got {self.watermark_interval_s}")
        if not 0.1 <= self.worker_queue_ms <= 1000:
            raise ConfigError(f"worker_queue_ms must be 0.1..1000, got {self.worker_queue_ms}")
        _positive(
            self,
            "etcd_timeout_s",
            "keepalive_interval_s",
            "fence_after_s",
            "reservation_window_s",
            "heartbeat_interval_s",
            "heartbeat_timeout_s",
            "shutdown_timeout_s",
            "worker_kill_after_s",
            "loop_stall_s",
        )
        if self.worker_kill_after_s <= self.heartbeat_timeout_s:
            raise ConfigError(
                "worker_kill_after_s must exceed heartbeat_timeout_s: a silent worker leaves rotation first, "
                "and is killed only if it stays silent"
            )
        if self.lease_ttl_s < 2:
            raise ConfigError(f"lease_ttl_s must be at least 2, got {self.lease_ttl_s}")
        if not self.keepalive_interval_s < self.fence_after_s < self.lease_ttl_s:
            raise ConfigError(
                "need keepalive_interval_s < fence_after_s < lease_ttl_s so a worker fences itself "
                f"before etcd can give its worker ID away; got {self.keepalive_interval_s} < "
                f"{self.fence_after_s} < {self.lease_ttl_s}"
            )
        if self.etcd_timeout_s >= self.fence_after_s:
            raise ConfigError("etcd_timeout_s must be shorter than fence_after_s")
        if not 0 < self.max_reservation_window_s <= 3600:
            raise ConfigError(
                f"max_reservation_window_s must be above 0 and at most 3600, got {self.max_reservation_window_s}"
            )
        if self.reservation_window_s > self.max_reservation_window_s:
            raise ConfigError(
                f"reservation_window_s {self.reservation_window_s:g} is above max_reservation_window_s "
                f"{self.max_reservation_window_s:g}: a store that looks new waits out only the bound, so a node may "
                "not reserve further; raise max_reservation_window_s on every node of the store"
            )
        if self.reservation_window_s <= self.keepalive_interval_s:
            raise ConfigError(
                "reservation_window_s must exceed keepalive_interval_s, or the reservation runs out between renewals"
            )
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError("heartbeat_timeout_s must be more than twice heartbeat_interval_s")
        if self.clock_policy not in ("wait", "hlc"):
            raise ConfigError(f"clock_policy must be wait or hlc, got {self.clock_policy!r}")
        if not 0 <= self.max_ahead_ms < self.reservation_window_s * 1000:
            raise ConfigError("max_ahead_ms must be below the reservation window, or minting ahead would outrun it")
        if self.max_peer_offset_ms < -1:
            raise ConfigError("max_peer_offset_ms must be >= 0, or -1 for half of max_clock_skew_ms")
        if not 0 <= self.max_clock_skew_ms <= 3_600_000:
            raise ConfigError(f"max_clock_skew_ms must be 0..3600000, got {self.max_clock_skew_ms}")
        if self.curve_allow and not self.curve_secret_key:
            raise ConfigError("curve_allow needs curve_secret_key")
        if not 0 <= self.curve_allow_poll_s <= 3600:
            raise ConfigError(f"curve_allow_poll_s must be 0..3600, got {self.curve_allow_poll_s}")
        if bool(self.curve_next_secret_key) != bool(self.curve_next_bind):
            raise ConfigError("curve_next_secret_key and curve_next_bind go together")
        if self.curve_next_secret_key and not self.curve_secret_key:
            raise ConfigError("curve_next_secret_key needs curve_secret_key")
        if self.max_clock_error_ms < 0 or self.forward_jump_ms < 1:
            raise ConfigError("max_clock_error_ms must be >= 0 and forward_jump_ms >= 1")
        if self.fast_bind not in ("auto", "off", ""):
            try:
                host_port(self.fast_bind, "127.0.0.1:5556")
            except ValueError as exc:
                raise ConfigError(f"fast_bind {self.fast_bind!r}: {exc} (or auto, or off)") from None
            if self.curve_secret_key:
                raise ConfigError(
                    "fast_bind: the fast port carries no encryption, and a node with CURVE has none "
                    "(set fast_bind to off or auto)"
                )
        if self.http_bind not in ("auto", "off", ""):
            try:
                host_port(self.http_bind, "127.0.0.1:8080")
            except ValueError as exc:
                raise ConfigError(f"http_bind {self.http_bind!r}: {exc} (or auto, or off)") from None
            if self.curve_secret_key:
                raise ConfigError(
                    "http_bind: the HTTP door has neither encryption nor authentication, and a node with CURVE "
                    "has none (set http_bind to off or auto)"
                )
        if self.metrics_bind:
            try:
                host_port(self.metrics_bind)
            except ValueError as exc:
                raise ConfigError(f"metrics_bind {self.metrics_bind!r}: {exc}") from None
        if not 0 <= self.max_step_back_ms <= 1000:
            raise ConfigError(f"max_step_back_ms must be 0..1000, got {self.max_step_back_ms}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level must be debug, info, warning or error, got {self.log_level!r}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format must be text or json, got {self.log_format!r}")
        for f in dataclasses.fields(self):
            if f.metadata.get("secret") and getattr(self, f.name) == MASK:
                raise ConfigError(
                    f"{f.name} is {MASK!r}, the mask check-config prints in place of a secret, not the secret: "
                    f"give it in {env_name(f.name)} or the config file"
                )
        if bool(self.etcd_user) != bool(self.etcd_password):
            raise ConfigError("etcd_user and etcd_password go together")
        if (self.etcd_cert or self.etcd_key) and not (self.etcd_cert and self.etcd_key):
            raise ConfigError("etcd_cert and etcd_key go together")
        if not self.cluster or "/" in self.cluster:
            raise ConfigError(f"cluster must be a non-empty name without '/', got {self.cluster!r}")
        members = [etcd_endpoint(url) for url in self.etcd]
        if any(member.secure for member in members) and not self.etcd_ca:
            raise ConfigError("https etcd endpoints need etcd_ca (the CA certificate file)")

    @property
    def layout(self) -> Layout:
        return Layout(
            epoch_ms=parse_epoch(self.epoch),
            time_bits=self.time_bits,
            region_bits=self.region_bits,
            worker_bits=self.worker_bits,
            sequence_bits=self.sequence_bits,
            shard_bits=self.shard_bits,
        )

    @property
    def peer_offset_bound_ms(self) -> int:
        """How far this node's clock may disagree with its peers' before it leaves rotation (0: only measure)."""
        return self.max_clock_skew_ms // 2 if self.max_peer_offset_ms == -1 else self.max_peer_offset_ms

    @property
    def store_window_ms(self) -> int:
        """The window a store counts a quarantine with: the longest any node of it may use
        (``max_reservation_window_s``), never below this node's own."""
        return int(max(self.reservation_window_s, self.max_reservation_window_s) * 1000)

    @property
    def journal_path(self) -> str:
        return self.journal_dir or os.path.join(self.state_dir, "journal")

    @property
    def worker_count(self) -> int:
        return self.workers or usable_cpus()

    @property
    def embedded(self) -> bool:
        return not self.etcd

    def public(self) -> dict:
        """The settings with secrets masked, for logs and status."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = MASK if f.metadata.get("secret") and value else value
        return out

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: What a secret's value is shown as; refused as a value, so that shown settings fed back fail
#: with a message rather than run with it as the password.
MASK = "***"

#: Settings that take one of a few words; any case is accepted, kept in lower case.
WORD_SETTINGS = ("log_level", "log_format", "clock_policy", "fast_bind", "http_bind")


def host_port(text: str, example: str = "127.0.0.1:9464") -> tuple[str, int]:
    """The (host, port) of a ``HOST:PORT`` setting; an IPv6 host goes in brackets (``[::1]:9464``)
    and comes back without them; an empty host means every IPv4 interface. ValueError says what
    is wrong, with ``example`` for what is right."""
    brackets = "an IPv6 address goes in brackets, then the port: [::1]:" + example.rpartition(":")[2]
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed:
            raise ValueError(brackets)
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"[{host}] is not an IPv6 address in brackets") from None
        sep, port = rest[:1], rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise ValueError(brackets)
    if sep != ":":
        raise ValueError(f"needs HOST:PORT, e.g. {example} (a port alone names no host)")
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"the port must be a number 0..65535, got {port!r}")
    return host, int(port)


class EtcdEndpoint(NamedTuple):
    """An etcd member to connect to."""

    #: As the client library takes it: a name, an IPv4 address, or an IPv6 address in brackets.
    host: str
    port: int
    #: https: TLS, with the CA in ``etcd_ca``.
    secure: bool


def etcd_endpoint(url: str) -> EtcdEndpoint:
    """The member an etcd endpoint ``http://host:port`` or ``https://host:port`` names;
    ``host:port`` alone (etcdctl's habit) is ``http://host:port``.

    The one check of an etcd URL: the config validates every endpoint with it,
    and the etcd client connects to what it returns. ConfigError says what is
    wrong. The scheme's case does not matter (RFC 3986), and one trailing ``/``
    is let pass; anything the client would silently drop is refused: a path, a
    query, a fragment, and a user name or password in the URL (they go in
    ``etcd_user`` and ``etcd_password``; a URL is shown in logs and status).
    """

    def unusable(why: str) -> ConfigError:
        return ConfigError(f"etcd endpoint {url!r} must look like http://host:port or https://host:port: {why}")

    if not isinstance(url, str) or not url.isprintable() or any(c.isspace() for c in url):
        raise unusable("it has spaces or control characters")
    scheme, sep, rest = url.partition("://") if "://" in url else ("http", "://", url)
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise unusable("the scheme is http or https")
    rest = rest.removesuffix("/")
    if "@" in rest:
        raise unusable("a user name and password go in etcd_user and etcd_password, not in the URL")
    if any(c in rest for c in "/?#"):
        raise unusable("nothing may follow the port (a path, query or fragment would be ignored)")
    try:
        host, port = host_port(rest, example="127.0.0.1:2379")
    except ValueError as exc:
        raise unusable(str(exc)) from None
    if not host:
        raise unusable("it names no host")
    if not port:
        raise unusable("port 0 is nobody's port")
    return EtcdEndpoint(f"[{host}]" if ":" in host else host, port, scheme == "https")


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self/cgroup") -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (containers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_self)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def cgroup_cpu_quota(cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time the cgroup quota allows (``cpu.max`` of v2, ``cfs_quota_us`` of v1); None if unlimited."""
    root = Path(cgroup_root)
    try:
        lines = Path(proc_self).read_text().splitlines()
    except OSError:
        lines = []
    v2_path = v1_path = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "cpu" in parts[1].split(","):
            v1_path = parts[2]
    candidates = []
    if v2_path is not None:
        # The quota of any cgroup on the way up limits us; take the tightest.
        rel = Path(v2_path.lstrip("/"))
        for d in [rel, *rel.parents]:
            candidates.append(("v2", root / d / "cpu.max"))
    if v1_path is not None:
        for base in (root / "cpu,cpuacct", root / "cpu"):
            candidates.append(("v1", base / v1_path.lstrip("/")))
            candidates.append(("v1", base))
    best: float | None = None
    for kind, path in candidates:
        try:
            if kind == "v2":
                quota, period = path.read_text().split()[:2]
                if quota == "max":
                    continue
                cpus = int(quota) / int(period)
            else:
                quota_us = int((path / "cpu.cfs_quota_us").read_text())
                period_us = int((path / "cpu.cfs_period_us").read_text())
                if quota_us <= 0:
                    continue
                cpus = quota_us / period_us
        except (OSError, ValueError, ZeroDivisionError):
            continue
        if cpus > 0 and (best is None or cpus < best):
            best = cpus
    return best


def _positive(cfg: Config, *names: str) -> None:
    for name in names:
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")


#: What a setting of each type is, in words, for the message that refuses a value.
_KIND_WORDS = {
    "int": "integer: a whole number is expected",
    "float": "number: a number such as 2 or 0.5 is expected",
    "str": "text: a string is expected",
    "bool": "switch: true or false (also yes/no, on/off, 1/0) is expected",
    "tuple[str, ...]": "list: an array of strings, or one string with commas between the items, is expected",
}


def _bind_host_problem(endpoint: str) -> str | None:
    """Why a tcp:// bind endpoint's host cannot be bound (libzmq says only "No such device"),
    or None: an address, ``*``, an interface name and a host name that resolves are fine."""
    if not endpoint.startswith("tcp://") or "," in endpoint:  # two endpoints: preflight says so
        return None
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    host = host.strip("[]")
    if not host or host == "*":
        return None
    try:
        if host in {name for _, name in socket.if_nameindex()}:
            return None
    except OSError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return (
            f"{endpoint!r}: the host {host!r} cannot be resolved (it is not an address, a network interface or a "
            "known host name)"
        )
    return None


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Bring a value from TOML, the environment or a flag to the field's type."""
    kind = f.type
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "str":
            if isinstance(value, (list, tuple)) and f.name == "bind":
                raise ConfigError(_one_bind(value))
            if isinstance(value, (bool, list, tuple, dict)):  # a TOML list or table is not its text
                raise ValueError
            return str(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError
        if kind == "tuple[str, ...]":
            if isinstance(value, str):
                return tuple(part.strip() for part in value.split(",") if part.strip())
            if isinstance(value, (list, tuple)):
                return tuple(str(part) for part in value)
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{f.name}: {value!r} is not a valid {_KIND_WORDS.get(kind, kind)}") from None
    raise AssertionError(f"no coercion for {kind}")


FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _one_bind(value) -> str:
    """What a list given for ``bind`` is told: what ``--bind a,b`` is told (preflight.py)."""
    return (
        f"bind {value!r} is a list; a node binds one endpoint: run a node for each, and give clients every "
        "node's endpoint (or let them discover the cluster's nodes)"
    )


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


#: The ``SNOWFENCE_*`` variables read besides the settings' own: the config file, the client
#: commands' endpoint and keys (cli/), the workers' fault hooks (workers/main.py).
OTHER_ENV = ("CONFIG", "CONNECT", "SERVER_KEY", "CLIENT_KEY", "FAULT_HOOKS")


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    """One line for each ``SNOWFENCE_*`` variable that nothing reads (a typo, say), naming a close match."""
    env = os.environ if env is None else env
    known = sorted({name.upper() for name in FIELDS} | set(OTHER_ENV))
    lines = []
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n[len(ENV_PREFIX) :] not in known):
        close = difflib.get_close_matches(name[len(ENV_PREFIX) :], known, n=1, cutoff=0.75)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        lines.append(f"{name} is not a snowfence variable and is ignored{hint}")
    return lines


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


#: Where a setting came from: ("default", None), ("file", path), ("env", variable) or ("flag", flag).
Source = tuple[str, str | None]


def load(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike | None = None,
) -> Config:
    """Build a Config from defaults < TOML file < environment < flags.

    ``flags`` holds only the flags the user gave. The config file comes from the
    ``config_file`` argument or else ``SNOWFENCE_CONFIG``.
    """
    return resolve(flags, env, config_file)[0]


def resolve(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike | None = None,
) -> tuple[Config, dict[str, Source]]:
    """What :func:`load` builds, and the :data:`Source` of every setting."""
    env = os.environ if env is None else env
    flags = dict(flags or {})
    values: dict[str, Any] = {}
    sources: dict[str, Source] = dict.fromkeys(FIELDS, ("default", None))
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        for name, value in read_toml(path).items():
            values[name], sources[name] = value, ("file", os.fspath(path))
    for name in FIELDS:
        if env_name(name) in env:
            values[name], sources[name] = env[env_name(name)], ("env", env_name(name))
    for name, value in flags.items():
        if name not in FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        values[name], sources[name] = value, ("flag", flag_name(name))
    return Config(**values), sources


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    # Accept either top-level keys or a [snowfence] table.
    if isinstance(data.get("snowfence"), dict):
        data = data["snowfence"]
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown settings {', '.join(unknown)}")
    return data


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Which of the top-level modules ``names`` are not installed (looks, without importing):
    what an optional extra brings, checked before the code that imports it runs."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing
