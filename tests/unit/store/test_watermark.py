"""The watermark's rules (store/watermark.py), the floor a holder publishes, and a round of
each store: what it may promise, what it must not, and what a claim after it starts above."""

from __future__ import annotations

import time

import orjson
import pytest
from etcdrig import Etcd, claim
from fakeclock import FakeClock
from filerig import file_store

from snowfence.errors import WatermarkRecordUnreadable
from snowfence.ids import DEFAULT_LAYOUT, Layout
from snowfence.store import watermark
from snowfence.store.files import FileStore
from snowfence.store.genesis import Genesis
from snowfence.store.watermark import Floor
from snowfence.workers.minter import FLOOR_TRAIL_MS

HOLDER = "node-a:41:slot0"


def floor(floor_ms, reserved=10_000, held=True, released=False, saw_record=False, worker_id=0) -> Floor:
    return Floor(0, worker_id, floor_ms, reserved, held=held, released=released, saw_record=saw_record)


# -- the rules ----------------------------------------------------------------------------------


def test_a_held_worker_id_binds_whatever_its_mark_says():
    assert watermark.binds(floor(5, reserved=0, released=True), now_ms=10**9, skew_ms=0)


def test_one_let_go_without_a_release_binds_until_the_clock_less_the_skew_passes_its_reservation():
    f = floor(5, reserved=1_000, held=False)
    assert watermark.binds(f, now_ms=1_000, skew_ms=0)
    assert watermark.binds(f, now_ms=1_100, skew_ms=100)
    assert not watermark.binds(f, now_ms=1_101, skew_ms=100)


def test_a_released_one_binds_nothing():
    assert not watermark.binds(floor(5, reserved=10**9, held=False, released=True), now_ms=0, skew_ms=0)


def test_the_candidate_is_the_lowest_binding_floor_and_never_above_the_clock_less_the_skew():
    floors = [floor(700), floor(500, worker_id=1), floor(100, held=False, released=True, worker_id=2)]
    assert watermark.candidate(floors, now_ms=1_000, skew_ms=50) == 500
    assert watermark.candidate([floor(2_000)], now_ms=1_000, skew_ms=50) == 950
    assert watermark.candidate([], now_ms=1_000, skew_ms=50) == 950


def test_a_binding_mark_without_a_floor_allows_nothing():
    assert watermark.candidate([floor(None), floor(900, worker_id=1)], now_ms=1_000, skew_ms=0) == 0
    assert not watermark.holds(1, [floor(None)], now_ms=1_000, skew_ms=0)


def test_a_candidate_holds_only_if_every_binding_floor_is_at_or_above_it_or_its_claim_saw_the_record():
    assert watermark.holds(500, [floor(500), floor(600, worker_id=1)], now_ms=1_000, skew_ms=0)
    assert not watermark.holds(501, [floor(500), floor(600, worker_id=1)], now_ms=1_000, skew_ms=0)
    assert watermark.holds(501, [floor(500, saw_record=True)], now_ms=1_000, skew_ms=0)
    # Marks that bind nothing do not hold it back.
    assert watermark.holds(900, [floor(1, held=False, released=True)], now_ms=1_000, skew_ms=0)
    assert not watermark.holds(900, [floor(1, held=False, reserved=2_000)], now_ms=1_000, skew_ms=0)


def test_no_promise_without_a_genesis_nor_before_a_new_store_has_outlived_its_window():
    layout = DEFAULT_LAYOUT
    genesis = Genesis.create(layout, now_unix_ms=layout.epoch_ms + 10_000, window_ms=5_000)
    assert not watermark.settled(None, layout, now_ms=10**9, skew_ms=0)
    assert not watermark.settled(genesis, layout, now_ms=15_000, skew_ms=0)
    assert watermark.settled(genesis, layout, now_ms=15_001, skew_ms=0)
    assert not watermark.settled(genesis, layout, now_ms=15_101, skew_ms=101)
    quarantined = Genesis.create(layout, now_unix_ms=layout.epoch_ms, window_ms=5_000, quarantine_until_ms=40_000)
    assert not watermark.settled(quarantined, layout, now_ms=40_000, skew_ms=0)


