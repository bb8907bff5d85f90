"""Bounded resources for any input: bombs and oversized records in every format and compression
are read by the real reader, in a child process whose peak memory and time are measured, and
each comes out as a dead letter (the records around it intact), never an abort or a hang."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backports import zstd
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (
    parquet_footer,
    records_of,
    thrift_decode,
    thrift_encode,
    thrift_field,
    with_parquet_footer,
)
from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.read.decompress import DECODED_CHUNK_BYTES, DecodedStream
from kvtrace.transforms.read.parquet_payload import decompressed
from kvtrace.transforms.read.paths import (
    PAGE_BOUND_MULTIPLE,
    Page,
    _page_header,
    _pages,
    _repetition_levels,
    _RowCounter,
    chunk_levels,
    open_raw,
    oversized_pages,
    parquet_file,
)
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.read.sources import FileRange, parse_one
from kvtrace.transforms.read.trace_io import read_trace

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20
COMPRESSORS = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".zst": zstd.compress,
    ".xz": lzma.compress,
    "": bytes,
}
BEFORE, AFTER = b'{"timestamp": 1, "prompt": "before"}', b'{"timestamp": 2, "prompt": "after"}'
# Peak memory a read may add over the reader's own start, as a multiple of the record bound,
# plus a fixed allowance for buffers that do not scale with it (docs/BOUNDS.md).
# Measured (docs/BOUNDS.md): 3.0 x for a record at the bound read and parsed; up to 16 MiB of
# decoder state and buffers.
CEILING_MULTIPLE, CEILING_FIXED = 4, 24 * MiB
PARQUET_CEILING_MULTIPLE = 9  # pages decoded whole, up to 2 x the bound

# The child: read and parse one file with the real reader, report what came out, its time and
# its peak resident memory above its resident memory once imported (Linux resets the peak,
# VmHWM, when told "5" through clear_refs).
_CHILD = """
import json, re, sys, time
from kvtrace.transforms.read.sources import FileRange, parse_one, read_range
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.dead_letters import DeadLetter
def status_kb(field):
    return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
bound = int(sys.argv[1])
for path in sys.argv[2:]:
    with open("/proc/self/clear_refs", "w") as peak:
        peak.write("5")
    start_kb, start = status_kb("VmRSS"), time.monotonic()
    out = []
    for item in read_range(FileRange(path, 0, None), bound):
        if isinstance(item, DeadLetter) and item.share:  # a Parquet file's share: no record
            continue
        if not isinstance(item, DeadLetter):
            item = parse_one(*item, ParseOptions(max_record_bytes=bound))
        out.append(item.reason if isinstance(item, DeadLetter) else item.prompt)
    print(json.dumps({"out": out, "peak_bytes": (status_kb("VmHWM") - start_kb) * 1024,
                      "seconds": time.monotonic() - start}))
"""


def bomb(path: Path, line_bytes: int) -> Path:
    """A log whose middle line is line_bytes long, compressed by the path's suffix as
    concatenated members (frames) of one compressed 16 MiB piece: a GiB line in KBs, made in a
    second."""
    compress = COMPRESSORS[path.suffix if path.suffix != ".jsonl" else ""]
    piece_bytes = min(line_bytes, 16 * MiB)
    piece = compress(b"x" * piece_bytes)
    with open(path, "wb") as out:
        out.write(compress(BEFORE + b"\n"))
        for _ in range(line_bytes // piece_bytes):
            out.write(piece)
        out.write(compress(b"\n" + AFTER + b"\n"))
    return path


def read_in_child(paths: list[Path], bound: int, timeout_s: float = 120) -> list[dict]:
    """What reading each file gave, in one child process (one start-up for them all)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(bound), *map(str, paths)],
        cwd=ROOT,
        capture_output=True,
        timeout=timeout_s,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def assert_bounded(result: dict, bound: int) -> None:
    assert result["peak_bytes"] <= CEILING_MULTIPLE * bound + CEILING_FIXED, result["peak_bytes"]


def test_an_oversized_line_is_a_dead_letter_within_the_ceiling_in_every_compression(tmp_path):
    bound = 512 * 1024  # a line held whole (32 MiB) would be over the ceiling (26 MiB)
    suffixes = [".jsonl", ".jsonl.gz", ".jsonl.bz2", ".jsonl.zst", ".jsonl.xz"]
    results = read_in_child([bomb(tmp_path / f"logs{s}", 32 * MiB) for s in suffixes], bound)
    for result in results:
        assert result["out"] == ["before", "too_large", "after"]
        assert_bounded(result, bound)


