from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import parquet_footer, thrift_decode, thrift_field
from kvtrace.transforms.read.bloom_filter import bitset, plain_hashes, plain_values


@pytest.mark.parametrize(
    ("values", "kind"),
    [([f"prompt {i}" for i in range(300)], pa.string()), (list(range(-50, 250)), pa.int64())],
    ids=["byte-array", "int64"],
)
def test_the_rebuilt_filter_is_the_one_arrow_writes(values, kind):
    """The split-block filter rebuilt from a chunk's PLAIN values is, bit for bit, the bitset
    Arrow wrote for them."""
    buffer = io.BytesIO()
    table = pa.table({"v": pa.array(values, kind)})
    pq.write_table(table, buffer, bloom_filter_options={"v": {"ndv": 300}})
    data = buffer.getvalue()
    footer, _ = parquet_footer(data)
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0]
    offset = thrift_field(thrift_field(chunk, 3)[2], 14)[2]
    header, start = thrift_decode(data, offset)
    size = thrift_field(header, 1)[2]
    if kind == pa.string():
        width, plain = None, [len(v).to_bytes(4, "little") + v.encode() for v in values]
    else:
        width, plain = 8, [value.to_bytes(8, "little", signed=True) for value in values]
    hashes = plain_hashes(b"".join(plain), 0, len(plain), width)
    assert bitset([hashes], size) == data[start : start + size]
    assert bitset([hashes[1:]], size) != data[start : start + size]


def test_values_of_one_width_hash_as_xxhash64_hashes_each():
    """The vectorized hash of fixed-width values is xxhash64's, at every width it covers and
    past it."""
    import xxhash

    data = bytes(range(256)) * 40
    for width in range(1, 40):
        expected = [
            xxhash.xxh64_intdigest(data[3 + i * width : 3 + (i + 1) * width]) for i in range(50)
        ]
        assert plain_hashes(data, 3, 50, width).tolist() == expected


def test_plain_values_are_split_by_width_or_length_and_held_to_the_data():
    strings = b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
    assert list(plain_values(strings, 0, 2, None)) == [b"a", b"bc"]
    assert list(plain_values(b"\x01\x02\x03\x04", 0, 2, 2)) == [b"\x01\x02", b"\x03\x04"]
    with pytest.raises(ValueError, match="run past"):
        list(plain_values(strings, 0, 3, None))