def test_the_record_sorts_as_bytes_as_its_numbers_do_and_anything_else_is_refused():
    assert watermark.encode(9) < watermark.encode(10) < watermark.encode(2**61)
    assert watermark.decode(watermark.encode(12_345)) == 12_345 and watermark.decode(None) == 0
    for bad in (b"12", b"x" * watermark.RECORD_WIDTH, b"-" + b"1" * (watermark.RECORD_WIDTH - 1)):
        with pytest.raises(ValueError):
            watermark.decode(bad)


# -- the floor a holder publishes ------------------------------------------------------------------


def test_raise_floor_moves_an_idle_minter_up_to_the_clock_and_it_never_mints_below():
    clock = FakeClock()
    minter = clock.minter()
    minter.fence_deadline_ns, minter.reserved_until_ms = 1 << 62, 10**12
    first, _ = minter.reserve(1)
    clock.advance_ms(5_000)
    minter.raise_floor()
    floor = clock.wall_ms - DEFAULT_LAYOUT.epoch_ms - FLOOR_TRAIL_MS
    assert minter.last_ms == floor - 1  # every later mint carries the floor or more
    clock.step_ms(-FLOOR_TRAIL_MS)  # a step back of the trail: taken in its stride, as before
    first, _ = minter.reserve(1)
    assert DEFAULT_LAYOUT.ms_of(first) == floor
    clock.step_ms(-5)  # a small step back below the floor: it waits rather than mint below it
    second, _ = minter.reserve(1)
    assert DEFAULT_LAYOUT.ms_of(second) >= floor


def test_raise_floor_stops_at_the_reservation():
    clock = FakeClock()
    minter = clock.minter()
    minter.reserved_until_ms = 100
    minter.raise_floor()
    assert minter.last_ms == 100


def test_the_keeper_publishes_the_minters_last_millisecond_with_the_extension(tmp_path):
    clock = FakeClock()
    # A store whose nodes reserve 1 s ahead: a new one waits 1 s, within the keeper's extension.
    s = file_store(tmp_path, DEFAULT_LAYOUT, 0, wall_ns=clock.wall_ns, window_ms=1000)
    s.check_layout(DEFAULT_LAYOUT)
    lease = s.try_claim(0, HOLDER, None)
    minter = clock.minter()
    minter.start_after(lease.claimed_mark_ms)
    keeper = clock.keeper(lease, minter)
    keeper.renew_once()  # extends the reservation ahead of the clock
    clock.advance_ms(5_000)  # past the new store's wait, and the trail
    minter.raise_floor()  # on the minting thread, at its next tick
    keeper.renew_once()
    published = orjson.loads((tmp_path / "regions" / "0" / "worker-0.floor").read_bytes())
    assert published["floor_ms"] == minter.last_ms == clock.wall_ms - DEFAULT_LAYOUT.epoch_ms - FLOOR_TRAIL_MS - 1


# -- a round of the file store --------------------------------------------------------------------


class Files:
    """A state directory on a fake clock, its store settled (past its new-store window)."""

    def __init__(self, tmp_path) -> None:
        self.clock = FakeClock()
        self.root = tmp_path
        self.store = self.open()
        self.clock.advance_ms(10_000)

    def open(self) -> FileStore:
        s = file_store(self.root, DEFAULT_LAYOUT, 0, wall_ns=self.clock.wall_ns)
        s.check_layout(DEFAULT_LAYOUT)
        return s

    @property
    def now_ms(self) -> int:
        return self.clock.wall_ms - DEFAULT_LAYOUT.epoch_ms

    def hold(self, worker_id: int, floor_ms: int):
        """Another process's holder (another store object: its own witnesses) with a floor."""
        lease = self.open().try_claim(worker_id, HOLDER, None)
        lease.floor_ms = floor_ms
        lease.extend(self.now_ms + 5_000)
        return lease


