"""Operations and security with real processes: metrics that move, readiness
that flips, clock monitoring, CURVE, limits on hostile clients."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import zmq
from nodes import FAST_LEASES, TWO_HOPS, etcd_args, wait_for
from prometheus_client.parser import text_string_to_metric_families

import snowfence
from snowfence import Client, protocol
from snowfence.errors import ClockUnsafe, CurveRequired, KeyRefused


def health(node) -> str:
    """The metrics address the broker logged (it binds port 0: no free-port race)."""
    m = wait_for(
        lambda: re.search(r"metrics and health on http://([\d.]+:\d+)/", node.log()),
        10,
        what="the metrics address in the log",
    )
    return m.group(1)


def get(addr: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(addr: str, name: str, labels: str = "") -> float:
    _, text = get(addr, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + (("{" + labels + "}") if labels else "") + " ") or (
            not labels and line.startswith(name + " ")
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_move_on_a_fence_and_readiness_flips(nodes, etcd):
    node = nodes.start(workers=2, args=(*etcd_args(etcd, "test", *FAST_LEASES), "--metrics-bind", "127.0.0.1:0"))
    node.wait_ready()
    addr = health(node)
    assert get(addr, "/livez")[0] == 200
    wait_for(lambda: get(addr, "/readyz")[0] == 200, 5, what="ready")
    with node.client() as c:
        c.reserve(10_000)
    wait_for(lambda: metric(addr, "snowfence_ids_total") >= 10_000, 5, what="ids counted")
    assert "snowfence_lease_renewal_latency_seconds" in get(addr, "/metrics")[1]
    before = metric(addr, "snowfence_fence_events_total")
    held = len(node.all_worker_ids())  # its workers' and the broker's own: each one's lease fences
    assert held == 3
    etcd.pause()
    try:
        wait_for(lambda: metric(addr, "snowfence_fence_events_total") >= before + held, 10, what="fence events")
        assert metric(addr, "snowfence_worker_ids", 'state="fenced"') == held
        code, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(get(addr, "/readyz")), 5, what="not ready")
        assert "fenced" in body
        with node.client(retries=0) as c:
            with pytest.raises(Exception) as info:
                c.reserve(1)
            assert info.value.code == "fenced"
        wait_for(
            lambda: (
                metric(addr, "snowfence_refusals_total", 'reason="fenced"')
                + metric(addr, "snowfence_requests_total", 'result="unavailable"')
                >= 1
            ),
            5,
            what="refusal counted",
        )
    finally:
        etcd.resume()
    wait_for(lambda: get(addr, "/readyz")[0] == 200, 15, what="ready again")


def test_metrics_move_on_a_clock_step_and_a_restart_and_counters_survive_it(nodes, clock):
    # Two hops: the step back must meet the one minter that has minted (the worker's).
    node = nodes.start(workers=1, env=clock.env(), args=("--metrics-bind", "127.0.0.1:0", *TWO_HOPS))
    node.wait_ready()
    addr = health(node)
    with node.client(retries=0) as c:
        c.reserve(5000)
        clock.shift_all(-300)
        with pytest.raises(ClockUnsafe):
            c.reserve(1)
    wait_for(lambda: metric(addr, "snowfence_clock_step_back_seconds_count") >= 1, 5, what="step back counted")
    assert metric(addr, "snowfence_clock_step_back_seconds_bucket", 'le="1"') >= 1
    assert metric(addr, "snowfence_clock_step_back_seconds_bucket", 'le="0.1"') == 0
    assert metric(addr, "snowfence_clock_unsafe_events_total") >= 1
    clock.shift_all(0)
    node.wait_ready()
    ids_before = wait_for(lambda: metric(addr, "snowfence_ids_total") or None, 5)
    (pid,) = node.worker_pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: metric(addr, "snowfence_worker_restarts_total") == 1, 10, what="restart counted")
    node.wait_ready()
    assert metric(addr, "snowfence_ids_total") >= ids_before, "counters survive a worker restart"


def test_forward_jumps_are_detected_counted_and_optionally_refused(nodes, clock):
    node = nodes.start(
        workers=1, env=clock.env(), args=("--metrics-bind", "127.0.0.1:0", "--refuse-forward-jumps", "true")
    )
    node.wait_ready()
    addr = health(node)
    clock.shift_all(+5000)
    # Counted by each process that watches the clock: the worker, and the broker for its own worker ID.
    wait_for(lambda: metric(addr, "snowfence_clock_forward_jumps_total") >= 1, 5, what="forward jump counted")
    wait_for(lambda: get(addr, "/readyz")[0] == 503, 5, what="not ready while ahead")
    assert "forward jump" in node.log() and "event=clock_forward_jump" in node.log()
    with node.client(retries=0) as c:
        with pytest.raises(ClockUnsafe):
            c.reserve(1)
    clock.shift_all(0)  # corrected: now a 5 s step back, waited out until real time passes what was minted
    wait_for(lambda: get(addr, "/readyz")[0] == 200, 15, what="ready again")


def test_a_kernel_clock_error_bound_makes_workers_refuse(nodes):
    # This host reports an unsynchronised clock (no NTP): with a bound set, nobody mints.
    from snowfence.clock import read_kernel_clock

    kc = read_kernel_clock()
    assert kc is not None
    node = nodes.start(workers=1, args=("--metrics-bind", "127.0.0.1:0", "--max-clock-error-ms", "100"))
    addr = health(node)
    if kc.synchronized and kc.max_error_s < 0.1:
        node.wait_ready()  # a synchronised host passes the bound
        return
    wait_for(lambda: "kernel clock" in node.log(), 10, what="the veto in the log")
    assert not node.ready_workers()
    code, body = wait_for(
        lambda: (lambda r: r if "clock" in r[1] else None)(get(addr, "/readyz")), 5, what="readiness to name the clock"
    )
    assert code == 503
    assert metric(addr, "snowfence_clock_synchronized") in (0.0, 1.0)
    assert metric(addr, "snowfence_clock_max_error_seconds") > 0


def keygen(tmp_path, name: str, where: str) -> tuple[str, str]:
    subprocess.run(
        [sys.executable, "-m", "snowfence", "keygen", name, "--dir", str(tmp_path / where)],
        check=True,
        capture_output=True,
    )
    return str(tmp_path / where / f"{name}.key"), str(tmp_path / where / f"{name}.key_secret")


def test_curve_a_client_without_the_key_gets_nothing_and_one_with_it_gets_ids(nodes, tmp_path):
    server_public, server_secret = keygen(tmp_path, "server", "keys")
    node = nodes.start(workers=1, args=("--curve-secret-key", server_secret))
    node.wait_bound()
    with pytest.raises(CurveRequired):
        with Client(node.endpoint, timeout_s=0.5, retries=1) as plain:
            plain.reserve(1)
    with Client(node.endpoint, timeout_s=2.0, server_key=server_public) as secure:
        wait_for(lambda: any(w["state"] == "ready" for w in secure.status()["workers"]), 10)
        assert sum(b.count for b in secure.reserve(1000)) == 1000
    out = subprocess.run(
        [sys.executable, "-m", "snowfence", "reserve", "3", "--connect", node.endpoint, "--server-key", server_public],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and len(out.stdout.split()) == 3


def test_curve_allow_list_admits_only_known_clients(nodes, tmp_path):
    server_public, server_secret = keygen(tmp_path, "server", "keys")
    alice_public, alice_secret = keygen(tmp_path, "alice", "alice")
    _, mallory_secret = keygen(tmp_path, "mallory", "mallory")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "alice.key").write_text(open(alice_public).read())
    node = nodes.start(workers=1, args=("--curve-secret-key", server_secret, "--curve-allow", str(allowed)))
    with Client(node.endpoint, timeout_s=2.0, server_key=server_public, client_key=alice_secret) as alice:
        wait_for(lambda: any(w["state"] == "ready" for w in alice.status()["workers"]), 10)
        assert sum(b.count for b in alice.reserve(100)) == 100
    for key in (mallory_secret, None):  # a known-bad key, and a key made up for the session
        with pytest.raises(KeyRefused):
            with Client(node.endpoint, timeout_s=0.5, retries=1, server_key=server_public, client_key=key) as c:
                c.reserve(1)


def test_too_many_requests_in_flight_on_one_connection_are_overloaded(nodes, raw):
    node = nodes.start(workers=1, args=("--max-inflight-per-client", "4"))
    node.wait_ready()
    s = raw(node.endpoint)
    for rid in range(1, 41):
        s.send(protocol.encode_reserve(rid, 4096))  # each needs a fresh millisecond: they queue
    replies = [protocol.decode_reply(s.recv()) for _ in range(40)]
    codes = [r.error.code if r.error else "ok" for r in replies]
    assert codes.count("ok") >= 4 and codes.count("overloaded") >= 20, codes
    assert all(r.error.retriable for r in replies if r.error)
    assert {r.request_id for r in replies} == set(range(1, 41))
    with node.client() as c:  # other connections, and this one later, are served as usual
        assert sum(b.count for b in c.reserve(100)) == 100
    s.send(protocol.encode_reserve(99, 1))
    assert protocol.decode_reply(s.recv()).type == protocol.BLOCK


STATES = ("held", "quarantined", "free")


def scrape(addr: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics: (name, its labels) -> value."""
    code, text = get(addr, "/metrics")
    assert code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def latency_counts(addr: str) -> dict[tuple[str, str, str], float]:
    """count, sum and the first bucket's count of both latency histograms, by kind."""
    samples = scrape(addr)
    out = {}
    for name in ("queued", "mint"):
        for kind in ("reserve", "reserve_after"):
            family, labels = f"snowfence_request_{name}_seconds", {("kind", kind)}
            out[name, kind, "count"] = samples[f"{family}_count", frozenset(labels)]
            out[name, kind, "sum"] = samples[f"{family}_sum", frozenset(labels)]
            out[name, kind, "10us"] = samples[f"{family}_bucket", frozenset(labels | {("le", "1e-05")})]
    return out


