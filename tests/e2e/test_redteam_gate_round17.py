"""Red team round 17, the gate (nothing private published, nothing lost): reproducers of what
the Parquet reader still lets through after round 16 closed every page and bloom filter
header. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from helpers import (
    CLEAN_CHAT_MS,
    chat,
    parquet_footer,
    parquet_night,
    read_jsonl,
    thrift_decode,
    thrift_encode,
    thrift_field,
    trace,
)

pytestmark = pytest.mark.slow


def _lost_none(out: Path) -> bool:
    """Every chat of the night exported, or the damaged file letter-ed."""
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    return published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


@pytest.mark.xfail(strict=True, reason="red team round 17")
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    rows = [{**chat(i, 1_000 * i), "zz": 7} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, 3, write_page_index=True)
    data = buffer.getvalue()
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1)
    chunks = [group.column(c) for c in range(group.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
    start = min(starts)
    hidden = data[start : max(s + c.total_compressed_size for s, c in zip(starts, chunks))]
    footer, _ = parquet_footer(data)
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
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
