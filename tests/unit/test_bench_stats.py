"""bench/stats.py: the one statistics module of the benchmarks (percentiles, summaries, spreads)."""

from __future__ import annotations

import math

import pytest

from bench import stats


def test_percentile_is_nearest_rank_a_measured_value():
    values = list(range(1, 1001))  # 1..1000
    assert stats.percentile(values, 50) == 500
    assert stats.percentile(values, 99) == 990
    assert stats.percentile(values, 99.9) == 999  # not 1000: 99.9 / 100 * 1000 is 999.0000000000001
    assert stats.percentile(values, 100) == 1000
    assert stats.percentile([7.0], 99.9) == 7.0
    assert stats.percentile(iter([3.0, 1.0, 2.0]), 50) == 2.0  # any iterable, unsorted
    assert math.isnan(stats.percentile([], 50))


def test_percentile_interpolated_is_linear_between_closest_ranks():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(values, 50, interpolate=True) == 3.0
    assert stats.percentile(values, 99, interpolate=True) == pytest.approx(4.96)
    assert stats.percentile(values, 0, interpolate=True) == 1.0
    assert stats.percentile(values, 100, interpolate=True) == 5.0
    assert stats.percentile([7.0], 99, interpolate=True) == 7.0
    assert math.isnan(stats.percentile([], 50, interpolate=True))


@pytest.mark.parametrize("q", [-1, 100.5, 0.99 * 1000])
def test_percentile_refuses_a_q_outside_0_to_100(q):
    with pytest.raises(ValueError, match="q must be in"):
        stats.percentile([1.0], q)


def test_latency_summary_keeps_the_unit():
    summary = stats.latency_summary([float(v) for v in range(1, 1001)])
    assert summary == {"p50": 500.0, "p99": 990.0, "p99.9": 999.0, "max": 1000.0}
    assert all(math.isnan(v) for v in stats.latency_summary([]).values())


def test_summary_by_either_method_and_none_when_empty():
    assert stats.summary([1.0, 2.0, 3.0], interpolate=True) == {
        "n": 3,
        "p50": 2.0,
        "p99": pytest.approx(2.98),
        "max": 3.0,
        "mean": 2.0,
    }
    assert stats.summary([1.0, 2.0, 3.0])["p99"] == 3.0  # nearest rank
    assert stats.summary([]) == {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}


def test_spread_and_median_min_max_leave_out_missing_values():
    assert stats.spread([3.0, 1.0, 2.0, None, math.nan]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert stats.spread([])["n"] == 0 and math.isnan(stats.spread([])["median"])
    assert stats.median_min_max([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert stats.median_min_max([None]) == {"median": None, "min": None, "max": None}


def test_ratio_is_none_without_both_figures_or_with_a_zero_divisor():
    assert stats.ratio(1.05, 1.0) == pytest.approx(1.05)
    assert stats.ratio(1.0, 0.0) is None and stats.ratio(None, 1.0) is None and stats.ratio(1.0, None) is None
