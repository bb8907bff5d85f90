"""Read Mooncake traces (JSONL, .gz/.zst, Parquet) into columns, noting every malformed line.

The fast path is pyarrow's multithreaded JSON reader, given blocks of whole lines each within
the line reader's pre-parse rule and asked for the trace fields only; a file it cannot read
whole (a malformed line somewhere) is read again line by line, so each bad line is reported
with its number and every good line is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.json as pa_json

from kvtrace.transforms.read.json_tree import containers_over
from kvtrace.transforms.read.paths import (
    PARQUET_SUFFIXES,
    NumberedLines,
    Oversized,
    broken_off,
    decoded_type,
    open_stream,
    python_values,
    read_lines,
    read_parquet_within,
)
from kvtrace.transforms.read.trace_inputs import (
    NotWholeOutput,
    PublishedFolder,
    pin_of,
    published_shards,
)
from kvtrace.transforms.trace_format import (
    HASH_IDS_FIELD,
    INPUT_LENGTH_FIELD,
    MAX_OUTPUT_LENGTH,
    MAX_RESPONSE_MS,
    MAX_TRACE_LINE_BYTES,
    NO_PARENT,
    NO_RESPONSE_MS,
    OUTPUT_IDS_FIELD,
    OUTPUT_LENGTH_FIELD,
    PARENT_FIELD,
    RESPONSE_FIELD,
    ROW_FIELDS,
    SESSION_FIELD,
    TIMESTAMP_FIELD,
)

READ_BLOCK_BYTES = 1 << 20  # JSON parsed per block: 1 MiB keeps the reader's peak low at full speed
# The largest value each numeric field (hash_ids: each id) may hold. The readers take other
# Mooncake traces too (epoch-millisecond times, 64-bit ids), so the bounds are what the reader's
# int64 arrays and date arithmetic hold, not the tighter ones kvtrace publishes (the gate checks
# those): a time within ~140 years of the epoch either way, a length or id below 2^63. A row
# holding more is malformed, whatever wrote it. Times may be fractional or negative (validate
# reports a negative one).
MAX_READ_TIMESTAMP_MS = 1 << 42
MAX_READ_INT = (1 << 63) - 1
HIGHEST = {
    TIMESTAMP_FIELD: MAX_READ_TIMESTAMP_MS,
    INPUT_LENGTH_FIELD: MAX_READ_INT,
    OUTPUT_LENGTH_FIELD: MAX_OUTPUT_LENGTH,
    RESPONSE_FIELD: MAX_RESPONSE_MS,
    HASH_IDS_FIELD: MAX_READ_INT,
    PARENT_FIELD: MAX_READ_INT,  # a row number; whether it precedes its row: Trace.parents
}
# Fields a row may leave null, read as absent.
NULLABLE = (RESPONSE_FIELD, PARENT_FIELD)
# A line is read up to MAX_TRACE_LINE_BYTES (trace_format: the longest row kvtrace writes); a
# longer one is malformed, skipped without being held.
MAX_REPORTED_LINES = 1000  # malformed lines listed in the report; the count is always exact
# kvtrace publishes conversations as `session` (trace_format.SESSION_FIELD); other traces use
# session_id.
SESSION_FIELDS = (SESSION_FIELD, "session_id")
READ_FIELDS = (*ROW_FIELDS, RESPONSE_FIELD, PARENT_FIELD, *SESSION_FIELDS)
# A row's JSON containers, as kvtrace writes it: its object and its lists of ids (every other
# field a number or a name). A line of more is malformed, found before it is parsed
# (json_tree.containers_over): parsed, 16 MiB of `[],` is ~350 MB of Python lists.
ROW_LISTS = (HASH_IDS_FIELD, OUTPUT_IDS_FIELD)
MAX_ROW_CONTAINERS = 1 + len(ROW_LISTS)


@dataclass
class Trace:
    """A trace as columns, rows in file order (files in the order given, then line order)."""

    timestamp: np.ndarray  # float64 ms (published traces use integers; floats are allowed)
    input_length: np.ndarray  # int64
    output_length: np.ndarray  # int64
    offsets: np.ndarray  # int64, len rows + 1: row r's ids are ids[offsets[r]:offsets[r + 1]]
    ids: np.ndarray  # int32 when every id fits, else int64
    session: np.ndarray | None  # object array of session ids (None where absent), or None
    line: np.ndarray  # int64: 1-based line (or Parquet row) number within its file
    file_index: np.ndarray  # int32: index into files
    files: list[str] = field(default_factory=list)
    malformed: list[dict] = field(default_factory=list)  # {"file", "line", "error"}
    malformed_count: int = 0
    # int64: ms from arrival to the response's end (NO_RESPONSE_MS where unsaid), or None: none
    response_ms: np.ndarray | None = None
    # int64: the row number (in this order) of the row's parent (NO_PARENT where none), or None
    parent: np.ndarray | None = None
    # Why the parents cannot be used (a parent_row naming no earlier row of its own trace), or
    # None: said when they are (parents), so a command that reads no parent reads the trace.
    parent_error: str | None = None

    def __len__(self) -> int:
        return len(self.input_length)

    def parents(self) -> np.ndarray:
        """Each row's parent row, NO_PARENT where none; ValueError (one line) when a parent does
        not precede its row in its own trace, as kvtrace writes it (a foreign trace's, or rows
        read out of their folder's order)."""
        if self.parent_error is not None:
            raise ValueError(self.parent_error)
        if self.parent is None:
            return np.full(len(self), NO_PARENT, dtype=np.int64)
        return self.parent

    def response_ends(self) -> np.ndarray:
        if self.response_ms is None:
            return np.full(len(self), NO_RESPONSE_MS, dtype=np.int64)
        return self.response_ms

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def read_trace(files: Sequence[str]) -> Trace:
    """The files' rows; a shard of a kvtrace output folder only as its manifest lists it
    (NotWholeOutput if not: trace_inputs), through the folder as pinned: when the trace files
    were listed (a PinnedPath's), else here, each folder once."""
    opened = published_shards(files)
    published = {**opened, **{path: pin for path in files if (pin := pin_of(path)) is not None}}
    parts, rows = [], {}
    try:
        for index, path in enumerate(files):
            for part in _read_file(path, published.get(path)):
                part["file_index"] = np.full(len(part[INPUT_LENGTH_FIELD]), index, dtype=np.int32)
                parts.append(part)
                rows[path] = rows.get(path, 0) + len(part[INPUT_LENGTH_FIELD])
    finally:
        for folder in set(opened.values()):  # a pin from trace_files is its holder's to close
            folder.close()
    _check_exported(published, rows)
    malformed = [m for p in parts for m in p["malformed"]]
    sessions = [p[SESSION_FIELD] for p in parts]
    has_sessions = any(s is not None for s in sessions)
    lengths = np.concatenate([np.diff(p["offsets"]) for p in parts]) if parts else np.zeros(0)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    file_index, line = _cat(parts, "file_index", np.int32), _cat(parts, "line", np.int64)
    # A parent_row counts from its own trace's first row: a kvtrace output's (its first
    # shard's), else its file's.
    traces: dict[str | int, int] = {}
    own = [
        traces.setdefault(pin.token if (pin := published.get(f)) is not None else i, len(traces))
        for i, f in enumerate(files)
    ]
    parent, wrong = _own_rows(
        _cat(parts, PARENT_FIELD, np.int64),
        np.asarray(own, np.int64)[file_index],
        np.isin(file_index, _out_of_place(files, published)),
    )
    parent_error = (
        None
        if wrong is None
        else f"row {wrong}'s {PARENT_FIELD} {int(parent[wrong])} does not precede it in its "
        f"own trace ({files[file_index[wrong]]} line {line[wrong]}; a kvtrace output's rows "
        f"count from its first shard's first, read in order, another file's from its first)"
    )
    return Trace(
        timestamp=_cat(parts, TIMESTAMP_FIELD, np.float64),
        input_length=_cat(parts, INPUT_LENGTH_FIELD, np.int64),
        output_length=_cat(parts, OUTPUT_LENGTH_FIELD, np.int64),
        offsets=offsets,
        ids=_cat(parts, "ids", _id_dtype(parts)),
        session=np.concatenate(
            [
                s if s is not None else np.full(len(p[INPUT_LENGTH_FIELD]), None, dtype=object)
                for s, p in zip(sessions, parts)
            ]
        )
        if has_sessions
        else None,
        response_ms=_cat(parts, RESPONSE_FIELD, np.int64),
        parent=parent,
        parent_error=parent_error,
        line=line,
        file_index=file_index,
        files=list(files),
        malformed=malformed[:MAX_REPORTED_LINES],
        malformed_count=len(malformed),
    )


def _out_of_place(files: Sequence[str], published: dict[str, PublishedFolder]) -> list[int]:
    """The files (indices) that are shards of a kvtrace output read after a gap in its shards or
    out of their order: their rows' numbers in their output are not known from what is read."""
    read: dict[str, list[int]] = {}
    for index, path in enumerate(files):
        if (pin := published.get(path)) is not None:
            read.setdefault(pin.token, []).append(index)
    out: list[int] = []
    for indices in read.values():
        shards = sorted(s.rsplit(".", 1)[0] for s in published[files[indices[0]]].shards)
        for k, index in enumerate(indices):
            if k >= len(shards) or posixpath.basename(files[index]).rsplit(".", 1)[0] != shards[k]:
                out += indices[k:]  # each shard after it is out of place too
                break
    return out


def _own_rows(
    parent: np.ndarray, trace: np.ndarray, unplaced: np.ndarray
) -> tuple[np.ndarray, int | None]:
    """(each row's parent, given as a row of the row's own trace (trace[r]: which), as a row of
    this read, NO_PARENT where none; the first row whose parent is not an earlier row of its
    own trace, or whose own place in it is not known (unplaced), or None): so a parent never
    names a row of another trace read with it. The row refused keeps its parent as given."""
    linked = np.flatnonzero(parent != NO_PARENT)
    if not len(linked):
        return parent, None
    lost = linked[unplaced[linked]]
    order = np.argsort(trace, kind="stable")  # each trace's rows together, in read order
    ranked = trace[order]
    cut = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
    first = np.empty(len(trace), dtype=np.int64)  # where the row's trace starts in order
    first[order] = np.repeat(cut, np.diff(np.append(cut, len(trace))))
    place = np.empty(len(trace), dtype=np.int64)
    place[order] = np.arange(len(trace))
    given = parent[linked]
    wrong = np.union1d(linked[given >= place[linked] - first[linked]], lost)
    if len(wrong):
        return parent, int(wrong[0])
    mapped = parent.copy()
    mapped[linked] = order[first[linked] + given]
    return mapped, None


def _id_dtype(parts: list[dict]) -> type:
    """int32 when every id fits (published traces' ids are dense from 0): half the memory."""
    largest = max((int(np.max(p["ids"])) for p in parts if len(p["ids"])), default=0)
    return np.int32 if largest < 2**31 else np.int64


def _cat(parts: list[dict], name: str, dtype) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([np.asarray(p[name], dtype=dtype) for p in parts])


def _check_exported(published: dict[str, PublishedFolder], rows: dict[str, int]) -> None:
    """A whole folder read (each shard it lists, by one twin or the other): its rows are the
    records its manifest says were exported."""
    for folder in set(published.values()):
        read = {
            posixpath.basename(p).rsplit(".", 1)[0]: n
            for p, n in rows.items()
            if published.get(p) is folder
        }
        if {s.rsplit(".", 1)[0] for s in folder.shards} <= set(read) and sum(
            read.values()
        ) != folder.exported:
            raise NotWholeOutput(
                folder.folder,
                f"its shards hold {sum(read.values())} rows, its manifest says {folder.exported}",
            )


def _read_file(path: str, published: PublishedFolder | None = None) -> list[dict]:
    """Column parts of one file, in line order; a shard of a published folder only from bytes
    that are the ones the folder's manifest lists, read through the folder as opened with it."""
    if published is not None:
        return _read_shard(path, published)
    if path.lower().endswith(PARQUET_SUFFIXES):
        return [_read_parquet(path)]
    with open_stream(path) as stream:
        parts = _read_jsonl_streamed(stream, path)
    return [_read_jsonl_lines(path)] if parts is None else parts


def _read_shard(path: str, published: PublishedFolder) -> list[dict]:
    """A published shard (plain JSONL or Parquet, by kvtrace's names) from one open of it: a
    publish that replaces it meanwhile is not read."""
    with published.open(posixpath.basename(path)) as raw:
        if path.lower().endswith(PARQUET_SUFFIXES):
            # Read by seeking (footer first), so held whole (it is one shard, as large as the
            # descriptor says) and parsed from the very bytes hashed.
            data = (
                raw.read()
                if published.identity is None
                else raw.read(os.fstat(raw.fileno()).st_size + 1)
            )  # a file growing meanwhile differs
            published.check(path, _sha256_of(data))
            return [_read_parquet(path, pa.BufferReader(data))]
        parts = _read_jsonl_streamed(raw, path, published)
        if parts is not None:
            return parts
        raw.seek(0)  # read again line by line, through the same open, hashed again
        tally = _Tally(raw, hashed=True)
        part = _read_jsonl_lines(path, _numbered(read_lines(tally, 0, None, MAX_TRACE_LINE_BYTES)))
        tally.drain()
    published.check(path, tally.sha256())
    return [part]


def _sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _numbered(
    lines: Iterable[tuple[int, bytes | Oversized]],
) -> Iterable[tuple[int, bytes | Oversized]]:
    """(1-based line number, line) of read_lines' (offset, line)."""
    return ((number, line) for number, (_, line) in enumerate(lines, 1))


def _read_jsonl_lines(
    path: str, numbered: Iterable[tuple[int, bytes | Oversized]] | None = None
) -> dict:
    """The file's columns, line by line (numbered: those lines, of a plain file already open):
    each bad line, overlong line or break reported."""
    lines = NumberedLines(path, MAX_TRACE_LINE_BYTES) if numbered is None else numbered
    overlong: list[dict] = []
    part = _columns_from_rows(_within_bound(lines, path, overlong), path)
    part["malformed"] += overlong
    part["malformed"].sort(key=lambda m: m["line"])
    if isinstance(lines, NumberedLines) and lines.broken:
        part["malformed"].append(
            {
                "file": path,
                "line": lines.lines_read + 1,
                "error": f"the file breaks off: {lines.broken}",
            }
        )
    return part


def _within_bound(
    lines: Iterable[tuple[int, bytes | Oversized]], path: str, overlong: list[dict]
) -> Iterable[tuple[int, bytes]]:
    for number, line in lines:
        if isinstance(line, Oversized):
            overlong.append(
                {
                    "file": path,
                    "line": number,
                    "error": f"line of {line.size} bytes, over {MAX_TRACE_LINE_BYTES}: skipped",
                }
            )
        elif line.strip():
            yield number, line


def _read_parquet(path: str, opened: IO[bytes] | None = None) -> dict:
    """A Parquet trace (opened: read from it) with the checks a JSONL one gets: columns as they
    are when well typed, else row by row, each bad row reported by its number. A file without
    an input_length column, every row of which would lack it, is refused whole, unread."""
    try:
        table, numbers, oversized = read_parquet_within(
            path, MAX_TRACE_LINE_BYTES, READ_FIELDS, opened, required=(INPUT_LENGTH_FIELD,)
        )
    except (OSError, ValueError, pa.ArrowException) as err:
        return _columns_from_rows(
            [], path, [{"file": path, "line": 0, "error": f"not a readable Parquet file ({err})"}]
        )
    unread = [{"file": path, "line": int(row), "error": why} for row, why in oversized]
    if _well_typed(table):
        return _columns_from_table(table, path, numbers, unread)
    return _columns_from_rows(zip(numbers.tolist(), _parquet_rows(table)), path, unread)


class _Unread:
    """A Parquet value of a type no trace field holds (a date, a decimal, a map), left
    unconverted: Python may not hold it (a date past year 9999), and _row refuses it as a value
    of no field's kind."""


def _parquet_rows(table: pa.Table) -> list[dict]:
    """Each row's fields (the columns a trace row is read from), as Python values where the
    column's type is one the field may hold (_readable), else _Unread."""
    columns = {}
    for name in table.schema.names:
        if name in READ_FIELDS:
            column = table[name]
            readable = _readable(name, decoded_type(column.type))
            columns[name] = (
                python_values(column)
                if readable
                else [
                    None if value is None else _Unread() for value in column.is_valid().to_pylist()
                ]
            )
    return [
        {name: values[row] for name, values in columns.items()} for row in range(table.num_rows)
    ]


def _readable(name: str, type: pa.DataType) -> bool:
    """Whether a Parquet column's type is one its field's values may have (what _row then checks
    value by value); sessions may be nested (read as their JSON text) of such types."""
    if pa.types.is_null(type) or pa.types.is_integer(type):
        return True
    if name == TIMESTAMP_FIELD:
        return pa.types.is_floating(type)
    lists = (
        pa.types.is_list(type) or pa.types.is_large_list(type) or pa.types.is_fixed_size_list(type)
    )  # as other Parquet writers (polars) write them
    if name == HASH_IDS_FIELD:
        return lists and _readable("", type.value_type)
    if name in SESSION_FIELDS:
        return (
            pa.types.is_string(type)
            or pa.types.is_large_string(type)
            or pa.types.is_floating(type)
            or pa.types.is_boolean(type)
            or (lists and _readable(name, type.value_type))
            or (pa.types.is_struct(type) and all(_readable(name, field.type) for field in type))
        )
    return False


class _Tally:
    """A stream's bytes counted (lines) and, when asked, hashed as the reader takes them: one
    pass checks both the row count and a published shard's sha256."""

    def __init__(self, stream: IO[bytes], hashed: bool):
        self._stream = stream
        self._sha256 = hashlib.sha256() if hashed else None
        self.newlines, self._last = 0, b"\n"

    def read(self, size: int = -1) -> bytes:
        return self._counted(self._stream.read(size))

    def _counted(self, data: bytes) -> bytes:
        if data:
            self.newlines += data.count(b"\n")
            self._last = data[-1:]
            if self._sha256 is not None:
                self._sha256.update(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        return self._counted(self._stream.readline(size))

    @property
    def closed(self) -> bool:
        return self._stream.closed

    @property
    def lines(self) -> int:
        """As paths.count_lines counts them: a last line without a newline included."""
        return self.newlines + (self._last != b"\n")

    def drain(self) -> None:
        while self.read(READ_BLOCK_BYTES):
            pass

    def sha256(self) -> str | None:
        return self._sha256.hexdigest() if self._sha256 is not None else None


def _read_jsonl_streamed(
    stream: IO[bytes], path: str, published: PublishedFolder | None = None
) -> list[dict] | None:
    """The stream's columns (open_stream's, or a published shard's), streamed through pyarrow's
    JSON reader in blocks (memory stays near the size of the columns); None when any line is
    blank, malformed or ill-typed, since pyarrow skips blank lines and accepts any JSON types.
    The caller then reads it line by line. With published, the bytes are checked against the
    manifest once read, before any row is used."""
    tally = _Tally(stream, hashed=published is not None)
    parts = _streamed_columns(tally, path)
    if parts is not None or published is not None:  # to its end: its count, its hash
        tally.drain()
    broken = broken_off(stream)
    if published is not None:
        published.check(path, tally.sha256())
    if parts is None or broken or sum(p["line"].size for p in parts) != tally.lines:
        return None
    return parts


def _streamed_columns(stream: _Tally, path: str) -> list[dict] | None:
    """The stream's columns, block by block (_screened_blocks), pyarrow asked for the trace
    fields only; None (read line by line) at the first block it cannot read as columns."""
    parts, rows, schemas, session_names = [], 0, list(_READ_SCHEMAS), set()
    for block in _screened_blocks(stream):
        table = None if block is None else _parsed_block(block, schemas)
        if table is None or not _well_typed(table):
            return None
        session_names.add(next((n for n in SESSION_FIELDS if n in table.column_names), None))
        parts.append(
            _columns_from_table(table, path, np.arange(rows + 1, rows + table.num_rows + 1), [])
        )
        rows += table.num_rows
    # A file's session field is the first one any of its rows names (as read line by line):
    # blocks naming different ones are read line by line; so is a file of no rows (one part).
    return parts if parts and len(session_names - {None}) <= 1 else None


def _screened_blocks(stream: _Tally) -> Iterator[bytes | None]:
    """The stream in blocks of whole lines, each line checked by the line reader's pre-parse
    rule (json_tree.containers_over, MAX_ROW_CONTAINERS) before pyarrow sees it: pyarrow's JSON
    parser recurses natively on nesting (a 40 KB line 20,000 deep overflows the stack) and takes
    time quadratic in it. None, and no more, at a line outside the rule, longer than a block, or
    that json.loads may refuse where pyarrow would not (_json_loads_may_read): the file is then
    read line by line, which decides each line."""
    rest = b""
    while True:
        data = stream.read(READ_BLOCK_BYTES)
        chunk = rest + data
        end = chunk.rfind(b"\n") + 1 if data else len(chunk)
        block, rest = chunk[:end], chunk[end:]
        if len(rest) > READ_BLOCK_BYTES or not (
            _lines_within_rule(block) and _json_loads_may_read(block)
        ):
            yield None
            return
        if block:
            yield block
        if not data:
            return


def _lines_within_rule(block: bytes) -> bool:
    """Whether no line of a block holds more than MAX_ROW_CONTAINERS containers, as
    json_tree.containers_over counts them. Its first count (brackets, strings included) is made
    here for the whole block at numpy speed, so only a line over it is handed to it. Line by line
    it cost as much as half pyarrow's parse on short rows (63 MiB of 37-byte rows: 1.1 s of CPU,
    0.25 s so; the parse 1.9 s)."""
    data = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    brackets = np.flatnonzero((data == ord("[")) | (data == ord("{")))
    per_line = np.bincount(np.searchsorted(ends, brackets), minlength=len(ends) + 1)
    starts = np.concatenate(([0], ends + 1))
    ends = np.append(ends, len(block))
    return all(
        containers_over(block[starts[line] : ends[line]], MAX_ROW_CONTAINERS) is None
        for line in np.flatnonzero(per_line > MAX_ROW_CONTAINERS).tolist()
    )


def _json_loads_may_read(block: bytes) -> bool:
    """Whether the block holds none of the bytes the line reader's json.loads refuses and pyarrow
    skips unchecked in a field it is not asked for (or keeps, in a session): invalid UTF-8, and
    an integer longer than Python's limit (sys.get_int_max_str_digits). Each line is then one
    the line reader would read alike. Stricter than json.loads where it costs nothing to be (a
    UTF-8 surrogate, a long run of digits in a string): such a block is read line by line."""
    try:
        block.decode()  # strict UTF-8, ~5 GB/s on ASCII: 12 ms of a 68 MB trace's 1 s read
    except UnicodeDecodeError:
        return False
    limit = sys.get_int_max_str_digits()  # 0: no limit
    return not limit or not _digit_run_over(np.frombuffer(block, np.uint8), limit)


def _digit_run_over(data: np.ndarray, limit: int) -> bool:
    """Whether a run of ASCII digits in data is longer than limit. Such a run covers a whole
    aligned chunk of limit // 3 bytes (its partial first and last chunks and the data's
    unchunked tail are each shorter), so runs are measured exactly (a position per non-digit:
    4 ms a MiB) only in a block holding an all-digit chunk (the chunks: 14 ms of a 68 MB trace)."""
    digits = (data - ord("0")) < 10  # uint8 wraps below "0"
    chunk = limit // 3
    whole = len(data) // chunk * chunk
    if not digits[:whole].reshape(-1, chunk).all(axis=1).any():
        return False
    breaks = np.concatenate(([-1], np.flatnonzero(~digits), [len(data)]))
    return int(np.diff(breaks).max()) - 1 > limit


def _read_schema(session: pa.DataType) -> pa.Schema:
    """The trace fields as pyarrow is asked for them: any other field of a row is skipped as it
    is parsed, never a column (a row of 90,000 extra fields made 90,000 columns)."""
    return pa.schema(
        [
            (TIMESTAMP_FIELD, pa.float64()),
            (INPUT_LENGTH_FIELD, pa.int64()),
            (OUTPUT_LENGTH_FIELD, pa.int64()),
            (HASH_IDS_FIELD, pa.list_(pa.int64())),
            (RESPONSE_FIELD, pa.int64()),
            (PARENT_FIELD, pa.int64()),
            *((name, session) for name in SESSION_FIELDS),
        ]
    )


# Sessions are numbers (kvtrace's) or names; pyarrow converts no number to a string.
_READ_SCHEMAS = (_read_schema(pa.int64()), _read_schema(pa.string()))
# A field named as a key: its quoted name and a colon (in valid JSON without escapes, only a
# key is).
_NAMED = {name: re.compile(rb'"%s"\s*:' % name.encode()) for name in READ_FIELDS}


def _parsed_block(block: bytes, schemas: list[pa.Schema]) -> pa.Table | None:
    """A block's trace fields, by the first of schemas that reads them (moved first, for the
    next block), without the fields no row names; None if no schema reads them."""
    for schema in list(schemas):
        try:
            table = pa_json.read_json(
                pa.BufferReader(block),
                read_options=pa_json.ReadOptions(block_size=len(block)),  # whole: no split line
                parse_options=pa_json.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior="ignore"
                ),
                memory_pool=pa.system_memory_pool(),  # returns freed blocks to the OS at once
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue
        schemas.remove(schema)
        schemas.insert(0, schema)
        return _named_only(table, block)
    return None


def _named_only(table: pa.Table, block: bytes) -> pa.Table | None:
    """The table without the columns of fields no row of the block names: pyarrow gives each
    field of the schema a column, null where a row lacks it, and an absent field is not a null
    one (output_length: 0, or malformed; a session field: the file's, or none)."""
    nulls = [name for name in table.column_names if table[name].null_count == table.num_rows]
    if nulls and b"\\" in block:
        return None  # an escape may spell a name (or a quote in a key seem to): line by line
    return table.drop_columns([name for name in nulls if not _NAMED[name].search(block)])


def _well_typed(table: pa.Table | pa.RecordBatch) -> bool:
    names = set(table.schema.names)
    if INPUT_LENGTH_FIELD not in names:
        return False
    for name in HIGHEST:  # a null time or length is read row by row; a null response is none
        if name in names and not _column_fits(name, table[name], nulls=name in NULLABLE):
            return False
    for name in SESSION_FIELDS:  # sessions are names or numbers; anything else, line by line
        if name in names and not (
            pa.types.is_string(decoded_type(table[name].type))
            or pa.types.is_integer(table[name].type)
            or pa.types.is_null(table[name].type)
        ):
            return False
    return True


def _column_fits(name: str, column: pa.Array | pa.ChunkedArray, nulls: bool) -> bool:
    """Whether every value of a column is one its field may hold (_fits, column-wise)."""
    if name == HASH_IDS_FIELD:
        if not (pa.types.is_list(column.type) and pa.types.is_integer(column.type.value_type)):
            return False
        column, nulls = pa.compute.list_flatten(column), False
    if not (
        pa.types.is_integer(column.type)
        or (name == TIMESTAMP_FIELD and pa.types.is_floating(column.type))
    ):
        return False
    if (column.null_count and not nulls) or (
        pa.types.is_floating(column.type) and pa.compute.any(pa.compute.is_nan(column)).as_py()
    ):
        return False  # min_max skips NaN
    bounds = pa.compute.min_max(column).as_py()
    return bounds["min"] is None or (
        _lowest(name) <= bounds["min"] and bounds["max"] <= HIGHEST[name]
    )


def _fits(name: str, value: object) -> bool:
    """Whether a value is one a trace field may hold: an integer (a time may be a fraction) in
    the field's range (NaN is in none)."""
    kinds = (int, float) if name == TIMESTAMP_FIELD else (int,)
    return type(value) in kinds and _lowest(name) <= value <= HIGHEST[name]


def _lowest(name: str) -> int:
    return -HIGHEST[name] if name == TIMESTAMP_FIELD else 0


def _columns_from_table(
    table: pa.Table | pa.RecordBatch, path: str, lines: np.ndarray, malformed: list
) -> dict:
    names = set(table.schema.names)
    if INPUT_LENGTH_FIELD not in names:
        raise ValueError(f"{path}: no {INPUT_LENGTH_FIELD} column")
    ids = _whole(table[HASH_IDS_FIELD]) if HASH_IDS_FIELD in names else None
    if ids is None:
        offsets, values = np.zeros(table.num_rows + 1, np.int64), np.zeros(0, np.int64)
    else:
        ids = ids.fill_null([]) if ids.null_count else ids
        offsets = as_numpy(ids.offsets).astype(np.int64)
        values = as_numpy(ids.values)[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
        if len(values) and values.max() < 2**31:  # as most traces: half the memory
            values = values.astype(np.int32)
    column = lambda name, default: (  # noqa: E731
        np.full(table.num_rows, default)
        if name not in names
        else as_numpy(table[name].fill_null(default) if table[name].null_count else table[name])
    )
    session_name = next((n for n in SESSION_FIELDS if n in names), None)
    session = None
    if session_name:
        session = np.empty(table.num_rows, dtype=object)
        session[:] = [_scalar_session(v) for v in python_values(table[session_name])]
    return {
        TIMESTAMP_FIELD: column(TIMESTAMP_FIELD, 0),
        INPUT_LENGTH_FIELD: column(INPUT_LENGTH_FIELD, 0),
        OUTPUT_LENGTH_FIELD: column(OUTPUT_LENGTH_FIELD, 0),
        "offsets": offsets,
        "ids": values,
        SESSION_FIELD: session,
        RESPONSE_FIELD: column(RESPONSE_FIELD, NO_RESPONSE_MS),
        PARENT_FIELD: column(PARENT_FIELD, NO_PARENT),
        "line": lines,
        "malformed": malformed,
    }


# Arrow's numeric types by name, as numpy's ("float" is Arrow's 32-bit float).
_NUMPY_TYPES = {
    **{f"{sign}int{bits}": f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)},
    "halffloat": "float16",
    "float": "float32",
    "double": "float64",
}


def as_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric Arrow array as numpy, over its buffer where it has no nulls. Array.to_numpy
    does the same but imports pandas on the way (47 MB and 0.25 s of every analyze)."""
    if isinstance(array, pa.ChunkedArray):
        parts = [as_numpy(chunk) for chunk in array.chunks]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, _NUMPY_TYPES.get(str(array.type)))
    name = _NUMPY_TYPES.get(str(array.type))
    if name is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(name)
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)


def _scalar_session(value: object) -> object:
    """A session as a name or number; a Parquet column of lists or structs as their JSON text."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return value  # _row checks it


def _whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _columns_from_rows(
    numbered: Iterable[tuple[int, bytes | dict]], path: str, malformed: list[dict] | None = None
) -> dict:
    """Columns of (line number, JSON line or Parquet row) pairs, each row checked (_row) and
    only its trace fields kept as it goes: a row may carry any other field, of any size."""
    rows, malformed = [], list(malformed or [])
    for number, raw in numbered:
        try:
            row = _row(raw)
            rows.append((number, {name: row[name] for name in READ_FIELDS if name in row}))
        except ValueError as err:
            malformed.append({"file": path, "line": number, "error": str(err)})
    lengths = [len(r[HASH_IDS_FIELD]) for _, r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    session_name = next((n for n in SESSION_FIELDS if any(n in r for _, r in rows)), None)
    return {
        TIMESTAMP_FIELD: [r.get(TIMESTAMP_FIELD, 0) for _, r in rows],
        INPUT_LENGTH_FIELD: [r[INPUT_LENGTH_FIELD] for _, r in rows],
        OUTPUT_LENGTH_FIELD: [r.get(OUTPUT_LENGTH_FIELD, 0) for _, r in rows],
        "offsets": offsets,
        "ids": [i for _, r in rows for i in r[HASH_IDS_FIELD]],
        SESSION_FIELD: (
            np.asarray([r.get(session_name) for _, r in rows], dtype=object)
            if session_name
            else None
        ),
        RESPONSE_FIELD: [r.get(RESPONSE_FIELD, NO_RESPONSE_MS) for _, r in rows],
        PARENT_FIELD: [r.get(PARENT_FIELD, NO_PARENT) for _, r in rows],
        "line": [n for n, _ in rows],
        "malformed": malformed,
    }


def _row(raw: bytes | dict) -> dict:
    """One trace row (a JSON line, or a Parquet row's dict), checked; raises ValueError saying
    what is wrong."""
    if isinstance(raw, dict):  # a Parquet row: a session of lists or structs reads as its JSON
        row = {k: _scalar_session(v) if k in SESSION_FIELDS else v for k, v in raw.items()}
    else:
        containers = containers_over(raw, MAX_ROW_CONTAINERS)
        if containers is not None:
            raise ValueError(
                f"{containers} JSON objects and lists, over the {MAX_ROW_CONTAINERS} a trace "
                f"row holds (the row, {' and '.join(ROW_LISTS)}): not parsed"
            )
        try:
            row = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"not JSON ({str(err)[:200]})") from None
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    if row.get(TIMESTAMP_FIELD) is None:
        row[TIMESTAMP_FIELD] = 0
    for name in NULLABLE:
        if row.get(name) is None:
            row.pop(name, None)
    if row.get(HASH_IDS_FIELD) is None:
        row[HASH_IDS_FIELD] = []
    if INPUT_LENGTH_FIELD not in row:
        raise ValueError(f"{INPUT_LENGTH_FIELD} missing")
    for name in HIGHEST:
        values = row[name] if name == HASH_IDS_FIELD else [row.get(name, 0)]
        if not isinstance(values, list) or not all(_fits(name, value) for value in values):
            raise ValueError(f"{name} is not {_described(name)} (what kvtrace writes)")
    for name in SESSION_FIELDS:
        session = row.get(name)
        if session is not None and (
            isinstance(session, bool) or not isinstance(session, (str, int))
        ):
            raise ValueError(f"{name} is not a string or an integer")
    return row


def _described(name: str) -> str:
    """What a field may hold, as _fits checks it."""
    value = "a number" if name == TIMESTAMP_FIELD else "an integer"
    listed = "a list, each " if name == HASH_IDS_FIELD else ""
    return f"{listed}{value} in [{_lowest(name)}, {HIGHEST[name]}]"
