"""Statistics from histograms (transforms/stats/histograms.py): the same digits however the
values are split into shards and merged, in whatever order, which is what makes the local and
the Beam engine's reports byte-identical; numpy's numbers where numpy rounds correctly."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.stats.histograms import describe_histogram, histogram, merge
from kvtrace.transforms.stats.trace_stats import describe

# Hit rates are j/n, lengths integers: the values the reports describe.
RATES = st.lists(
    st.builds(lambda j, n: min(j, n) / n, st.integers(0, 40), st.integers(1, 40)),
    min_size=1,
    max_size=200,
)
LENGTHS = st.lists(st.integers(0, 1 << 40), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(
    values=st.one_of(RATES, LENGTHS),
    cuts=st.lists(st.integers(0, 200), max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_shards_merged_in_any_order_give_the_whole_traces_digits(values, cuts, seed):
    shuffled = np.random.default_rng(seed).permutation(np.array(values))
    parts = np.split(shuffled, sorted(c % (len(values) + 1) for c in cuts))
    merged = merge(histogram(part) for part in parts[::-1])
    assert describe_histogram(merged) == describe(np.array(values))


@settings(max_examples=200, deadline=None)
@given(values=RATES)
def test_the_mean_and_std_are_the_exact_ones_rounded_once(values):
    exact_mean = sum(map(Fraction, values)) / len(values)
    described = describe(np.array(values))
    assert described["mean"] == float(exact_mean)
    exact_variance = sum((Fraction(v) - exact_mean) ** 2 for v in values) / len(values)
    assert math.isclose(
        described["std_dev"] ** 2, float(exact_variance), rel_tol=1e-15, abs_tol=1e-300
    )


@settings(max_examples=200, deadline=None)
@given(values=st.one_of(RATES, LENGTHS))
def test_quartiles_are_numpys(values):
    described = describe(np.array(values))
    quartiles = np.percentile(np.array(values, dtype=np.float64), [25, 50, 75]).tolist()
    assert [described["p25"], described["median"], described["p75"]] == quartiles


def test_a_mean_of_hit_rates_is_the_same_in_either_order():
    rates = np.array([0.0, 0.5, 0.6, 0.75, 0.8, 0.75])
    assert (
        describe(rates)["mean"]
        == describe(rates[::-1])["mean"]
        == float(sum(map(Fraction, rates.tolist())) / len(rates))
    )
