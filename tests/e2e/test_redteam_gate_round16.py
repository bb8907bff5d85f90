"""Red team round 16, the gate (nothing private published, nothing lost): reproducers of what
the Parquet readers and `kvtrace audit` still let through after round 15 held every page,
index and bloom filter to what a decoder consumes. Each asserts the promised behaviour, so each
fails until it is fixed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from helpers import (
    CLEAN_CHAT_MS,
    MINUTE,
    SALT,
    STREAM_SALT,
    agent_log,
    anonymize,
    chat,
    message,
    parquet_footer,
    parquet_night,
    read_jsonl,
    run_stream,
    streaming_config,
    thrift_decode,
    thrift_encode,
    thrift_field,
    thrift_uvarint,
    trace,
    write_jsonl,
)

pytestmark = pytest.mark.slow


def _six_chats() -> tuple[bytes, list, tuple[int, int]]:
    """Six chats (at 0, 1000, ... ms, each with an integer column `zz` last) in two row groups
    of three, as pyarrow writes them; the footer decoded with row group 1 left out of its list
    (num_rows 3); and the bytes [start, end) row group 1's pages hold, right after row group
    0's `zz` chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    rows = [{**chat(i, 1_000 * i), "zz": 7} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buffer, 3)
    data = buffer.getvalue()
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1)
    chunks = [group.column(c) for c in range(group.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
    ends = [start + c.total_compressed_size for start, c in zip(starts, chunks)]
    footer, _ = parquet_footer(data)
    del thrift_field(footer, 4)[2][1][1]
    thrift_field(footer, 3)[2] = 3
    return data, footer, (min(starts), max(ends))


def _zz_metadata(footer: list) -> list:
    """Row group 0's `zz` chunk's ColumnMetaData (its fields), the last chunk of the group."""
    chunk = thrift_field(thrift_field(footer, 4)[2][1][0], 1)[2][1][-1]
    metadata = thrift_field(chunk, 3)[2]
    assert thrift_field(metadata, 3)[2][1] == [b"zz"]
    return metadata


def _lost_none(out: Path) -> bool:
    """Every chat of the night exported, or the damaged file letter-ed."""
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    return published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


def test_a_row_group_inside_a_page_headers_unknown_field_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """Nothing lost. Round 15 holds every page's payload to what its decoder consumes, but not
    its header: kvtrace's Thrift reader (paths._CompactReader, via _pages) skips a header's
    strings and fields the format does not define, as Arrow's does, and the whole header is
    counted as accounted for. Six chats in two row groups of three; row group 1's pages moved,
    byte for byte, into a binary field 15 of the dictionary page header of row group 0's last
    chunk (its sizes and data page offset grown to match), the footer listing row group 0
    alone: "4 read = 4 exported + 0 rejected", exit 0, no letter, three chats gone. A header
    must be the spec's fields, each string bounded by what the page's values make."""
    data, footer, (start, end) = _six_chats()
    metadata = _zz_metadata(footer)
    header_at = thrift_field(metadata, 11)[2]  # dictionary_page_offset: the chunk's first page
    assert header_at + thrift_field(metadata, 7)[2] == start  # the chunk ends where group 1 starts
    fields, header_end = thrift_decode(data, header_at)
    assert fields[-1][0] == 7  # dictionary_page_header: the header's last field
    hidden = data[start:end]
    extra = bytes([(15 - 7) << 4 | 8]) + thrift_uvarint(len(hidden)) + hidden  # after field 7
    body = data[:header_at] + data[header_at : header_end - 1] + extra + b"\0"
    body += data[header_end:start]
    for field in (6, 7, 9):  # total uncompressed and compressed sizes, data_page_offset
        thrift_field(metadata, field)[2] += len(extra)
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


def test_a_row_group_inside_a_bloom_filters_bitset_loses_none_silently(tiny_tokenizer, tmp_path):
    """The same cause in the bloom filter round 15 made parse as the spec's: its header is held
    to the one filter the spec defines and its length to the header's, but its bitset, any
    whole number of 32-byte blocks, is never held to the chunk's values. Row group 0's `zz`
    chunk names a bloom filter (ColumnMetaData fields 14, 15) at row group 1's place, whose
    bitset is row group 1's pages padded to 32 bytes, the footer listing row group 0 alone:
    exit 0, no letter, three chats gone. A bitset must be the one the chunk's values set, at
    the size its distinct values need."""
    data, footer, (start, end) = _six_chats()
    hidden = data[start:end]
    bitset = hidden + bytes(-len(hidden) % 32)
    header = thrift_encode([[1, 5, len(bitset)], *([n, 12, [[1, 12, []]]] for n in (2, 3, 4))])
    metadata = _zz_metadata(footer)
    metadata += [[14, 6, start], [15, 5, len(header) + len(bitset)]]
    metadata.sort(key=lambda field: field[0])
    body = data[:start] + header + bitset
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


DAY_MS = 86_400_000


def _agent_night(day: int, day_ms: int = DAY_MS) -> list[dict]:
    """The agent log (helpers.agent_log) `day` days (of day_ms) on, its sessions and response
    ids that day's own: nothing links one day's requests to another's."""
    night = []
    for record, _ in agent_log():
        record = json.loads(json.dumps(record))
        record["timestamp"] += day * day_ms
        if "session_id" in record:
            record["session_id"] += f"-{day}"
        if isinstance(record.get("response"), dict) and "id" in record["response"]:
            record["response"]["id"] += f"-{day}"
        night.append(record)
    return night


def test_nights_of_an_id_map_exported_together_link_no_row_to_another_nights(
    tiny_tokenizer, tmp_path, capsys
):
    """A row's parent is a request of its own night (PRIVACY.md: "an earlier one of the same
    night"), and nightly traces of an id map concatenate into one trace (NIGHTLY.md). But
    parent_row counts from each night's first row, and every trace reader concatenates the
    files it is given without offsetting it (read/trace_io.read_trace): two nights of one map,
    each the agent log with --emit-parents, exported together (`export N1 N2 --to
    dynamo-agentic`, exit 0) make night 2's subagent wait on night 1's first request, 24 h
    before (`"request_id": "r0", "delay_ms": 86400500, "relation": "spawn"`), its own
    parent (night 2's first row, r8) unnamed: each night's links land on the rows of the one
    before, silently, in every form that reads parent_row."""
    from kvtrace.cli import main

    (tmp_path / "salt").write_text(SALT)
    nights = []
    for day in (0, 1):
        log = write_jsonl(tmp_path / f"night-{day}.jsonl", _agent_night(day))
        out = tmp_path / f"out-{day}"
        extra = ("--block-size", "4", "--emit-parents", "--quiet")
        keyed = ("--salt-file", str(tmp_path / "salt"), "--id-map", str(tmp_path / "map"))
        assert anonymize(tiny_tokenizer, [log], out, *extra, *keyed) == 0
        nights.append(str(out))
    exported = tmp_path / "both.jsonl"
    assert main(["export", *nights, "--to", "dynamo-agentic", "-o", str(exported)]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in exported.read_text().splitlines()[1:]]
    first = len(agent_log())  # night 2's first request: r8, the parent of its tool result (r9)
    assert [d["request_id"] for d in rows[first + 1]["dependencies"]] == [f"r{first}"]


@pytest.mark.beam
def test_a_streams_windows_with_parents_concatenate_to_the_batch_output(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """The same cause in a stream (STREAMING.md: "with nothing late the windows concatenated
    are, byte for byte, the batch output of the same requests"): the stream publishes
    parent_row (its parse reads links once --emit-parents is given), each window numbering
    from its own first row. The agent log in the first minute's window and again, linked only
    within itself, in the second's: window 1's rows name parent_row 0, 1, 0, 0 and 5 where the
    batch run over the same requests names 8, 9, 8, 8 and 13 (and a reader of the windows
    together links the second minute's requests to the first's).

    Decided (STREAMING.md): with --emit-parents each window numbers its parents as a night of
    its own (a link to an earlier window is none), so the windows are the batch output but for
    parent_row; read together, each window's parents name its own rows (read_trace offsets
    them), which, where no link crosses a window as here, are the batch's."""
    import dataclasses

    from apache_beam.testing.test_stream import TestStream

    monkeypatch.setenv("KVTRACE_SALT", STREAM_SALT)
    records = [*_agent_night(0, MINUTE), *_agent_night(1, MINUTE)]
    config = streaming_config(tmp_path, tiny_tokenizer, idle_ms=3_600_000)
    parse = dataclasses.replace(config.job.parse, links=True)  # anonymize --emit-parents
    config = dataclasses.replace(config, job=dataclasses.replace(config.job, parse=parse))
    stream = TestStream().add_elements([message(r) for r in records])
    run_stream(config, stream.advance_watermark_to_infinity())
    windows = sorted(p for p in Path(config.job.output).iterdir() if p.is_dir())
    assert len(windows) == 2
    streamed = [row for window in windows for row in trace(window)]
    (tmp_path / "salt").write_text(STREAM_SALT)
    log = write_jsonl(tmp_path / "log.jsonl", records)
    batch = tmp_path / "batch"
    extra = ("--block-size", "4", "--emit-parents", "--quiet")
    assert (
        anonymize(tiny_tokenizer, [log], batch, *extra, "--salt-file", str(tmp_path / "salt")) == 0
    )
    capsys.readouterr()
    from kvtrace.transforms.read.trace_inputs import trace_files
    from kvtrace.transforms.read.trace_io import read_trace

    def unlinked(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "parent_row"} for row in rows]

    assert unlinked(streamed) == unlinked(trace(batch))
    together = read_trace(trace_files([str(window) for window in windows])).parents()
    assert together.tolist() == read_trace(trace_files([str(batch)])).parents().tolist()
    assert (together >= 0).sum() == 2 * sum("parent_row" in row for row in trace(windows[0]))
