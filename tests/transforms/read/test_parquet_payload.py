"""A Parquet page's payload held to what decoding consumes (parquet_payload, paths._check_payload)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import parquet_footer, thrift_decode, thrift_encode, thrift_field, with_parquet_footer
from kvtrace.transforms.read.parquet_payload import decompressed, hybrid_end, values_end
from kvtrace.transforms.read.paths import parquet_file

DATA = bytes(range(200)) + b"a" * 3000
# a zstd skippable frame: its magic, its size, bytes every decoder skips
SKIPPABLE = bytes.fromhex("502a4d18") + (8).to_bytes(4, "little") + b"hidden!!"


@pytest.mark.parametrize("codec", ["SNAPPY", "ZSTD", "GZIP", "BROTLI", "LZ4_RAW"])
@pytest.mark.parametrize("tail", [b"\0", b"xyz" * 10, SKIPPABLE])
def test_a_codec_must_consume_exactly_the_pages_bytes(codec, tail):
    """Bytes past a codec's stream (pyarrow's zstd skips a skippable frame, its brotli stops at
    the stream's end and ignores the rest) are no part of the page."""
    stored = pa.compress(DATA, codec.lower(), asbytes=True)
    assert decompressed(stored, codec, len(DATA)) == DATA
    with pytest.raises(ValueError, match="decompress|stream"):
        decompressed(stored + tail, codec, len(DATA))


def test_a_gzip_header_holding_skipped_fields_is_refused():
    import gzip

    stored = bytearray(gzip.compress(DATA))
    stored[3] |= 0b1000  # FNAME: a name follows the header, which decoders skip
    stored[10:10] = b"hidden row group\0"
    with pytest.raises(ValueError, match="skipped fields"):
        decompressed(bytes(stored), "GZIP", len(DATA))


def test_runs_of_the_hybrid_end_where_their_values_do_and_count_a_value():
    # an RLE run of 5 ones (header 5 << 1), a bit-packed group of 8 (header 1 << 1 | 1)
    data = bytes([10, 1, 3, 0b10110001])
    assert hybrid_end(data, 0, 1, 13, 1) == (4, 5 + 4)
    with pytest.raises(ValueError, match="empty run"):
        hybrid_end(bytes([0, 1]), 0, 1, 1)
    with pytest.raises(ValueError, match="inside a bit-packed run"):
        hybrid_end(bytes([3]), 0, 1, 8)


def test_a_bit_packed_run_passes_its_values_by_less_than_a_writers_block():
    """Red team round 16: a run claiming groups past its values held bytes no decoder reads.
    DuckDB packs 256 values (32 groups) a run, the last past the page's values: so far, no
    further."""
    stale = bytes([0b11111101]) + b"\xff" * 31  # 3 values (1, 0, 1), then earlier ones
    assert hybrid_end(bytes([32 << 1 | 1]) + stale, 0, 1, 3, 1) == (33, 2)
    with pytest.raises(ValueError, match="groups past its values"):
        hybrid_end(bytes([33 << 1 | 1]) + bytes(33), 0, 1, 3)
    # a group, then a run of 33 groups for the 9 values left
    with pytest.raises(ValueError, match="groups past its values"):
        hybrid_end(bytes([1 << 1 | 1, 0, 33 << 1 | 1]) + bytes(33), 0, 1, 8 + 9)
    with pytest.raises(ValueError, match="wider than its bit width"):
        hybrid_end(bytes([3 << 1, 2]), 0, 1, 3)  # an RLE run of 2, one bit wide


def test_dictionary_indices_end_after_every_run():
    # width 3: an RLE run of 2 fives, a bit-packed group of 0, 1, 1, 2 and padding (4 values)
    packed = (0 | 1 << 3 | 1 << 6 | 2 << 9).to_bytes(3, "little")
    data = bytes([3, 2 << 1, 5, 1 << 1 | 1]) + packed
    assert values_end(data, 0, 8, None, 6) == len(data)
    with pytest.raises(ValueError, match="end inside a bit-packed run"):
        values_end(data[:-1], 0, 8, None, 6)


