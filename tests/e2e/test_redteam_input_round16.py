"""Red team round 16, hostile input: reproducers of the holes found past the round-1..15 fixes
(test_redteam_input*.py). Each asserts the promised behaviour (bad input: a one-line error or a
dead letter saying why, never a crash, a hang or memory that grows without bound; nothing lost:
read = exported + rejected) and fails today (2026-11-28)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from helpers import (
    CLEAN_CHAT_MS,
    anonymize,
    chat,
    parquet_footer,
    parquet_night,
    read_jsonl,
    thrift_decode,
    thrift_encode,
    thrift_field,
    thrift_uvarint,
    trace,
)

pytestmark = pytest.mark.slow


def _hidden_group(grow_page: object) -> tuple[list, bytes]:
    """Six chats with a last column `zz` ("a", "b", ...: dictionary-encoded, indices one bit
    each), uncompressed, in two row groups of three. Row group 1's bytes, which sit right after
    row group 0's `zz` chunk, are moved into one of that chunk's pages by grow_page(header,
    payload, hidden) -> payload, the page's header, the chunk's sizes and offsets grown to
    match; the footer lists row group 0 alone. The footer, decoded, and the body."""
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
    zz = metadata.row_group(0).column(later.num_columns - 1)
    page = zz.dictionary_page_offset if grow_page is _unindexed_entry else zz.data_page_offset
    header, payload_at = thrift_decode(data, page)
    end = payload_at + thrift_field(header, 3)[2]
    payload = grow_page(header, data[payload_at:end], hidden)
    for field in (2, 3):  # uncompressed_page_size, compressed_page_size
        thrift_field(header, field)[2] = len(payload)
    grown = thrift_encode(header) + payload
    body = data[:page] + grown + data[end:start]
    footer, _ = parquet_footer(data)
    groups = thrift_field(footer, 4)[2][1]
    del groups[1]
    thrift_field(footer, 3)[2] = 3  # num_rows, as the list now gives it
    column = thrift_field(thrift_field(groups[0], 1)[2][1][-1], 3)[2]
    assert thrift_field(column, 3)[2][1] == [b"zz"]
    moved = len(grown) - (end - page)
    for field in (6, 7):  # total_uncompressed_size, total_compressed_size
        thrift_field(column, field)[2] += moved
    if page == zz.dictionary_page_offset:
        thrift_field(column, 9)[2] += moved  # data_page_offset, after the dictionary
    return footer, body


def _past_the_values(header: list, payload: bytes, hidden: bytes) -> bytes:
    """The data page's indices (0, 1, 0: one bit-packed group of 8) as one bit-packed run
    claiming a group more for each hidden byte: the hidden bytes are its groups' bits."""
    levels = 4 + int.from_bytes(payload[:4], "little")  # definition levels, their length first
    groups = 1 + len(hidden)
    return payload[:levels] + b"\x01" + thrift_uvarint(groups << 1 | 1) + b"\x02" + hidden


def _unindexed_entry(header: list, payload: bytes, hidden: bytes) -> bytes:
    """The dictionary page's entries ("a", "b", PLAIN) and a third that no index names: the
    hidden bytes, as one byte array."""
    thrift_field(thrift_field(header, 7)[2], 1)[2] += 1  # num_values
    return payload + len(hidden).to_bytes(4, "little") + hidden


def _in_page_statistics(header: list, payload: bytes, hidden: bytes) -> bytes:
    """The data page unchanged, its header given statistics (DataPageHeader field 5) whose
    max_value (Statistics field 6) is the hidden bytes."""
    thrift_field(header, 5)[2].append([5, 12, [[6, 8, hidden]]])
    return payload


def _lost_none(out: Path) -> bool:
    """Every chat of the night exported, or the damaged file letter-ed."""
    letters = Path(f"{out}-rejected").glob("rejected-*.jsonl")
    errors = {record["error"] for path in letters for record in read_jsonl(path)}
    published = sorted(row["timestamp"] for row in trace(out))
    return published == [*(1_000 * i for i in range(6)), CLEAN_CHAT_MS] or "damaged_file" in errors


