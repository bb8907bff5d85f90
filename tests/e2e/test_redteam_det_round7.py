"""Red team round 7 (det7): determinism and nothing lost across readers, engines and runs. Each
test asserts a promise and fails today."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace.cli import main

pytestmark = pytest.mark.slow


def _rows(n: int, start: int = 0) -> list[bytes]:
    return [
        json.dumps({"timestamp": 1000 * i, "input_length": 8, "hash_ids": [0, i + 1]}).encode()
        for i in range(start, start + n)
    ]


def _analyzed(tmp_path: Path, name: str, *files: Path, engine: str = "local") -> tuple[int, dict]:
    out = tmp_path / f"{name}.json"
    code = main(
        ["analyze", *map(str, files), "--block-size", "4", "--json", str(out), "--engine", engine]
    )
    return code, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_session_of_invalid_utf8_is_a_malformed_line_not_a_refused_trace(tmp_path, engine):
    """Promise: analyze reports malformed lines as warnings, never a failure, and the pyarrow
    block reader gives exactly what the line reader gives (trace_io._screened_blocks). A row whose
    session_id holds bytes that are not UTF-8 is, read line by line, one malformed line
    ('not JSON (utf-8 codec...)'). Read through pyarrow's blocks (the fast path, taken when every
    other line is fine) pyarrow keeps the bytes, and trace_io._columns_from_table ->
    paths.python_values -> StringArray.to_pylist raises UnicodeDecodeError: the whole analyze
    ends 'error: utf-8 codec can't decode byte 0xe9' (exit 2), on both engines."""
    trace = tmp_path / "t.jsonl"
    bad = b'{"timestamp": 99000, "input_length": 8, "hash_ids": [0, 99], "session_id": "\xe9"}'
    good = [json.dumps({**json.loads(r), "session_id": "s"}).encode() for r in _rows(5)]
    trace.write_bytes(b"\n".join([*good, bad]) + b"\n")
    code, report = _analyzed(tmp_path, "r", trace, engine=engine)
    assert code == 0
    assert report["total_requests"] == 5


@pytest.mark.parametrize(
    "odd",
    [b'"note": "caf\xe9"', b'"note": "\xc0\x80"', b'"n": ' + b"9" * 5000],
    ids=["latin1", "overlong-utf8", "int-of-5000-digits"],
)
def test_a_row_of_invalid_utf8_is_kept_or_dropped_by_which_other_lines_share_its_file(
    tmp_path, odd
):
    """Promise: same rows, same numbers whatever the file split; the block reader gives exactly
    what the line reader gives. A row with a field kvtrace does not read holding invalid UTF-8
    (a note of Latin-1 bytes) is malformed to the line reader (json.loads refuses the bytes) but
    kept by pyarrow's block reader (the unread field is skipped unchecked). Which reader a file
    gets depends on its other lines: alone with good rows the row is counted; in one file with any
    malformed line the file is read line by line and the row is dropped. So the same rows split
    [latin + good] / [bad] count 6 requests, and joined in one file 5. The same for an
    overlong UTF-8 sequence, and for an integer of 5,000 digits in an unread field (Python's
    json refuses integers over 4,300 digits: 'not JSON'; pyarrow skips the field)."""
    latin = b'{"timestamp": 50000, "input_length": 8, "hash_ids": [0, 77], ' + odd + b"}"
    good = _rows(5)
    broken = b'{"timestamp": 60000, "input_length": '
    first, second, joined = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "ab.jsonl"
    first.write_bytes(b"\n".join([latin, *good]) + b"\n")
    second.write_bytes(broken + b"\n")
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    _, split = _analyzed(tmp_path, "split", first, second)
    _, whole = _analyzed(tmp_path, "whole", joined)
    assert split["total_requests"] == whole["total_requests"]


