"""The pure helpers of bench/scale.py: quantiles, Prometheus parsing, pacing, aggregation (no cluster)."""

from __future__ import annotations

import math

import pytest

from bench import scale

SCRAPE = """\
# HELP scheduler_pod_scheduling_sli_duration_seconds [BETA] E2e latency for a pod being scheduled
# TYPE scheduler_pod_scheduling_sli_duration_seconds histogram
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.01"} 8
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.02"} 50
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.04"} 88
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="+Inf"} 90
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="1"} 1.5
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="1"} 90
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.01"} 2
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.02"} 10
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.04"} 10
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="+Inf"} 10
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="2"} 0.5
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="2"} 10
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 100
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 7
scheduler_schedule_attempts_total{profile="other",result="scheduled"} 1
weird_metric{path="a \\"quoted\\" b"} 1e3 1700000000000
not a sample line
"""


def test_histogram_quantile_interpolates_inside_the_bucket():
    buckets = {0.01: 10, 0.02: 60, 0.04: 100, math.inf: 100}
    # rank 50 falls in (0.01, 0.02] holding 50 observations, 40 of them below the rank
    assert scale.histogram_quantile(0.5, buckets) == pytest.approx(0.018)
    # rank 99 in (0.02, 0.04]: 0.02 + 0.02 * 39/40
    assert scale.histogram_quantile(0.99, buckets) == pytest.approx(0.0395)
    # the first bucket's lower bound is 0
    assert scale.histogram_quantile(0.05, buckets) == pytest.approx(0.005)
    assert scale.histogram_quantile(1.0, buckets) == pytest.approx(0.04)


def test_histogram_quantile_in_the_inf_bucket_returns_the_highest_finite_bound():
    assert scale.histogram_quantile(0.99, {0.01: 50, 0.02: 90, math.inf: 100}) == 0.02


def test_histogram_quantile_skips_empty_buckets_and_handles_no_data():
    # no observation in (0.01, 0.02]: rank 50 lands in (0.02, 0.04], interpolated from 0.02
    assert scale.histogram_quantile(0.5, {0.01: 0, 0.02: 0, 0.04: 100, math.inf: 100}) == pytest.approx(0.03)
    assert scale.histogram_quantile(0.99, {0.01: 0, math.inf: 0}) is None
    assert scale.histogram_quantile(0.99, {}) is None
    with pytest.raises(ValueError):
        scale.histogram_quantile(99, {0.01: 1, math.inf: 1})


def test_parse_prometheus_and_histogram_sum_over_labels():
    samples = scale.parse_prometheus(SCRAPE)
    assert ("weird_metric", {"path": 'a "quoted" b'}, 1000.0) in samples
    h = scale.histogram(samples, scale.SLI_METRIC)
    assert h == {"buckets": {0.01: 10.0, 0.02: 60.0, 0.04: 98.0, math.inf: 100.0}, "sum": 2.0, "count": 100.0}
    assert scale.histogram(samples, "absent_metric") == {"buckets": {}, "sum": 0.0, "count": 0.0}
    assert scale.counter_by(samples, scale.ATTEMPTS_METRIC, "result") == {"scheduled": 101.0, "unschedulable": 7.0}


