"""Red team round 13, hostile input: reproducers of the holes found past the round-1..12 fixes
(test_redteam_input*.py). Each asserts the promised behaviour and fails today (2026-11-27)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import (
    anonymize,
    chat,
    kvtrace_child,
    parquet_footer,
    read_jsonl,
    thrift_field,
    trace,
    with_parquet_footer,
    write_jsonl,
)

pytestmark = pytest.mark.slow

# Two engine hashes as LMCache's lookup log spells them (read/captures.py).
HASHES = ["0x9f3c2a71be44d0aa", "0x51d0e9c3a2b7f601"]


def _letter_lines(out: Path) -> str:
    letters = sorted(out.parent.glob(f"{out.name}-rejected/rejected-*.jsonl"))
    return "".join(r["line"] for p in letters for r in read_jsonl(p))


def test_a_batch_line_naming_engine_hashes_withholds_its_letter(tiny_tokenizer, tmp_path):
    """docs/CAPTURES.md: in a text run, a record any of whose keys, decoded, names a field
    engines keep hashes in withholds its letter, "whether it is refused as it is parsed or
    later". A line with a custom_id and a body is decoded as a Batch half (batch_half), but a
    half's letters (unjoined_batch, duplicate_custom_id, a joined record refused) are made in
    batch_join._letter without ParseOptions.withholds: the line, its hashes, is written. The
    same record without custom_id is withheld (the check can fail)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world"}]}
    half = {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    good = write_jsonl(tmp_path / "good.jsonl", [chat(i, 1_000 * i) for i in range(3)])
    batch = write_jsonl(tmp_path / "batch_input.jsonl", [dict(half, chunk_hashes=HASHES)])
    plain = write_jsonl(tmp_path / "plain.jsonl", [{**body, "chunk_hashes": HASHES}])
    out = tmp_path / "out"
    extra = ("--max-rejected-fraction", "1", "--quiet")
    assert anonymize(tiny_tokenizer, [good, batch, plain], out, *extra) == 0
    letters = [
        r for p in (tmp_path / "out-rejected").glob("rejected-*.jsonl") for r in read_jsonl(p)
    ]
    assert sorted(r["error"] for r in letters) == ["missing_timestamp", "unjoined_batch"]
    assert [h for h in HASHES if h in _letter_lines(out)] == []


def test_a_measured_file_that_is_a_fifo_is_refused_not_waited_on(tiny_tokenizer, tmp_path):
    """Every other file kvtrace reads is opened as a regular file or refused in one line
    (storage.open_regular: "a FIFO, device, socket or /proc file that took a file's name is
    refused, not read"; tests/transforms/read/test_bounds.py). `--measured FILE` is opened by
    read/measured.read_measured with storage.open_read, a plain open(): a named pipe no one
    writes (a measured file's name reused for one) blocks calibrate (and analyze --measured,
    report --measured) for ever. It must be a one-line error (exit 2)."""
    good = write_jsonl(tmp_path / "good.jsonl", [chat(i, 1_000 * i) for i in range(3)])
    night = tmp_path / "night"
    assert anonymize(tiny_tokenizer, [good], night, "--block-size", "4", "--quiet") == 0
    fifo = tmp_path / "measured-run.jsonl"
    os.mkfifo(fifo)
    try:
        done = kvtrace_child("calibrate", str(night), "--measured", str(fifo), timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("calibrate --measured FIFO did not answer: it waits on the pipe")
    said = [line for line in done.stderr.splitlines() if " INFO " not in line]  # the read log
    assert done.returncode == 2 and len(said) == 1 and said[0].startswith("error: --measured")


def test_a_row_group_claiming_fewer_rows_than_its_pages_hold_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """Nothing lost: every record is exported or dead-lettered. Six chats in two row groups of
    three; the footer's second group claims 0 rows (and the file 3), its pages still holding
    three rows, which pyarrow.parquet.read_table reads (6 rows). kvtrace reads each group with
    iter_batches(row_groups=[g]), which stops at the footer's claim: "3 read = 3 exported + 0
    rejected", exit 0, no letter, the group's rows and bytes gone. They must be exported or
    weighed as lost in a damaged_file letter."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    table = pa.Table.from_pylist([chat(i, 1_000 * i) for i in range(6)])
    pq.write_table(table, buffer, row_group_size=3)
    footer, body = parquet_footer(buffer.getvalue())
    thrift_field(thrift_field(footer, 4)[2][1][1], 3)[2] = 0  # row group 1's num_rows
    thrift_field(footer, 3)[2] = 3  # the file's num_rows
    source = tmp_path / "log.parquet"
    source.write_bytes(with_parquet_footer(body, footer))
    assert pq.read_table(source).num_rows == 6  # the rows are there to read
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [source], out, "--max-rejected-fraction", "1", "--quiet") == 0
    letters = [
        r for p in (tmp_path / "out-rejected").glob("rejected-*.jsonl") for r in read_jsonl(p)
    ]
    assert len(trace(out)) == 6 or "damaged_file" in {r["error"] for r in letters}