@pytest.mark.parametrize(
    "banner", [b"BZh91AY&SY log start", b"PAR1 log start"], ids=["bz2", "parquet"]
)
def test_standard_input_whose_first_line_is_damaged_like_a_magic_number_reads_as_its_file(
    tiny_tokenizer, tmp_path, monkeypatch, banner
):
    """Promise: standard input gives the output the same file gives (a bad line is one dead
    letter, never a lost run). decompress.spooled_standard_input names the spooled copy by its
    first bytes alone (standard_input_name, MAGIC_SUFFIXES: 'no JSON text starts with any of
    these'); but a damaged first line is no JSON text. As a file, a JSONL log whose first line
    begins 'BZh' or 'PAR1' is one invalid_json letter and its 40 records exported; piped in, the
    same bytes are read as a bzip2 / Parquet file: one damaged_file letter, nothing exported,
    the run refused ('every record rejected')."""
    import io
    import sys

    from helpers import anonymize, chat, trace

    records = [json.dumps(chat(i, 1_700_000_000_000 + 1000 * i)).encode() for i in range(40)]
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\n".join([banner, *records]) + b"\n")
    assert anonymize(tiny_tokenizer, [log], tmp_path / "file", "--block-size", "4") == 0
    assert len(trace(tmp_path / "file")) == 40
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
    code = anonymize(tiny_tokenizer, ["-"], tmp_path / "stdin", "--block-size", "4")
    assert code == 0
    assert len(trace(tmp_path / "stdin")) == 40


def test_validate_does_not_call_a_line_of_invalid_utf8_a_json_object(tmp_path):
    """Promise: validate's first check ('every line is a JSON object ...') and the block reader
    giving what the line reader gives. A trace whose first line carries a Latin-1 byte in a field
    validate does not read is 'valid' (the pyarrow block path skips the field unchecked); the same
    line beside a broken one is read line by line and reported 'not JSON (utf-8 codec can't
    decode byte 0xe9)'. A replayer's json.loads refuses that line, so the trace validate passed
    breaks the benchmark it was checked for."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(
        b'{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [0, 1], '
        b'"note": "caf\xe9"}\n'
        b'{"timestamp": 1000, "input_length": 8, "output_length": 1, "hash_ids": [0, 2]}\n'
    )
    assert main(["validate", "--block-size", "4", str(trace)]) == 1


def test_the_summary_says_rejected_reasons_commonest_first(tiny_tokenizer, tmp_path, capsys):
    """Promise (issue 35; manifest.RecordCounts.reasons: '(reason, count) of the rejected
    records, commonest first: the operator's summary says them'): the run's summary line
    'rejected' lists its reasons commonest first. The night sorts them so
    (anonymize_night: key (-count, reason)), but they reach the summary through run-counts.json,
    written by canonical_json with sort_keys=True (manifest.write_run_counts ->
    read_run_counts): the dict comes back in alphabetical order. 1 bad_timestamp and 5
    invalid_json print as 'bad_timestamp 1, invalid_json 5'."""
    from helpers import anonymize, chat

    lines = [json.dumps(chat(i, 1_700_000_000_000 + 1000 * i)).encode() for i in range(30)]
    lines += [b"not json"] * 5
    lines.append(json.dumps({**chat(99, 0), "timestamp": "yesterday"}).encode())
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    capsys.readouterr()
    assert anonymize(tiny_tokenizer, [log], tmp_path / "out", "--block-size", "4", "--quiet") == 0
    said = next(
        line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("rejected")
    )
    assert said.split()[1:5] == ["invalid_json", "5,", "bad_timestamp", "1:"], said


def test_standard_input_of_zstd_opening_with_a_skippable_frame_reads_as_its_file(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Promise: standard input gives the output the same file gives. A zstd stream may open with
    a skippable frame (magic 0x184D2A50..0x184D2A5F, RFC 8878 section 3.1.2): pzstd writes one
    before every frame, seekable-format writers too, and zstd reads such a file as any other.
    Named log.jsonl.zst, it is read whole (40 records exported). Piped in, its first bytes are
    not in decompress.MAGIC_SUFFIXES (only the frame magic 28 b5 2f fd), so the spool is named
    stdin.jsonl and read as text: every line invalid_utf8, the run refused."""
    import io
    import struct
    import sys

    import zstandard

    from helpers import anonymize, chat, trace

    data = b"".join(
        json.dumps(chat(i, 1_700_000_000_000 + 1000 * i)).encode() + b"\n" for i in range(40)
    )
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"meta"
    log = tmp_path / "log.jsonl.zst"
    log.write_bytes(skippable + zstandard.ZstdCompressor().compress(data))
    assert anonymize(tiny_tokenizer, [log], tmp_path / "file", "--block-size", "4") == 0
    assert len(trace(tmp_path / "file")) == 40
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log.read_bytes())))
    assert anonymize(tiny_tokenizer, ["-"], tmp_path / "stdin", "--block-size", "4") == 0
    assert len(trace(tmp_path / "stdin")) == 40
