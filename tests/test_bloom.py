"""The Bloom filter that keeps a night's join with the id map night-sized."""

from __future__ import annotations

import numpy as np
from transforms.ids import bloom


def keys(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False),
            rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False))


def test_no_false_negatives_and_few_false_positives():
    hi, lo = keys(50_000, 1)
    packed = bloom.build(hi, lo, bloom.bloom_bits(len(hi)))
    assert bloom.may_contain(packed, hi, lo).all()
    other_hi, other_lo = keys(200_000, 2)
    assert bloom.may_contain(packed, other_hi, other_lo).mean() < 0.01


def test_union_of_parts_equals_the_filter_of_all():
    hi, lo = keys(10_000, 3)
    bits = bloom.bloom_bits(len(hi))
    parts = bloom.union(bloom.build(hi[:3000], lo[:3000], bits), bloom.build(hi[3000:], lo[3000:], bits))
    assert np.array_equal(parts, bloom.build(hi, lo, bits))


def test_an_empty_filter_contains_nothing():
    hi, lo = keys(1000, 4)
    empty = bloom.build(hi[:0], lo[:0], bloom.bloom_bits(0))
    assert not bloom.may_contain(empty, hi, lo).any()
