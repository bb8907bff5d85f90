"""Exact summary statistics from value histograms, so that distributed partial results merge.

A histogram maps each distinct value to its count. Trace metrics take few distinct values
(integer lengths; hit rates j/n with small n), so histograms stay small where the rows are many,
and the quartiles come out exact, as numpy's linear interpolation computes them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

STAT_NAMES = ("mean", "std_dev", "min", "p25", "median", "p75", "max")


def histogram(values: np.ndarray) -> Counter:
    distinct, counts = np.unique(values, return_counts=True)
    return Counter(dict(zip(distinct.tolist(), counts.tolist())))


def merge(histograms: Iterable[Counter]) -> Counter:
    total: Counter = Counter()
    for h in histograms:
        total.update(h)
    return total


def describe_histogram(counts: Counter) -> dict[str, float]:
    """mean, population std, min, p25, median, p75, max, as trace_stats.describe gives them."""
    n = sum(counts.values())
    if n == 0:
        return dict.fromkeys(STAT_NAMES, 0.0)
    values = sorted(counts)
    mean = math.fsum(v * counts[v] for v in values) / n
    variance = math.fsum(counts[v] * (v - mean) ** 2 for v in values) / n
    cumulative = np.cumsum([counts[v] for v in values])

    def at(index: int) -> float:  # the index-th smallest value, 0-based
        return float(values[int(np.searchsorted(cumulative, index, side="right"))])

    def percentile(p: float) -> float:
        k = (n - 1) * p
        low, high = math.floor(k), math.ceil(k)
        return at(low) + (at(high) - at(low)) * (k - low)

    return {"mean": mean, "std_dev": math.sqrt(variance), "min": float(values[0]),
            "p25": percentile(0.25), "median": percentile(0.5), "p75": percentile(0.75),
            "max": float(values[-1])}