def test_histogram_delta_and_quantile_of_the_delta():
    before = {"buckets": {0.01: 5.0, 0.02: 5.0, math.inf: 5.0}, "sum": 0.02, "count": 5.0}
    after = {"buckets": {0.01: 15.0, 0.02: 105.0, math.inf: 105.0}, "sum": 1.52, "count": 105.0}
    delta = scale.histogram_delta(after, before)
    assert delta["buckets"] == {0.01: 10.0, 0.02: 100.0, math.inf: 100.0}
    assert delta["count"] == 100.0 and delta["sum"] == pytest.approx(1.5)
    assert scale.histogram_quantile(0.99, delta["buckets"]) == pytest.approx(0.01 + 0.01 * 89 / 90)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_pacer_keeps_an_absolute_schedule():
    clock = FakeClock()
    pacer = scale.Pacer(10.0, clock=clock, sleep=clock.sleep)
    assert pacer.wait() == 0.0 and clock.sleeps == []  # the first call goes at once
    clock.now += 0.03  # the call took 30 ms: sleep the remaining 70 ms, not 100 ms
    assert pacer.wait() == 0.0
    assert clock.sleeps == [pytest.approx(0.07)] and clock.now == pytest.approx(100.1)
    clock.now += 0.25  # a slow call: the next one is 150 ms late and goes at once ...
    assert pacer.wait() == pytest.approx(0.15)
    assert len(clock.sleeps) == 1
    assert pacer.wait() == pytest.approx(0.05)  # ... and the one after catches up without drifting
    assert pacer.wait() == 0.0 and clock.now == pytest.approx(100.4)
    assert pacer.calls == 5 and pacer.due(10) == pytest.approx(101.0)
    with pytest.raises(ValueError):
        scale.Pacer(0)


def test_aggregate_pairs_runs_by_repeat():
    def run(rep, with_guard, p99):
        return {
            "repeat": rep,
            "with_guard": with_guard,
            "scheduler_sli": {"p99": p99, "p50": p99 / 2, "mean": p99 / 3},
            "workload_seconds": 200.0,
        }

    runs = [
        run(0, False, 0.04),
        run(0, True, 0.042),
        run(1, True, 0.05),
        run(1, False, 0.04),
        {"repeat": 2, "with_guard": False, "error": "boom"},
    ]
    out = scale.aggregate(runs)
    assert out["without"]["runs"] == 2 and out["with"]["runs"] == 2
    assert out["with"]["scheduler_sli_p99_s"] == {"median": pytest.approx(0.046), "min": 0.042, "max": 0.05}
    assert out["ratio_with_over_without"]["scheduler_sli_p99_s"] == pytest.approx(0.046 / 0.04)
    assert out["sli_p99_ratio_per_repeat"] == [pytest.approx(1.05), pytest.approx(1.25)]
    assert out["without"]["create_to_bound_p99_s"]["median"] is None  # missing figures stay None


def test_tracker_startup_times():
    tracker = scale.Tracker()
    tracker.creating("p1", 10.0)
    tracker.created("p1", 0.02)
    pod = {"metadata": {"name": "p1"}, "spec": {}}
    tracker.on_pod("ADDED", pod, 10.01)
    claim = {"metadata": {"name": "p1-gpu-x", "ownerReferences": [{"kind": "Pod", "name": "p1"}]}, "status": {}}
    tracker.on_claim("ADDED", claim, 10.1)
    tracker.on_claim("MODIFIED", {**claim, "status": {"allocation": {"devices": {}}}}, 10.3)
    tracker.on_pod("MODIFIED", {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"}}, 10.4)
    tracker.on_pod("MODIFIED", {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"}}, 11.0)  # first bind counts
    out = tracker.startup()
    assert out["create_to_bound"]["max"] == pytest.approx(0.4)
    assert out["create_to_claim_created"]["p50"] == pytest.approx(0.1)
    assert out["create_to_claim_allocated"]["p99"] == pytest.approx(0.3)
    assert out["create_request"]["n"] == 1
    assert tracker.pods["p1"]["node"] == "n1"
    tracker.on_pod("DELETED", {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"}}, 12.0)
    assert tracker.wait_until(lambda: "deleted" in tracker.pods["p1"], timeout=0.1)


def test_workload_pod_and_slice_shapes():
    pod = scale.workload_pod("churn-00-001", "churn", 0)
    assert pod["metadata"]["labels"] == {"app": "scale", "kind": "churn", "round": "0"}
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]
    rs = scale.resource_slice("n1")
    assert len(rs["spec"]["devices"]) == scale.DEVICES_PER_NODE and rs["spec"]["nodeName"] == "n1"
    ds = scale.driver_ds()
    assert ds["metadata"]["namespace"] == "dra-system" and ds["spec"]["template"]["spec"]["serviceAccountName"] == "driver"
