"""The broker's own worker ID (workers/inline.py) on a real embedded store in a temporary
state directory: when it claims, what it mints, when it declines, and its release."""

from __future__ import annotations

import threading
import time

import pytest

from snowfence.config import Config
from snowfence.workers.inline import InlineMinter
from snowfence.workers.main import open_store


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

    def make(settled: bool = True, **settings) -> tuple[InlineMinter, threading.Event]:
        config = Config(
            state_dir=str(tmp_path / "state"), bind="tcp://127.0.0.1:5999", broker_mint_max_ids=64, **settings
        )
        settle = threading.Event()
        if settled:
            settle.set()
        im = InlineMinter(
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


def ready(im: InlineMinter) -> bool:
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
    config = Config(state_dir=str(blocker / "state"), bind="tcp://127.0.0.1:5999")
    im = InlineMinter(config, open_store=open_store, workers_settled=lambda: True, loop_ns=time.monotonic_ns, pid=1)
    assert not im.start()
    assert im.describe() is None
    im.stop()


def test_a_failure_on_its_thread_leaves_nothing_in_rotation_and_requests_go_to_workers(inline):
    im, _ = inline()
    assert until(lambda: ready(im))
    assert im.mint(1) is not None

    def broken(now_ns, **kw):
        raise RuntimeError("a bug in a timer")

    im.core.tick = broken  # the next turn of its thread fails
    assert until(lambda: not im._thread.is_alive())
    assert im.mint(1) is None and im.declined["not_ready"] >= 1