@pytest.mark.slow  # a GiB decoded per codec
@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.bz2", ".jsonl.zst", ".jsonl.xz"])
def test_a_gib_line_bomb_is_a_dead_letter_within_the_ceiling_and_minutes(tmp_path, suffix):
    bound = 64 * MiB  # the default --max-record-bytes
    path = bomb(tmp_path / f"logs{suffix}", 1 << 30)
    assert path.stat().st_size < 4 * MiB
    [result] = read_in_child([path], bound, timeout_s=180)
    assert result["out"] == ["before", "too_large", "after"]
    assert_bounded(result, bound)


@pytest.mark.slow  # a record at the bound, parsed: the ceiling docs/BOUNDS.md states
def test_a_record_at_the_bound_is_read_and_parsed_within_the_ceiling(tmp_path):
    bound = 64 * MiB
    prompt = b"y" * (bound - 64)
    line = b'{"timestamp": 3, "prompt": "' + prompt + b'"}'
    (tmp_path / "logs.jsonl").write_bytes(BEFORE + b"\n" + line + b"\n" + AFTER + b"\n")
    [result] = read_in_child([tmp_path / "logs.jsonl"], bound)
    assert result["out"] == ["before", prompt.decode(), "after"]
    assert_bounded(result, bound)


def _parquet_with_a_huge_cell(path: Path, cell_bytes: int, small_rows: int) -> Path:
    prompts = ["before"] * small_rows + ["z" * cell_bytes] + ["after"]
    pq.write_table(
        pa.table({"timestamp": list(range(len(prompts))), "prompt": prompts}),
        path,
        compression="zstd",
    )
    return path


def test_a_parquet_cell_over_the_bound_is_refused_unread(tmp_path):
    small_rows = [0, 1000]  # the cell alone in its page, or among many
    paths = [
        _parquet_with_a_huge_cell(tmp_path / f"logs{n}.parquet", 12 * MiB, n) for n in small_rows
    ]
    for rows, result in zip(small_rows, read_in_child(paths, MiB)):
        # Its row group is refused whole: one too_large dead letter, no row decoded.
        assert result["out"] == ["too_large"]
        assert result["peak_bytes"] < 12 * MiB


@pytest.mark.slow  # 200 MB of cell written and refused
def test_a_200_mb_parquet_cell_in_a_tiny_file_is_refused_unread(tmp_path):
    path = _parquet_with_a_huge_cell(tmp_path / "logs.parquet", 200_000_000, 0)
    assert path.stat().st_size < 64 * 1024  # compressed: a bomb
    [result] = read_in_child([path], 64 * MiB)
    assert result["out"] == ["too_large"]
    assert result["peak_bytes"] < 64 * MiB


def test_a_parquet_list_cell_of_more_values_than_the_bound_is_refused_unread(tmp_path):
    path = tmp_path / "logs.parquet"
    ids = pa.array([[0] * (2 * MiB)], pa.list_(pa.int8()))  # small pages, one huge row
    pq.write_table(pa.table({"timestamp": [0], "input_ids": ids}), path, compression="zstd")
    letters = list(records_of(FileRange(str(path), 0, None), MiB))
    assert [letter.reason for letter in letters] == ["too_large"]
    assert f"rows of up to {2 * MiB + 1} values" in letters[0].message  # the ids and timestamp


def test_parquet_rows_within_the_pages_ceiling_are_read_and_checked_one_by_one(tmp_path):
    bound = 64 * 1024
    prompts = [f"p{i}" for i in range(100)] + ["w" * (bound + 10)] + ["after"]
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"timestamp": list(range(len(prompts))), "prompt": prompts}), path)
    options = ParseOptions(max_record_bytes=bound)
    out = [
        item if isinstance(item, DeadLetter) else parse_one(*item, options)
        for item in records_of(FileRange(str(path), 0, None), bound)
    ]
    assert [x.reason if isinstance(x, DeadLetter) else x.prompt for x in out] == (
        prompts[:100] + ["too_large", "after"]
    )


