"""``snowfence bench``: load a running deployment and report what it delivered.

Several client processes (not threads: the GIL would measure itself) each keep
``depth`` RESERVE requests of ``batch`` IDs in flight on their own DEALER
socket, for ``duration`` seconds after a warm-up. With ``rate`` they send on a
fixed schedule instead (open loop) and latency counts from the scheduled time,
so a stall shows up in the numbers rather than slowing the load down.

Every acknowledged block is kept and, at the end, checked: all IDs unique, and
each block stamped within the wall-clock time of its own request.

Ctrl-C (SIGINT, to the parent or, from a terminal, to every process) ends the
measurement early: the client processes ignore the signal and are told to stop
by their parent, which then reports what was measured until then. A second
Ctrl-C gives up at once.
"""

from __future__ import annotations

import array
import ctypes
import multiprocessing
import select
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from . import protocol
from .errors import SnowfenceError

PROGRESS_INTERVAL_S = 0.25
DRAIN_S = 2.0
#: Sent by the parent to end a client's measurement at the given monotonic time (ns).
STOP = "stop"


@dataclass
class BenchSpec:
    endpoints: list[str]
    duration_s: float = 10.0
    batch: int = protocol.MAX_BLOCK
    clients: int = 4
    depth: int = 16
    rate: float = 0.0  # total requests/s; 0 means closed loop
    warmup_s: float = 1.0
    check: bool = True
    timeout_s: float = 5.0
    server_key: str | None = None
    client_key: str | None = None
    #: Spread the client processes over every node the cluster reports (NODES).
    discover: bool = True
    layout: dict = field(default_factory=dict)


