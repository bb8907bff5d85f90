"""Red team round 14, the gate (nothing private published, nothing lost): reproducers of what
the gate and its readers still let through after the thirteenth round's fixes. Each asserts
the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from helpers import (
    anonymize,
    chat,
    parquet_footer,
    read_jsonl,
    thrift_field,
    trace,
    with_parquet_footer,
)

pytestmark = pytest.mark.slow


@pytest.mark.xfail(strict=True, reason="red team round 14")
def test_a_row_group_the_footer_does_not_list_loses_none_silently(tiny_tokenizer, tmp_path):
    """Nothing lost: every record is exported or dead-lettered. Round 13 counts a listed row
    group's rows from its pages (paths._check_group_rows), but a group the footer leaves out of
    its list is never looked at: six chats in two row groups of three, the footer's list
    holding only the first (and the file's num_rows 3), the second group's pages still in the
    body. kvtrace reads the listed group alone: "3 read = 3 exported + 0 rejected", exit 0, no
    letter, three records and their bytes gone unseen. Every byte between the magic and the
    footer is a listed chunk's (or a page index, bloom filter or zero padding a writer leaves):
    the rest must be exported or weighed as lost in a damaged_file letter."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([chat(i, 1_000 * i) for i in range(6)]), buffer, 3)
    footer, body = parquet_footer(buffer.getvalue())
    groups = thrift_field(footer, 4)[2][1]
    assert len(groups) == 2
    del groups[1]  # the footer forgets row group 1; its pages stay where they were written
    thrift_field(footer, 3)[2] = 3  # the file's num_rows, as the list now gives it
    source = tmp_path / "log.parquet"
    source.write_bytes(with_parquet_footer(body, footer))
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [source], out, "--max-rejected-fraction", "1", "--quiet") == 0
    letters = [r for p in Path(f"{out}-rejected").glob("rejected-*.jsonl") for r in read_jsonl(p)]
    assert len(trace(out)) == 6 or "damaged_file" in {r["error"] for r in letters}
