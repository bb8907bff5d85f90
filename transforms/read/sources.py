"""Read request logs: JSONL (plain, .gz, .zst, .bz2, .xz) and Parquet, local or on Beam
filesystems; parse each record into a Request. Pure: read/steps.py runs these on Beam workers.

Plain JSONL is read in byte ranges, so one large file keeps every worker busy; a compressed file
is one range (compressed streams cannot be entered midway). A UTF-8 byte order mark opening a
file is skipped. A file that ends early or is corrupt is never exported silently partial: the
records before the damage go on, and the file itself becomes a dead letter naming where it broke
(decompressed byte offset, or Parquet row group); so does a local file that changed since its
ranges were planned (FileRange.pin). A file is read as its name says: compressed
or Parquet bytes under a plain name are refused whole (misnamed_form). Every record is bounded
before it is decoded (paths.py; docs/BOUNDS.md): what exceeds --max-record-bytes is a too_large
dead letter.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.transforms.dead_letters import DAMAGED_FILE, WHOLE_ROW, DeadLetter, shown_name
from kvtrace.transforms.errors import UNANTICIPATED, Rejected, unanticipated
from kvtrace.transforms.read.decompress import PLAIN_SUFFIX, content_form, input_name
from kvtrace.transforms.read.numbers import row_reader
from kvtrace.transforms.read.paths import (
    OVERSIZED_EXCERPT_BYTES,
    READ_CHUNK_BYTES,
    FooterOverBound,
    Oversized,
    StrayBytes,
    broken_off,
    child_fields,
    column_bytes,
    compression_of,
    group_bytes,
    is_parquet,
    open_raw,
    open_stream,
    oversized_pages,
    parquet_file,
    read_lines,
    sized_rows,
    stored_position,
    stored_share,
    valued,
    with_children,
    without_views,
)
from kvtrace.transforms.read.records import (
    ParseOptions,
    Request,
    RowSize,
    SizedLine,
    StoredLine,
    Weighed,
    decode_value,
    letter_weight,
    object_of,
    request_from_object,
    row_weight,
    without_nulls,
)
from kvtrace.transforms.storage import is_url

# Byte ranges of plain files that workers read in parallel: small enough that one large file
# keeps every worker busy, large enough that per-range overhead stays negligible.
READ_SPLIT_BYTES = 8 << 20
BOM = b"\xef\xbb\xbf"
# Parquet rows turned into Python values at once: few, so they stay small beside the page being
# decoded (at 1024, a page's worth, the peak was 40% higher; docs/BOUNDS.md).
PARQUET_BATCH_ROWS = 64
# What turning Arrow values into Python ones may raise: a row's failure, not the file's.
CONVERSION_FAILURES = (*UNANTICIPATED, pa.ArrowException)


# A local file as its ranges were planned: (st_dev, st_ino, size planned, st_mtime_ns).
FilePin = tuple[int, int, int, int]


@dataclass(frozen=True)
class FileRange:
    path: str
    start: int
    end: int | None  # None: to the end (compressed files and Parquet are read whole)
    # The file as planned (file_pin), checked as the range is opened and once it is read: a log
    # rotated, truncated or rewritten in between would lose records with no letter. None: a
    # store's object (not pinned: its reads are of one generation or fail).
    pin: FilePin | None = None


def file_ranges(path: str, size: int, split_bytes: int = READ_SPLIT_BYTES) -> list[FileRange]:
    """The ranges a file is read in, pinned to the file as sized (`size`): byte ranges of a
    plain file, the whole of any other."""
    pin = file_pin(path, size)
    if compression_of(path) or is_parquet(path):
        return [FileRange(path, 0, None, pin)]
    return [
        FileRange(path, start, min(start + split_bytes, size), pin)
        for start in range(0, max(size, 1), split_bytes)
    ]


def file_pin(path: str, size: int) -> FilePin | None:
    """A local file's identity as its `size` was taken (a changed size then shows as a change);
    None for a store's object, or a file that cannot be stated (its read fails, a letter)."""
    if is_url(path):
        return None
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_dev, status.st_ino, size, status.st_mtime_ns


