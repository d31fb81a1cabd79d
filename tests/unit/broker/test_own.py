"""The broker's own worker ID (broker/own.py) on a real embedded store in a temporary
state directory: when it claims, what it mints, when it declines, and its release."""

from __future__ import annotations

import threading
import time

import pytest

from snowfence.broker import own as own_mod
from snowfence.broker.own import CLAIM, GIVE_BACK, KEEP, WAIT, OwnWorkerId, spare_rule
from snowfence.config import Config
from snowfence.store import open_store

#: A short reservation window: a new store waits out its bound (5 s on the defaults) before
#: its first ID, which none of these tests is about.
QUICK = {"keepalive_interval_s": 0.3, "reservation_window_s": 1.0, "max_reservation_window_s": 1.0, "max_ahead_ms": 500}


def until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def inline(tmp_path):
    made = []

    def make(settled: bool = True, **settings) -> tuple[OwnWorkerId, threading.Event]:
        config = Config(
            state_dir=str(tmp_path / "state"),
            bind="tcp://127.0.0.1:5999",
            broker_mint_max_ids=64,
            **{**QUICK, **settings},
        )
        settle = threading.Event()
        if settled:
            settle.set()
        im = OwnWorkerId(
            config,
            open_store=open_store,
            workers_settled=settle.is_set,
            loop_ns=time.monotonic_ns,
            pid=4242,
        )
        made.append(im)
        assert im.start()
        return im, settle

    yield make
    for im in made:
        im.stop()


def ready(im: OwnWorkerId) -> bool:
    return bool(im.core.ready)


def test_it_claims_only_once_the_workers_hold_theirs_then_mints_unique_increasing_ids(inline):
    im, settle = inline(settled=False)
    time.sleep(0.3)
    assert im.core.held == [] and im.mint(1) is None and im.declined["not_ready"] == 1
    settle.set()
    assert until(lambda: ready(im))
    ids = []
    for _ in range(2000):
        minted = im.mint(3)
        if minted is not None:
            first, count = minted
            assert 1 <= count <= 3
            ids.extend(range(first, first + count))
    assert ids == sorted(ids) and len(set(ids)) == len(ids) > 0
    assert im.core.counters["ids"] == len(ids)
    states = []
    # None while its thread holds the core (every 10 ms, briefly): the loop never waits.
    assert until(lambda: states.append(im.snapshot(time.monotonic_ns())) or states[-1] is not None)
    state = states[-1]
    assert state.slot == -1 and [h.state for h in state.held] == ["ready"]
    assert im.describe()["max_ids"] == 64


def test_it_declines_rather_than_wait_for_its_lock_or_for_the_next_millisecond(inline):
    im, _ = inline(sequence_bits=4, worker_bits=15)  # 16 IDs per millisecond
    assert until(lambda: ready(im))
    with im._lock:  # its thread is ticking (or claiming): the loop may not wait for it
        assert im.mint(1) is None
    assert im.declined["busy"] == 1
    started = time.monotonic()
    for _ in range(10_000):
        if im.mint(16) is None and im.declined["would_wait"]:
            break
    # A used-up millisecond is handed on at once, never slept out.
    assert im.declined["would_wait"] >= 1 and im.core.waits == {"step_back": 0, "sequence": 0}
    assert time.monotonic() - started < 5


def test_stop_releases_the_worker_id_for_the_next_claimer(inline, tmp_path):
    im, _ = inline()
    assert until(lambda: ready(im))
    first, _ = im.mint(1)
    worker_id = im.core.held[0].lease.worker_id
    im.stop()
    assert im.core.held == [] and im.mint(1) is None
    again, _ = inline()
    assert until(lambda: ready(again))
    assert again.core.held[0].lease.worker_id == worker_id  # its preference file, and the ID was free
    later, _ = again.mint(1)
    assert later > first


def test_a_store_it_cannot_open_leaves_it_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = Config(state_dir=str(blocker / "state"), bind="tcp://127.0.0.1:5999", **QUICK)
    im = OwnWorkerId(config, open_store=open_store, workers_settled=lambda: True, loop_ns=time.monotonic_ns, pid=1)
    assert not im.start()
    assert im.describe() is None
    im.stop()


def test_a_failure_on_its_thread_leaves_nothing_in_rotation_and_requests_go_to_workers(inline):
    im, _ = inline()
    assert until(lambda: ready(im))
    assert im.mint(1) is not None

    def broken(now_ns, **kw):
        raise RuntimeError("a bug in a timer")

    worker_id = im.core.held[0].lease.worker_id
    im.core.tick = broken  # the next turn of its thread fails
    assert until(lambda: not im._thread.is_alive())
    assert im.mint(1) is None and im.declined["not_ready"] >= 1
    # Nothing would give its worker ID back to workers any more: it lets it go.
    assert im.core.held == [] and im.state_due
    other = open_store(im.config)
    assert other.claim(worker_id, "a worker", 0, 1000).worker_id == worker_id


def test_a_count_that_raises_anything_changes_nothing_and_its_thread_goes_on(inline, quick_counts):
    im, _ = inline()
    assert until(lambda: ready(im))

    def broken(up_to=None):
        raise OSError(24, "Too many open files")

    im.store.unheld = broken
    time.sleep(0.3)
    assert im._thread.is_alive() and im.free is None and ready(im)