def test_a_parquet_rows_template_values_weigh_toward_its_bytes(tmp_path):
    """A chat row's own template values (documents, chat_template_kwargs) are sized with the
    rest of the row, as a JSONL line's are by being part of it: over the bound, unread."""
    bound = 64 * 1024
    hello = [{"role": "user", "content": "hi"}]
    rows = [
        {"timestamp": t, "messages": hello, "chat_template_kwargs": {"extra": ["x" * 100] * n}}
        for t, n in ((0, 1), (1, bound // 100))
    ]
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = list(records_of(FileRange(str(path), 0, None), bound))
    assert [x.reason for x in out if isinstance(x, DeadLetter)] == ["too_large"]
    assert len(out) == 2


def test_a_parquet_footer_over_the_bound_is_a_dead_letter(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"timestamp": [1], "prompt": ["p"]}), path)
    data = bytearray(path.read_bytes())
    data[-8:-4] = (1 << 31).to_bytes(4, "little")  # a footer claiming 2 GiB
    path.write_bytes(bytes(data))
    letters = list(records_of(FileRange(str(path), 0, None), MiB))
    assert [letter.reason for letter in letters] == ["damaged_file"]
    assert "footer" in letters[0].message


def test_a_valid_parquet_footer_over_the_bound_is_too_large_and_weighs_the_file(tmp_path):
    """A footer longer than --max-record-bytes in a whole file is the bound's refusal
    (too_large), not damage, and the file unread weighs all its bytes as lost."""
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"timestamp": list(range(200)), "prompt": ["p"] * 200}), path)
    footer_bytes = int.from_bytes(path.read_bytes()[-8:-4], "little")
    [letter] = records_of(FileRange(str(path), 0, None), footer_bytes - 1)
    assert letter.reason == "too_large"
    assert "footer" in letter.message
    assert letter.lost_bytes == path.stat().st_size


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.text(max_size=3000), min_size=1, max_size=3000),
    page_bytes=st.sampled_from([1024, 64 * 1024, MiB]),
    dictionary=st.booleans(),
    version=st.sampled_from(["1.0", "2.0"]),
)
def test_page_headers_walk_every_column_chunk_exactly(
    tmp_path_factory, rows, page_bytes, dictionary, version
):
    """Against pyarrow's own writer: the pages found cover each column chunk to its last byte
    (else the walk raises) and hold all its values."""
    path = tmp_path_factory.mktemp("pages") / "t.parquet"
    table = pa.table({"prompt": rows, "ids": [[len(r)] * (len(r) % 5) for r in rows]})
    pq.write_table(
        table,
        path,
        data_page_size=page_bytes,
        use_dictionary=dictionary,
        data_page_version=version,
        row_group_size=1000,
    )
    with parquet_file(str(path), MiB) as (raw, parquet):
        for group in range(parquet.num_row_groups):
            for index in range(parquet.metadata.num_columns):
                column = parquet.metadata.row_group(group).column(index)
                pages = list(_pages(raw, column))
                data_values = sum(page.values for page in pages)
                dictionary_values = data_values - column.num_values
                assert dictionary_values >= 0 and (
                    column.has_dictionary_page or not dictionary_values
                )
                # the dictionary page is the one page without a data page's encoding
                dictionary_pages = sum(page.encoding is None for page in pages)
                assert dictionary_pages == int(column.has_dictionary_page)


@settings(max_examples=150, deadline=None)
@given(header=st.binary(max_size=200))
def test_any_bytes_as_a_page_header_are_read_or_refused_with_a_value_error(
    tmp_path_factory, header
):
    path = tmp_path_factory.mktemp("headers") / "h"
    path.write_bytes(header)
    with open(path, "rb") as raw:
        try:
            fields, size = _page_header(raw, 0)
        except ValueError:
            return
    assert isinstance(fields, dict) and 0 < size <= len(header)


@pytest.mark.parametrize(
    "container", [b"\x19", b"\x1a", b"\x1b\x01\x99"], ids=["list", "set", "map"]
)
def test_a_page_header_nested_past_the_bound_in_any_container_is_a_value_error(tmp_path, container):
    """Field 1 a list (set, map) of lists of lists...: refused, before Python's recursion
    limit, as a field of a type the format does not define (the header's reader is closed)."""
    path = tmp_path / "h"
    path.write_bytes(container * 5000)
    with open(path, "rb") as raw, pytest.raises(ValueError, match="not the format's"):
        _page_header(raw, 0)


