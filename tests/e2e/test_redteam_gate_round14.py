"""Red team round 14, the gate (nothing private published, nothing lost): reproducers of what
the gate and its readers still let through after the thirteenth round's fixes. Each asserts
the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import copy
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
    with_parquet_footer,
)

pytestmark = pytest.mark.slow


def _six_chats_in_two_groups() -> tuple[list, bytes]:
    """Six chats (at 0, 1000, ... ms) in two row groups of three: the footer, decoded, and the
    bytes before it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([chat(i, 1_000 * i) for i in range(6)]), buffer, 3)
    footer, body = parquet_footer(buffer.getvalue())
    assert len(thrift_field(footer, 4)[2][1]) == 2
    return footer, body


def _letters(out: Path) -> set[str]:
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    return {record["error"] for path in letters for record in read_jsonl(path)}


def test_a_row_group_the_footer_does_not_list_loses_none_silently(tiny_tokenizer, tmp_path):
    """Nothing lost: every record is exported or dead-lettered. Round 13 counts a listed row
    group's rows from its pages (paths._check_group_rows), but a group the footer leaves out of
    its list is never looked at: six chats in two row groups of three, the footer's list
    holding only the first (and the file's num_rows 3), the second group's pages still in the
    body. kvtrace reads the listed group alone: "3 read = 3 exported + 0 rejected", exit 0, no
    letter, three records and their bytes gone unseen. Every byte between the magic and the
    footer is a listed chunk's (or a page index, bloom filter or zero padding a writer leaves):
    the rest must be exported or weighed as lost in a damaged_file letter."""
    footer, body = _six_chats_in_two_groups()
    del thrift_field(footer, 4)[2][1][1]  # the footer forgets row group 1; its pages stay
    thrift_field(footer, 3)[2] = 3  # the file's num_rows, as the list now gives it
    out = parquet_night(tiny_tokenizer, tmp_path, footer, body)
    assert len(trace(out)) == 7 or "damaged_file" in _letters(out)


def test_a_row_group_naming_another_groups_chunks_loses_none_silently(tiny_tokenizer, tmp_path):
    """The same cause, every count agreeing: the footer's row group 1 names row group 0's
    column chunks (round 13's check that chunks lie apart let a chunk be named twice: its
    bytes were walked once), its own pages left in the body unreferenced. Those chunks hold the 3 rows it claims,
    so the round-13 check passes; the run says "6 read = 6 exported + 0 rejected" and publishes
    the first three chats twice (timestamps 0, 0, 1000, 1000, 2000, 2000), the last three gone
    with no letter."""
    footer, body = _six_chats_in_two_groups()
    groups = thrift_field(footer, 4)[2][1]
    groups[1] = copy.deepcopy(groups[0])
    out = parquet_night(tiny_tokenizer, tmp_path, footer, body)
    published = sorted(row["timestamp"] for row in trace(out))
    assert published == [
        *(1_000 * i for i in range(6)),
        CLEAN_CHAT_MS,
    ] or "damaged_file" in _letters(out)


def test_a_trace_parquet_whose_footer_leaves_a_row_group_out_is_refused_by_export(tmp_path, capsys):
    """The same cause in the trace readers (every one reads Parquet through paths.parquet_file):
    a trace of six rows in two row groups, the footer listing the first alone, exported
    "3 rows" with exit 0. The file is refused in one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtrace.cli import main

    rows = [
        {"timestamp": 1_000 * i, "input_length": 8, "output_length": 2, "hash_ids": [i, i + 1]}
        for i in range(6)
    ]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer, 3)
    footer, body = parquet_footer(buffer.getvalue())
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
    source = tmp_path / "t.parquet"
    source.write_bytes(with_parquet_footer(body, footer))
    args = ["export", str(source), "--to", "aiperf", "--block-size", "4"]
    assert main([*args, "-o", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "lie in no part of the file its footer lists" in err and "Traceback" not in err
    assert not (tmp_path / "t.jsonl").exists()