def _changed(piece: FileRange) -> bool:
    """Whether a pinned range's file is no longer the file its ranges were planned on."""
    if piece.pin is None:
        return False
    try:
        status = os.stat(piece.path)
    except (OSError, ValueError):
        return True
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns) != piece.pin


def _changed_letter(piece: FileRange, when: str, reached: int) -> DeadLetter:
    """The one letter of a range whose file changed between the plan and the end of its read
    (logrotate's copytruncate, a rename rotation, a rewrite): its planned bytes not read weigh
    as lost (all of them when it changed before the read began)."""
    return DeadLetter(
        piece.path,
        b"",
        DAMAGED_FILE,
        f"file changed {when} (its size, inode or modification time is not as planned: "
        f"rotated, truncated or rewritten); bytes {piece.start} on of the range not trusted",
        lost_bytes=unread_bytes(_range_stored_bytes(piece), reached),
    )


def stored_bytes(piece: FileRange, file_size: int) -> int:
    """How many of its file's bytes as stored a range covers (file_size: the file's)."""
    return (file_size if piece.end is None else piece.end) - piece.start


class ReadProgress(Protocol):
    """Told, as a range is read, how many of its bytes as stored it has consumed so far
    (compressed bytes of a compressed file), when it is due (asking costs a system call):
    pipelines/progress.py shows them."""

    def due(self) -> bool: ...

    def reached(self, stored_offset: int) -> None: ...


def read_range(
    piece: FileRange,
    max_record_bytes: int,
    progress: ReadProgress | None = None,
    withhold: bool = False,
) -> Iterator[tuple[str, Any] | DeadLetter]:
    """(source, record) for every record of the range, a record being a JSONL line's bytes or a
    Parquet row's dict; a DeadLetter for each oversized record and for a file that breaks off
    (the records before the break still come), and last a Parquet file's share record
    (RowShare: no record, tallied alone). Blank lines are not records. The source is the
    file's name as every letter shows it (dead_letters.shown_name; standard input's spooled
    copy as `-`, decompress.input_name), shown once here for both
    engines: Beam carries text between steps as UTF-8, and a Linux name need not be. withhold:
    the run's ParseOptions.withholds_letters (a capture run's letters never hold what was read,
    which is undecoded here)."""
    source = shown_name(input_name(piece.path))
    for item in _read_range(piece, max_record_bytes, progress):
        if isinstance(item, DeadLetter):
            yield dataclasses.replace(item, source=source, withhold=withhold)
        else:
            yield source, item[1]