def _set_timer_slack_ns(ns: int) -> None:
    """Precise sleeps: Linux's default 50 us timer slack would blur the schedule."""
    try:
        ctypes.CDLL(None).prctl(29, ns, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def _percentile(sorted_values, q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[index]


def load_socket(ctx, spec: BenchSpec, endpoint: str):
    """A load-generating process's DEALER, connected to ``endpoint``: no high-water marks,
    so the load is what was asked; and no send ever waits (a send timeout of 0), since
    with no high-water mark a send still waits on a DEALER with no connection to send on,
    which a refused CURVE handshake leaves it. Such a send raises ``zmq.Again``."""
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.SNDTIMEO, 0)
    if spec.server_key:
        from .curve import Curve

        Curve.for_client(spec.server_key, spec.client_key).apply(sock)
    sock.connect(endpoint)
    return sock


def _client_main(conn, spec_dict: dict, index: int) -> None:
    """One load-generating process. Talks to the parent over ``conn``."""
    import zmq
    import zmq.backend

    # Started with SIGINT ignored (see run), and it stays so: a terminal's Ctrl-C is the
    # parent's to act on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = BenchSpec(**spec_dict)
    time_shift = spec.layout["sequence_bits"] + spec.layout["worker_bits"] + spec.layout["region_bits"]
    max_ms = (1 << spec.layout["time_bits"]) - 1
    epoch_ms = spec.layout["epoch_ms"]
    ctx = zmq.Context()
    sock = load_socket(ctx, spec, spec.endpoints[index % len(spec.endpoints)])
    # An open-loop schedule needs waits shorter than a millisecond, which zmq_poll
    # cannot express: wait on the socket's file descriptor with select() instead
    # (its readiness is edge-triggered, so ZMQ_EVENTS is checked before and after).
    fd, events_opt, pollin = sock.get(zmq.FD), int(zmq.EVENTS), int(zmq.POLLIN)
    get = zmq.backend.Socket.get

    def wait_readable(timeout_s: float) -> bool:
        if get(sock, events_opt) & pollin:
            return True
        select.select([fd], [], [], timeout_s)
        return bool(get(sock, events_opt) & pollin)

    _set_timer_slack_ns(1)
    conn.send("ready")
    start_ns, measure_ns, end_ns = conn.recv()

    mono, wall = time.monotonic_ns, time.time_ns
    send, recv, noblock = zmq.backend.Socket.send, zmq.backend.Socket.recv, int(zmq.NOBLOCK)
    encode, unpack = protocol.encode_reserve, protocol.unpack_block
    batch, depth, check = spec.batch, spec.depth, spec.check
    interval_ns = int(1e9 * spec.clients / spec.rate) if spec.rate else 0
    latencies = array.array("q")
    blocks = array.array("q")
    errors: Counter = Counter()
    outside = ids = requests = 0
    inflight: dict[int, tuple[int, int]] = {}
    rid = index << 40
    progress_ids = progress_reqs = 0
    next_progress = start_ns + int(PROGRESS_INTERVAL_S * 1e9)
    # Clients keep the same interval at staggered phases: started in step, their
    # requests would arrive in bursts the offered rate does not describe.
    next_send = start_ns + (interval_ns * index) // spec.clients
    while mono() < start_ns:
        time.sleep(0.0005)
    drain_until = end_ns + int(DRAIN_S * 1e9)
    while True:
        now = mono()
        sending = now < end_ns
        if not sending and (not inflight or now > drain_until):
            break
        if sending:
            # The wall clock is read before the send: a reply can beat a reading after it.
            try:
                if interval_ns:
                    while next_send <= now and len(inflight) < depth:
                        rid += 1
                        inflight[rid] = (next_send, wall() // 1_000_000)
                        send(sock, encode(rid, batch))
                        next_send += interval_ns
                else:
                    while len(inflight) < depth:
                        rid += 1
                        inflight[rid] = (mono(), wall() // 1_000_000)
                        send(sock, encode(rid, batch))
            except zmq.Again:  # nowhere to send (refused): counted, asked again after the wait below
                del inflight[rid]
                errors["not_sent"] += 1
                if interval_ns:
                    next_send += interval_ns
        if interval_ns and sending:
            readable = wait_readable(max(0, next_send - mono()) / 1e9)
        else:
            readable = sock.poll(100, zmq.POLLIN)
        if readable:
            for _ in range(1000):
                try:
                    body = recv(sock, noblock)
                except zmq.Again:
                    break
                got_ns = mono()
                try:
                    request_id, first, count = unpack(body)
                except (ValueError, Exception):
                    try:
                        reply = protocol.decode_reply(body)
                    except SnowfenceError:
                        errors["garbled_reply"] += 1
                        continue
                    sent = inflight.pop(reply.request_id, None)
                    if sent is not None and sent[0] >= measure_ns:
                        errors[reply.error.code if reply.error else f"type_{reply.type}"] += 1
                    continue
                sent = inflight.pop(request_id, None)
                if sent is None:
                    continue
                if sent[0] < measure_ns or sent[0] >= end_ns:
                    continue
                latencies.append(got_ns - sent[0])
                ids += count
                requests += 1
                progress_ids += count
                progress_reqs += 1
                if check:
                    blocks.append(first)
                    blocks.append(count)
                    unix_ms = ((first >> time_shift) & max_ms) + epoch_ms
                    if not sent[1] <= unix_ms <= wall() // 1_000_000:
                        outside += 1
        if now >= next_progress:
            conn.send(("progress", now, progress_ids, progress_reqs, sum(errors.values())))
            progress_ids = progress_reqs = 0
            next_progress = now + int(PROGRESS_INTERVAL_S * 1e9)
            if conn.poll():
                message, stop_ns = conn.recv()
                if message == STOP and stop_ns < end_ns:
                    # What was sent from then on is drained, not counted.
                    end_ns = max(stop_ns, start_ns)
                    drain_until = now + int(DRAIN_S * 1e9)
    conn.send(("progress", mono(), progress_ids, progress_reqs, sum(errors.values())))
    conn.send(
        (
            "done",
            {
                "ids": ids,
                "requests": requests,
                "errors": dict(errors),
                "outside_window": outside,
                "latencies": latencies.tobytes(),
                "blocks": blocks.tobytes(),
                "lost": len(inflight),
            },
        )
    )
    sock.close(0)
    ctx.term()


def check_unique(pairs: list[tuple[int, int]]) -> tuple[int, int]:
    """``(ids checked, overlapping blocks)`` for blocks given as (first, count)."""
    pairs.sort()
    overlaps = 0
    last_end = -1
    total = 0
    for first, count in pairs:
        if first <= last_end:
            overlaps += 1
        last_end = max(last_end, first + count - 1)
        total += count
    return total, overlaps


def minting_ids(status: dict, batch: int) -> int:
    """The worker IDs of a node (its STATUS) that mint the benchmark's requests: its workers'
    in rotation, and the broker's own worker ID when it holds one and the batch is small
    enough for it (``mints_up_to``). One count, whether the node was given or discovered."""
    ids = sum(1 for w in status.get("workers", ()) if w.get("in_rotation") and w.get("worker_id") is not None)
    broker = status.get("broker") or {}
    own = broker.get("own_worker_id")
    if isinstance(own, dict) and own.get("ready") and 0 < batch <= (broker.get("mints_up_to") or 0):
        ids += sum(1 for h in own.get("held") or () if isinstance(h, dict) and h.get("state") == "ready")
    return ids


def _node_minting_ids(spec: BenchSpec, node: dict) -> int:
    """:func:`minting_ids` of one discovered node, asked directly; its entry's count if it does not answer."""
    from .clients import Client

    try:
        with Client(
            node["endpoints"][0],
            timeout_s=spec.timeout_s,
            retries=1,
            server_key=spec.server_key,
            client_key=spec.client_key,
            discover=False,
        ) as client:
            return minting_ids(client.status(), spec.batch)
    except SnowfenceError:
        return len(node.get("worker_ids") or ())


def plan(spec: BenchSpec) -> int:
    """Ask the node(s): the layout (into ``spec``), the endpoints the client processes take
    in turn (every node in rotation, when discovering), and the worker IDs that mint for them."""
    from .clients import Client

    with Client(
        spec.endpoints,
        timeout_s=spec.timeout_s,
        retries=2,
        server_key=spec.server_key,
        client_key=spec.client_key,
        discover=spec.discover,
    ) as client:
        status = client.status()
        serving = []
        if spec.discover:
            try:
                serving = [n for n in client.nodes()["nodes"] if n.get("in_rotation") and n.get("endpoints")]
            except SnowfenceError:
                pass  # a server that does not answer NODES (another release, a relay): the endpoints given

    spec.layout = status["layout"]
    worker_ids = minting_ids(status, spec.batch)
    if len(serving) > 1:
        # A cluster: the client processes take the nodes in turn, and the ceiling is all of
        # theirs, each node's counted as one node's is (its STATUS, not its entry's worker IDs,
        # which list the broker's own worker ID too).
        spec.endpoints = [n["endpoints"][0] for n in serving]
        worker_ids = sum(_node_minting_ids(spec, n) for n in serving) or worker_ids
    return worker_ids


def run(spec: BenchSpec, progress=None) -> dict:
    """Run the benchmark and return the results (see ``--json``)."""
    worker_ids = plan(spec)
    ceiling = worker_ids * (1 << spec.layout["sequence_bits"]) * 1000

    mp = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    # The handler only records Ctrl-C; the loop below acts on it.
    interrupts: list[int] = []

    def record(signum, frame) -> None:
        interrupts.append(time.monotonic_ns())

    previous = signal.signal(signal.SIGINT, record)
    # Children start with SIGINT ignored: an ignored signal stays ignored across exec (a
    # blocked one does not: the interpreter a spawn starts unblocks it), so none can die
    # of a Ctrl-C while it starts and imports. Ours is ignored only while each is made.
    for i in range(spec.clients):
        parent, child = mp.Pipe()
        p = mp.Process(target=_client_main, args=(child, asdict(spec), i), daemon=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            p.start()
        finally:
            signal.signal(signal.SIGINT, record)
        pipes.append(parent)
        procs.append(p)
    try:
        for conn in pipes:
            while not conn.poll(0.1):
                if interrupts:
                    raise KeyboardInterrupt
                if not any(p.is_alive() for p in procs):
                    raise SnowfenceError("a bench client did not start")
            conn.recv()
        start_ns = time.monotonic_ns() + 200_000_000
        measure_ns = start_ns + int(spec.warmup_s * 1e9)
        end_ns = measure_ns + int(spec.duration_s * 1e9)
        for conn in pipes:
            conn.send((start_ns, measure_ns, end_ns))
        timeline: Counter = Counter()
        results = [None] * spec.clients
        live_ids = 0
        last_print = 0.0
        stopped_ns = None
        while any(r is None for r in results):
            if interrupts and stopped_ns is None:
                stopped_ns = min(interrupts[0], end_ns)
                if stopped_ns <= measure_ns:
                    raise KeyboardInterrupt  # nothing measured yet: nothing to report
                for conn in pipes:
                    conn.send((STOP, stopped_ns))
            elif len(interrupts) > 1:
                raise KeyboardInterrupt
            for i, conn in enumerate(pipes):
                while results[i] is None and conn.poll():
                    msg = conn.recv()
                    if msg[0] == "progress":
                        _, at_ns, n_ids, _, _ = msg
                        if at_ns >= measure_ns:
                            # A report covers the interval before it: file it under its middle.
                            middle_s = (at_ns - measure_ns) / 1e9 - PROGRESS_INTERVAL_S / 2
                            timeline[max(0, int(middle_s / 0.5))] += n_ids
                            live_ids += n_ids
                    else:
                        results[i] = msg[1]
            if not any(p.is_alive() for p in procs) and any(r is None for r in results):
                raise SnowfenceError("a bench client died")
            now = time.monotonic_ns()
            if progress is not None and now - last_print > 0.5e9 and now > measure_ns:
                elapsed = min(now, end_ns) - measure_ns
                rate = live_ids / (elapsed / 1e9) if elapsed > 0 else 0
                progress.write(f"\r  [{elapsed / 1e9:5.1f}/{spec.duration_s:.0f} s] {rate:15,.0f} IDs/s")
                progress.flush()
                last_print = now
            time.sleep(0.02)
        if progress is not None:
            progress.write("\n")
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        signal.signal(signal.SIGINT, previous)
    measured_s = spec.duration_s if stopped_ns is None else (stopped_ns - measure_ns) / 1e9
    return summarize(spec, results, timeline, ceiling, worker_ids, measured_s)


def summarize(
    spec: BenchSpec,
    results: list[dict],
    timeline: Counter,
    ceiling: int,
    worker_ids: int,
    measured_s: float | None = None,
) -> dict:
    """The results of a run; ``measured_s`` is shorter than ``spec.duration_s`` if it was interrupted."""
    measured_s = spec.duration_s if measured_s is None else measured_s
    latencies = array.array("q")
    pairs: list[tuple[int, int]] = []
    errors: Counter = Counter()
    ids = requests = outside = lost = 0
    for r in results:
        lat = array.array("q")
        lat.frombytes(r["latencies"])
        latencies.extend(lat)
        if spec.check:
            b = array.array("q")
            b.frombytes(r["blocks"])
            pairs.extend(zip(b[0::2], b[1::2], strict=True))
        errors.update(r["errors"])
        ids += r["ids"]
        requests += r["requests"]
        outside += r["outside_window"]
        lost += r["lost"]
    ordered = sorted(latencies)
    out = {
        "ids_per_s": ids / measured_s,
        "requests_per_s": requests / measured_s,
        "measured_s": measured_s,
        "interrupted": measured_s < spec.duration_s,
        "ids": ids,
        "requests": requests,
        "latency_us": {
            "p50": _percentile(ordered, 0.50) / 1000,
            "p90": _percentile(ordered, 0.90) / 1000,
            "p99": _percentile(ordered, 0.99) / 1000,
            "p999": _percentile(ordered, 0.999) / 1000,
            "max": (ordered[-1] / 1000) if ordered else 0.0,
            "mean": (sum(ordered) / len(ordered) / 1000) if ordered else 0.0,
        },
        "errors": dict(errors),
        "lost_in_flight": lost,
        "ceiling_ids_per_s": ceiling,
        "worker_ids": worker_ids,
        "timeline_ids_per_s": [timeline[i] / 0.5 for i in range(int(measured_s / 0.5))],
        "spec": {k: v for k, v in asdict(spec).items() if k != "layout"},
    }
    if spec.check:
        checked, overlaps = check_unique(pairs)
        out["check"] = {
            "ids_checked": checked,
            "duplicates": overlaps,
            "outside_request_window": outside,
            "unique": overlaps == 0,
        }
    out["_latencies_ns"] = ordered
    return out


def format_table(res: dict) -> str:
    spec = res["spec"]
    lat = res["latency_us"]
    took = f"{spec['duration_s']:g} s"
    if res["interrupted"]:
        took = f"interrupted after {res['measured_s']:.1f} of {took}"
    lines = [
        f"snowfence bench: {spec['clients']} clients x {spec['depth']} in flight, batch {spec['batch']}, {took}"
        + (f", {spec['rate']:,.0f} requests/s offered" if spec["rate"] else ""),
        f"  IDs/s        {res['ids_per_s']:>14,.0f}"
        + (
            f"   ({res['ids_per_s'] / res['ceiling_ids_per_s']:.1%} of the layout's ceiling for "
            f"{res['worker_ids']} worker IDs)"
            if res["ceiling_ids_per_s"]
            else ""
        ),
        f"  requests/s   {res['requests_per_s']:>14,.0f}",
        f"  latency us   p50 {lat['p50']:,.0f}  p90 {lat['p90']:,.0f}  p99 {lat['p99']:,.0f}  "
        f"p99.9 {lat['p999']:,.0f}  max {lat['max']:,.0f}",
        "  errors       " + (", ".join(f"{k}: {v}" for k, v in sorted(res["errors"].items())) or "none"),
    ]
    if "check" in res:
        c = res["check"]
        lines.append(
            f"  unique       {'yes' if c['unique'] else 'NO'} ({c['ids_checked']:,} IDs checked, "
            f"{c['duplicates']} overlapping blocks)"
        )
        lines.append(f"  time window  {c['outside_request_window']} blocks stamped outside their request's time")
    return "\n".join(lines)


def need_matplotlib():
    """pyplot, or a ConfigError that says how to get it (checked before a run, not after)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from .errors import ConfigError

        raise ConfigError("--plot needs matplotlib: pip install 'snowfence[bench]' (or matplotlib)") from None
    return plt


def plot(res: dict, path: str) -> None:
    plt = need_matplotlib()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lat_us = [v / 1000 for v in res["_latencies_ns"]]
    if lat_us:
        n = len(lat_us)
        left.plot(lat_us, [i / n for i in range(n)])
        left.set_xscale("log")
    left.set_xlabel("latency (us)")
    left.set_ylabel("fraction of requests")
    left.set_title("latency distribution (CDF)")
    tl = res["timeline_ids_per_s"]
    right.plot([i * 0.5 for i in range(len(tl))], tl)
    right.set_xlabel("time (s)")
    right.set_ylabel("IDs/s")
    right.set_title("throughput over time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv_spec: BenchSpec, as_json: bool, plot_path: str | None) -> int:
    import orjson

    # Progress rewrites one line with \r: only for a person watching a terminal.
    try:
        res = run(argv_spec, progress=sys.stderr if sys.stderr.isatty() else None)
    except KeyboardInterrupt:
        print("snowfence: interrupted during the warm-up: nothing was measured", file=sys.stderr)
        return 130
    latencies = res.pop("_latencies_ns", None)
    if as_json:
        print(orjson.dumps(res, option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_table(res))
    sys.stdout.flush()
    if plot_path:  # after the results are out: a plot that cannot be saved loses nothing
        plot({**res, "_latencies_ns": latencies}, plot_path)
    check = res.get("check")
    if check and not check["unique"]:
        return 1
    return 130 if res["interrupted"] else 0
