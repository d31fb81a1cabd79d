"""The single-node service end to end: real `snowfence serve` processes, real
ZeroMQ sockets, real file locks."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest
import zmq
from checks import check_blocks, read_pairs
from nodes import TWO_HOPS, loadgen, wait_for

import snowfence
from snowfence import protocol
from snowfence.errors import ClockUnsafe, ReservationExpired, SnowfenceError, Unavailable
from snowfence.ids import DEFAULT_LAYOUT

L = DEFAULT_LAYOUT


def held_worker_ids(node) -> set[int]:
    return {w["worker_id"] for w in node.status()["workers"] if w.get("worker_id") is not None}


def test_blocks_are_contiguous_within_one_millisecond_and_decode_to_the_serving_worker(nodes):
    node = nodes.start(workers=1, args=TWO_HOPS)  # the blocks of the one worker
    node.wait_ready()
    (worker_id,) = held_worker_ids(node)
    with node.client() as c:
        for n in (1, 2, 100, 4096, 4097, 12_345):
            t0 = time.time_ns() // 1_000_000
            blocks = c.reserve(n)
            t1 = time.time_ns() // 1_000_000
            assert sum(len(b) for b in blocks) == n
            for b in blocks:
                a, z = L.decompose(b.first), L.decompose(b.last)
                assert a.unix_ms == z.unix_ms, "a block must lie within one millisecond"
                assert z.sequence - a.sequence == b.count - 1, "a block is a contiguous range"
                assert (a.region, a.worker) == (0, worker_id)
                assert t0 <= a.unix_ms <= t1, "stamped within the time of the request"
            ids = [i for b in blocks for i in b]
            assert ids == sorted(set(ids))


def test_a_node_on_the_default_timing_waits_out_its_window_then_serves(nodes):
    # Every other test's node runs a short window (tests/harness/nodes.py, QUICK_WINDOW); this
    # one runs what a user gets: a 5 s window renewed every 2 s, and a first start that mints
    # nothing until the window has passed.
    node = nodes.start(workers=2, quick=False)
    assert "--reservation-window-s" not in node.args and "--keepalive-interval-s" not in node.args
    created = wait_for(lambda: re.search(r"new store \S+ in .*: it mints nothing for (\d+) ms", node.log()), 10)
    assert int(created.group(1)) == 5000, created.group(0)
    started = time.monotonic()
    with node.client(timeout_s=10.0, retries=0, retry_for_s=20.0) as client:
        [block] = client.reserve(10)
    waited = time.monotonic() - started
    assert block.count == 10
    # Its first IDs come once the window has passed, not before (the node's log said when the
    # store was made; the client asked just after).
    assert waited > 3.0, waited
    status = node.status()
    held = [w for w in status["workers"] if w.get("worker_id") is not None]
    assert len(held) == 2 and all(w["state"] == "ready" for w in held), held


def test_100k_ids_from_concurrent_client_processes_are_unique_and_increase_per_worker(nodes, tmp_path):
    node = nodes.start(workers=2)
    node.wait_ready()
    wait_for(lambda: (node.status()["broker"]["own_worker_id"] or {}).get("ready"), 20, what="the broker's worker ID")
    outs = [tmp_path / f"client{i}.bin" for i in range(4)]
    procs = [loadgen(node.endpoint, 25_000, out, i) for i, out in enumerate(outs)]
    for p in procs:
        assert p.wait(60) == 0, p.stdout.read()
    figures = check_blocks([read_pairs(o) for o in outs])
    assert figures["ids"] >= 100_000
    assert figures["workers"] == 3  # both workers (blocks above 64) and the broker's own worker ID (up to 64)


def test_sigkill_of_a_worker_loses_only_its_in_flight_requests_and_never_repeats(nodes, tmp_path):
    node = nodes.start(workers=2)
    node.wait_ready()
    outs = [tmp_path / f"c{i}.bin" for i in range(2)]
    procs = [loadgen(node.endpoint, 400_000, o, i, 30) for i, o in enumerate(outs)]
    time.sleep(0.7)
    victim = node.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    for p in procs:
        p.wait(60)
        out = p.stdout.read()
        got, errors = map(int, out.split())
        assert got >= 400_000, (
            f"clients kept being served while a worker was killed and restarted: {out}\n{node.log_tail()}"
        )
        assert errors == 0, f"no request failed beyond what retries absorbed: {out}\n{node.log_tail()}"
    figures = check_blocks([read_pairs(o) for o in outs])
    assert figures["ids"] >= 800_000
    # The clients may be done before the broker has reaped the victim: give it a moment.
    status = wait_for(
        lambda: (lambda st: st if victim not in {w["pid"] for w in st["workers"]} else None)(node.status()),
        10,
        what="the killed worker reaped",
    )
    assert sum(s["restarts"] for s in status["broker"]["slots"]) == 1, (status["broker"], node.log_tail())
    node.wait_ready(2)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_restart_on_the_same_state_dir_continues_above_every_earlier_id(nodes, how):
    node = nodes.start(workers=2)
    node.wait_ready()
    with node.client() as c:
        before = [b for _ in range(50) for b in c.reserve(3000)]
    if how == "sigterm":
        assert node.stop() == 0
    else:
        node.kill()  # no release: the marks stay ahead and the next owners wait them out
    again = nodes.start(name="again", workers=2, state_dir=node.state_dir)
    again.wait_ready(timeout_s=30)
    with again.client() as c:
        after = [b for _ in range(50) for b in c.reserve(3000)]
    assert min(b.first for b in after) > max(b.last for b in before)
    check_blocks([[(b.first, b.count) for b in before + after]])


def test_clean_shutdown_exits_0_within_5_s_releases_locks_and_lowers_marks(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    with node.client() as c:
        blocks = c.reserve(20_000)
    held = held_worker_ids(node)
    t0 = time.monotonic()
    assert node.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 5
    wait_for(lambda: not node.group_alive(), 5, what="workers to exit")
    last_ms = max(L.ms_of(b.last) for b in blocks)
    region_dir = node.state_dir / "regions" / "0"
    for w in held:
        mark = orjson.loads((region_dir / f"worker-{w}.mark").read_bytes())["reserved_until_ms"]
        assert mark <= last_ms, "the mark was lowered to the last millisecond used"
        with open(region_dir / f"worker-{w}.lock", "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the lock was released
    assert "released worker ID" in node.log()


def test_sigint_stops_cleanly_too(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    assert node.stop(signal.SIGINT) == 0
    wait_for(lambda: not node.group_alive(), 5, what="workers to exit")


def test_workers_exit_and_release_when_their_broker_dies(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    pids = node.worker_pids()
    held = held_worker_ids(node)
    os.kill(node.pid, signal.SIGKILL)
    node.proc.wait(5)

    def gone():
        return not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in pids)

    wait_for(gone, 5, what="orphaned workers to exit")
    region_dir = node.state_dir / "regions" / "0"
    for w in held:
        with open(region_dir / f"worker-{w}.lock", "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_boot_error_halts_instead_of_crash_looping(nodes):
    first = nodes.start(workers=1)
    first.wait_ready()
    assert first.stop() == 0
    # Same state dir, a different layout: every worker would fail the same way.
    node = nodes.start(
        name="foreign", workers=2, state_dir=first.state_dir, args=("--region-bits", "2", "--worker-bits", "8")
    )
    assert node.proc.wait(15) == 78
    log = node.log()
    # Refused before it says it serves (the layout is checked before any worker is spawned).
    assert "will not start" in log and "serving" not in log
    assert log.count("restarted as pid") == 0


def test_unusable_state_dir_halts(nodes, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    node = nodes.start(workers=1, state_dir=blocker / "state")
    assert node.proc.wait(15) == 73
    assert "not usable" in node.log()


def test_crashing_worker_is_restarted_with_growing_backoff(nodes):
    node = nodes.start(workers=1)
    for _ in range(3):
        node.wait_ready()
        (pid,) = node.worker_pids()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda pid=pid: pid not in node.worker_pids(), 5, what="the supervisor to notice")
    restarts = [line for line in node.log().splitlines() if "restarting in" in line]
    got = [float(line.split("restarting in ")[1].split(" s")[0]) for line in restarts]
    assert len(got) == 3 and got == sorted(got) and got[-1] > got[0], got
    node.wait_ready()
    assert node.status()["broker"]["slots"][0]["restarts"] == 3


def test_a_silent_worker_leaves_rotation_and_comes_back(nodes):
    node = nodes.start(workers=2, args=("--heartbeat-timeout-s", "1.5"))
    node.wait_ready()
    victim = node.worker_pids()[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        wait_for(lambda: len(node.ready_workers()) == 1, 6, what="the silent worker to leave rotation")
        with node.client(timeout_s=1.0) as c:
            assert sum(len(b) for b in c.reserve(50_000)) == 50_000  # the other worker serves
    finally:
        os.kill(victim, signal.SIGCONT)
    node.wait_ready(2)


# -- refusals reach the client as typed errors -----------------------------------------------


def test_a_large_clock_step_back_reaches_the_client_as_clock_unsafe_and_recovers(nodes, clock):
    node = nodes.start(workers=1, env=clock.env(), args=TWO_HOPS)
    node.wait_ready()
    # A new store's worker ID is ready the moment the clock passes its first mark (the store's
    # wait): a step back of 300 ms right then lands below the mark, which is a wait, not a
    # step back past minted IDs. Half a second later it is the step back this test means.
    time.sleep(0.5)
    with node.client(retries=0) as c:
        c.reserve(10)
        clock.shift_all(-300)
        with pytest.raises(ClockUnsafe) as info:
            c.reserve(10)
        assert info.value.code == "clock_unsafe" and info.value.retriable
        wait_for(lambda: not node.ready_workers(), 2, what="the worker to leave rotation")
        # Once the wall clock passes the last minted millisecond, it rejoins by itself.
        wait_for(lambda: node.ready_workers(), 5, what="the worker to rejoin")
        c.reserve(10)
    assert "event=clock_step_back" in node.log() and "step_back_ms=" in node.log()


def test_a_refusing_worker_leaves_rotation_and_its_requests_are_retried_on_another(nodes, clock):
    node = nodes.start(workers=2, env=clock.env(), args=TWO_HOPS)
    node.wait_ready()
    victim = node.worker_pids()[0]
    with node.client() as c:
        c.reserve(50_000)  # both workers have minted: a step back is now behind their last_ms
    clock.shift_pid(victim, -2_000)  # only this worker's wall clock steps back 2 s
    with node.client(retries=0, window=4) as c:
        blocks = [b for _ in range(200) for b in c.reserve(50)]  # no error reaches the client
    check_blocks([[(b.first, b.count) for b in blocks]])
    status = node.status()
    victim_entry = next(w for w in status["workers"] if w["pid"] == victim)
    assert victim_entry["state"] == "clock_unsafe" and not victim_entry["in_rotation"]
    assert status["broker"]["counters"]["retried"] >= 1
    clock.shift_pid(victim, 0)
    node.wait_ready(2, timeout_s=10)


def test_a_small_clock_step_back_is_waited_out_without_an_error(nodes, clock):
    node = nodes.start(workers=1, env=clock.env(), args=TWO_HOPS)
    node.wait_ready()
    with node.client(retries=0) as c:
        before = c.reserve(10)
        clock.shift_all(-8)
        after = c.reserve(10)
    assert after[0].first > before[-1].last


def test_a_forward_jump_past_the_reservation_reaches_the_client_as_reservation_expired(nodes, clock):
    node = nodes.start(workers=1, env=clock.env())
    node.wait_ready()
    seen = None
    with node.client(retries=0) as c:
        for attempt in range(1, 4):  # the keeper could extend between the jump and our request
            clock.shift_all(attempt * 8_000)
            try:
                c.reserve(1)
            except ReservationExpired as err:
                seen = err
                break
        assert seen is not None and seen.retriable
        # The keeper extends the reservation and the worker serves again.
        wait_for(lambda: c.reserve(1), 5, what="service after the keeper extended the reservation")


def test_no_ready_worker_is_unavailable_retriable(nodes, clock):
    # Leave a mark 60 s ahead (as a clock set back while the node was down would).
    first = nodes.start(workers=1, env=clock.env(), args=TWO_HOPS)
    first.wait_ready()
    with first.client() as c:
        before = c.reserve(5)
    assert first.stop() == 0
    clock.shift_all(-60_000)
    node = nodes.start(name="behind", workers=1, state_dir=first.state_dir, env=clock.env(), args=TWO_HOPS)
    wait_for(
        lambda: node.status()["workers"] and node.status()["workers"][0].get("worker_id") is not None,
        10,
        what="the worker to claim",
    )
    with node.client(retries=0) as c:
        with pytest.raises(Unavailable) as info:
            c.reserve(1)
        assert info.value.retriable
    assert not node.ready_workers()  # it waits rather than minting below its old IDs
    assert "clock_behind_mark" in node.log()
    clock.shift_all(0)
    node.wait_ready(timeout_s=10)
    with node.client() as c:
        after = c.reserve(5)
    assert after[0].first > before[-1].last


def test_restart_after_the_clock_was_set_back_a_little_waits_then_continues_above(nodes, clock):
    first = nodes.start(workers=2, env=clock.env())
    first.wait_ready()
    with first.client() as c:
        before = [b for _ in range(20) for b in c.reserve(4096)]
    first.kill()  # unclean: marks stay ~5 s ahead
    clock.shift_all(-2_000)
    node = nodes.start(name="again", workers=2, state_dir=first.state_dir, env=clock.env())
    node.wait_ready(timeout_s=20)
    with node.client() as c:
        after = [b for _ in range(20) for b in c.reserve(4096)]
    assert min(b.first for b in after) > max(b.last for b in before)


# -- bad input never hurts -----------------------------------------------------------------------


def assert_still_serving(node, pids_before):
    with node.client(retries=0) as c:
        assert len(c.reserve(5)) >= 1
    assert node.proc.poll() is None
    assert node.worker_pids() == pids_before


def error_of(sock) -> tuple[int, str]:
    reply = protocol.decode_reply(sock.recv())
    assert reply.type == protocol.ERROR
    return reply.request_id, reply.error.code


def test_malformed_frames_get_typed_errors_and_the_service_keeps_serving(nodes, raw):
    node = nodes.start(workers=2)
    node.wait_ready()
    pids = node.worker_pids()
    s = raw(node.endpoint)
    cases = [
        (b"", (0, "bad_request")),
        (b"hello world, not a frame", (0, "unsupported_version")),
        (b"\x02" + protocol.encode_reserve(11, 5)[1:], (0, "unsupported_version")),
        (protocol.HEADER.pack(1, 1, 0, 12) + (0).to_bytes(4, "big"), (12, "bad_request")),  # count 0
        (protocol.HEADER.pack(1, 1, 0, 13) + (4097).to_bytes(4, "big"), (13, "bad_request")),  # > 4096
        (protocol.HEADER.pack(1, 1, 0, 14) + (2**32 - 1).to_bytes(4, "big"), (14, "bad_request")),
        (protocol.HEADER.pack(1, 0x7E, 0, 15), (15, "bad_request")),  # unknown type
        (protocol.encode_reserve(16, 5)[:-2], (16, "bad_request")),  # truncated
        (b"\x01" * 300, (0x0101010101010101, "frame_too_large")),
    ]
    for body, expected in cases:
        s.send(body)
        assert error_of(s) == expected, body
    s.send_multipart([b"a", b"b", b"c"])  # too many frames
    assert error_of(s) == (0, "bad_request")
    assert_still_serving(node, pids)
    # A huge frame is dropped by the transport (the connection is closed), nothing else.
    big = raw(node.endpoint)
    big.send(b"\x01" * (1 << 20))
    time.sleep(0.2)
    assert_still_serving(node, pids)
    # Random garbage in bulk.
    rng = __import__("random").Random(7)
    for _ in range(2000):
        s.send(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
    got = 0
    while True:
        try:
            s.recv()
            got += 1
        except zmq.Again:
            break
    assert got == 2000, "every malformed frame got an error reply"
    assert_still_serving(node, pids)


def test_a_req_socket_client_is_served_with_its_delimiter(nodes, raw):
    node = nodes.start(workers=1)
    node.wait_ready()
    s = raw(node.endpoint, zmq.REQ)
    s.send(protocol.encode_reserve(99, 3))
    reply = protocol.decode_reply(s.recv())
    assert (reply.type, reply.request_id, reply.count) == (protocol.BLOCK, 99, 3)


def test_absurd_counts_from_the_client_are_refused_before_sending(nodes):
    node = nodes.start(workers=1)
    node.wait_ready()
    with node.client() as c:
        for n in (0, -1):
            with pytest.raises(ValueError):
                c.reserve(n)
        with pytest.raises(TypeError):
            c.reserve(1.5)
        assert sum(len(b) for b in c.reserve(1)) == 1


def test_client_is_refused_at_once_by_a_dead_endpoint(tmp_path):
    from snowfence import Client
    from snowfence.errors import ConnectionRefused

    with Client(f"ipc://{tmp_path}/nobody.sock", timeout_s=5.0, retries=1) as c:
        t0 = time.monotonic()
        with pytest.raises(ConnectionRefused) as info:
            c.reserve(1)
        assert info.value.retriable
        assert time.monotonic() - t0 < 2  # not the timeout of 5 s


def test_concurrent_threads_share_one_client(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    results, errors = [], []
    with node.client() as c:

        def run():
            try:
                for _ in range(20):
                    results.extend(c.reserve(777))
            except SnowfenceError as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors
    check_blocks([[(b.first, b.count) for b in results]])
    assert sum(len(b) for b in results) == 4 * 20 * 777


# -- the command line ------------------------------------------------------------------------------


def run_cli(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=30)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_cli_reserve_decode_status(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    ids = [int(x) for x in run_cli("reserve", "5", "--connect", node.endpoint).stdout.split()]
    assert len(ids) == 5 and len(set(ids)) == 5
    as_json = orjson.loads(run_cli("reserve", "3", "--connect", node.endpoint, "--json").stdout)
    assert len(as_json) == 3 and all(isinstance(x, str) for x in as_json)
    decoded = [orjson.loads(line) for line in run_cli("decode", *map(str, ids[:2]), "--json").stdout.splitlines()]
    assert [d["id"] for d in decoded] == [str(i) for i in ids[:2]]
    for d in decoded:
        assert set(d) == {"id", "unix_ms", "time", "region", "worker", "sequence"}
        assert d["time"].endswith("Z") and d["region"] == 0
    status = orjson.loads(run_cli("status", "--connect", node.endpoint, "--json").stdout)
    assert len(status["workers"]) == 2
    for w in status["workers"]:
        assert {"worker_id", "state", "pid"} <= set(w) and w["state"] == "ready"
    assert status["version"] == protocol.VERSION and status["software_version"] == snowfence.__version__
    text = run_cli("status", "--connect", node.endpoint).stdout
    assert "ready" in text
    assert f"(snowfence {snowfence.__version__}, protocol {protocol.VERSION})" in text.splitlines()[0]
    bad = run_cli("decode", "not-an-id", check=False)
    assert bad.returncode == 1 and "not a snowfence ID" in bad.stderr
    too_many = run_cli("reserve", "0", "--connect", node.endpoint, check=False)
    assert too_many.returncode == 78 and "at least 1" in too_many.stderr  # a usage error, caught before asking


def test_cli_reports_an_unreachable_server_clearly(tmp_path):
    p = run_cli("status", "--connect", f"ipc://{tmp_path}/none.sock", "--timeout", "0.3", check=False)
    assert p.returncode == 1 and "connection_refused" in p.stderr and "is snowfence serve running" in p.stderr


def test_env_settings_reach_the_node(nodes):
    node = nodes.start(workers=1, env={"SNOWFENCE_REGION": "3"})
    node.wait_ready()
    with node.client() as c:
        (block,) = c.reserve(1)
    assert L.decompose(block.first).region == 3


def test_a_worker_process_can_mint_from_several_worker_ids_in_turn(nodes):
    node = nodes.start(workers=2, args=("--ids-per-worker", "3"))
    node.wait_ready(6)
    entries = node.status()["workers"]
    assert len({w["worker_id"] for w in entries}) == 6 and len({w["pid"] for w in entries}) == 2
    with node.client(window=64) as c:
        blocks = c.reserve(4096 * 300)
    check_blocks([[(b.first, b.count) for b in blocks]])
    per_ms: dict[int, int] = {}
    for b in blocks:
        per_ms[L.ms_of(b.first)] = per_ms.get(L.ms_of(b.first), 0) + b.count
    assert len({L.decompose(b.first).worker for b in blocks}) == 6
    assert max(per_ms.values()) > 2 * 4096, "more than one full block per millisecond per process"


def test_ids_prefetches_and_drops_stale_blocks(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    with node.client() as c:
        stream = c.ids(batch=1, max_age_s=0.2)
        first = [next(stream) for _ in range(50)]
        assert len(set(first)) == 50
        time.sleep(0.5)  # what is in hand now is older than max_age_s
        resumed_ms = time.time_ns() // 1_000_000
        later = next(stream)
        assert L.decompose(later).unix_ms >= resumed_ms - 1, "a stale block was handed out"
        assert later not in first
        ids = [next(stream) for _ in range(20_000)]
        check_blocks([[(i, 1) for i in first + [later] + ids]])


def test_bench_reports_rates_latency_and_checks_every_id(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    p = run_cli(
        "bench",
        "--connect",
        node.endpoint,
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--clients",
        "2",
        "--depth",
        "4",
        "--batch",
        "4096",
        "--json",
    )
    res = orjson.loads(p.stdout)
    assert res["ids_per_s"] > 1_000_000 and res["requests_per_s"] > 0
    assert set(res["latency_us"]) >= {"p50", "p99", "p999"}
    assert res["check"]["unique"] and res["check"]["duplicates"] == 0
    assert res["check"]["ids_checked"] == res["ids"] > 0
    assert res["check"]["outside_request_window"] == 0
    assert res["errors"] == {}
    assert res["ceiling_ids_per_s"] == 2 * 4096 * 1000
    text = run_cli(
        "bench",
        "--connect",
        node.endpoint,
        "--duration",
        "0.5",
        "--warmup",
        "0",
        "--clients",
        "1",
        "--rate",
        "200",
        "--batch",
        "1",
    ).stdout
    assert "IDs/s" in text and "unique       yes" in text


def test_a_shard_prefixed_layout_end_to_end(nodes):
    from snowfence.ids import Layout

    layout = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    args = ("--time-bits", "39", "--shard-bits", "2")
    node = nodes.start(workers=2, args=args)
    node.wait_ready()
    with node.client() as c:
        blocks = c.reserve(20_000)
    for b in blocks:
        d = layout.decompose(b.first)
        assert d.shard == layout.shard_of(d.region, d.worker)
        assert layout.ms_of(b.first) == layout.ms_of(b.last)
    decoded = orjson.loads(run_cli("decode", str(blocks[0].first), "--json", *args).stdout)
    assert decoded["shard"] == layout.decompose(blocks[0].first).shard
    # The layout's end, 2**39 ms after the epoch, and the years left, in STATUS and in status's text.
    asked_ms = time.time_ns() // 1_000_000
    end = orjson.loads(run_cli("status", "--connect", node.endpoint, "--json").stdout)["layout_end"]
    assert end["end_unix_ms"] == layout.epoch_ms + 2**39 and end["end"] == "2043-06-03T21:56:53.888Z", end
    assert abs(end["years_left"] - layout.years_left(asked_ms)) < 0.011, end
    text = run_cli("status", "--connect", node.endpoint).stdout
    assert re.search(r"^layout ends 2043-06-03T21:56:53.888Z \((1[67]\.\d\d) years left\)$", text, re.M), text
    # Region 0's pool, once a watermark round has read the marks: two workers' worker IDs held at least.
    line = re.compile(r"^region 0: (\d+) of 128 worker IDs free, (\d+) held, (\d+) quarantined", re.M)

    def pool():
        shown = line.search(run_cli("status", "--connect", node.endpoint).stdout)
        return shown and tuple(map(int, shown.groups()))

    free, held, quarantined = wait_for(pool, 20, what="the pool in status")
    assert held >= 2 and quarantined == 0 and free == 128 - held, (free, held, quarantined)
    assert abs(decoded["unix_ms"] - time.time() * 1000) < 60_000