def test_a_page_stored_over_the_ceiling_is_over_it_however_small_its_values(tmp_path):
    """The ceiling is one rule (paths.over_ceiling), by the larger of a page's stored and
    decompressed sizes: the body check leaves such a page unread, so every reader refuses its
    group for it; left unread and stored uncompressed, it must store exactly its size."""
    bound = 4096
    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": [1, 2, 3]}), buffer, use_dictionary=False, compression="none")
    data = buffer.getvalue()
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    at, end = column.data_page_offset, column.data_page_offset + column.total_compressed_size
    header, payload_at = thrift_decode(data, at)
    payload = data[payload_at:end] + bytes(3 * bound)  # a stored tail past 2 x the bound
    thrift_field(header, 3)[2] = len(payload)  # compressed_page_size alone
    page = thrift_encode(header) + payload
    footer, before = parquet_footer(data)
    chunk = thrift_field(thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][0], 3)[2]
    for field in (6, 7):  # total_uncompressed_size, total_compressed_size
        thrift_field(chunk, field)[2] += len(page) - (end - at)
    crafted = with_parquet_footer(before[:at] + page + before[end:], footer)
    raw = io.BytesIO(crafted)
    why = oversized_pages(raw, pq.ParquetFile(raw).metadata, 0, bound)
    assert why and f"ceiling of {PAGE_BOUND_MULTIPLE} x {bound}" in why
    path = tmp_path / "tail.parquet"
    path.write_bytes(crafted)
    with pytest.raises(ValueError, match="stores .* bytes, its header's size"):
        with parquet_file(str(path), bound):
            pass


def test_a_page_ceiling_refuses_pages_of_many_values_over_it(tmp_path):
    bound = 4096
    prompts = [f"{i:05d}" * 400 for i in range(1024)]  # 2 KB values: pages of ~2 MB
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"prompt": prompts}), path, use_dictionary=False)
    with parquet_file(str(path), MiB) as (raw, parquet):
        why = oversized_pages(raw, parquet.metadata, 0, bound)
        assert why and f"ceiling of {PAGE_BOUND_MULTIPLE} x {bound}" in why
        assert oversized_pages(raw, parquet.metadata, 0, MiB) is None


@pytest.mark.parametrize("codec", ["gzip", "bz2", "zstd", "xz"])
def test_each_decoding_step_is_bounded_and_the_stream_is_whole(codec):
    data = b"a" * (6 * MiB) + b"tail\n"
    compress = {
        "gzip": gzip.compress,
        "bz2": bz2.compress,
        "zstd": zstd.compress,
        "xz": lzma.compress,
    }[codec]
    stream = DecodedStream(io.BytesIO(compress(data[:MiB]) + compress(data[MiB:])), codec)
    # A read hands out at most what one decoding step returned, however much is asked for.
    got = list(iter(lambda: stream.read(8 * DECODED_CHUNK_BYTES), b""))
    assert max(len(piece) for piece in got) <= DECODED_CHUNK_BYTES
    assert b"".join(got) == data and stream.broken is None


