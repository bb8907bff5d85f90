"""The Bloom filter of each id map segment: what lets a night skip the map's row groups."""

from __future__ import annotations

import numpy as np

from kvtrace.transforms.ids import bloom


def keys(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False),
        rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False),
    )


def test_no_false_negatives_and_few_false_positives():
    hi, lo = keys(50_000, 1)
    packed = bloom.build(hi, lo, bloom.bloom_bits(len(hi)))
    assert bloom.may_contain(packed, hi, lo).all()
    other_hi, other_lo = keys(200_000, 2)
    # Sized for ~0.05%: each false positive costs a row-group read.
    assert bloom.may_contain(packed, other_hi, other_lo).mean() < 0.002


def test_an_empty_filter_contains_nothing():
    hi, lo = keys(1000, 4)
    empty = bloom.build(hi[:0], lo[:0], bloom.bloom_bits(0))
    assert not bloom.may_contain(empty, hi, lo).any()