def test_values_end_where_their_encoding_says():
    strings = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"", b"cde"))
    assert values_end(strings, 0, 0, None, 3) == len(strings)
    assert values_end(b"\0" * 24, 0, 0, 8, 3) == 24
    assert values_end(b"\0", 0, 0, 0, 7) == 1  # booleans, a bit each
    assert values_end(bytes([1, 6, 1]), 0, 8, 4, 3) == 3  # indices: width 1, RLE run of 3


def _one_group_listed(**options) -> tuple[list, bytes, int]:
    """Six rows of `n` in two row groups, the footer listing the first alone: the footer, the
    body, and where row group 0's one data page's header starts."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(6))}), buffer, 3, use_dictionary=False, **options)
    footer, body = parquet_footer(buffer.getvalue())
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
    return footer, body, pq.ParquetFile(buffer).metadata.row_group(0).column(0).data_page_offset


def _opened(tmp_path, footer: list, body: bytes) -> list:
    path = tmp_path / "t.parquet"
    path.write_bytes(with_parquet_footer(body, footer))
    stray: list = []
    with parquet_file(str(path), 1 << 20, stray=stray):
        pass
    return stray


def test_an_uncompressed_page_grown_over_a_row_group_is_refused(tmp_path):
    """Red team round 15 (d): a row group left out of the footer, its pages after row group
    0's one uncompressed data page, whose header (and its chunk's size) is grown over them.
    The page walk tiles and Arrow stops at the values the header counts: the bytes past them
    were counted as read."""
    footer, body, at = _one_group_listed(compression="none")
    assert _opened(tmp_path, footer, body)  # as cut: row group 1's bytes are stray
    header, end = thrift_decode(body, at)
    hidden = len(body) - end - thrift_field(header, 3)[2]
    for field in (2, 3):  # uncompressed, compressed page size
        thrift_field(header, field)[2] += hidden
    grown = thrift_encode(header)
    body = body[:at] + grown + body[end:]
    metadata = thrift_field(thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0], 3)[2]
    for field in (6, 7):  # the chunk's total sizes
        thrift_field(metadata, field)[2] += hidden + len(grown) - (end - at)
    with pytest.raises(ValueError, match="a page of n holds other than its values' bytes"):
        _opened(tmp_path, footer, body)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_delta_page_is_read_only_when_its_codec_bounds_it(tmp_path, compression):
    """DELTA_* values are not decoded here to their end: compressed, the codec's end holds
    the page; uncompressed (no common writer's default), nothing does: refused."""
    buffer = io.BytesIO()
    table = pa.table({"n": list(range(6))})
    options = {"column_encoding": {"n": "DELTA_BINARY_PACKED"}, "compression": compression}
    pq.write_table(table, buffer, use_dictionary=False, **options)
    path = tmp_path / "t.parquet"
    path.write_bytes(buffer.getvalue())
    if compression == "zstd":
        with parquet_file(str(path), 1 << 20):
            pass
    else:
        with pytest.raises(ValueError, match="uncompressed page of n in encoding 5, not read"):
            with parquet_file(str(path), 1 << 20):
                pass


def test_dictionary_entries_no_row_names_are_accepted(tmp_path):
    """pyarrow writes a dictionary array's entries whole, named or not (so do categoricals of
    pandas and fastparquet, and polars' enums): an entry no index names is the file's own
    data, not stray bytes (the residual: docs/BOUNDS.md)."""
    entries = pa.array(["a", "b", "no row names me"])
    column = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), entries)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": column}), path, compression="none")
    stray: list = []
    with parquet_file(str(path), 1 << 20, stray=stray) as (_, parquet):
        assert parquet.read().column("k").to_pylist() == ["a", "b", "a"]
    assert stray == []
