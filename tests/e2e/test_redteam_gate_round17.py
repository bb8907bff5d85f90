"""Red team round 17, the gate (nothing private published, nothing lost): reproducers of what
the Parquet reader still lets through after round 16 closed every page and bloom filter
header. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from helpers import (
    CLEAN_CHAT_MS,
    anonymize,
    chat,
    parquet_footer,
    parquet_night,
    read_jsonl,
    thrift_decode,
    thrift_encode,
    thrift_field,
    trace,
    write_jsonl,
)

pytestmark = pytest.mark.slow


def _six_chats(page_index: bool = False) -> tuple[bytes, list, int, bytes]:
    """Six chats (at 0, 1000, ... ms, each with an integer column `zz` last) in two row groups
    of three, as pyarrow writes them (page_index: with its page indexes, after the groups);
    the footer decoded with row group 1 left out of its list; where row group 1's pages start
    (row group 0's `zz` chunk ends there) and their bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    rows = [{**chat(i, 1_000 * i), "zz": 7} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, 3, write_page_index=page_index)
    data = buffer.getvalue()
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1)
    chunks = [group.column(c) for c in range(group.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
    start = min(starts)
    end = max(s + c.total_compressed_size for s, c in zip(starts, chunks))
    footer, _ = parquet_footer(data)
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
    return data, footer, start, data[start:end]


def _lost_none(out: Path) -> bool:
    """Every chat of the night exported, or the damaged file letter-ed."""
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    return published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


def test_a_row_group_inside_a_column_indexs_level_histogram_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """Nothing lost. Round 16 reads page and bloom filter headers with a closed reader, but a
    column index is read by the open one (paths._IndexReader) and _check_column_index holds
    its level histograms (ColumnIndex fields 6 and 7) only to be lists of integers, of any
    length and element type: a list<i8> carries its bytes verbatim. Six chats in two row
    groups of three (pyarrow, page index on); the footer lists row group 0 alone, row group
    1's pages moved, byte for byte, into a repetition_level_histograms list<i8> of row group
    0's `zz` chunk's column index (the chunk's only index), which is counted as accounted
    for: exit 0, no letter, three chats gone. A histogram must be the one the chunk's levels
    give (max level + 1 counts a page, each page's walked levels counted), i64s only."""
    data, footer, start, hidden = _six_chats(page_index=True)
    body = data[:start]  # row group 0's pages; the page indexes came after row group 1
    for chunk in thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1]:
        index_at = thrift_field(chunk, 6)[2]
        chunk[:] = [field for field in chunk if field[0] not in (4, 5, 6, 7)]  # no page index
        if thrift_field(thrift_field(chunk, 3)[2], 3)[2][1] == [b"zz"]:
            index, _ = thrift_decode(data, index_at)
            index = sorted([*index, [6, 9, (3, list(hidden))]], key=lambda field: field[0])
            encoded = thrift_encode(index)
            chunk += [[6, 6, len(body)], [7, 5, len(encoded)]]
            body += encoded
    assert hidden in body
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


@pytest.mark.parametrize("carrier", ["an unknown field", "its statistics"])
def test_a_row_group_inside_a_metadata_copy_behind_a_chunk_loses_none_silently(
    tiny_tokenizer, tmp_path, carrier
):
    """Nothing lost. Round 16 accounts for a gap behind a chunk's pages by a copy of the chunk's
    footer entry or metadata (paths._stray_gap: polars and parquet-cpp 1.x write one), byte for
    byte as the footer encodes it, and refuses only a copy whose metadata carries key-value
    metadata (_copied: "a copy would double what they carry"). Any other string the footer's
    ColumnMetaData carries unread is doubled into the body just the same: a field the format
    does not define (the footer's reader skips it), or its statistics' max_value and min_value
    (BOUNDS.md: the footer's statistics are read, never held to the values). Six chats in two
    row groups of three; row group 1's pages put, byte for byte, into such a string of row
    group 0's `zz` chunk's metadata, a copy of that metadata behind the chunk's pages, the
    footer listing row group 0 alone: exit 0, no letter, three chats gone. A copy must hold no
    string a decoder skips: read closed (no field the format does not define), its path its
    column's, its statistics' strings bytes the chunk's pages hold (as a page's are)."""
    data, footer, start, hidden = _six_chats()
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][-1]
    metadata = thrift_field(chunk, 3)[2]
    assert thrift_field(metadata, 3)[2][1] == [b"zz"]  # the chunk just before row group 1
    if carrier == "an unknown field":
        metadata.append([30, 8, hidden])
    else:
        statistics = thrift_field(metadata, 12)[2]
        statistics[:] = [f for f in statistics if f[0] not in (5, 6)]
        statistics += [[5, 8, hidden], [6, 8, hidden]]
        statistics.sort(key=lambda field: field[0])
    metadata.sort(key=lambda field: field[0])
    body = data[:start] + thrift_encode(metadata)  # the copy, as the footer encodes it
    assert hidden in body
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


def test_a_page_over_the_ceiling_refuses_its_row_group_not_the_file(tiny_tokenizer, tmp_path):
    """Nothing lost to a letter that should not be (BOUNDS.md, "Parquet page": a page over 2 x
    the bound makes its row group one `too_large` letter, unread, and the other groups are
    read). Round 16 holds a page's statistics to its values, but a chunk over the ceiling is
    not decompressed (_ChunkValues.holds: each statistic only as long as its page at most),
    and a dictionary-encoded data page is a few bytes of indices while its statistics are
    whole values: the pyarrow file of nine chats in three row groups, unedited (statistics on,
    as pyarrow's default), one chat's prompt 73 KB under --max-record-bytes 8KiB, is one
    `damaged_file` letter, its eight readable chats rejected with it. Without statistics the
    same file gives row group 1's `too_large` letter and the other six chats."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [chat(i, 1_000 * i) for i in range(9)]
    rows[4]["messages"][-1]["content"] = " ".join(f"w{i}" for i in range(12_000))
    source = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source, 3)
    clean = tmp_path / "clean.jsonl"
    write_jsonl(clean, [chat(6, CLEAN_CHAT_MS)])
    out = tmp_path / "out"
    # the group weighs nearly all the bytes: its letter is the subject here, not the guard
    bound = ("--max-record-bytes", "8KiB", "--max-rejected-fraction", "1")
    assert anonymize(tiny_tokenizer, [source, clean], out, *bound, "--quiet") == 0
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    assert [record["error"] for path in letters for record in read_jsonl(path)] == ["too_large"]
    published = sorted(row["timestamp"] for row in trace(out))
    assert published == [0, 1_000, 2_000, 6_000, 7_000, 8_000, CLEAN_CHAT_MS]