def test_a_file_round_promises_the_lowest_floor_of_the_holders(tmp_path):
    f = Files(tmp_path)
    holders = [f.hold(0, f.now_ms - 700), f.hold(1, f.now_ms - 300)]
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms - 700
    assert f.store.read_watermark() == f.now_ms - 700
    assert (f.store.watermark_low.worker_id, f.store.watermark_low.floor_ms) == (0, f.now_ms - 700)
    holders[0].release(f.now_ms)
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms - 300


def test_a_file_round_does_not_promise_past_a_holder_that_claimed_after_its_first_read(tmp_path, monkeypatch):
    f = Files(tmp_path)
    early = f.hold(0, f.now_ms - 100)
    late = []
    reads = f.store._region_floors

    def claim_between(region, path):
        out = reads(region, path)
        if not late:  # after the first read, before the record is raised: a claim with a low floor
            late.append(f.hold(1, f.now_ms - 5_000))
        return out

    monkeypatch.setattr(f.store, "_region_floors", claim_between)
    assert f.store.watermark_round(f.now_ms, 0) == 0  # its second read sees the late claim
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms - 5_000
    assert early.floor_ms == f.now_ms - 100


def test_a_claim_after_a_promise_starts_above_the_record(tmp_path):
    f = Files(tmp_path)
    promised = f.store.watermark_round(f.now_ms, 0)
    assert promised == f.now_ms  # no holder: the clock (one host, no skew)
    lease = f.open().try_claim(3, HOLDER, None)
    assert lease.watermark_ms == promised and lease.floor_ms >= promised
    published = orjson.loads((tmp_path / "regions" / "0" / "worker-3.floor").read_bytes())
    assert published["floor_ms"] >= promised


def test_a_holder_that_let_go_without_a_release_holds_the_watermark_until_its_reservation_passes(tmp_path):
    f = Files(tmp_path)
    lease = f.hold(0, f.now_ms - 1_000)
    reserved = lease.reserved_until_ms
    lease.abandon()  # a crash, or a stalled loop's give-up: no release
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms - 1_000
    f.clock.advance_ms(reserved - f.now_ms + 1)
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms


def test_a_released_holder_holds_nothing_back(tmp_path):
    f = Files(tmp_path)
    lease = f.hold(0, f.now_ms - 1_000)
    lease.release(f.now_ms - 1_000)
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms


def test_a_file_store_promises_nothing_before_it_has_outlived_its_window(tmp_path):
    clock = FakeClock()
    s = file_store(tmp_path, DEFAULT_LAYOUT, 0, wall_ns=clock.wall_ns)
    s.check_layout(DEFAULT_LAYOUT)
    now = clock.wall_ms - DEFAULT_LAYOUT.epoch_ms
    assert s.watermark_round(now, 0) == 0


def test_an_unreadable_record_is_refused_by_name_and_claims_wait_out_a_quarantine(tmp_path):
    f = Files(tmp_path)
    (tmp_path / "watermark").write_bytes(b"not a record")
    holder = f.hold(0, f.now_ms - 100)
    with pytest.raises(WatermarkRecordUnreadable, match="unreadable"):
        f.store.watermark_round(f.now_ms, 0)
    assert (tmp_path / "watermark").read_bytes() == b"not a record"  # changed nothing
    lease = f.open().try_claim(1, HOLDER, None)
    assert lease.watermark_ms >= f.now_ms + f.store.quarantine_ms()
    holder.release(f.now_ms)