def test_counting_stops_where_the_rule_needs_no_more(tmp_path):
    config = Config(state_dir=str(tmp_path / "state"), bind="tcp://127.0.0.1:5999", **QUICK)
    store = open_store(config)
    assert store.unheld() == 128 and store.unheld(up_to=2) == 2


# -- workers come first: the spare worker ID ------------------------------------------------------


def test_the_spare_rule_keeps_one_worker_id_free_for_workers():
    assert spare_rule(holding=False, free=2, settled=True) == CLAIM  # one stays free after its claim
    assert spare_rule(holding=False, free=1, settled=True) == WAIT  # the last free one is for a worker
    assert spare_rule(holding=False, free=5, settled=False) == WAIT  # its own workers first
    assert spare_rule(holding=False, free=None, settled=True) == WAIT  # a count that failed: nothing known
    assert spare_rule(holding=True, free=1, settled=True) == KEEP
    assert spare_rule(holding=True, free=0, settled=False) == GIVE_BACK  # a worker somewhere needs one
    assert spare_rule(holding=True, free=None, settled=True) == KEEP  # etcd away: its lease says the rest


def test_the_file_store_counts_unheld_worker_ids_by_their_witnesses(tmp_path):
    config = Config(
        state_dir=str(tmp_path / "state"), bind="tcp://127.0.0.1:5999", worker_bits=2, time_bits=46, **QUICK
    )
    store, other = open_store(config), open_store(config)
    assert store.unheld() == 4
    leases = [other.claim(None, "w", 0, 1000) for _ in range(3)]
    assert store.unheld() == 1
    store.passed_over[3] = "its mark is damaged"
    assert store.unheld() == 0
    store.passed_over.clear()
    leases[0].abandon()  # its process let go: the kernel's witness with it
    assert store.unheld() == 2
    assert other.claim(None, "w", 0, 1000) is not None  # counting took nothing from a claimer


def test_a_witness_socket_that_cannot_be_opened_is_a_state_dir_error_and_changes_nothing(tmp_path, monkeypatch):
    import socket

    from snowfence.errors import StateDirError

    config = Config(
        state_dir=str(tmp_path / "state"), bind="tcp://127.0.0.1:5999", worker_bits=2, time_bits=46, **QUICK
    )
    store = open_store(config)
    assert store.unheld() == 4

    def out_of_descriptors(*args, **kwargs):
        raise OSError(24, "Too many open files")

    with monkeypatch.context() as patch:
        patch.setattr(socket, "socket", out_of_descriptors)
        with pytest.raises(StateDirError, match="cannot open the holder's witness socket for worker ID 0"):
            store.unheld()
    assert store.unheld() == 4 and store.passed_over == {}  # nothing counted as held or passed over


@pytest.fixture
def quick_counts(monkeypatch):
    monkeypatch.setattr(own_mod, "SPARE_CHECK_S", 0.05)


def test_it_claims_only_while_another_worker_id_stays_free_and_gives_its_own_back_when_none_does(
    inline, quick_counts, tmp_path
):
    # Four worker IDs; two held by "workers" (another store on the same state directory).
    im, _ = inline(worker_bits=2, time_bits=46)
    workers = open_store(im.config)
    held = [workers.claim(None, f"worker-{i}", 0, 1000) for i in range(2)]
    assert until(lambda: ready(im))
    mine = im.core.held[0].lease.worker_id
    first, _ = im.mint(1)
    assert im.free == 1 or until(lambda: im.free == 1)
    # A worker takes the last free one (a new node's, or one restarted while its old
    # lease lingers): the broker gives its own back, its mark lowered to what it used.
    held.append(workers.claim(None, "worker-2", 0, 1000))
    assert until(lambda: not im.core.held and im.gave_back == 1)
    assert im.mint(1) is None
    mark_ms, _ = workers.read_mark(mine)
    # Lowered to its minter's last millisecond: the one it used, or the clock's that its idle
    # minter has since promised not to go below (for the watermark); never ahead of the clock,
    # so the next owner on this host waits for nothing.
    now_ms = time.time_ns() // 1_000_000 - im.config.layout.epoch_ms
    assert im.config.layout.ms_of(first) <= mark_ms <= now_ms
    fourth = workers.claim(None, "worker-3", 0, 1000)
    assert fourth is not None and fourth.worker_id == mine
    time.sleep(0.3)
    assert not im.core.held  # no worker ID free: it waits
    fourth.release(0)
    time.sleep(0.3)
    assert not im.core.held  # one free: that one is for workers
    held.pop().release(0)
    assert until(lambda: ready(im))  # two free: it takes one, one stays free
    assert until(lambda: im.snapshot(time.monotonic_ns()) is not None)
    assert im.describe()["gave_back"] == 1 and im.describe()["region_unheld"] in (1, 2)


def test_a_count_that_fails_changes_nothing(inline, quick_counts):
    from snowfence.errors import EtcdUnavailable

    im, _ = inline()
    assert until(lambda: ready(im))

    def away():
        raise EtcdUnavailable("scripted")

    im.store.unheld = away
    time.sleep(0.3)
    assert im.free is None and ready(im) and im.gave_back == 0