@settings(max_examples=100, deadline=None)
@given(
    codec=st.sampled_from(["gzip", "bz2", "zstd", "xz"]),
    data=st.binary(max_size=2000),
    cut=st.integers(0, 4000),
    noise=st.binary(max_size=64),
)
def test_any_bytes_decode_to_a_prefix_or_a_break_never_an_error(codec, data, cut, noise):
    """Whole, cut, or followed by garbage: the stream gives bytes of the data and says why it
    stopped, and never raises."""
    compress = {
        "gzip": gzip.compress,
        "bz2": bz2.compress,
        "zstd": zstd.compress,
        "xz": lzma.compress,
    }[codec]
    whole = compress(data)
    stream = DecodedStream(io.BytesIO(whole[:cut] + (noise if cut >= len(whole) else b"")), codec)
    got = b"".join(iter(lambda: stream.read(4096), b""))
    assert data.startswith(got) or (noise and got.startswith(data))
    if cut < len(whole) and cut:
        assert stream.broken
    if cut >= len(whole) and not noise:
        assert got == data and stream.broken is None


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _within(seconds: float, action):
    """action() run in a thread: its result, or a failure if it has not answered in time."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = action()
        except Exception as err:  # noqa: BLE001  (raised again in the test's thread)
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "no answer: the reader blocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@pytest.mark.parametrize("name", ["logs.jsonl", "logs.jsonl.gz", "logs.parquet"])
def test_a_fifo_input_is_a_dead_letter_not_a_hang(tmp_path, name):
    path = _fifo(tmp_path, name)
    letters = _within(10, lambda: list(records_of(FileRange(str(path), 0, None), MiB)))
    assert [letter.reason for letter in letters] == ["damaged_file"]
    assert "not a regular file" in letters[0].message


def test_devices_are_refused_at_open():
    with pytest.raises(ValueError, match="not a regular file"):
        open_raw("/dev/zero")


def test_the_trace_reader_refuses_a_fifo_and_skips_an_overlong_line(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        _within(10, lambda: read_trace([str(_fifo(tmp_path, "night.jsonl"))]))
    row = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}
    path = tmp_path / "trace.jsonl.bz2"
    path.write_bytes(
        bz2.compress(
            json.dumps(row).encode()
            + b"\n"
            + b"9" * (17 * MiB)
            + b"\n"
            + json.dumps(row).encode()
            + b"\n"
        )
    )
    trace = read_trace([str(path)])
    assert len(trace) == 2 and [m["line"] for m in trace.malformed] == [2]
    assert "over" in trace.malformed[0]["error"]


def test_a_manifest_that_is_a_fifo_is_ignored_not_waited_on(tmp_path):
    from kvtrace.transforms.read.trace_inputs import declared_block_size

    _fifo(tmp_path, "manifest.json")
    shard = tmp_path / "trace-00000-of-00001.jsonl"
    shard.write_bytes(b"")
    assert _within(10, lambda: declared_block_size([str(shard)])) is None


def test_a_trace_parquet_page_over_the_bound_is_malformed_not_read(tmp_path):
    path = tmp_path / "trace.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": [0],
                "input_length": [1],
                "output_length": [1],
                "hash_ids": [[0]],
                "session": ["s" * (17 * MiB)],
            }
        ),
        path,
        compression="zstd",
    )
    trace = read_trace([str(path)])
    assert len(trace) == 0 and trace.malformed_count == 1
    assert "page" in trace.malformed[0]["error"]


PARQUET_BOUND = 4 * MiB
BOMB_ENTRY = "hello " * 650_000  # one dictionary entry near the bound
BOMB_ROWS = 32  # 64 at once before: ~130 MiB, over the ceiling


def _dictionary_bomb(path: Path) -> Path:
    pq.write_table(
        pa.table(
            {
                "timestamp": ["not a time"] * BOMB_ROWS,
                "prompt": pa.array([BOMB_ENTRY] * BOMB_ROWS).dictionary_encode(),
            }
        ),
        path,
        compression="zstd",
    )
    return path


def _fallback_bomb(path: Path, column: str) -> Path:
    values = [BOMB_ENTRY] * BOMB_ROWS + ["b"]
    if column == "messages":
        values = [[{"role": "user", "content": value}] for value in values]
    pq.write_table(
        pa.table({"timestamp": ["not a time"] * (BOMB_ROWS + 1), column: values}),
        path,
        compression="zstd",
        write_batch_size=BOMB_ROWS,
    )
    return path


@pytest.fixture(scope="module")
def parquet_bombs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The Parquet bombs below by name, each with what reading it gave: all read in one child
    (one start-up of the reader for them all; each file's peak is measured on its own)."""
    folder = tmp_path_factory.mktemp("parquet-bombs")
    paths = {
        "dictionary": _dictionary_bomb(folder / "dictionary.parquet"),
        "prompt": _fallback_bomb(folder / "prompt.parquet", "prompt"),
        "messages": _fallback_bomb(folder / "messages.parquet", "messages"),
    }
    results = read_in_child(list(paths.values()), PARQUET_BOUND)
    return {name: (path, result) for (name, path), result in zip(paths.items(), results)}


