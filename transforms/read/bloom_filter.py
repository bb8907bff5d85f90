"""Parquet's split-block bloom filter rebuilt from a column chunk's values, as the format
defines it: each value's xxhash64 (seed 0) of its PLAIN encoding sets one bit in each of the
eight 32-bit words of one 32-byte block. A filter read from a file is accounted for only when
it is this rebuild, bit for bit (paths._chunk_extras): any other bitset holds bytes no reader
consumes for what they are."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import xxhash

BLOCK_BYTES = 32
# the format's eight odd constants, one per word of a block
SALT = np.array(
    [
        0x47B6137B,
        0x44974D91,
        0x8824AD5B,
        0xA2B7289D,
        0x705495C7,
        0x2DF1424B,
        0x9EFC4947,
        0x5C6BFB31,
    ],
    dtype=np.uint32,
)


def plain_values(data: bytes, at: int, count: int, width: int | None) -> Iterator[bytes]:
    """The `count` PLAIN values from `at` of a (decompressed) page, each as its bytes: `width`
    each, or (width None: BYTE_ARRAY) each after its 4-byte length; ValueError when they run
    past the data."""
    for _ in range(count):
        size = width
        if size is None:
            size, at = int.from_bytes(data[at : at + 4], "little"), at + 4
        if at + size > len(data):
            raise ValueError("a page's values run past its end")
        yield data[at : at + size]
        at += size


_P1, _P2, _P3, _P4, _P5 = (
    np.uint64(p)
    for p in (
        0x9E3779B185EBCA87,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x85EBCA77C2B2AE63,
        0x27D4EB2F165667C5,
    )
)
_SHORT = 32  # xxhash64 takes inputs shorter than this in one pass


def plain_hashes(data: bytes, at: int, count: int, width: int | None) -> np.ndarray:
    """The xxhash64 of each of `count` PLAIN values from `at` (plain_values), as uint64: values
    of one width under 32 bytes (numbers, timestamps) hashed together by numpy, the same
    steps xxhash64 takes on each (a Python call a value costs ~1 us: 0.4 s for 400,000)."""
    if width is None or width >= _SHORT:
        return np.fromiter(
            (xxhash.xxh64_intdigest(v) for v in plain_values(data, at, count, width)), np.uint64
        )
    if at + width * count > len(data):
        raise ValueError("a page's values run past its end")
    rows = np.frombuffer(data, np.uint8, width * count, at).reshape(count, width)
    with np.errstate(over="ignore"):
        h = np.full(count, _P5 + np.uint64(width), np.uint64)
        taken = 0
        for taken in range(0, width - 7, 8):
            lane = _words(rows[:, taken : taken + 8], np.uint64)
            h ^= _rotl(lane * _P2, 31) * _P1
            h = _rotl(h, 27) * _P1 + _P4
        taken = width - width % 8
        if width % 8 >= 4:
            h ^= _words(rows[:, taken : taken + 4], np.uint32).astype(np.uint64) * _P1
            h = _rotl(h, 23) * _P2 + _P3
            taken += 4
        for byte in range(taken, width):
            h ^= rows[:, byte].astype(np.uint64) * _P5
            h = _rotl(h, 11) * _P1
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def _words(columns: np.ndarray, kind: type) -> np.ndarray:
    """Each row's bytes as one little-endian word."""
    return np.ascontiguousarray(columns).view(np.dtype(kind).newbyteorder("<")).ravel()


def _rotl(value: np.ndarray, bits: int) -> np.ndarray:
    return (value << np.uint64(bits)) | (value >> np.uint64(64 - bits))


def bitset(hashes: Iterable[np.ndarray], size: int) -> bytes:
    """The split-block filter of `size` bytes (whole blocks) holding each of the values whose
    hashes (plain_hashes) are given."""
    hashes = np.concatenate([np.zeros(0, np.uint64), *hashes])  # a value set twice: one bit
    blocks = size // BLOCK_BYTES
    # the block: the hash's high half scaled to the blocks; its low half picks a bit per word
    block = ((hashes >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)
    key = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    bits = (key[:, None] * SALT[None, :]) >> np.uint32(27)  # wraps mod 2^32, as specified
    # little-endian words: bit b of word w of block k is the bitset's bit (8 k + w) 32 + b
    words = block[:, None] * np.uint64(len(SALT)) + np.arange(len(SALT), dtype=np.uint64)
    at = (words * np.uint64(32) + bits).ravel()
    filled = np.zeros(size, np.uint8)
    bit = np.uint8(1) << (at & np.uint64(7)).astype(np.uint8)
    np.bitwise_or.at(filled, (at >> np.uint64(3)).astype(np.intp), bit)
    return filled.tobytes()
