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


def bitset(values: Iterable[bytes], size: int) -> bytes:
    """The split-block filter of `size` bytes (whole blocks) holding each of the values."""
    hashes = np.unique(np.fromiter((xxhash.xxh64_intdigest(v) for v in values), np.uint64))
    blocks = size // BLOCK_BYTES
    words = np.zeros((blocks, len(SALT)), np.uint32)
    # the block: the hash's high half scaled to the blocks; its low half picks a bit per word
    block = ((hashes >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)
    key = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    bits = (key[:, None] * SALT[None, :]) >> np.uint32(27)  # wraps mod 2^32, as specified
    np.bitwise_or.at(words, block.astype(np.intp), np.uint32(1) << bits)
    return words.astype("<u4").tobytes()