@pytest.mark.parametrize("table", [True, False], ids=["kernel-table", "binding-each-name"])
def test_a_witnessed_holder_whose_files_are_gone_holds_the_watermark(tmp_path, monkeypatch, table):
    if not table:  # where the kernel's table of unix sockets cannot be read
        monkeypatch.setattr(FileStore, "_bound_names", staticmethod(lambda: None))
    f = Files(tmp_path)
    lease = f.hold(0, f.now_ms - 100)
    for name in ("worker-0.floor", "worker-0.mark"):
        (tmp_path / "regions" / "0" / name).unlink()
    assert f.store.watermark_round(f.now_ms, 0) == 0
    lease.abandon()  # the holder goes (its witnesses with it): nothing is left to wait for
    assert f.store.watermark_round(f.now_ms, 0) == f.now_ms


# -- a round of the etcd store --------------------------------------------------------------------


@pytest.fixture
def etcd():
    return Etcd()


def settled(etcd: Etcd) -> int:
    """The store's genesis long past its window; the wall clock the rounds read."""
    genesis = Genesis(etcd.genesis.layout, "ab" * 16, window_ms=5_000, legacy=True)
    etcd.put("layout", genesis.to_dict())
    return int(time.time() * 1000) - etcd.genesis.layout.epoch_ms


def test_an_etcd_round_promises_the_lowest_floor_and_a_later_claim_reads_the_record(etcd):
    now = settled(etcd)
    store = etcd.store()
    skew = store.config.max_clock_skew_ms
    a, b = claim(store, preferred=0), claim(store, preferred=1)
    a.floor_ms, b.floor_ms = now - skew - 900, now - skew - 400
    a.extend(now + 5_000)
    b.extend(now + 5_000)
    assert store.watermark_round(now, 0) == now - skew - 900
    assert etcd.value("watermark") == watermark.encode(now - skew - 900)
    c = claim(etcd.store(), preferred=2)
    assert c.watermark_ms == now - skew - 900
    a.release(now)
    assert store.watermark_round(now, 0) == 1  # c's floor: its claim's, until its first extension


def test_an_etcd_round_never_lowers_the_record_and_skips_a_claim_that_saw_it(etcd):
    now = settled(etcd)
    store = etcd.store()
    skew = store.config.max_clock_skew_ms
    etcd.server.put_key("/snowfence/unit/watermark", watermark.encode(now - skew - 100))
    late = claim(store, preferred=0)  # read the record: starts above it, whatever its claim's floor says
    assert late.watermark_ms == now - skew - 100 and late.floor_ms == 1
    assert store.watermark_round(now, 0) == 1  # its claim's floor is the candidate
    assert etcd.value("watermark") == watermark.encode(now - skew - 100)  # never lowered
    late.floor_ms = now - skew - 50
    late.extend(now + 5_000)
    assert store.watermark_round(now, 0) == now - skew - 50


def test_an_etcd_round_waits_for_a_lapsed_holder_until_its_reservation_passes(etcd):
    now = settled(etcd)
    store = etcd.store()
    gone = claim(store, preferred=0)
    gone.floor_ms = now - 2_000
    gone.extend(now + 3_000)
    etcd.delete("workers/1/0")  # its claim lapsed: cut off (minting through a partition) or crashed
    assert store.watermark_round(now, 0) == now - 2_000
    skew = store.config.max_clock_skew_ms
    assert store.watermark_round(now + 3_000 + skew + 1, 0) > now


def test_an_etcd_round_refuses_a_record_it_did_not_write_and_changes_nothing(etcd):
    now = settled(etcd)
    store = etcd.store()
    etcd.server.put_key("/snowfence/unit/watermark", b"{}")
    with pytest.raises(WatermarkRecordUnreadable):
        store.watermark_round(now, 0)
    assert etcd.value("watermark") == b"{}"
    fresh = claim(etcd.store(), preferred=1, now_ms=now)
    assert fresh.watermark_ms >= now + store.quarantine_ms() - 1_000