def test_a_parquet_dictionary_bomb_is_read_within_the_ceiling(parquet_bombs):
    """One dictionary entry near the bound referenced by 32 rows (a ~1.5 KB file): read 64 rows
    at a time and decoded whole, the rows took 32 x the entry and more (a run of 128 such rows
    at 4 MiB peaked at ~1.1 GB). Each row is now sized from its dictionary index and decoded
    alone."""
    path, result = parquet_bombs["dictionary"]
    assert path.stat().st_size < 4096
    assert result["out"] == ["bad_timestamp"] * BOMB_ROWS
    # docs/BOUNDS.md: Parquet reading stays under 9 x the bound (measured 54 MiB; was ~1.1 GB)
    assert result["peak_bytes"] <= PARQUET_CEILING_MULTIPLE * PARQUET_BOUND + CEILING_FIXED


@pytest.mark.parametrize("column", ["prompt", "messages"])
def test_a_dictionary_bomb_whose_chunk_falls_back_to_plain_is_read_within_the_ceiling(
    parquet_bombs, column
):
    """The same entry, its chunk holding a PLAIN page too (pyarrow's writer falls back once its
    dictionary is over 1 MB): read dense, so the rows indexing the dictionary are decoded before
    they are sized; they are read as many at once as the bound holds at their most (one here,
    from its largest entry), not 64 (~870 MB peak at 128 rows)."""
    path, result = parquet_bombs[column]
    with parquet_file(str(path), PARQUET_BOUND) as (raw, parquet):
        group = parquet.metadata.row_group(0)
        chunk = group.column(group.num_columns - 1)  # the prompt, or the messages' content
        assert {page.encoding for page in _pages(raw, chunk)} >= {None, 0}  # dictionary, PLAIN
    assert path.stat().st_size < 4096
    assert result["out"] == ["bad_timestamp"] * (BOMB_ROWS + 1)
    assert result["peak_bytes"] <= PARQUET_CEILING_MULTIPLE * PARQUET_BOUND + CEILING_FIXED


def _understated_footer(path: Path, small: int = 100) -> None:
    """Every column chunk's total_uncompressed_size over `small` rewritten as `small` in the
    footer, at the same length (a zero-padded varint, which Thrift reads): a lying footer."""

    def varint(value: int, length: int | None = None) -> bytes:
        value, out = value << 1, bytearray()  # zigzag
        while value or not out or (length and len(out) < length):
            out.append(value & 0x7F)
            value >>= 7
        return bytes(b | 0x80 for b in out[:-1]) + out[-1:]

    data = path.read_bytes()
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    footer = data[start:-8]
    metadata = pq.ParquetFile(path).metadata
    for group in range(metadata.num_row_groups):
        for index in range(metadata.num_columns):
            size = metadata.row_group(group).column(index).total_uncompressed_size
            if size > small:
                footer = footer.replace(varint(size), varint(small, len(varint(size))))
    path.write_bytes(data[:start] + footer + data[-8:])


def test_a_footer_understating_a_chunk_does_not_skip_its_page_headers(tmp_path):
    """The footer is input: a page is sized from its header, what Arrow decodes by."""
    path = _parquet_with_a_huge_cell(tmp_path / "logs.parquet", 4 * MiB, 0)
    _understated_footer(path)
    with parquet_file(str(path), MiB) as (raw, parquet):
        assert (
            max(
                parquet.metadata.row_group(0).column(i).total_uncompressed_size
                for i in range(parquet.metadata.num_columns)
            )
            == 100
        )
        why = oversized_pages(raw, parquet.metadata, 0, MiB)
    assert why and f"ceiling of {PAGE_BOUND_MULTIPLE} x {MiB}" in why