def _read_range(
    piece: FileRange, max_record_bytes: int, progress: ReadProgress | None
) -> Iterator[tuple[str, Any] | DeadLetter]:
    if is_parquet(piece.path):
        if _changed(piece):
            yield _changed_letter(piece, "before it was read", 0)
            return
        yield from _parquet(piece.path, max_record_bytes)
        if _changed(piece):  # its rows' bytes cannot be placed: the whole file weighs
            yield _changed_letter(piece, "as it was read", 0)
        return
    offset = piece.start
    reached = 0  # the range's bytes as stored that records handed on were decoded from
    compressed = compression_of(piece.path) is not None
    weighed = 0  # what the range's oversized lines weighed as lost
    share = _whole_share(piece.path) if compressed else 1.0
    held: tuple[int, bytes] | None = None  # the last line, held until we know it is whole
    try:
        if not compressed and (form := misnamed_form(piece.path)):
            if piece.start == 0:  # the file's one letter, whichever worker reads its first range
                yield _misnamed(piece.path, form)
            return
        with open_stream(piece.path) as stream:
            if _changed(piece):
                yield _changed_letter(piece, "before it was read", 0)
                return
            for offset, line in read_lines(stream, piece.start, piece.end, max_record_bytes):
                if held is not None:
                    yield piece.path, held[1]
                    held = None
                    reached = stored_position(stream, offset) - piece.start
                if isinstance(line, Oversized):
                    # Its letter weighs its bytes, a compressed file's at the file's whole
                    # share (as every line's letter does), never more in all than the range
                    # holds as stored (the gate divides by those).
                    lost = stored_weight(line.size, share)
                    if compressed:
                        lost = min(lost, _range_stored_bytes(piece) - weighed)
                    weighed += lost
                    yield _oversized(piece.path, offset, line, max_record_bytes, lost)
                    # A break after it must not weigh its bytes again.
                    reached = stored_position(stream, offset + line.size) - piece.start
                    continue
                if offset == 0 and line.startswith(BOM):
                    line = line[len(BOM) :]
                if line.strip():
                    held = (
                        offset,
                        StoredLine.weighing(line, stored_weight(len(line), share))
                        if compressed
                        else line,
                    )
                if progress is not None and progress.due():
                    progress.reached(stored_position(stream, offset) - piece.start)
            broken = broken_off(stream)
            ends_with_newline = not broken or stream.raw.ends_with_newline
            if broken and held is not None and not ends_with_newline:
                yield _damaged_tail(piece, held[0], held[1], broken, reached)
            elif held is not None:
                yield piece.path, held[1]
                reached = stored_position(stream, offset) - piece.start
            if broken and (held is None or ends_with_newline):
                yield _damaged_tail(piece, offset, b"", broken, reached)
            elif _changed(piece):
                yield _changed_letter(piece, "as it was read", reached)
    except (OSError, ValueError, EOFError) as err:
        yield DeadLetter(
            piece.path,
            b"",
            DAMAGED_FILE,
            f"file unreadable after byte {offset}: {err}",
            lost_bytes=unread_bytes(_range_stored_bytes(piece), reached),
        )


def _whole_share(path: str) -> float:
    """The bytes as stored a decoded byte of a compressed file stands for over the whole file
    (paths.stored_share at its end, or where it breaks off), decoded once before its lines are
    read: every line's weight is its decoded bytes at this one share, so no order of the lines
    changes what a line weighs (a share so far would weigh a line by what came before it). A
    file that cannot be opened weighs its lines' decoded bytes (share 1: more, never less); its
    read fails alike, a letter."""
    try:
        with open_stream(path) as stream:
            try:
                while stream.read(READ_CHUNK_BYTES):
                    pass
            except (OSError, ValueError, EOFError):
                pass  # broken off: the share of what decodes; the read's letter says where
            return stored_share(stream)
    except (OSError, ValueError, EOFError):
        return 1.0


def stored_weight(decoded: int, share: float) -> int:
    """What `decoded` bytes weigh as stored at a file's share (_whole_share), rounded up: a loss
    weighs more, never less."""
    return math.ceil(decoded * share)


class StoredRow(Weighed, dict):
    """A Parquet row, with its bytes as JSON as sized before it was decoded (`stored`,
    paths.sized_rows), which every letter made of it weighs at its file's share (RowShare): a
    row's bytes cannot be placed in compressed pages, its size can, so a row wrapping a log
    weighs what it holds."""

    _PLAIN = dict