def test_latency_histograms_count_each_request_by_kind_and_build_and_process_metrics_are_exported(nodes):
    started_s = time.time()
    node = nodes.start(workers=1, args=("--metrics-bind", "127.0.0.1:0"))
    node.wait_ready()
    addr = health(node)
    before = latency_counts(addr)  # exported, for both kinds, before any request
    with node.client() as c:
        # One ID per request: a request is never cut short at a millisecond's end and asked again.
        token = [c.reserve(1)[0].first for _ in range(25)][-1]
        for _ in range(4):
            token = c.reserve(1, after=token)[0].first

    def grew():
        now = latency_counts(addr)
        wanted = {"reserve": 25, "reserve_after": 4}
        counted = all(
            now[n, k, "count"] - before[n, k, "count"] >= c for n in ("queued", "mint") for k, c in wanted.items()
        )
        return now if counted else None

    # Plain single IDs are minted by the broker's own worker ID, those after a token by the
    # worker: each reports its minting times on its own schedule.
    after = wait_for(grew, 5, what="the minting times reported")
    gained = {key: after[key] - before[key] for key in after}
    for name in ("queued", "mint"):
        assert gained[name, "reserve", "count"] == 25 and gained[name, "reserve_after", "count"] == 4, gained
    # One request at a time: each was minted by the broker or went to the worker at once,
    # so it waited exactly nothing.
    assert gained["queued", "reserve", "10us"] == 25 and gained["queued", "reserve", "sum"] == 0
    assert gained["queued", "reserve_after", "10us"] == 4 and gained["queued", "reserve_after", "sum"] == 0
    # Minting takes time; here well under a second a request.
    assert 0 < gained["mint", "reserve", "sum"] < 25 and 0 < gained["mint", "reserve_after", "sum"] < 4

    # A pipeline deeper than the worker's room (one block at a time): requests queue in the broker.
    with node.client() as c:
        took_s = time.monotonic()
        assert sum(b.count for b in c.reserve(100_000)) == 100_000
        took_s = time.monotonic() - took_s

    def settled():
        now = latency_counts(addr)
        minted, sent = now["mint", "reserve", "count"], now["queued", "reserve", "count"]
        # 100,000 IDs take at least 25 requests of at most 4,096.
        return now if minted == sent >= after["queued", "reserve", "count"] + 25 else None

    done = wait_for(settled, 5, what="as many minting times as requests sent to the worker")
    sent = done["queued", "reserve", "count"] - after["queued", "reserve", "count"]
    waited = sent - (done["queued", "reserve", "10us"] - after["queued", "reserve", "10us"])
    queued_s = done["queued", "reserve", "sum"] - after["queued", "reserve", "sum"]
    minted_s = done["mint", "reserve", "sum"] - after["mint", "reserve", "sum"]
    assert waited > 0 and 0 < queued_s, (sent, waited)
    # No request waited longer than the client took for all of them, and the one worker,
    # minting one request at a time, spent less than that on all of them together.
    assert queued_s < sent * took_s and minted_s < took_s, (queued_s, minted_s, took_s)

    samples = scrape(addr)
    assert samples["snowfence_build_info", frozenset({("version", snowfence.__version__)})] == 1
    assert samples["snowfence_node_info", frozenset({("cluster", ""), ("region", "0"), ("mode", "embedded")})] == 1
    assert samples["snowfence_layout_end_timestamp_seconds", frozenset()] == 3_966_248_855.552  # 2095-09-07

    # Region 0's worker-ID pool as the watermark rounds read it: the worker's and perhaps the broker's own
    # worker ID held, the rest of the 128 free (a new state directory: nothing quarantined).
    def read_pool():
        got = scrape(addr)
        return {s: got.get(("snowfence_worker_id_pool", frozenset({("region", "0"), ("state", s)}))) for s in STATES}

    pool = wait_for(lambda: (lambda p: p if p["held"] is not None else None)(read_pool()), 20, what="a pool read")
    assert 1 <= pool["held"] <= 2 and pool["quarantined"] == 0 and pool["free"] == 128 - pool["held"], pool
    assert samples["process_cpu_seconds_total", frozenset()] > 0
    assert samples["process_resident_memory_bytes", frozenset()] > 10_000_000
    assert samples["process_open_fds", frozenset()] > 3
    assert started_s - 1 <= samples["process_start_time_seconds", frozenset()] <= time.time()


