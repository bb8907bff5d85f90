"""A Parquet page's payload held to what decoding consumes (paths._check_payload): a compressed
page's codec consumes exactly its stored bytes and produces exactly its header's size, and a
page's levels and values end at its end. Arrow stops decoding a page once it has the values its
header counts and ignores what follows, so a page grown over other bytes (a row group the
footer left out) would make them look accounted for: a byte is accounted for only when a
decoder consumed it."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import zstandard

# Parquet's codecs as pyarrow names them; LZ4 (Hadoop's framing or none), ZSTD, GZIP and
# BROTLI are read apart, each held to its stream's end.
_PAGE_CODECS = {"SNAPPY": "snappy", "LZ4_RAW": "lz4_raw"}
# gzip's header flags naming an extra field, a name or a comment: bytes a decoder skips
_GZIP_SKIPPED = 0b11100

# Parquet's Encoding enum
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY, BYTE_STREAM_SPLIT = 0, 2, 3, 8, 9
# Encodings decoded here to their end; the others (DELTA_*) only by their codec's end.
DECODED_ENCODINGS = frozenset((PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY, BYTE_STREAM_SPLIT))


def decompressed(data: bytes, codec: str, size: int) -> bytes:
    """A page's stored bytes decompressed to its header's size, the codec's stream ending at
    the data's end (ValueError if not: trailing bytes, a zstd skippable frame, a gzip header's
    skipped fields, a second stream)."""
    try:
        if codec == "UNCOMPRESSED":
            out = data
        elif codec == "LZ4":
            framed = _lz4_hadoop(data, size)
            out = pa.decompress(data, size, "lz4_raw", asbytes=True) if framed is None else framed
        elif codec == "ZSTD":
            out = zstandard.ZstdDecompressor().decompress(
                data, max_output_size=size, allow_extra_data=False
            )
        elif codec == "GZIP":
            out = _gzip(data, size)
        elif codec == "BROTLI":
            out = _brotli(data, size)
        elif codec in _PAGE_CODECS:  # each fails on bytes past its stream
            out = pa.decompress(data, size, _PAGE_CODECS[codec], asbytes=True)
        else:
            raise ValueError(f"pages compressed as {codec} cannot be read")
    except (pa.ArrowException, OSError, zstandard.ZstdError, zlib.error) as err:
        raise ValueError(f"a page does not decompress: {err}") from None
    if len(out) != size:
        raise ValueError(f"a page decompresses to {len(out)} bytes, not its header's {size}")
    return out


def _gzip(data: bytes, size: int) -> bytes:
    """One gzip (or zlib) stream, ending at the data's end, no header field a decoder skips."""
    if data[:2] == b"\x1f\x8b" and len(data) > 3 and data[3] & _GZIP_SKIPPED:
        raise ValueError("a gzip page whose header holds skipped fields")
    stream = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib, by its header
    out = stream.decompress(data, size + 1)
    if not stream.eof or stream.unused_data or stream.unconsumed_tail:
        raise ValueError("a gzip page whose stream does not end at its end")
    return out


def _brotli(data: bytes, size: int) -> bytes:
    """A brotli stream ending at the data's end: pyarrow's decoder stops at the stream's end,
    so the data less its last byte must not decode (the stream needs that byte)."""
    out = pa.decompress(data, size, "brotli", asbytes=True)
    try:
        pa.decompress(data[:-1], size, "brotli", asbytes=True)
    except (pa.ArrowException, OSError):
        return out
    raise ValueError("a brotli page whose stream ends before its end")


def _lz4_hadoop(data: bytes, size: int) -> bytes | None:
    """LZ4 blocks in Hadoop's framing (each block's decompressed and compressed sizes, 4 bytes
    big-endian, before it), as Arrow reads them first; None when the data is not so framed
    (Arrow then reads it as one raw block)."""
    out, at, produced = [], 0, 0
    while len(data) - at >= 8:
        expected = int.from_bytes(data[at : at + 4], "big")
        stored = int.from_bytes(data[at + 4 : at + 8], "big")
        at += 8
        if stored > len(data) - at or expected > size - produced:
            return None
        try:
            out.append(pa.decompress(data[at : at + stored], expected, "lz4_raw", asbytes=True))
        except (pa.ArrowException, OSError):
            return None
        at += stored
        produced += expected
    return b"".join(out) if at == len(data) else None


# Bit-packed values unpacked at once (a multiple of 8: whole groups; a run may claim any).
_SLICE = 1 << 16
# Groups a page's last bit-packed run may hold past its values: DuckDB packs its values 256 at
# a time (32 groups), the last block's unused groups left as they were (earlier values), and
# polars leaves its last group's padding bits unset; a decoder reads neither. What a page can
# hold past its values so is bounded: 31 groups of its width, 124 bytes at most.
_LAST_RUN_GROUPS = 32