@dataclass
class RowShare:
    """A Parquet file's rows read so far, per top-level column (and WHOLE_ROW): the bytes as
    stored their row groups own in that column (paths.column_bytes) and the rows' bytes as JSON
    in it. Its one share record (letter) ends the file's read: the tally weighs each row
    letter's JSON bytes in each column at that column's stored over sized (dead_letters.Tally),
    so a row weighs the chunks its values were stored in, rows are sized once, as they are
    read, and no group is sized whole before it."""

    stored: dict[int, int] = dataclasses.field(default_factory=dict)
    sized: dict[int, int] = dataclasses.field(default_factory=dict)

    def add_group(self, raw: IO[bytes], parquet: pq.ParquetFile, group: int, stored: int) -> None:
        """A group's owned bytes (group_stored_bytes), placed in its columns in their order,
        never past the group's: what is left is WHOLE_ROW's."""
        left = group_stored_bytes(raw, group, stored)
        for column, owned in enumerate(column_bytes(raw, parquet, group) or []):
            self._add(self.stored, column, min(owned, left))
            left -= min(owned, left)
        self._add(self.stored, WHOLE_ROW, left)

    def add_rows(self, columns: np.ndarray) -> None:
        """Rows' sizes per column (paths.SizedRows.columns)."""
        for column, sized in enumerate(columns.sum(axis=0).tolist()):
            self._add(self.sized, column, sized)
        self._add(self.sized, WHOLE_ROW, int(columns.sum()))

    @staticmethod
    def _add(counts: dict[int, int], column: int, count: int) -> None:
        counts[column] = counts.get(column, 0) + count

    def letter(self, path: str) -> DeadLetter | None:
        """The share record, None if no row was read."""
        if not self.sized.get(WHOLE_ROW):
            return None
        share = tuple((c, self.stored.get(c, 0), sized) for c, sized in sorted(self.sized.items()))
        return DeadLetter(path, b"", "row_share", "the share its rows weigh at", share=share)


def misnamed_form(path: str) -> str | None:
    """The suffix of the form a file under a plain name holds when it is not plain JSONL
    (decompress.content_form, the check standard input's form is decided by), else None."""
    form = content_form(lambda: open_raw(path))
    return None if form == PLAIN_SUFFIX else form


def _misnamed(path: str, form: str) -> DeadLetter:
    """The one letter of a file whose name says plain JSONL and whose bytes are another form:
    read as its name says, never guessed from its bytes, it is refused whole, weighing every
    byte (read as text, its compressed runs would be letters weighing one record each)."""
    return DeadLetter(
        path,
        b"",
        DAMAGED_FILE,
        f"not read: its name says plain JSONL, its bytes are a {form} file; rename it to "
        f"end in {form}",
        lost_bytes=unread_bytes(_range_stored_bytes(FileRange(path, 0, None)), 0),
    )


def unread_bytes(stored: int, reached: int, partial: int = 0) -> int:
    """What a file, a tail of one or a row group refused or broken off weighs as lost, one rule
    for every reader and codec: its bytes as stored (`stored`) less those records were decoded
    from (`reached`, as far as the reader can place them; a compressed stream reads ahead, so
    this may fall short by a chunk), and at least the partial record cut by a break (decoded
    bytes: a compressed file's loss weighs more, never less). A file refused whole weighs all
    its bytes: --max-rejected-fraction sees it however few records it would have held."""
    return max(stored - min(max(reached, 0), stored), partial)


def _range_stored_bytes(piece: FileRange) -> int:
    """A range's bytes as stored (a compressed file's range is the whole file); 0 where the
    store cannot tell, as a file that cannot be opened has nothing to weigh."""
    if piece.end is not None:
        return piece.end - piece.start
    if piece.pin is not None:  # as planned: a file cut since weighs what it held
        return piece.pin[2] - piece.start
    try:
        with open_raw(piece.path) as raw:
            return raw.seek(0, os.SEEK_END) - piece.start
    except (OSError, ValueError):
        return 0


def _damaged_tail(
    piece: FileRange, offset: int, partial: bytes, why: str, reached: int
) -> DeadLetter:
    """The dead letter of a file that breaks off: where, why, the partial record cut by the
    break, and the bytes lost (unread_bytes)."""
    return DeadLetter(
        piece.path,
        partial[:OVERSIZED_EXCERPT_BYTES],
        DAMAGED_FILE,
        f"file breaks off at byte {offset} (decompressed): {why}",
        lost_bytes=unread_bytes(_range_stored_bytes(piece), reached, len(partial)),
    )


def _oversized(
    path: str, offset: int, line: Oversized, max_record_bytes: int, stored: int
) -> DeadLetter:
    """A line refused unread weighs its bytes (`stored`, as _read_range places them), however
    many records it would have held (a writer that left out the newlines)."""
    return DeadLetter(
        path,
        line.excerpt,
        "too_large",
        f"record at byte {offset} is {line.size} bytes, over --max-record-bytes "
        f"{max_record_bytes}; `line` holds its first bytes only",
        lost_bytes=max(stored, 0),
    )


