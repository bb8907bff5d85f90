"""Red team round 9, the gate (nothing private published): reproducers of what `kvtrace audit`
let through, or could not refuse within its bounds, on a folder anonymize published. Each test
asserts the promised behaviour. Fixed by construction: the audit never decodes a Parquet shard
(its rows come from the JSONL twin; the Parquet must be kvtrace's bytes for them)."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

import pytest

from helpers import (
    chat,
    kvtrace_child,
    parquet_footer,
    peak_rss_mb,
    thrift_encode,
    thrift_field,
    thrift_uvarint,
    with_parquet_footer,
    write_jsonl,
)

pytestmark = pytest.mark.slow
SHARD = "trace-00000-of-00001"


@pytest.fixture(scope="module")
def night(tiny_tokenizer, tmp_path_factory) -> Path:
    """A publishable night at block size 4: six rows, two sessions."""
    tmp = tmp_path_factory.mktemp("redgate9")
    log = write_jsonl(tmp / "night.jsonl", [chat(i, 1000 * i, f"s{i % 2}") for i in range(6)])
    made = kvtrace_child(
        "anonymize", "--input", str(log), "--output", str(tmp / "out"),
        "--tokenizer", tiny_tokenizer, "--block-size", "4",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    audited = kvtrace_child("audit", str(tmp / "out"))
    assert audited.returncode == 0, audited.stdout
    return tmp / "out"


def _hash_ids_chunk(footer: list) -> list:
    """The metadata (ColumnMetaData's fields) of the first row group's hash_ids chunk."""
    group = thrift_field(footer, 4)[2][1][0]
    return thrift_field(thrift_field(group, 1)[2][1][3], 3)[2]


def _rle(count: int, level: int) -> bytes:
    """One run of the RLE/bit-packed hybrid at bit width 1."""
    return thrift_uvarint(count << 1) + bytes([level])


def _zeros(size: int) -> bytes:
    """size zero bytes as zstd: one 8 MB frame of zeros (~300 bytes), repeated (a reader
    decodes concatenated frames as one stream)."""
    from pyarrow import Codec

    frame = 8 << 20
    assert size % frame == 0
    return Codec("zstd").compress(bytes(frame), asbytes=True) * (size // frame)


def _a_data_page_of(parquet: bytes, values: int) -> bytes:
    """kvtrace's Parquet shard whose hash_ids chunk is one zstd data page of `values` zero ids
    in the shard's six rows (the last holding the rest), its footer unchanged but for where the
    chunk lies: it still counts the values kvtrace wrote (num_values)."""
    from pyarrow import Codec

    footer, body = parquet_footer(parquet)
    repetition = _rle(6, 0) + _rle(values - 6, 1)
    definition = _rle(values, 1)
    levels = b"".join(struct.pack("<i", len(r)) + r for r in (repetition, definition))
    data = Codec("zstd").compress(levels, asbytes=True) + _zeros(8 * values)
    page_header = thrift_encode(
        [
            [1, 5, 0],  # a v1 data page
            [2, 5, len(levels) + 8 * values],  # uncompressed
            [3, 5, len(data)],
            [5, 12, [[1, 5, values], [2, 5, 0], [3, 5, 3], [4, 5, 3]]],  # PLAIN, RLE levels
        ]
    )
    _move_chunk(
        footer, len(body), len(page_header) + len(levels) + 8 * values, len(page_header) + len(data)
    )
    return with_parquet_footer(body + page_header + data, footer)


def _a_dictionary_page_of(parquet: bytes, values: int) -> bytes:
    """kvtrace's Parquet shard whose hash_ids dictionary page holds `values` zero ids, before
    kvtrace's own data page (indices into the first 14): a footer counts a chunk's data values,
    never its dictionary's."""
    footer, body = parquet_footer(parquet)
    chunk = _hash_ids_chunk(footer)
    start, data_start = thrift_field(chunk, 11)[2], thrift_field(chunk, 9)[2]
    data_page = parquet[data_start : start + thrift_field(chunk, 7)[2]]
    data = _zeros(8 * values)
    page_header = thrift_encode(
        [[1, 5, 2], [2, 5, 8 * values], [3, 5, len(data)], [7, 12, [[1, 5, values], [2, 5, 0]]]]
    )
    dictionary = len(page_header) + len(data)
    _move_chunk(
        footer,
        len(body),
        dictionary + 8 * values + len(data_page) - len(data),
        dictionary + len(data_page),
    )
    thrift_field(chunk, 9)[2] = len(body) + dictionary
    chunk[:] = sorted([*chunk, [11, 6, len(body)]])
    return with_parquet_footer(body + page_header + data + data_page, footer)


def _move_chunk(footer: list, start: int, uncompressed: int, stored: int) -> None:
    """The hash_ids chunk's metadata pointed at its new pages (at start in the file): its sizes
    set, its statistics, encoding stats and size statistics dropped (they describe kvtrace's
    pages); num_values (field 5) left as kvtrace wrote it."""
    chunk = _hash_ids_chunk(footer)
    chunk[:] = sorted(
        [f for f in chunk if f[0] not in (6, 7, 9, 11, 12, 13, 16)]
        + [[6, 6, uncompressed], [7, 6, stored], [9, 6, start]]
    )


@pytest.mark.parametrize(
    "page, values", [(_a_data_page_of, 16 << 20), (_a_dictionary_page_of, 32 << 20)],
    ids=["data page", "dictionary page"],
)  # fmt: skip
def test_a_parquet_page_larger_than_its_footer_says_is_decoded_whole(night, tmp_path, page, values):
    """The audit bounds a Parquet shard's rows and values by its footer (columns_of_parquet:
    num_rows, each chunk's num_values, against the JSONL twin's size), then lets Arrow decode
    it; but Arrow decodes by the page headers, which the footer's counts do not bind (the input
    reader walks them: read/paths.oversized_pages), and a dictionary page's values are counted
    nowhere. A 7 KB shard whose footer still counts the 33 ids kvtrace wrote but whose one data
    page holds 16M zero ids (128 MB) costs the audit ~650 MB, a dictionary page of 32M ~600 MB
    (96 MB for the untouched night): 2^31 bytes per page, a few GB for a file of a few KB. The
    gate should refuse it from its page headers, before decoding, in bounded memory."""
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    shard = folder / f"{SHARD}.parquet"
    shard.write_bytes(page(shard.read_bytes(), values))
    assert shard.stat().st_size < 16 << 10
    code, peak_mb, _ = peak_rss_mb([sys.executable, "-m", "kvtrace.cli", "audit", str(folder)])
    assert code == 1
    assert peak_mb < 300, (
        f"the audit of a {shard.stat().st_size:,}-byte shard peaked at {peak_mb} MB"
    )


def _audit_of_shard(night: Path, folder: Path, edit) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the CLI's audit of a copy of the night whose Parquet
    shard's footer was edited in place (edit: the decoded footer, changed in place)."""
    shutil.copytree(night, folder)
    shard = folder / f"{SHARD}.parquet"
    footer, body = parquet_footer(shard.read_bytes())
    edit(footer)
    shard.write_bytes(with_parquet_footer(body, footer))
    done = kvtrace_child("audit", str(folder), timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_a_parquet_footers_size_statistics_abort_the_audit(night, tmp_path):
    """A shard's footer whose hash_ids chunk lists five repetition-level counts in its size
    statistics (ColumnMetaData.size_statistics; a list column has two levels) makes Arrow throw
    while building the chunk's metadata, outside any handler: the process aborts (SIGABRT,
    exit 134, "terminate called after throwing an instance of parquet::ParquetException"),
    with no verdict and no word of which file (columns_of_parquet: meta.row_group(g).column(c),
    before any bound). One byte of the footer does it; in a stream, one window's shard ends the
    audit of every window. The gate should flag the shard and say NOT publishable (exit 1)."""

    def five_levels(footer: list) -> None:
        histogram = thrift_field(thrift_field(_hash_ids_chunk(footer), 16)[2], 2)
        histogram[2] = (histogram[2][0], [*histogram[2][1], 0, 0, 0])

    code, out, err = _audit_of_shard(night, tmp_path / "night", five_levels)
    assert code == 1, f"exit {code}: {err[-200:]}"
    assert f"{SHARD}.parquet" in out and "NOT publishable" in out


def _name_not_utf8(footer: list) -> None:
    """The timestamp column (schema[1]) named b"timestam\\xff"."""
    thrift_field(thrift_field(footer, 2)[2][1][1], 4)[2] = b"timestam\xff"


def _a_chunk_missing(footer: list) -> None:
    """The row group lists four column chunks where the schema has five columns."""
    chunks = thrift_field(thrift_field(footer, 4)[2][1][0], 1)
    chunks[2] = (chunks[2][0], chunks[2][1][:4])


@pytest.mark.parametrize("edit", [_name_not_utf8, _a_chunk_missing], ids=lambda f: f.__name__)
def test_a_parquet_footer_pyarrow_refuses_with_its_own_errors_stops_the_audit(
    night, tmp_path, edit
):
    """columns_of_parquet turns OSError and ArrowException into a FormatError (the shard
    flagged), but pyarrow refuses some footers with Python's own errors: a column name not
    UTF-8 raises UnicodeDecodeError (ParquetFile: column_paths), a row group with fewer column
    chunks than the schema has columns IndexError (RowGroupMetaData.column, in the bound on
    values). The audit then stops with no verdict and names no file: "error: 'utf-8' codec
    can't decode byte 0xff in position 8" (exit 2, the audit could not run) or "error: the job
    failed: IndexError: 4 out of bounds" (exit 1, the code of a folder flagged, without its
    report); in a stream, no window is reported. The gate should flag the shard by name, NOT
    publishable (exit 1)."""
    code, out, err = _audit_of_shard(night, tmp_path / "night", edit)
    assert code == 1, f"exit {code}: {err[-200:]}"
    assert f"{SHARD}.parquet" in out and "NOT publishable" in out
