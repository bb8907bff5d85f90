"""Red team round 18, hostile input: reproducers of the holes found past the round-1..17 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost:
read = exported + rejected) and fails today (2026-11-28)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    CLEAN_CHAT_MS,
    KVTRACE,
    ROOT,
    anonymize,
    chat,
    parquet_footer,
    peak_rss_mb,
    read_jsonl,
    thrift_decode,
    thrift_encode,
    thrift_field,
    trace,
    under_rlimit,
    with_parquet_footer,
    write_jsonl,
)

pytestmark = pytest.mark.slow

MAX_RECORD_BYTES = 16_384  # the reader's page ceiling is twice this


def _group_behind_a_stored_tail(tmp_path: Path) -> Path:
    """Six chats with a last column `zz` ("a", "b"), uncompressed, in two row groups of three.
    Row group 1's bytes are appended to row group 0's `zz` data page, with zeros past the
    ceiling (2 x MAX_RECORD_BYTES): the page header's compressed_page_size (what is stored)
    grown to match, its uncompressed_page_size left as written; the footer lists row group 0
    alone. Arrow reads the page's 3 values from its first bytes and never the rest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    rows = [{**chat(i, 1_000 * i), "zz": "ab"[i % 2]} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, 3, compression="NONE")
    data = buffer.getvalue()
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    later = metadata.row_group(1)
    chunks = [later.column(c) for c in range(later.num_columns)]
    start = min(c.dictionary_page_offset or c.data_page_offset for c in chunks)
    hidden = data[start : max(c.data_page_offset + c.total_compressed_size for c in chunks)]
    page = metadata.row_group(0).column(later.num_columns - 1).data_page_offset
    header, payload_at = thrift_decode(data, page)
    end = payload_at + thrift_field(header, 3)[2]
    payload = data[payload_at:end] + hidden + bytes(3 * MAX_RECORD_BYTES)
    thrift_field(header, 3)[2] = len(payload)  # compressed_page_size alone
    grown = thrift_encode(header) + payload
    footer, _ = parquet_footer(data)
    groups = thrift_field(footer, 4)[2][1]
    del groups[1]
    thrift_field(footer, 3)[2] = 3  # num_rows, as the list now gives it
    column = thrift_field(thrift_field(groups[0], 1)[2][1][-1], 3)[2]
    assert thrift_field(column, 3)[2][1] == [b"zz"]
    for field in (6, 7):  # total_uncompressed_size, total_compressed_size
        thrift_field(column, field)[2] += len(grown) - (end - page)
    source = tmp_path / "log.parquet"
    source.write_bytes(with_parquet_footer(data[:page] + grown + data[end:start], footer))
    assert pq.read_table(source).num_rows == 3  # Arrow reads it, the tail unread
    return source


def test_a_row_group_behind_a_pages_stored_tail_past_the_ceiling_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """Nothing lost. paths._check_chunks leaves a page's payload unchecked when
    max(page.size, page.stored) is over the ceiling (2 x --max-record-bytes), trusting that
    oversized_pages refuses its group when it is read; but oversized_pages (_check_ceiling)
    looks at page.size (uncompressed) alone. A page whose stored bytes are over the ceiling
    and whose uncompressed size is not is neither checked nor refused: row group 1 left out
    of the footer and appended to row group 0's `zz` data page (compressed_page_size grown,
    uncompressed_page_size as written, codec UNCOMPRESSED): exit 0, "4 read = 4 exported",
    no letter, three chats gone. The same page under the ceiling is a damaged_file letter."""
    source = _group_behind_a_stored_tail(tmp_path)
    clean = tmp_path / "clean.jsonl"
    write_jsonl(clean, [chat(6, CLEAN_CHAT_MS)])
    out = tmp_path / "out"
    extra = ("--max-rejected-fraction", "1", "--max-record-bytes", str(MAX_RECORD_BYTES))
    assert anonymize(tiny_tokenizer, [source, clean], out, *extra, "--quiet") == 0
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    assert published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