def test_a_row_group_inside_a_bit_packed_run_past_its_values_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """Nothing lost. Round 15 counts a page's bytes as accounted for once its values decode to
    its end (paths._check_payload -> parquet_payload.values_end -> hybrid_end). hybrid_end
    takes a bit-packed run's group count as written and moves past all its groups, however
    many more than the values it still owes: a dictionary page's indices for 3 values written
    as one run of 1 + N groups (1 bit each) carry N bytes no decoder reads (Arrow stops at the
    page's 3 values). Row group 1 (three chats) left out of the footer and moved into that
    run: "4 read = 4 exported + 0 rejected", exit 0, no letter, three chats gone. A run must
    end with the values it owes (its last group the one holding the last value, the padding
    bits zero); definition levels go through the same walk."""
    footer, body = _hidden_group(_past_the_values)
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


@pytest.mark.xfail(strict=True, reason="accepted residual: docs/BOUNDS.md")
def test_a_row_group_inside_a_dictionary_entry_no_index_names_loses_none_silently(
    tiny_tokenizer, tmp_path
):
    """The same hole by the dictionary page: its entries are walked to their end (values_end
    with the page's count), but nothing holds them to what the indices name. Row group 1
    moved into a third entry, one byte array, of row group 0's `zz` dictionary (whose indices
    name entries 0 and 1 only): exit 0, no letter, three chats gone. Round 17 accepts entries
    no index names (real writers keep unused categories: a pandas categorical, a polars or
    DuckDB enum; telling them from a hidden row group is not cheap), so this crafted file
    still loses its group unweighed. Kept as a strict xfail, not turned into an assertion of
    the bound: the promise it states is still broken here, and the mark says so honestly
    (an XPASS flags a later fix)."""
    footer, body = _hidden_group(_unindexed_entry)
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


def test_a_row_group_inside_a_page_headers_statistics_loses_none_silently(tiny_tokenizer, tmp_path):
    """Nothing lost, by the page header: paths._page_header reads a header with
    _CompactReader, which skips every string (and any field the format does not define) up
    to MAX_PAGE_HEADER_BYTES (1 MiB), and the header's bytes count as the chunk's. Row group
    1 moved into the max_value of statistics given to row group 0's `zz` data page header
    (Arrow never reads a page header's statistics): exit 0, no letter, three chats gone. A
    page header must be read as exactly the fields the format defines, its statistics held
    to its page's values (one value's bytes at most), as the column index's already are."""
    footer, body = _hidden_group(_in_page_statistics)
    assert _lost_none(parquet_night(tiny_tokenizer, tmp_path, footer, body))


def test_a_list_response_wrapping_a_log_beside_it_weighs_its_bytes(tiny_tokenizer, tmp_path):
    """Round 15 made a line that decodes to no object (a JSON array of records) weigh its bytes
    in --max-rejected-fraction (sources.StoredLine). The same records wrapped in an object, as
    a list endpoint returns them (`{"object": "list", "data": [...]}`), are one no_input letter
    weighing one record: 10 good lines and a 400 KB line of 2,000 requests are "11 read = 10
    exported + 1 rejected", and the night publishes 10 of 2,010 requests, exit 0, the letter
    keeping the line's first 256 KiB. Whether a line's bytes became no record cannot hang on
    the JSON type they decode to: a letter must weigh the bytes it stands for."""
    good = [json.dumps(chat(i, 1_000 * i)) for i in range(10)]
    wrapped = {"object": "list", "data": [chat(i, 1_000 * i + 500) for i in range(2_000)]}
    source = tmp_path / "log.jsonl"
    source.write_text("\n".join(good) + "\n" + json.dumps(wrapped) + "\n")
    out = tmp_path / "out"
    code = anonymize(tiny_tokenizer, [source], out, "--quiet")
    assert code != 0 and not (out / "manifest.json").exists()