def test_an_etcd_round_does_not_promise_past_a_claim_made_after_its_first_read(etcd, monkeypatch):
    now = settled(etcd)
    store = etcd.store()
    skew = store.config.max_clock_skew_ms
    early = claim(store, preferred=0)
    early.floor_ms = now - skew - 100
    early.extend(now + 5_000)
    client = store.client
    transaction = client.transaction
    late = []

    def claim_after_the_first_read(*args, **kwargs):
        out = transaction(*args, **kwargs)
        if not late:  # the round's first read is done; a claim with a low floor comes before its raise
            late.append(claim(etcd.store(), preferred=1))
        return out

    monkeypatch.setattr(client, "transaction", claim_after_the_first_read)
    assert store.watermark_round(now, 0) == 0  # the raise's own read sees the late claim: no promise
    assert late[0].watermark_ms == 0  # it read no record: its claim came first
    assert store.watermark_round(now, 0) == 1  # its claim's floor


def test_with_a_wide_worker_field_a_round_reads_the_worker_ids_that_have_files(tmp_path):
    layout = Layout(time_bits=41, region_bits=3, worker_bits=13, sequence_bits=6)  # 8,192 worker IDs
    clock = FakeClock()

    def open_store():
        s = file_store(tmp_path, layout, 0, wall_ns=clock.wall_ns)
        s.check_layout(layout)
        return s

    store = open_store()
    clock.advance_ms(10_000)
    now = clock.wall_ms - layout.epoch_ms
    holder = open_store().try_claim(5_000, HOLDER, None)
    holder.floor_ms = now - 300
    holder.extend(now + 5_000)
    assert store.watermark_round(now, 0) == now - 300
    holder.release(now)
    assert store.watermark_round(now, 0) == now


def test_a_claim_after_the_state_directory_was_wiped_starts_above_what_its_journal_promised(tmp_path):
    from snowfence.store.journal import Journal

    clock = FakeClock()
    state, journals = tmp_path / "state", tmp_path / "journal-on-another-disk"

    def open_store():
        s = FileStore(state, DEFAULT_LAYOUT, 0, wall_ns=clock.wall_ns, journal=Journal(journals, "embedded"))
        s.check_layout(DEFAULT_LAYOUT)
        return s

    store = open_store()
    clock.advance_ms(10_000)
    now = clock.wall_ms - DEFAULT_LAYOUT.epoch_ms
    promised = store.watermark_round(now, 0)
    assert promised == now and Journal(journals, "embedded").watermark_ms == promised  # noted before answered
    import shutil

    shutil.rmtree(state)  # the record with it
    clock.step_ms(-30_000)  # and the clock set back further than any quarantine reaches
    again = FileStore(state, DEFAULT_LAYOUT, 0, wall_ns=clock.wall_ns, journal=Journal(journals, "embedded"))
    again.accept_restore("wiped by hand")  # the journal saw the store: an operator accepts its loss
    again.check_layout(DEFAULT_LAYOUT)
    lease = again.try_claim(0, HOLDER, None)
    assert lease.claimed_mark_ms < promised  # the mark alone would let it mint below the promise
    assert lease.watermark_ms == promised and lease.floor_ms >= promised


def test_the_pools_count_held_quarantined_and_free_worker_ids_from_the_marks_a_round_read():
    floors = [
        watermark.Floor(0, 0, 100, 500, held=True),
        watermark.Floor(0, 1, 100, 1001, held=False),  # let go, its reservation ahead of now: quarantined
        watermark.Floor(0, 2, 100, 1001, held=False, released=True),  # released, yet its mark ahead: quarantined
        watermark.Floor(0, 3, 100, 1000, held=False),  # its reservation not ahead of now: free again
        watermark.Floor(2, 5, None, 9999, held=True),
    ]
    assert watermark.pools(floors, 1000, 8, regions=(0, 1)) == {
        0: {"held": 1, "quarantined": 2, "free": 5},
        1: {"held": 0, "quarantined": 0, "free": 8},
        2: {"held": 1, "quarantined": 0, "free": 7},
    }
