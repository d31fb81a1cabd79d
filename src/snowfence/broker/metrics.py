"""Prometheus metrics and health endpoints, served by the broker over HTTP.

Workers report monotonic counts in every STATE frame; the broker adds up the
increments, so its counters keep rising across worker restarts (a new worker
process starts from zero under a new identity). The same goes for the minting
time histograms; the queueing time histograms are the routing core's own. Gauges
come from the latest STATE of each worker. The broker's loop builds a snapshot
every ``SNAPSHOT_INTERVAL_NS``; the HTTP thread only ever reads the latest one,
so it never touches state the loop is changing. ``process_*`` (the standard
process collector) describe the broker's own process, read from /proc at each
scrape.

    /metrics   Prometheus text format
    /livez     200 while the broker's loop is turning
    /readyz    200 while at least one worker ID is leased, unfenced, clock-healthy and in rotation
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .. import __version__, latency
from ..clock import read_kernel_clock
from ..config import Config, host_port
from ..protocol import WorkerState
from .auth import Denials
from .peers import STATES as CLOCK_VERDICTS

log = logging.getLogger("snowfence.broker")

SNAPSHOT_INTERVAL_NS = 500_000_000
#: The loop counts as stuck when it has not built a snapshot for this long.
LIVENESS_S = 5.0
STATES = ("claiming", "waiting", "ready", "fenced", "clock_unsafe", "reserving", "stopping", "silent")


class Metrics:
    """Totals over all worker processes, and the latest snapshot for the HTTP thread."""

    def __init__(self, config: Config | None = None) -> None:
        self.totals: Counter = Counter()
        self.step_back_counts: list[int] = []
        self.step_back_le: list[int] = []
        self.step_back_sum_ms = 0
        #: Minting times over all worker processes, by kind (as latency.KINDS).
        self.mint_ns = latency.by_kind()
        self._last: dict[bytes, dict] = {}
        self._last_hist: dict[bytes, dict] = {}
        self._last_mint: dict[bytes, dict] = {}
        #: What does not change while the node runs: its version, cluster, region, mode.
        self.info = _info_families(config)
        self.families: list = []
        self.ready_reason = "starting"
        self.ready = False
        self.snapshot_ns = time.monotonic_ns()
        self._next_ns = 0
        self.peers = None
        #: The fast port (:class:`snowfence.broker.doors.fast.FastPort`), when the node has one.
        self.fast = None
        #: The last state of the broker's own worker ID (for small requests), if it runs:
        #: what it holds counts with the workers' worker IDs.
        self.own: WorkerState | None = None
        #: CURVE denials, counted from the ZAP and monitor threads.
        self.curve_denials = Denials()

    def observe(self, ident: bytes, status: WorkerState) -> None:
        """Add the increments of one worker's counts since its previous report."""
        counters = status.counters
        prev = self._last.get(ident, {})
        for key, value in counters.items():
            delta = value - prev.get(key, 0)
            if delta > 0:
                self.totals[key] += delta
        self._last[ident] = counters
        hist = status.step_back_ms
        if hist:
            if not self.step_back_le:
                self.step_back_le = list(hist["le"])
                self.step_back_counts = [0] * len(hist["counts"])
            before = self._last_hist.get(ident, {"counts": [0] * len(hist["counts"]), "sum_ms": 0})
            for i, (now, then) in enumerate(zip(hist["counts"], before["counts"], strict=False)):
                self.step_back_counts[i] += max(0, now - then)
            self.step_back_sum_ms += max(0, hist["sum_ms"] - before["sum_ms"])
            self._last_hist[ident] = hist
        mint = status.mint_ns
        # Bounds of another version (a worker started from upgraded files) would add
        # counts to the wrong buckets: such a worker's times are left out.
        if mint and mint["le"] == _BOUNDS:
            before = self._last_mint.get(ident, {})
            for kind, total in zip(latency.KINDS, self.mint_ns, strict=True):
                now = mint["kinds"].get(kind)
                if now is not None:
                    total.add_increase(now, before.get(kind))
            self._last_mint[ident] = mint["kinds"]

    def forget(self, ident: bytes) -> None:
        self._last.pop(ident, None)
        self._last_hist.pop(ident, None)
        self._last_mint.pop(ident, None)

    def maybe_snapshot(self, now_ns: int, routing, restarts: int, kills: int = 0) -> None:
        if now_ns < self._next_ns:
            return
        self._next_ns = now_ns + SNAPSHOT_INTERVAL_NS
        self.families = self.build(routing, restarts, kills)
        # Read by the HTTP thread with the families: the routing core decides it.
        self.ready, self.ready_reason = routing.readiness()
        self.snapshot_ns = now_ns

    def build(self, routing, restarts: int, kills: int = 0) -> list:
        t, rc = self.totals, routing.counters
        fams = []

        def counter(name, doc, value, labels=None):
            fam = CounterMetricFamily(name, doc, labels=list(labels or {}))
            fam.add_metric(list((labels or {}).values()), value)
            fams.append(fam)

        def by_why(name, doc, values):
            fam = CounterMetricFamily(name, doc, labels=["why"])
            for why, value in values.items():
                fam.add_metric([why], value)
            fams.append(fam)

        counter("snowfence_ids", "IDs minted and sent.", t["ids"])
        req = CounterMetricFamily("snowfence_requests", "Requests answered, by result.", labels=["result"])
        for result, value in (
            ("ok", t["requests_ok"]),
            ("bad_request", t["bad_request"] + rc["bad_request"]),
            ("refused", rc["refused"]),
            ("unavailable", rc["unavailable"]),
            ("overloaded", rc["overloaded"]),
        ):
            req.add_metric([result], value)
        fams.append(req)
        ref = CounterMetricFamily("snowfence_refusals", "Refusals by a worker's minter, by reason.", labels=["reason"])
        for reason in ("fenced", "clock_unsafe", "reservation_expired", "unavailable"):
            ref.add_metric([reason], t[f"refused_{reason}"])
        fams.append(ref)
        counter("snowfence_retries", "Refused requests the broker sent to another worker.", rc["retried"])
        by_why(
            "snowfence_requests_dropped",
            "ZeroMQ requests the broker's gate dropped unanswered, by why: the connection's CURVE key was taken "
            "off the allow-list after it connected (revoked), or the peer set itself the address of one of the "
            "broker's own connections (impostor, counted as a bad_request too).",
            {"revoked": rc.get("revoked_dropped", 0), "impostor": rc.get("impostors", 0)},
        )
        by_why(
            "snowfence_worker_states_unread",
            "STATE frames from workers not as this version writes them: ignored (bad), or read but for keys "
            "it does not know (unknown_keys, a worker of another version).",
            {"bad": rc.get("bad_state", 0), "unknown_keys": rc.get("state_unknown_keys", 0)},
        )
        waits = CounterMetricFamily("snowfence_waits", "Waits inside the minter, by cause.", labels=["cause"])
        waits.add_metric(["step_back"], t["waits_step_back"])
        waits.add_metric(["sequence"], t["waits_sequence"])
        waits.add_metric(["ahead"], t["waits_ahead"])  # hlc: minted ahead of the wall clock instead of waiting
        fams.append(waits)
        if self.step_back_le:
            cumulative, buckets = 0, []
            edges = [f"{le / 1000:g}" for le in self.step_back_le] + ["+Inf"]
            for le, n in zip(edges, self.step_back_counts, strict=False):
                cumulative += n
                buckets.append((le, cumulative))
            fams.append(
                HistogramMetricFamily(
                    "snowfence_clock_step_back_seconds",
                    "Sizes of wall-clock steps back seen by minters.",
                    buckets=buckets,
                    sum_value=self.step_back_sum_ms / 1000,
                )
            )
        fams.append(
            _by_kind(
                "snowfence_request_queued_seconds",
                "Time a request waited in the broker for a worker with room (0 if one had room at once).",
                routing.queued_ns,
            )
        )
        fams.append(
            _by_kind(
                "snowfence_request_mint_seconds",
                "Time a worker took over a request, from taking it to handing back the answer.",
                self.mint_ns,
            )
        )
        fams.extend(self.info)
        counter("snowfence_fence_events", "Times a worker ID became fenced.", t["fenced_events"])
        counter(
            "snowfence_clock_unsafe_events", "Times a worker ID left rotation for its clock.", t["clock_unsafe_events"]
        )
        counter("snowfence_clock_forward_jumps", "Forward jumps of the wall clock seen by workers.", t["forward_jumps"])
        counter("snowfence_leases_lost", "Worker-ID leases lost (expired or taken over).", t["leases_lost"])
        counter("snowfence_claims", "Worker IDs claimed.", t["claims"])
        counter(
            "snowfence_clock_releases",
            "Times a worker process let its worker IDs go because the peers refused this node's clock.",
            t["clock_releases"],
        )
        counter("snowfence_worker_restarts", "Worker processes restarted by the supervisor.", restarts)
        denied = CounterMetricFamily(
            "snowfence_curve_denials", "Clients turned away by CURVE, by reason.", labels=["reason"]
        )
        for reason in ("not_allowed", "handshake"):
            denied.add_metric([reason], self.curve_denials.counts[reason])
        fams.append(denied)
        counter("snowfence_worker_kills", "Silent worker processes killed by the supervisor.", kills)
        counter("snowfence_loop_stalls", "Worker IDs given up because their minting loop stalled.", t["loop_stalls"])
        gauge_conns = GaugeMetricFamily("snowfence_connections", "Client connections with requests in flight.")
        gauge_conns.add_metric([], routing.active_connections())
        fams.append(gauge_conns)
        gauge_wait = GaugeMetricFamily(
            "snowfence_requests_waiting", "Requests waiting in the broker for a worker with room."
        )
        gauge_wait.add_metric([], len(routing.fair))
        fams.append(gauge_wait)

        states = Counter()
        latency = GaugeMetricFamily(
            "snowfence_lease_renewal_latency_seconds",
            "Duration of the last successful lease renewal.",
            labels=["worker_id"],
        )
        age = GaugeMetricFamily(
            "snowfence_lease_renewal_age_seconds",
            "Time since the last successful lease renewal was sent.",
            labels=["worker_id"],
        )
        headroom = GaugeMetricFamily(
            "snowfence_reservation_headroom_seconds",
            "How far the persisted reservation is ahead of the wall clock.",
            labels=["worker_id"],
        )
        ahead = GaugeMetricFamily(
            "snowfence_clock_ahead_seconds",
            "How far a worker's wall clock is ahead after a forward jump.",
            labels=["slot"],
        )
        holders = []
        for link in routing.links.values():
            st = link.status
            ahead.add_metric([str(link.slot)], st.clock_ahead_ms / 1000)
            if not st.held:  # a worker process without one counts as one in its state
                states["silent" if link.silent else st.state] += 1
            holders.extend((h, link.silent) for h in st.held)
        if self.own is not None:  # the broker's own: only what it holds (it may want none)
            holders.extend((h, False) for h in self.own.held)
        for h, silent in holders:
            states["silent" if silent else h.state] += 1
            wid = str(h.worker_id)
            if h.last_renewal_latency_s is not None:
                latency.add_metric([wid], h.last_renewal_latency_s)
            if h.renewed_ago_s is not None:
                age.add_metric([wid], h.renewed_ago_s)
            if h.reservation_headroom_ms is not None:
                headroom.add_metric([wid], h.reservation_headroom_ms / 1000)
        fams.extend([latency, age, headroom, ahead])
        ws = GaugeMetricFamily("snowfence_worker_ids", "Worker IDs held, by state.", labels=["state"])
        for state in STATES:
            ws.add_metric([state], states[state])
        fams.append(ws)
        rot = GaugeMetricFamily("snowfence_workers_in_rotation", "Worker processes the broker routes to.")
        rot.add_metric([], len(routing.rotation))
        fams.append(rot)
        kc = read_kernel_clock()
        if kc is not None:
            for name, doc, value in (
                (
                    "snowfence_clock_synchronized",
                    "1 if the kernel reports the wall clock synchronised.",
                    float(kc.synchronized),
                ),
                ("snowfence_clock_max_error_seconds", "The kernel's maximum error of the wall clock.", kc.max_error_s),
                (
                    "snowfence_clock_estimated_error_seconds",
                    "The kernel's estimated error of the wall clock.",
                    kc.est_error_s,
                ),
            ):
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], value)
                fams.append(g)
        if self.fast is not None:
            stats = self.fast.stats
            counter("snowfence_fast_port_requests", "Requests that came on the fast port (TCP).", stats["requests"])
            conns = GaugeMetricFamily("snowfence_fast_port_connections", "Connections open on the fast port.")
            conns.add_metric([], len(self.fast.by_fd))
            fams.append(conns)
            closed = CounterMetricFamily(
                "snowfence_fast_port_closed", "Fast-port connections the broker closed, by why.", labels=["why"]
            )
            for why in ("bad_frame", "not_reading", "too_many"):
                closed.add_metric([why], stats[why])
            fams.append(closed)
        watermark = getattr(routing, "watermark", None)
        if watermark is not None:
            lag = GaugeMetricFamily(
                "snowfence_watermark_lag_seconds",
                "How far the node's last watermark promise is behind its wall clock (NaN: none yet).",
            )
            promised = watermark.promised_ms
            now_ms = time.time_ns() // 1_000_000 - watermark.config.layout.epoch_ms
            lag.add_metric([], (now_ms - promised) / 1e3 if promised else float("nan"))
            failures = GaugeMetricFamily(
                "snowfence_watermark_round_failures", "Watermark rounds failed in a row (0: the last one succeeded)."
            )
            failures.add_metric([], watermark.failures)
            fams.extend([lag, failures])
            floors = getattr(watermark.store, "watermark_floors", None)
            if floors is not None:
                fams.append(_pool_family(watermark.config, floors, now_ms))
        if self.peers is not None:
            off = GaugeMetricFamily(
                "snowfence_peer_clock_offset_seconds",
                "How far a peer's wall clock is ahead of this node's.",
                labels=["peer"],
            )
            rtt = GaugeMetricFamily(
                "snowfence_peer_clock_delay_seconds",
                "Round trip of the last offset measurement (bounds its error).",
                labels=["peer"],
            )
            for peer, (offset_ns, delay_ns, _) in self.peers.offsets.items():
                off.add_metric([peer], offset_ns / 1e9)
                rtt.add_metric([peer], delay_ns / 1e9)
            verdict = GaugeMetricFamily(
                "snowfence_clock_verdict",
                "The peers' verdict on this node's clock: 1 for the state it is in (pending, vouched, alone: "
                "nobody answered to judge it, vetoed or unvouched: refused, unbounded: only measured).",
                labels=["verdict"],
            )
            state = self.peers.verdict.state
            for name in CLOCK_VERDICTS:
                verdict.add_metric([name], 1 if name == state else 0)
            fams.extend([off, rtt, verdict])
        return fams


