"""Healing and sharing, in pieces: the keeper gives up a worker ID whose minting
loop stalled, the default worker count follows the CPUs this process may use,
and clients honour the retry-after hint of ``overloaded``."""

from __future__ import annotations

import pytest
from fakeclock import FakeClock

from snowfence import protocol
from snowfence.clients.core import Core, ReserveJob, apply_reply
from snowfence.config import Config, cgroup_cpu_quota, usable_cpus
from snowfence.errors import Fenced, LeaseLost, Overloaded
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.base import Lease

# -- the keeper watches the minting loop ----------------------------------------------


class CountingLease(Lease):
    def __init__(self, expires: bool) -> None:
        super().__init__(region=0, worker_id=3, token=1, mark_ms=0)
        self.expires = expires
        self.refreshes = 0
        self.abandoned = 0

    def refresh(self) -> None:
        self.refreshes += 1

    def extend(self, until_ms: int) -> None:
        self.reserved_until_ms = until_ms

    def abandon(self) -> None:
        self.abandoned += 1
        super().abandon()


def keeper_with_loop(expires: bool, loop_idle_s: float):
    clock = FakeClock()
    lease = CountingLease(expires)
    minter = clock.minter(DEFAULT_LAYOUT, 0, 3)
    events = []
    loop_ns = clock.mono_ns() - int(loop_idle_s * 1e9)
    keeper = clock.keeper(
        lease, minter, on_event=lambda name, fields: events.append(name), loop_ns=lambda: loop_ns, stall_s=5.0
    )
    return clock, lease, minter, keeper, events


@pytest.mark.parametrize("expires", [True, False], ids=["etcd lease", "file lock"])
def test_a_stalled_minting_loop_makes_the_keeper_fence_and_stop_renewing(expires):
    clock, lease, minter, keeper, events = keeper_with_loop(expires, loop_idle_s=6.0)
    minter.start_after(0)
    keeper.run()  # returns at once: it gives up before renewing
    assert lease.refreshes == 0
    assert isinstance(keeper.lost, LeaseLost) and keeper.stalled
    assert "loop" in str(keeper.lost)
    assert events == ["loop_stalled"]
    with pytest.raises(Fenced):
        minter.reserve(1)
    # A file lock frees only when the process lets go; an etcd lease lapses on its own.
    assert lease.abandoned == (0 if expires else 1)


def test_a_loop_that_turns_keeps_its_worker_id():
    clock, lease, minter, keeper, events = keeper_with_loop(False, loop_idle_s=4.9)
    assert keeper.loop_stalled_s() is None
    keeper.renew_once()
    assert lease.refreshes == 1 and keeper.lost is None and not keeper.stalled


def test_a_keeper_paused_with_its_whole_process_gives_the_loop_a_turn_before_judging_it():
    clock, lease, minter, keeper, events = keeper_with_loop(False, loop_idle_s=30.0)
    assert keeper.loop_stalled_s() == pytest.approx(30.0)
    keeper._sleep(0)  # it meant to be away for no time...
    clock.advance_ms(30_000)  # ...and 30 s went by before it looked again: SIGSTOP, a VM freeze
    assert keeper.loop_stalled_s() is None
    # At its next look it judges again: the loop has had its chance.
    assert keeper.loop_stalled_s() == pytest.approx(60.0)


def test_without_a_loop_to_watch_the_keeper_never_gives_up_for_it():
    clock = FakeClock()
    lease = CountingLease(False)
    minter = clock.minter(DEFAULT_LAYOUT, 0, 3)
    keeper = clock.keeper(lease, minter)
    assert keeper.loop_stalled_s() is None


# -- one worker per usable CPU -----------------------------------------------------------


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_caps_the_cpus_and_the_tightest_ancestor_wins(tmp_path):
    write(tmp_path / "self-cgroup", "0::/kubepods/pod1/ctr\n")
    write(tmp_path / "cg/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    write(tmp_path / "cg/kubepods/pod1/cpu.max", "150000 100000\n")
    write(tmp_path / "cg/kubepods/cpu.max", "400000 100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "cg"), str(tmp_path / "self-cgroup")) == pytest.approx(1.5)
    assert usable_cpus(str(tmp_path / "cg"), str(tmp_path / "self-cgroup")) <= 2


def test_a_cgroup_v1_cfs_quota_caps_the_cpus(tmp_path):
    write(tmp_path / "self-cgroup", "4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n")
    write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n")
    write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "cg"), str(tmp_path / "self-cgroup")) == pytest.approx(0.5)
    assert usable_cpus(str(tmp_path / "cg"), str(tmp_path / "self-cgroup")) == 1  # never below one


def test_no_quota_or_unreadable_files_mean_no_cap(tmp_path):
    write(tmp_path / "self-cgroup", "0::/\n4:cpu:/\n")
    write(tmp_path / "cg/cpu.max", "max 100000\n")
    write(tmp_path / "cg/cpu/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cg/cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "cg"), str(tmp_path / "self-cgroup")) is None
    assert cgroup_cpu_quota(str(tmp_path / "nothing"), str(tmp_path / "nothing")) is None
    write(tmp_path / "bad/cpu.max", "garbage\n")
    assert cgroup_cpu_quota(str(tmp_path / "bad"), str(tmp_path / "self-cgroup")) is None


def test_the_default_worker_count_is_the_usable_cpus():
    import os

    assert Config().worker_count == usable_cpus() <= len(os.sched_getaffinity(0))
    assert Config(workers=3).worker_count == 3


# -- clients honour retry-after ---------------------------------------------------------


def overloaded_reply(retry_after_ms):
    err = Overloaded("more than 4 requests in flight on this connection")
    err.retry_after_ms = retry_after_ms
    return err


def test_the_hint_survives_the_wire_and_a_bad_hint_is_ignored():
    body = protocol.encode_error(7, overloaded_reply(250))
    assert protocol.decode_reply(body).error.retry_after_ms == 250
    for bad in (b'"soon"', b"-1", b"true", b"99999999"):
        raw = protocol.HEADER.pack(1, protocol.ERROR, 0, 7) + (
            b'{"code":"overloaded","message":"x","retriable":true,"retry_after_ms":' + bad + b"}"
        )
        assert protocol.decode_reply(raw).error.retry_after_ms is None


def test_a_job_waits_as_long_as_the_server_says_and_shrinks_its_window_without_using_retries():
    core = Core()
    job = ReserveJob(40 * 4096, window=32, retries=1)
    pendings = [core.reserve(c, 10**18, job)[0] for c in job.to_send()]
    assert job.inflight == 32
    for p in pendings[4:7]:
        reply = protocol.Reply(protocol.ERROR, p.request_id, error=overloaded_reply(250))
        assert apply_reply(job, p, reply) == pytest.approx(0.25)
    assert job.attempts == 0  # the server holds our other requests: progress will come
    assert job.window == 29 and job.unasked == 8 * 4096 + 3 * 4096


def test_overloaded_with_nothing_of_ours_in_flight_uses_up_retries():
    core = Core()
    job = ReserveJob(4096, window=1, retries=1)
    for _ in range(2):
        [count] = job.to_send()
        p = core.reserve(count, 10**18, job)[0]
        reply = protocol.Reply(protocol.ERROR, p.request_id, error=overloaded_reply(None))
        if job.attempts < 1:
            assert apply_reply(job, p, reply) > 0  # no hint: the client's own back-off
        else:
            with pytest.raises(Overloaded):
                apply_reply(job, p, reply)
