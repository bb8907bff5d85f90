"""Red team round 15, the gate (nothing private published, nothing lost): reproducers of what
the Parquet readers still let through after round 14 made the footer account for the body
(paths._stray_bytes). Each asserts the promised behaviour, so each fails until it is fixed."""

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
    thrift_field,
    trace,
)

pytestmark = pytest.mark.slow


def _six_chats_in_two_groups(**extra: int) -> tuple[list, bytes, tuple[int, int]]:
    """Six chats (at 0, 1000, ... ms, each with the extra columns) in two row groups of three:
    the footer, decoded, with row group 1 left out of its list (and num_rows 3, as the list
    now gives it); the bytes before it; and the bytes [start, end) row group 1's pages hold,
    which nothing the footer lists names as a column chunk any more."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(
        pa.Table.from_pylist([{**chat(i, 1_000 * i), **extra} for i in range(6)]), buffer, 3
    )
    data = buffer.getvalue()
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1)
    chunks = [group.column(c) for c in range(group.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
    ends = [start + c.total_compressed_size for start, c in zip(starts, chunks)]
    footer, body = parquet_footer(data)
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
    return footer, body, (min(starts), max(ends))


def _last_chunk(footer: list) -> list:
    """Row group 0's last column chunk (ColumnChunk's fields), which lies just before row group
    1's pages."""
    return thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][-1]


def _lost_none(out: Path) -> bool:
    """Every chat of the night exported, or the damaged file letter-ed."""
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    return published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


def test_a_row_group_inside_an_unread_columns_chunk_loses_none_silently(tiny_tokenizer, tmp_path):
    """Nothing lost. Round 14 accounts for the body by the column chunks the footer lists
    (_stray_bytes), but walks the pages (_pages: they must fill the chunk exactly) only of the
    columns kvtrace reads: six chats with an extra integer column `zz` in two row groups of
    three, the footer listing the first alone and its `zz` chunk's total_compressed_size grown
    by row group 1's bytes. The chunk is never read, so its size is never held to its pages:
    "4 read = 4 exported + 0 rejected", exit 0, no letter, three chats gone. Every chunk's
    pages, read or not, must fill exactly the bytes it claims."""
    footer, body, (start, end) = _six_chats_in_two_groups(zz=7)
    metadata = thrift_field(_last_chunk(footer), 3)[2]
    assert thrift_field(metadata, 3)[2][1] == [b"zz"]
    thrift_field(metadata, 7)[2] += end - start  # total_compressed_size
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


def test_a_row_group_inside_a_claimed_offset_index_loses_none_silently(tiny_tokenizer, tmp_path):
    """The same cause, by the index regions round 14 counts as accounted for (_chunk_extras):
    the footer lists row group 0 alone and gives its last chunk an offset index (ColumnChunk
    fields 4 and 5) whose offset and length are row group 1's pages. The region is counted
    without being read as an offset index, so no byte is stray: exit 0, no letter, three chats
    gone. (A bloom filter's offset and length, ColumnMetaData fields 14 and 15, do the same,
    and `kvtrace export` of a trace so cut writes its first row group alone, exit 0.) An index
    or bloom region must parse as what it claims and end where its structure ends."""
    footer, body, (start, end) = _six_chats_in_two_groups()
    chunk = _last_chunk(footer)
    chunk += [[4, 6, start], [5, 5, end - start]]  # offset_index_offset, offset_index_length
    chunk.sort(key=lambda field: field[0])
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))