def _levels_of_each_row(rows: list[list[list[int]] | None]) -> list[int]:
    """The levels Parquet stores for each row of a list<list<int64>> column: one for a null or
    empty list, else one per inner list that is null or empty, else one per value."""
    return [max(1, sum(max(1, len(inner or [])) for inner in row)) if row else 1 for row in rows]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.one_of(
            st.none(),
            st.lists(st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=40)), max_size=60),
        ),
        min_size=1,
        max_size=400,
    ),
    page_bytes=st.sampled_from([64, 1024, MiB]),
    version=st.sampled_from(["1.0", "2.0"]),
    codec=st.sampled_from(["none", "zstd", "snappy", "gzip", "lz4", "brotli"]),
    dictionary=st.booleans(),
)
def test_a_chunk_s_rows_and_largest_row_are_counted_from_its_repetition_levels(
    tmp_path_factory, rows, page_bytes, version, codec, dictionary
):
    """Against pyarrow's own writer, every page format and codec: chunk_levels counts each row
    group's rows, levels, and the levels of its largest row, as Arrow stores them."""
    path = tmp_path_factory.mktemp("levels") / "t.parquet"
    pq.write_table(
        pa.table({"ids": pa.array(rows, pa.list_(pa.list_(pa.int64())))}),
        path,
        data_page_size=page_bytes,
        data_page_version=version,
        compression=codec,
        use_dictionary=dictionary,
        row_group_size=150,
    )
    with parquet_file(str(path), MiB) as (raw, parquet):
        for group in range(parquet.num_row_groups):
            column = parquet.metadata.row_group(group).column(0)
            levels = chunk_levels(raw, column, 2, _pages(raw, column))
            expected = _levels_of_each_row(rows[group * 150 : (group + 1) * 150])
            assert levels == (len(expected), sum(expected), max(expected))


@settings(max_examples=300, deadline=None)
@given(levels=st.binary(max_size=64), width=st.integers(1, 3), count=st.integers(0, 1 << 40))
def test_any_bytes_as_repetition_levels_are_counted_or_refused_at_once(levels, width, count):
    """Damaged levels (a run header claiming 2^60 groups, a run past the page) are a
    ValueError, and counting them costs at most the bytes there are, whatever they claim."""
    rows = _RowCounter()
    try:
        rows.add(levels, width, count)
    except ValueError:
        return
    assert rows.rows <= count and rows.most_levels() <= count


def test_lz4_pages_are_read_in_hadoop_s_framing_or_raw():
    """Parquet's LZ4: Arrow reads Hadoop's framing first, one raw block if it is not that."""
    data = b"levels " * 1000
    block = pa.compress(data, "lz4_raw", asbytes=True)
    framed = len(data).to_bytes(4, "big") + len(block).to_bytes(4, "big") + block
    assert decompressed(framed, "LZ4", len(data)) == data
    assert decompressed(block, "LZ4", len(data)) == data
    for stored, codec, size in ((block, "LZ4_RAW", len(data) - 1), (b"abc", "UNCOMPRESSED", 4)):
        with pytest.raises(ValueError, match="decompress"):  # to a size not its header's
            decompressed(stored, codec, size)
    with pytest.raises(ValueError, match="LZO"):  # no codec of Arrow's
        decompressed(block, "LZO", len(data))