def _parquet(path: str, max_record_bytes: int) -> Iterator[tuple[str, Any] | DeadLetter]:
    """Every row of a Parquet file as a dict. The footer is bounded before it is read, and a
    row group whose pages could not be read within the bound (paths.oversized_pages) is never
    decoded: it is one too_large dead letter (_unread_group). Bytes of its body that its
    footer does not account for (a row group left out of its list) are one damaged_file
    letter weighing them, the listed groups read all the same. A file that cannot be read on
    weighs its bytes not yet read as lost (unread_bytes). Its rows' letters weigh their bytes
    as JSON at its share (RowShare), which ends its letters, whether it is read whole or not."""
    stored = reached = 0  # the file's bytes as stored; those weighed or read so far
    stray: list[StrayBytes] = []
    share = RowShare()
    try:
        with parquet_file(path, max_record_bytes, stray=stray) as (raw, parquet):
            stored = raw.seek(0, os.SEEK_END)
            for lost in stray:
                yield DeadLetter(
                    path, b"", DAMAGED_FILE, f"Parquet bytes not read: {lost}", lost_bytes=lost.size
                )
                reached += lost.size
            first = 0  # the file's number of the group's first row, counted as groups go by
            for group in range(parquet.num_row_groups):
                if why := oversized_pages(raw, parquet.metadata, group, max_record_bytes):
                    yield _unread_group(path, raw, parquet.metadata, group, first, why, stored)
                else:
                    yield from _row_group(
                        path, raw, parquet, group, first, max_record_bytes, stored, share
                    )
                first += parquet.metadata.row_group(group).num_rows
                reached += group_stored_bytes(raw, group, stored)
    except FooterOverBound as err:
        yield DeadLetter(
            path,
            b"",
            "too_large",
            f"Parquet file not read: {err} (--max-record-bytes)",
            lost_bytes=unread_bytes(_range_stored_bytes(FileRange(path, 0, None)), 0),
        )
    except (OSError, ValueError, pa.ArrowException) as err:
        yield DeadLetter(
            path,
            b"",
            DAMAGED_FILE,
            f"not a readable Parquet file: {err}",
            lost_bytes=unread_bytes(
                stored or _range_stored_bytes(FileRange(path, 0, None)), reached
            ),
        )
    if (letter := share.letter(path)) is not None:
        yield letter


def group_stored_bytes(raw: IO[bytes], group: int, stored: int) -> int:
    """A row group's bytes as stored: those it owns (paths.group_bytes: its column chunks and
    their indexes and bloom filters), at most the file's (`stored`)."""
    return min(group_bytes(raw, group), stored)


def _row_group(
    path: str,
    raw: IO[bytes],
    parquet: pq.ParquetFile,
    group: int,
    first: int,
    max_record_bytes: int,
    stored: int,
    share: RowShare,
) -> Iterator[tuple[str, Any] | DeadLetter]:
    """A row group's rows as every reader reads Parquet (paths.sized_rows), PARQUET_BATCH_ROWS
    at a time or fewer, each sized before it is turned into Python values: a row over
    max_record_bytes as JSON is a too_large dead letter, never decoded, and rows are decoded
    a few at a time, at most max_record_bytes of them together. Each row weighs its size
    (StoredRow), added to the file's share with the group's bytes as stored once a row of it
    is read (a group of no row weighs nothing of it). Where the group breaks, a
    dead letter weighing the group's bytes as stored (stored: the file's) as lost: its rows
    before the break cannot be placed in its compressed pages, and a loss weighs never less."""
    dense = without_views(parquet.schema_arrow)  # the rows' types, dictionaries decoded
    read = 0
    try:
        for run in sized_rows(raw, parquet, group, max_record_bytes, PARQUET_BATCH_ROWS):
            if run.first == 0:
                share.add_group(raw, parquet, group, stored)
            share.add_rows(run.columns)
            if run.rows is None:
                yield DeadLetter(
                    path,
                    b"",
                    "too_large",
                    f"row {first + run.first} not decoded: {run.size} bytes as "
                    f"JSON at least, over --max-record-bytes {max_record_bytes}",
                    **row_weight(RowSize.of(tuple(run.columns.sum(axis=0).tolist()))),
                )
            else:
                yield from _python_rows(path, run.rows, dense, first + run.first, run.columns)
            read = run.first + (1 if run.rows is None else run.rows.num_rows)
    except MemoryError:  # the process's state, not the file's
        raise
    except Exception as err:  # noqa: BLE001 - decoding a group is one step: any failure is its
        # dead letter, whatever a damaged file makes Arrow or a sizing raise
        yield DeadLetter(
            path,
            b"",
            DAMAGED_FILE,
            f"row group {group} of {parquet.num_row_groups} unreadable after {read} rows: {err}",
            lost_bytes=unread_bytes(group_stored_bytes(raw, group, stored), 0),
        )