def test_the_metrics_endpoint_answers_only_known_paths(nodes):
    node = nodes.start(workers=1, args=("--metrics-bind", "127.0.0.1:0"))
    addr = health(node)
    assert get(addr, "/nope")[0] == 404
    assert get(addr, "/metrics")[0] == 200


def test_hostile_frames_crash_nothing_and_valid_requests_keep_being_served(nodes, raw):
    """Random and mutated frames, many at once, from several connections."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    node = nodes.start(workers=2, args=("--max-inflight-per-client", "64"))
    node.wait_ready()
    pids = [node.pid, *node.worker_pids()]

    def rss_kib(pid: int) -> int:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    rss_before = {p: rss_kib(p) for p in pids}
    socks = [raw(node.endpoint) for _ in range(4)]
    served = []
    stop = False

    def valid_traffic():
        with node.client(timeout_s=2.0) as c:
            while not stop:
                served.append(sum(b.count for b in c.reserve(100)))

    import threading

    t = threading.Thread(target=valid_traffic)
    t.start()
    valid = protocol.encode_reserve(7, 10)
    frames = st.one_of(
        st.binary(max_size=300),
        st.builds(lambda i, b: valid[:i] + bytes([b]) + valid[i + 1 :], st.integers(0, 15), st.integers(0, 255)),
        st.builds(lambda n: valid[:n], st.integers(0, 16)),
    )
    messages = st.lists(frames, min_size=1, max_size=4)

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 3), messages)
    def throw(which, parts):
        socks[which].send_multipart(parts)

    try:
        throw()
    finally:
        stop = True
        t.join(30)
    time.sleep(0.5)
    for s in socks:  # drain what came back; nothing needs to, but the sockets must not be stuck
        s.setsockopt(zmq.RCVTIMEO, 200)
        try:
            while True:
                s.recv_multipart()
        except zmq.Again:
            pass
    assert [node.pid, *node.worker_pids()] == pids, "no process died or restarted"
    for p in pids:  # nothing piles up: per-connection state and queues drain
        assert rss_kib(p) - rss_before[p] < 20_000, f"pid {p} grew from {rss_before[p]} to {rss_kib(p)} KiB"
    assert len(served) > 10 and all(n == 100 for n in served)
    status = node.status()
    assert all(w["state"] == "ready" for w in status["workers"])
    assert status["broker"]["counters"]["bad_request"] > 100
    with node.client() as c:
        assert sum(b.count for b in c.reserve(10_000)) == 10_000


def test_a_node_whose_clock_disagrees_with_its_peers_leaves_rotation(nodes, tmp_path, clockshim_library):
    from clock import ClockTable

    skew = ClockTable(tmp_path / "c-clock", clockshim_library)
    skew.shift_all(+50)
    names = ["a", "b", "c"]
    made = {
        n: nodes.new(n, workers=1, state_dir=tmp_path / "shared-state", env=skew.env() if n == "c" else None)
        for n in names
    }
    for n, node in made.items():
        peers = ",".join(made[p].endpoint for p in names if p != n)
        node.args += ["--peers", peers, "--max-peer-offset-ms", "10", "--metrics-bind", "127.0.0.1:0"]
        node.start()
    a, c = made["a"], made["c"]
    addr_a, addr_c = health(a), health(c)
    # (Until b answers too, c's one peer cannot tell who is wrong: c claims nothing, in rotation.)
    wait_for(
        lambda: (lambda r: r if r[0] == 503 and "clock disagrees with 2 of 2 peers" in r[1] else None)(
            get(addr_c, "/readyz")
        ),
        15,
        what="c to leave rotation",
    )
    for n in ("a", "b"):
        made[n].wait_ready()
    wait_for(lambda: get(addr_a, "/readyz")[0] == 200, 10, what="a stays ready")

    def offset_and_delay():  # one scrape: the round trip that bounds this very offset's error
        _, text = get(addr_a, "/metrics")
        found = {}
        for name in ("offset", "delay"):
            line = f'snowfence_peer_clock_{name}_seconds{{peer="{c.endpoint}"}} '
            found[name] = next((float(x[len(line) :]) for x in text.splitlines() if x.startswith(line)), None)
        return (found["offset"], found["delay"]) if found["offset"] else None

    offset, delay = wait_for(offset_and_delay, 10, what="a's offset to c")
    # c's clock is 50 ms ahead; a loaded machine's round trip may be lopsided by up to
    # all of it, so the measurement is right to within half the round trip.
    assert abs(offset - 0.050) <= delay / 2 + 0.001, (offset, delay)
    with Client(c.endpoint, timeout_s=1.0, retries=0) as client:
        with pytest.raises(ClockUnsafe) as info:
            client.reserve(1)
        assert "peers" in info.value.message
    skew.shift_all(0)
    wait_for(lambda: get(addr_c, "/readyz")[0] == 200, 15, what="c to rejoin")
    assert "clock agrees with the cluster again" in c.log()
    skew.close()