_BOUNDS = list(latency.BOUNDS_NS)


def _by_kind(name: str, doc: str, histograms: tuple[latency.Durations, ...]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["kind"])
    for kind, h in zip(latency.KINDS, histograms, strict=True):
        fam.add_metric([kind], h.buckets(), sum_value=h.sum_ns / 1e9)
    return fam


def _pool_family(config: Config, floors: tuple, now_ms: int) -> GaugeMetricFamily:
    """Each region's worker IDs by state, from the marks the last watermark round read."""
    from ..store.watermark import pools

    fam = GaugeMetricFamily(
        "snowfence_worker_id_pool",
        "Worker IDs of each region the last watermark round saw: held, quarantined (no holder, mark ahead of the "
        "clock) or free.",
        labels=["region", "state"],
    )
    for region, pool in pools(floors, now_ms, config.layout.max_worker + 1, (config.region,)).items():
        for state in ("held", "quarantined", "free"):
            fam.add_metric([str(region), state], pool[state])
    return fam


def _info_families(config: Config | None) -> list:
    build = GaugeMetricFamily(
        "snowfence_build_info", "The snowfence version this node runs (always 1).", labels=["version"]
    )
    build.add_metric([__version__], 1)
    if config is None:
        return [build]
    node = GaugeMetricFamily(
        "snowfence_node_info",
        "This node's cluster (etcd mode only), region and mode (always 1).",
        labels=["cluster", "region", "mode"],
    )
    node.add_metric(
        ["" if config.embedded else config.cluster, str(config.region), "embedded" if config.embedded else "etcd"], 1
    )
    end = GaugeMetricFamily(
        "snowfence_layout_end_timestamp_seconds",
        "Unix time the ID layout ends (epoch + 2^time_bits ms): no ID can be minted from then on.",
    )
    end.add_metric([], config.layout.end_unix_ms / 1000)
    return [build, node, end]


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):
        yield from self.metrics.families


class _HTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class HealthServer:
    """Serves /metrics, /livez and /readyz from a daemon thread."""

    def __init__(self, bind: str, metrics: Metrics) -> None:
        host, port = host_port(bind)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(metrics))
        ProcessCollector(registry=registry)  # the standard process_* of the broker's process

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/livez":
                    age_s = (time.monotonic_ns() - metrics.snapshot_ns) / 1e9
                    ok = age_s < LIVENESS_S
                    self._reply(200 if ok else 503, b"ok\n" if ok else f"loop stalled for {age_s:.1f} s\n".encode())
                elif path == "/readyz":
                    self._reply(200 if metrics.ready else 503, f"{metrics.ready_reason}\n".encode())
                else:
                    self._reply(404, b"not found: /metrics, /livez, /readyz\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args) -> None:
                pass

        server = _HTTPServer6 if ":" in host else ThreadingHTTPServer
        self.server = server((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-http", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