def _python_rows(
    path: str, rows: pa.RecordBatch, dense: pa.Schema, first: int, columns: np.ndarray
) -> Iterator[tuple[str, Any] | DeadLetter]:
    """Rows (sized already) as dicts: the one place Parquet values become Python values, each
    the JSON value of its text as its Arrow type decides (numbers.json_reader: a decimal, a
    narrow float, bytes). A value Arrow holds but Python cannot (a timestamp past year 9999, a
    decimal past its precision, a map with a key twice, bytes not UTF-8) fails its row alone:
    the rows are then converted one by one, and each that fails is a dead letter saying why,
    numbered from `first`. Each row weighs its size per column in `columns` (StoredRow)."""
    try:
        converted = _as_python(rows, dense)
    except CONVERSION_FAILURES:
        converted = None
    sizes = [RowSize.of(tuple(row)) for row in columns.tolist()]
    if converted is not None:
        for row, size in zip(converted, sizes, strict=True):
            yield path, StoredRow.weighing(without_nulls(row), size)
        return
    for index in range(rows.num_rows):
        try:
            [row] = _as_python(rows.slice(index, 1), dense)
        except CONVERSION_FAILURES as err:
            failed = unanticipated(err)
            yield DeadLetter(
                path,
                b"",
                failed.reason,
                f"row {first + index} has a value Python cannot hold: {failed.message}",
                **row_weight(sizes[index]),
            )
            continue
        yield path, StoredRow.weighing(without_nulls(row), sizes[index])


def _as_python(rows: pa.RecordBatch, dense: pa.Schema) -> list[dict]:
    """Rows cast to the types `dense` names, then as Python values. Two casts, so that only a
    shrinking unit goes unchecked: first every change but nanoseconds' (checked: a
    timestamp[ms] or [s] scaled up to microseconds past what int64 holds raises, failing its
    row, where an unchecked cast would wrap it into a believable time), then nanoseconds
    floored to microseconds (safe=False lets the cast drop digits; dividing cannot overflow).
    Maps become dicts (a key twice fails), every value the JSON value of its text. A null-typed
    column or struct field (paths.valued) is never cast: dense leaves it out, and so does kept."""
    read_fields = valued(rows.schema)
    kept = pa.schema(
        [
            field.with_type(_ns_kept(field.type, read.type))
            for field, read in zip(dense, read_fields, strict=True)
        ]
    )
    values = (
        rows.select([field.name for field in read_fields])
        .cast(kept)
        .cast(dense, safe=False)
        .to_pylist(maps_as_pydicts="strict")
    )
    read = row_reader(dense)
    return values if read is None else [read(row) for row in values]