def test_a_footer_claiming_many_rows_does_not_lower_what_one_row_may_hold(tmp_path):
    """The footer's row count is a claim: one cell of 2 M dictionary-encoded zeros (an RLE run:
    a tiny file) among 3 rows is refused unread whatever rows the footer says the group has."""
    cell = 2 * MiB
    ids = pa.ListArray.from_arrays(
        pa.array([0, cell, cell + 1, cell + 2], pa.int32()), pa.array([0] * (cell + 2))
    )
    path = tmp_path / "rle.parquet"
    pq.write_table(pa.table({"timestamp": [0, 1, 2], "ids": ids}), path, compression="zstd")
    data = path.read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_bytes
    # FileMetaData.num_rows, the timestamp chunk's num_values, RowGroup.num_rows: the rows
    # claimed, not the values (pages holding fewer values than claimed are refused first)
    parts = data[start:-8].split(b"\x16" + _zigzag(3))
    assert len(parts) == 4
    claimed, kept = b"\x16" + _zigzag(10**9), b"\x16" + _zigzag(3)
    footer = parts[0] + claimed + parts[1] + kept + parts[2] + claimed + parts[3]
    path.write_bytes(data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    with parquet_file(str(path), MiB) as (raw, parquet):
        assert parquet.metadata.row_group(0).num_rows == 10**9
        why = oversized_pages(raw, parquet.metadata, 0, MiB)
    assert why and f"rows of up to {cell + 1} values" in why  # the cell and its timestamp


def _zigzag(value: int) -> bytes:
    """A Thrift compact i64 not below 0: zigzag, then LEB128."""
    return _uleb(value << 1)


def _hybrid(runs: list[tuple[str, list[int]]], width: int) -> bytes:
    """Levels in Parquet's RLE / bit-packed hybrid: ("rle", [value, length]) or ("packed",
    levels), the last group of a packed run padded with zeros."""
    out = bytearray()
    for kind, run in runs:
        if kind == "rle":
            value, length = run
            out += _uleb(length << 1) + value.to_bytes((width + 7) // 8, "little")
        else:
            padded = np.zeros(-(-len(run) // 8) * 8, dtype=np.uint8)
            padded[: len(run)] = run
            bits = ((padded[:, None] >> np.arange(width)) & 1).astype(np.uint8).ravel()
            out += (
                _uleb((len(padded) // 8) << 1 | 1) + np.packbits(bits, bitorder="little").tobytes()
            )
    return bytes(out)


def _uleb(value: int) -> bytes:
    """An unsigned LEB128 integer."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(1, 3),
    runs=st.lists(
        st.one_of(
            st.tuples(st.just("rle"), st.tuples(st.integers(0, 1), st.integers(0, 5000))),
            st.tuples(st.just("packed"), st.lists(st.integers(0, 1), min_size=1, max_size=300)),
        ),
        min_size=1,
        max_size=40,
    ),
    cut=st.integers(0, 7),
)
def test_rows_are_counted_from_runs_as_from_the_levels_they_stand_for(width, runs, cut):
    """Against the levels written out one by one, however the runs are sliced for unpacking
    (slices of a few levels here) and with the page ending inside a packed run's last group:
    the rows started (a 0 each) and the levels between one start and the next."""
    # only a page's last run may end inside a group of 8 (its padding is not levels)
    runs = [
        (kind, list(r) + [1] * (-len(r) % 8 if kind == "packed" and i < len(runs) - 1 else 0))
        for i, (kind, r) in enumerate(runs)
    ]
    levels = np.concatenate(
        [np.full(r[1], r[0]) if kind == "rle" else np.array(r) for kind, r in runs]
    ).astype(np.int64)
    levels = levels[: max(len(levels) - cut, 0)]
    starts = np.flatnonzero(levels == 0)
    bounds = np.concatenate([[0], starts, [len(levels)]])
    rows = _RowCounter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_RowCounter, "_SLICE_LEVELS", 16)
        patch.setattr(_RowCounter, "_SLICE_RUNS", 3)
        rows.add(_hybrid(runs, width), width, len(levels))
    assert rows.rows == len(starts)
    assert rows.most_levels() == int(np.diff(bounds).max(initial=0))


def test_a_bit_packed_run_longer_than_a_slice_is_unpacked_in_pieces():
    """A run header may claim any number of groups: a long run is taken in pieces."""
    levels = np.ones(3_000_000, dtype=np.int64)
    levels[[0, 5, 1_999_999]] = 0
    rows = _RowCounter()
    rows.add(_hybrid([("packed", list(levels))], 1), 1, len(levels))
    assert (rows.rows, rows.most_levels()) == (3, 1_999_994)


@pytest.mark.parametrize("cell", [MiB // 2, MiB // 2 + 1])
def test_a_cell_is_refused_by_its_levels_exactly_when_its_json_must_be_over_the_bound(
    tmp_path, cell
):
    """A cell of L values is 2 L - 1 bytes of JSON at least (`0,0,...0`): refused unread
    from its levels exactly when that is over the bound, read (and sized) when it is not."""
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"ids": pa.array([[0] * cell], pa.list_(pa.int8()))}), path)
    assert len(json.dumps([0] * cell, separators=(",", ":"))) - 2 == 2 * cell - 1
    with parquet_file(str(path), MiB) as (raw, parquet):
        why = oversized_pages(raw, parquet.metadata, 0, MiB)
    assert (why is not None) == (2 * cell - 1 > MiB)


@pytest.mark.parametrize("version", [1, 2])
def test_a_page_claiming_more_bytes_than_its_file_holds_is_refused_before_a_read(tmp_path, version):
    """A header's compressed size (v1) or levels' length (v2) is a claim: 1 TiB of it is a
    ValueError, never a read (a Python read allocates what it is asked for)."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"ids": [[1, 2]]}), path)
    huge = 1 << 40
    page = Page(8, 2, 0, 4, huge, version, huge if version == 2 else 3)
    with parquet_file(str(path), MiB) as (raw, parquet):
        column = parquet.metadata.row_group(0).column(0)
        with pytest.raises(ValueError, match="past its file"):
            _repetition_levels(raw, column, page)
