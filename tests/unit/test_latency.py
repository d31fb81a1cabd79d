"""Request latency histograms: their buckets, and the broker's totals over the
reports of worker processes that come and go; the worker IDs it counts by state."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from snowfence import latency, protocol
from snowfence.broker.metrics import Metrics, _Collector


def test_bounds_span_ten_microseconds_to_ten_seconds_evenly_per_decade():
    bounds = latency.BOUNDS_NS
    assert bounds[0] == 10_000 and bounds[-1] == 10_000_000_000
    assert list(bounds) == sorted(set(bounds))
    assert all(bounds[i + 3] == 10 * bounds[i] for i in range(len(bounds) - 3))


@pytest.mark.parametrize(
    "ns, bucket",
    [(0, 0), (10_000, 0), (10_001, 1), (25_000, 1), (999_999, 6), (1_000_000, 6), (10**10, 18), (10**10 + 1, 19)],
)
def test_a_duration_counts_in_the_first_bucket_whose_bound_is_at_or_above_it(ns, bucket):
    h = latency.Durations()
    h.observe(ns)
    assert h.counts[bucket] == 1 and h.count == 1 and h.sum_ns == ns


def test_buckets_are_cumulative_in_seconds_with_inf_last():
    h = latency.Durations()
    for ns in (5_000, 20_000, 20_000, 3 * 10**10):
        h.observe(ns)
    buckets = dict(h.buckets())
    assert buckets["1e-05"] == 1 and buckets["2.5e-05"] == 3 and buckets["10"] == 3 and buckets["+Inf"] == 4
    assert list(buckets) == [*(f"{b / 1e9:g}" for b in latency.BOUNDS_NS), "+Inf"]


def report(**kinds: latency.Durations) -> dict:
    return {"le": list(latency.BOUNDS_NS), "kinds": {k: h.to_dict() for k, h in kinds.items()}}


def state(mint_ns: dict) -> protocol.WorkerState:
    return protocol.decode_state(protocol.encode_state(protocol.WorkerState(mint_ns=mint_ns)))


def test_the_broker_adds_up_each_workers_increments_across_restarts():
    m = Metrics()
    a = latency.Durations()
    a.observe(1_000)
    m.observe(b"w0-1", state(report(reserve=a)))
    a.observe(2_000_000)
    m.observe(b"w0-1", state(report(reserve=a)))
    m.observe(b"w0-1", state(report(reserve=a)))  # a heartbeat with nothing new
    m.forget(b"w0-1")
    restarted = latency.Durations()  # the slot's next process starts from zero
    restarted.observe(30_000)
    m.observe(b"w0-2", state(report(reserve=restarted, reserve_after=restarted)))
    plain, after = m.mint_ns
    assert plain.count == 3 and plain.counts[0] == 1 and plain.counts[2] == 1 and plain.counts[7] == 1
    assert plain.sum_ns == 1_000 + 2_000_000 + 30_000
    assert after.count == 1 and after.sum_ns == 30_000


def test_a_report_with_other_bounds_or_an_unknown_kind_adds_nothing():
    m = Metrics()
    other = {"le": [1, 2], "kinds": {"reserve": {"counts": [5, 0, 0], "sum_ns": 5}}}
    m.observe(b"w0", state(other))
    h = latency.Durations()
    h.observe(5)
    m.observe(b"w1", state(report(batch=h)))
    assert all(total.count == 0 and total.sum_ns == 0 for total in m.mint_ns)


class FakeRouter:
    """What Metrics reads of the routing core."""

    def __init__(self) -> None:
        self.counters = {k: 0 for k in ("bad_request", "refused", "unavailable", "overloaded", "retried")}
        self.queued_ns = latency.by_kind()
        self.links, self.rotation, self.fair = {}, [], []
        self.accepting, self.veto = True, None

    def active_connections(self) -> int:
        return 0

    def readiness(self) -> tuple[bool, str]:
        return False, "no worker"


def scrape(m: Metrics) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(m))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_both_histograms_are_exported_for_every_kind_even_before_any_request():
    m, router = Metrics(), FakeRouter()
    router.queued_ns[1].observe(40_000)
    m.maybe_snapshot(0, router, restarts=0)
    samples = scrape(m)
    for name in ("snowfence_request_queued_seconds", "snowfence_request_mint_seconds"):
        for kind in latency.KINDS:
            assert (f"{name}_count", (("kind", kind),)) in samples
    assert samples[("snowfence_request_queued_seconds_count", (("kind", "reserve_after"),))] == 1
    assert samples[("snowfence_request_queued_seconds_sum", (("kind", "reserve_after"),))] == pytest.approx(40e-6)
    assert samples[("snowfence_request_queued_seconds_bucket", (("kind", "reserve_after"), ("le", "5e-05")))] == 1
    assert samples[("snowfence_request_queued_seconds_bucket", (("kind", "reserve_after"), ("le", "2.5e-05")))] == 0


def test_a_reported_histogram_is_a_copy_so_the_broker_sees_what_its_own_minter_gained():
    # The broker's own worker ID is described in-process, not through JSON: a report
    # that shared the live list would make every later increase look like none.
    from snowfence.clock import StepBacks
    from snowfence.config import Config

    metrics = Metrics(Config())
    hist = latency.by_kind()
    steps = StepBacks()
    for round_ in (1, 2):
        for _ in range(5):
            hist[0].observe(30_000)
        steps.record(3)
        metrics.observe(b"inline", protocol.WorkerState(mint_ns=latency.report(hist), step_back_ms=steps.to_dict()))
        assert metrics.mint_ns[0].count == 5 * round_
        assert sum(metrics.step_back_counts) == round_


def test_the_broker_s_own_worker_id_counts_with_the_workers_by_state_and_by_its_lease():
    from types import SimpleNamespace

    m, router = Metrics(), FakeRouter()
    worker = protocol.WorkerState(
        state="fenced", held=(protocol.HeldState(worker_id=0, state="fenced", renewed_ago_s=2.5),)
    )
    router.links = {b"w0": SimpleNamespace(slot=0, silent=False, status=worker)}
    m.own = protocol.WorkerState(
        slot=-1, state="fenced", held=(protocol.HeldState(worker_id=7, state="fenced", renewed_ago_s=3.0),)
    )
    m.maybe_snapshot(0, router, restarts=0)
    samples = scrape(m)
    assert samples[("snowfence_worker_ids", (("state", "fenced"),))] == 2
    assert samples[("snowfence_lease_renewal_age_seconds", (("worker_id", "7"),))] == 3.0
    # Holding none, as when it gave its own back to workers: nothing counted for it.
    m.own = protocol.WorkerState(slot=-1, state="claiming")
    m.maybe_snapshot(10**10, router, restarts=0)
    samples = scrape(m)
    assert samples[("snowfence_worker_ids", (("state", "fenced"),))] == 1
    assert samples[("snowfence_worker_ids", (("state", "claiming"),))] == 0