def _ns_kept(kind: pa.DataType, read: pa.DataType) -> pa.DataType:
    """A type of without_views' (kind) with the nanoseconds of the type it was made from (read)
    wherever it has microseconds in their place: a timestamp, duration or time, in any
    container, through paths' one walk of them (a struct's null-typed fields, which kind leaves
    out, skipped: paths.valued); everything else as kind has it."""
    if getattr(read, "unit", None) == "ns" and getattr(kind, "unit", None) == "us":
        if pa.types.is_timestamp(kind):
            return pa.timestamp("ns", kind.tz)
        return pa.duration("ns") if pa.types.is_duration(kind) else pa.time64("ns")
    if pa.types.is_dictionary(read):  # kind is its decoded values' type
        return _ns_kept(kind, read.value_type)
    if isinstance(read, pa.BaseExtensionType):  # kind is the type it stores
        return _ns_kept(kind, read.storage_type)
    return with_children(
        kind,
        [
            field.with_type(_ns_kept(field.type, of.type))
            for field, of in zip(
                child_fields(kind),
                valued(child_fields(read)) if pa.types.is_struct(read) else child_fields(read),
                strict=True,
            )
        ],
    )


def _unread_group(
    path: str,
    raw: IO[bytes],
    metadata: pq.FileMetaData,
    group: int,
    first: int,
    why: str,
    stored: int,
) -> DeadLetter:
    """The one too_large dead letter of a row group refused unread (first: its first row's
    number), counted as one record read and rejected: how many rows it holds is known only by
    decoding them, and its footer's count is a claim (a 34 KB file may claim 10^12 rows), so
    the letter states that claim and costs one letter whatever it says. Its bytes as stored
    (group_stored_bytes) weigh in --max-rejected-fraction as lost."""
    claimed = metadata.row_group(group).num_rows
    return DeadLetter(
        path,
        b"",
        "too_large",
        f"row group {group} (rows {first} to {first + claimed - 1}, {claimed} as its footer "
        f"claims) not read: {why} (--max-record-bytes)",
        lost_bytes=unread_bytes(group_stored_bytes(raw, group, stored), 0),
    )


def parse_one(source: str, record: Any, options: ParseOptions) -> Request | DeadLetter:
    """A record (JSONL line bytes or Parquet row) as a Request, or the reason it is not one. A
    letter withholds its line as the run and the decoded record decide
    (ParseOptions.withholds), decided here, where the record is decoded."""
    is_line = isinstance(record, bytes)
    try:
        line = (
            record
            if is_line
            else json.dumps(record, default=str, ensure_ascii=False).encode(
                "utf-8", errors="backslashreplace"
            )
        )
    except RecursionError:
        return DeadLetter(
            source,
            b"",
            "too_deep",
            "row nested too deep to serialize",
            **(row_weight(record.stored) if isinstance(record, StoredRow) else {}),
            withhold=options.withholds_letters,
        )
    if isinstance(record, StoredRow):  # its rendering stands for the row's bytes as stored
        line = SizedLine.weighing(line, record.stored)
    if not is_line and len(line) > options.max_record_bytes:  # a line's size is known sooner
        return DeadLetter(
            source,
            line[:OVERSIZED_EXCERPT_BYTES],
            "too_large",
            f"row of {len(line)} bytes as JSON, over --max-record-bytes "
            f"{options.max_record_bytes}; `line` holds its first bytes only",
            withhold=options.withholds(line, record),
            **letter_weight(line),
        )
    value = None if is_line else record  # the record decoded, once it is
    try:
        if is_line:
            value, check_strings = decode_value(line, options)
            found = object_of(value)
            return request_from_object(found, line, source, options, check_strings)
        if not isinstance(record, dict):
            raise Rejected("not_an_object", f"a {type(record).__name__}, not an object")
        return request_from_object(record, line, source, options)
    except Rejected as err:
        reason, message = err.reason, err.message
    except UNANTICIPATED as err:
        failed = unanticipated(err)
        reason, message = failed.reason, failed.message
    return DeadLetter(
        source,
        line,
        reason,
        message,
        withhold=options.withholds(line, value),
        # A line may wrap any number of records (a JSON array, a list response's `data`, a
        # writer that left out newlines): whatever it decodes to, its letter weighs its bytes.
        **letter_weight(line),
    )
