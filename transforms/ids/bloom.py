"""A Bloom filter over keyed 128-bit hashes, vectorised in numpy.

A night meets the id map in a join per hash shard; without a filter every row of the map would
be shuffled to that join, so a night's cost would grow with the map. Tonight's hashes as one
Bloom filter per hash shard (side inputs of ~1.2 bytes per hash in all, each sized for its own
shard) let the streaming pass over the map drop, before the shuffle, every row tonight cannot
use but ~1% of them. Filters are built packed: a 10^9-key night needs 1.25 GB of filters, not
the 10 GB an unpacked bit per byte would take.
"""

from __future__ import annotations

import numpy as np

# 10 bits per key and 7 probes give ~0.8% false positives (the textbook optimum k = 0.7 m/n).
BITS_PER_KEY = 10
PROBES = 7


def bloom_bits(count: int) -> int:
    """Filter size for count keys: a power of two (a mask, not a division, finds a bit), at
    least BITS_PER_KEY bits per key."""
    return 1 << max(6, (count * BITS_PER_KEY - 1).bit_length())


def _position(hi: np.ndarray, lo: np.ndarray, probe: int, bits: int) -> np.ndarray:
    """Probe number probe's bit by double hashing: the keys are uniform keyed hashes, so their
    halves serve as the two hash functions. uint64 arithmetic wraps on purpose."""
    return (hi + np.uint64(probe) * (lo | np.uint64(1))) & np.uint64(bits - 1)


def build(hi: np.ndarray, lo: np.ndarray, bits: int) -> np.ndarray:
    """The filter of the keys (hi, lo), packed 8 bits per byte (bit i is byte i // 8's bit
    i % 8), set in place: never a byte per bit."""
    packed = np.zeros(bits // 8, dtype=np.uint8)
    for probe in range(PROBES):
        position = _position(hi, lo, probe, bits)
        np.bitwise_or.at(packed, position >> np.uint64(3),
                         np.left_shift(1, position & np.uint64(7)).astype(np.uint8))
    return packed


def union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_or(a, b)


def may_contain(packed: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """False for keys certainly not in the filter; True for keys in it (and a few others).

    Probes run one at a time on the keys still possible: about half the filter's bits are set,
    so each probe halves the work of the next."""
    bits = len(packed) * 8
    candidates = np.arange(len(hi))
    for probe in range(PROBES):
        position = _position(hi[candidates], lo[candidates], probe, bits)
        byte = packed[position >> np.uint64(3)]
        candidates = candidates[(byte >> (position & np.uint64(7)).astype(np.uint8)) & 1 == 1]
    possible = np.zeros(len(hi), dtype=bool)
    possible[candidates] = True
    return possible