def _many_pages_over_one_dictionary(tmp_path: Path, rows: int) -> Path:
    """`rows` chats with a last column `zz` of distinct strings, dictionary-encoded, one data
    page a row (pyarrow's documented data_page_size and write_batch_size, at 1), so every
    page's statistics are one distinct value of one dictionary of `rows` entries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = [{**chat(i, 1_000 * i), "zz": f"{'A' * 64}{i:08d}"} for i in range(rows)]
    source = tmp_path / "log.parquet"
    pq.write_table(
        pa.Table.from_pylist(table),
        source,
        compression="zstd",
        data_page_size=1,
        write_batch_size=1,
        use_dictionary=["zz"],
    )
    metadata = pq.ParquetFile(source).metadata
    chunk = metadata.row_group(0).column(metadata.num_columns - 1)
    assert chunk.has_dictionary_page and pq.read_table(source).num_rows == rows
    return source


def test_page_statistics_over_a_dictionary_cost_its_bytes_a_bounded_number_of_times(
    tiny_tokenizer, tmp_path
):
    """Bounded CPU. _ChunkValues.holds looked each distinct page bound up by a substring search
    of the chunk's whole decompressed dictionary: a dictionary-encoded page holds indices,
    never its bound's bytes, so every page of a chunk paid a search of the dictionary, and a
    chunk of P pages over a dictionary of D bytes cost P x D, quadratic in the file. Written by
    pyarrow with documented settings (one page a row). Measured before the fix,
    paths.parquet_file alone: 6,000 rows 12 CPU-s, 12,000 rows 47. Fixed (round 18): a
    dictionary-encoded page's bounds are held to the entries its own indices name. Asserted
    without a clock: the open of 6,000 rows within 6 CPU-s (RLIMIT_CPU), half the old cost;
    first counted through a function the fix removed, so rewritten."""
    rows = 6_000
    source = _many_pages_over_one_dictionary(tmp_path, rows)
    out = tmp_path / "out"
    assert anonymize(tiny_tokenizer, [source], out, "--quiet") == 0  # read whole, once
    assert len(trace(out)) == rows
    opening = (
        "from kvtrace.transforms.read import paths\n"
        "from kvtrace.transforms.read.records import DEFAULT_MAX_RECORD_BYTES\n"
        f"with paths.parquet_file({str(source)!r}, DEFAULT_MAX_RECORD_BYTES):\n"
        "    pass\n"
    )
    done = subprocess.run(
        under_rlimit([sys.executable, "-c", opening], "RLIMIT_CPU", 6),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _dictionary_pages(tmp_path: Path, copies: int, page_bytes: int) -> Path:
    """Two chats with a last column `zz` ("a", "b"), dictionary-encoded, zstd, `copies`
    dictionary pages put before its own: each one empty entry `page_bytes` long (zeros, a
    few hundred bytes compressed), at the ceiling, not over it; the chunk's footer entry grown
    to hold them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    rows = [{**chat(i, 1_000 * i), "zz": "ab"[i % 2]} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, compression="zstd", use_dictionary=["zz"])
    data = buffer.getvalue()
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    start = metadata.row_group(0).column(metadata.num_columns - 1).dictionary_page_offset
    entry = (page_bytes - 4).to_bytes(4, "little") + bytes(page_bytes - 4)  # PLAIN: length, bytes
    payload = pa.compress(entry, "zstd", asbytes=True)
    dictionary = [[1, 5, 1], [2, 5, 0]]  # DictionaryPageHeader: one value, PLAIN
    header = [[1, 5, 2], [2, 5, page_bytes], [3, 5, len(payload)], [7, 12, dictionary]]
    pages = (thrift_encode(header) + payload) * copies
    footer, body = parquet_footer(data)
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][-1]
    column = thrift_field(chunk, 3)[2]
    for field in (6, 7, 9):  # total_uncompressed_size, total_compressed_size, data page offset
        thrift_field(column, field)[2] += len(pages)
    source = tmp_path / f"dictionaries-{copies}.parquet"
    source.write_bytes(with_parquet_footer(body[:start] + pages + body[start:], footer))
    return source


def test_dictionary_pages_of_one_chunk_cost_no_memory_past_one(tiny_tokenizer, tmp_path):
    """Bounded memory. The page walk (paths._pages) takes any number of dictionary pages in a
    chunk (the format allows one, first; Arrow refuses a second), and _ChunkValues.data keeps
    every dictionary page it decompresses while _starts_an_entry decompresses them all at
    once to look a page's bound up: a chunk of K dictionary pages at the ceiling
    (2 x --max-record-bytes, each a few hundred bytes zstd) holds K x the ceiling before any
    row is read. Measured on today's code, default --max-record-bytes: a 23 KB file of 20 such
    pages, anonymize peaks at 858 MB (then letters the group too_large); 40 pages: parquet_file
    alone 1.38 GB: 32 MiB more a kilobyte of file. The same chunk with one such page costs
    one ceiling; a hundred (today 91 MB, 287 MB at 1 MiB) must not cost more."""
    extra = ("--max-rejected-fraction", "1", "--max-record-bytes", str(1 << 20), "--quiet")
    peaks = []
    for copies in (1, 100):
        source = _dictionary_pages(tmp_path, copies, 2 << 20)
        out = tmp_path / f"out-{copies}"
        command = [*KVTRACE, "anonymize", "--tokenizer", tiny_tokenizer, "--output", str(out)]
        code, peak_mb, stderr = peak_rss_mb([*command, "--input", str(source), *extra])
        assert code in (0, 1) and "Traceback" not in stderr
        peaks.append(peak_mb)
    assert peaks[1] <= peaks[0] + 32, peaks
