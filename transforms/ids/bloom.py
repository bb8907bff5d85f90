"""A Bloom filter over keyed 128-bit hashes, vectorised in numpy.

Each id map segment file carries one (segments.py): a night probes it with its own keys and
reads only the row groups a possible key falls in, so what a night reads grows with the night
and not with the map. A false positive costs a row-group read (~24 KB), so the filter is sized
for a low rate: 16 bits per key and 11 probes give ~0.045% (2 bytes per map row, 1/12 of it).
Filters are packed, 8 bits per byte, and sized exactly (in 64-bit words, not powers of two).
"""

from __future__ import annotations

import numpy as np

BITS_PER_KEY = 16
PROBES = 11  # the textbook optimum k = 0.7 m/n


def bloom_bits(count: int) -> int:
    """Filter size for count keys: BITS_PER_KEY bits per key, in whole 64-bit words (a power of
    two would waste up to half of the index read every night)."""
    return max(64, -(-count * BITS_PER_KEY // 64) * 64)


def _position(hi: np.ndarray, lo: np.ndarray, probe: int, bits: int) -> np.ndarray:
    """Probe number probe's bit by double hashing: the keys are uniform keyed hashes, so their
    halves serve as the two hash functions. uint64 arithmetic wraps on purpose."""
    return (hi + np.uint64(probe) * (lo | np.uint64(1))) % np.uint64(bits)


def build(hi: np.ndarray, lo: np.ndarray, bits: int) -> np.ndarray:
    """The filter of the keys (hi, lo), packed 8 bits per byte (bit i is byte i // 8's bit
    i % 8): never a byte per bit."""
    packed = np.zeros(bits // 8, dtype=np.uint8)
    add(packed, hi, lo)
    return packed


def add(packed: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> None:
    """Set the keys' bits in a packed filter, in place (a filter built in parts)."""
    bits = len(packed) * 8
    for probe in range(PROBES):
        position = _position(hi, lo, probe, bits)
        np.bitwise_or.at(
            packed,
            position >> np.uint64(3),
            np.left_shift(1, position & np.uint64(7)).astype(np.uint8),
        )


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
