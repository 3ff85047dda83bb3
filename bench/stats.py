"""The statistics every benchmark reports, in one place: percentiles, summaries, spreads, ratios.

Two percentile methods, both on the raw values (no binning):

* nearest rank (the default): the smallest value with at least q% of the values at or below it,
  always one of the measured values. Latencies are reported this way (a p99 that was measured).
* linear (``interpolate=True``): between the two closest ranks, numpy's default "linear" method.
  bench/scale.py reports the scheduler's figures this way, as Prometheus' histogram_quantile
  interpolates inside a bucket.

Empty input gives NaN from `percentile` and `spread` (JSON writers turn NaN into null:
bench.common.write_json) and None from `summary` and `median_min_max`, whose callers write JSON
nulls directly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float, *, interpolate: bool = False) -> float:
    """The q-th percentile of `values` (q in [0, 100], same unit as the values); NaN for no values.

    Nearest rank unless `interpolate`: then linear between the closest ranks. Raises ValueError
    for q outside [0, 100].
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    if interpolate:
        pos = q / 100 * (len(ordered) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    rank = max(1, math.ceil(round(q / 100 * len(ordered), 9)))  # round: 99.9 / 100 * 1000 is 999.0000000000001
    return ordered[rank - 1]


def latency_summary(latencies: Sequence[float]) -> dict[str, float]:
    """{"p50", "p99", "p99.9", "max"} of latencies (any unit, kept), nearest rank; NaN when empty."""
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "p99.9": percentile(latencies, 99.9),
        "max": max(latencies) if latencies else math.nan,
    }


def summary(values: Iterable[float], *, interpolate: bool = False) -> dict[str, float | int | None]:
    """{"n", "p50", "p99", "max", "mean"} of `values` (same unit; None for each figure when empty)."""
    vals = list(values)
    if not vals:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {
        "n": len(vals),
        "p50": percentile(vals, 50, interpolate=interpolate),
        "p99": percentile(vals, 99, interpolate=interpolate),
        "max": max(vals),
        "mean": statistics.fmean(vals),
    }


def spread(values: Iterable[float | None]) -> dict[str, float]:
    """{"median", "min", "max", "n"} of repeated measurements, None and NaN left out (empty: NaNs, n 0)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def median_min_max(values: Iterable[float | None]) -> dict[str, float | None]:
    """`spread` without n and with None instead of NaN (for reports that write JSON nulls)."""
    s = spread(values)
    if not s["n"]:
        return {"median": None, "min": None, "max": None}
    return {"median": s["median"], "min": s["min"], "max": s["max"]}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b