def hybrid_end(
    data: bytes, at: int, width: int, count: int, target: int = -1, named: np.ndarray | None = None
) -> tuple[int, int]:
    """Where `count` values of the RLE / bit-packed hybrid, `width` bits each, starting at `at`,
    end, and how many of them equal `target`; given `named` (one flag a dictionary entry),
    each value's flag is set. ValueError when the data ends first, a run holds none (a run
    must move on) or holds bytes no decoder reads: a decoder stops at the last value, so only
    the last run passes it, by fewer groups than a writer's block of 256 values
    (_LAST_RUN_GROUPS), and an RLE run's value fits its width."""
    position = found = 0
    value_bytes = (width + 7) // 8
    packed: list[bytes] = []  # bit-packed bytes not yet unpacked, and the values they hold
    pending = 0
    while position < count:
        header, at = varint(data, at)
        if header & 1:  # bit-packed: groups of 8 values
            groups, owed = header >> 1, count - position
            levels, stored = groups * 8, groups * width
            if groups > max(-(-owed // 8), _LAST_RUN_GROUPS):
                raise ValueError("a page's bit-packed run claims groups past its values")
            if at + stored > len(data):
                raise ValueError("a page's values end inside a bit-packed run")
            taken = min(levels, owed)
            for first in range(0, taken if target >= 0 or named is not None else 0, _SLICE):
                values = min(_SLICE, taken - first)  # whole groups but for the last one's
                packed.append(
                    data[at + first // 8 * width : at + -(-(first + values) // 8) * width]
                )
                pending += values
                if pending >= _SLICE:
                    found += _tally(b"".join(packed), width, pending, target, named)
                    packed, pending = [], 0
        else:  # RLE: one value, `levels` times
            levels, stored = header >> 1, value_bytes
            if at + stored > len(data):
                raise ValueError("a page's values end inside a run")
            value = int.from_bytes(data[at : at + stored], "little")
            if value >> width:
                raise ValueError("a page's run holds a value wider than its bit width")
            if value == target:
                found += min(levels, count - position)
            if named is not None and value < len(named) and levels:
                named[value] = True
        if not levels:
            raise ValueError("a page's values hold an empty run")
        position += levels
        at += stored
    if pending:
        found += _tally(b"".join(packed), width, pending, target, named)
    return at, found


def _tally(packed: bytes, width: int, count: int, target: int, named: np.ndarray | None) -> int:
    """How many of the first `count` values bit-packed in `packed` equal `target`; given
    `named`, the flag of each value within it set (a value past it names no entry)."""
    values = unpacked(packed, width)[:count] if width else np.zeros(count, dtype=np.int64)
    if named is not None:
        named[values[values < len(named)]] = True
    return int((values == target).sum()) if target >= 0 else 0


def unpacked(packed: bytes, width: int) -> np.ndarray:
    """Values bit-packed `width` bits each, least significant bit first (Parquet's order)."""
    bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), bitorder="little")
    if width == 1:
        return bits
    return bits.reshape(-1, width) @ (1 << np.arange(width, dtype=np.int64))


def varint(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 integer at `at`, and where the data goes on."""
    value = shift = 0
    while shift < 64 and at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError("a page holds a damaged run header")


def values_end(
    data: bytes,
    at: int,
    encoding: int,
    width: int | None,
    count: int,
    named: np.ndarray | None = None,
) -> int:
    """Where `count` values from `at`, so encoded (one of DECODED_ENCODINGS), end: width is a
    fixed-width type's bytes (0 for BOOLEAN, bit-packed when PLAIN), None for BYTE_ARRAY;
    dictionary indices set the flags in `named` of the entries they name (hybrid_end)."""
    if encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY):  # indices: their bit width, then runs
        if at >= len(data) or data[at] > 32:
            raise ValueError("a page's dictionary indices have no valid bit width")
        return hybrid_end(data, at + 1, data[at], count, named=named)[0] if count else at + 1
    if encoding == RLE:  # booleans: their length, then runs of 1 bit
        stored = int.from_bytes(data[at : at + 4], "little")
        if hybrid_end(data[: at + 4 + stored], at + 4, 1, count)[0] != at + 4 + stored:
            raise ValueError("a page's booleans do not end at their length")
        return at + 4 + stored
    if width == 0:  # PLAIN booleans: a bit each
        return at + -(-count // 8)
    if width is not None:  # PLAIN or BYTE_STREAM_SPLIT: the type's bytes each
        return at + width * count
    if encoding != PLAIN:
        raise ValueError(f"byte arrays stored as encoding {encoding}")
    ends = byte_array_ends(data, at, count)
    return ends[-1] if ends else at


def byte_array_ends(data: bytes, at: int, count: int) -> list[int]:
    """Where each of `count` PLAIN byte arrays from `at` (each its length, then its bytes) ends."""
    ends, size, length = [], len(data), _LENGTH.unpack_from  # no slice a value: ~2x faster
    for _ in range(count):
        if at + 4 > size:
            raise ValueError("a page's byte arrays end inside a length")
        at += 4 + length(data, at)[0]
        ends.append(at)
    return ends


_LENGTH = struct.Struct("<I")  # a PLAIN byte array's length
