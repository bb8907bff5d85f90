"""Exact summary statistics from value histograms, so that distributed partial results merge.

A histogram maps each distinct value to its count. Trace metrics take few distinct values
(integer lengths; hit rates j/n with small n), so histograms stay small where the rows are many,
and the quartiles come out exact, as numpy's linear interpolation computes them; the mean and
std are exact, rounded once. trace_stats.describe goes through a histogram too, so both engines
compute every statistic from the same numbers in the same way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal, localcontext
from fractions import Fraction

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
    """mean, population std, min, p25, median, p75, max, as numpy gives them of the values, the
    mean and std correctly rounded (exact_moments): the same digits however the values were
    spread over shards and merged, and numpy's own wherever its sums round correctly."""
    n = sum(counts.values())
    if n == 0:
        return dict.fromkeys(STAT_NAMES, 0.0)
    values = sorted(counts)
    mean, std = exact_moments(counts, n)
    cumulative = np.cumsum([counts[v] for v in values])

    def at(index: int) -> float:  # the index-th smallest value, 0-based
        return float(values[int(np.searchsorted(cumulative, index, side="right"))])

    def percentile(p: float) -> float:  # numpy's linear method, its interpolation included
        k = (n - 1) * p
        low, high = math.floor(k), math.ceil(k)
        below, above, t = at(low), at(high), k - low
        return above - (above - below) * (1 - t) if t >= 0.5 else below + (above - below) * t

    return {
        "mean": mean,
        "std_dev": std,
        "min": float(values[0]),
        "p25": percentile(0.25),
        "median": percentile(0.5),
        "p75": percentile(0.75),
        "max": float(values[-1]),
    }


def exact_moments(counts: Counter, n: int) -> tuple[float, float]:
    """The mean and population std of the values, computed exactly and rounded once: no order
    of summation to depend on. Floats are dyadic rationals, so over a common power-of-two
    denominator every value is an integer and the sums are Python integers."""
    exact = [(v.as_integer_ratio(), c) for v, c in counts.items()]  # Python ints and floats
    scale = max(q for (_, q), _ in exact)
    scaled = [(p * (scale // q), c) for (p, q), c in exact]
    total = sum(v * c for v, c in scaled)
    spread = n * sum(v * v * c for v, c in scaled) - total * total  # n^2 scale^2 variance
    with localcontext() as context:
        context.prec = 60  # far past a double's 17 digits: the one rounding is float()'s
        std = (Decimal(spread) / Decimal(n * n * scale * scale)).sqrt()
    return float(Fraction(total, n * scale)), float(std)
