"""Read request logs: JSONL (plain, .gz, .zst, .bz2) and Parquet, local or on Beam filesystems;
parse each record into a Request. Pure: read/steps.py runs these on Beam workers.

Plain JSONL is read in byte ranges, so one large file keeps every worker busy; a compressed file
is one range (compressed streams cannot be entered midway). A UTF-8 byte order mark opening a
file is skipped. A file that ends early or is corrupt is never exported silently partial: the
records before the damage go on, and the file itself becomes a dead letter naming where it broke
(decompressed byte offset, or Parquet row group).
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from transforms import storage
from transforms.dead_letters import DAMAGED_FILE, DeadLetter
from transforms.errors import UNANTICIPATED, Rejected, unanticipated
from transforms.read.decompress import DecodedStream
from transforms.read.paths import PARQUET_SUFFIXES, compression_of, open_stream
from transforms.read.records import ParseOptions, Request, parse_record, request_from_object

_LOG = logging.getLogger("kvtrace")
# Byte ranges of plain files that workers read in parallel: small enough that one large file
# keeps every worker busy, large enough that per-range overhead stays negligible.
READ_SPLIT_BYTES = 8 << 20
READ_CHUNK_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"
PROGRESS_INTERVAL_S = 30.0
# What of an oversized record a dead letter keeps: enough to find it, not the whole thing.
OVERSIZED_EXCERPT_BYTES = 4096


@dataclass(frozen=True)
class FileRange:
    path: str
    start: int
    end: int | None  # None: to the end (compressed files and Parquet are read whole)


def file_ranges(path: str, size: int, split_bytes: int = READ_SPLIT_BYTES) -> list[FileRange]:
    """The ranges a file is read in: byte ranges of a plain file, the whole of any other."""
    if compression_of(path) or path.lower().endswith(PARQUET_SUFFIXES):
        return [FileRange(path, 0, None)]
    return [FileRange(path, start, min(start + split_bytes, size))
            for start in range(0, max(size, 1), split_bytes)]


def read_lines(stream: Any, start: int, end: int | None, max_bytes: int
               ) -> Iterator[tuple[int, bytes | None]]:
    """(offset, line) for every line starting in [start, end) of a positioned stream, without
    its newline; a line over max_bytes comes as (offset, None) and is skipped, never held.

    The line straddling `start` belongs to the previous range, the one straddling `end` to this
    one: every line is read exactly once however the file is split."""
    offset = start
    if start > 0:  # skip to the first line that starts inside this range
        stream.seek(start - 1)
        skipped = _skip_line(stream)
        offset = start - 1 + skipped
    while end is None or offset < end:
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        size = len(line)
        if not line.endswith(b"\n") and size > max_bytes:
            size += _skip_line(stream)
            yield offset, None
        else:
            yield offset, line.rstrip(b"\r\n")
        offset += size


def _skip_line(stream: Any) -> int:
    """Read past the next newline; returns the bytes consumed."""
    consumed = 0
    while True:
        chunk = stream.readline(READ_CHUNK_BYTES)
        consumed += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return consumed


def open_range_stream(path: str) -> Any:
    """A seekable raw stream for a plain file, or a decompressing one for a compressed file
    (a DecodedStream inside: every byte decoded before a break is read)."""
    codec = compression_of(path)
    raw = storage.open_read(path)
    if not codec:
        return raw
    return io.BufferedReader(DecodedStream(raw, codec), READ_CHUNK_BYTES)


class ReadProgress:
    """Logs bytes read of all input at most every PROGRESS_INTERVAL_S, per worker process."""

    def __init__(self, total_bytes: int):
        self._total = total_bytes
        self._done = 0
        self._start = self._last = time.monotonic()

    def add(self, done: int) -> None:
        self._done += done
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            _LOG.info("read %.1f of %.1f MB (this worker; %.1f MB/s)", self._done / 1e6,
                      self._total / 1e6, self._done / 1e6 / (now - self._start))


def read_range(piece: FileRange, max_record_bytes: int, progress: ReadProgress | None = None
               ) -> Iterator[tuple[str, Any] | DeadLetter]:
    """(source, record) for every record of the range, a record being a JSONL line's bytes or a
    Parquet row's dict; a DeadLetter for each oversized record and for a file that breaks off
    (the records before the break still come). Blank lines are not records."""
    if piece.path.lower().endswith(PARQUET_SUFFIXES):
        yield from _parquet(piece.path)
        return
    offset = piece.start
    held: tuple[int, bytes] | None = None  # the last line, held until we know it is whole
    try:
        with open_range_stream(piece.path) as stream:
            for offset, line in read_lines(stream, piece.start, piece.end, max_record_bytes):
                if held is not None:
                    yield piece.path, held[1]
                    held = None
                if offset == 0 and line and line.startswith(BOM):
                    line = line[len(BOM):]
                if line is None:
                    yield _oversized(piece.path, offset, max_record_bytes)
                elif line.strip():
                    held = (offset, line)
            decoded = getattr(stream, "raw", None)
            broken = decoded.broken if isinstance(decoded, DecodedStream) else None
            if broken and held is not None and not decoded.ends_with_newline:
                yield _damaged_tail(piece.path, held[0], held[1], broken)
            elif held is not None:
                yield piece.path, held[1]
            if broken and (held is None or decoded.ends_with_newline):
                yield _damaged_tail(piece.path, offset, b"", broken)
            if progress is not None:
                progress.add(offset - piece.start)
    except (OSError, ValueError, EOFError) as err:
        yield DeadLetter(piece.path, b"", DAMAGED_FILE,
                         f"file unreadable after byte {offset}: {err}")


def _damaged_tail(path: str, offset: int, partial: bytes, why: str) -> DeadLetter:
    """The dead letter of a file that breaks off: where, why, and the partial record cut by the
    break (its bytes are what was lost, as far as anyone can tell)."""
    return DeadLetter(path, partial[:OVERSIZED_EXCERPT_BYTES], DAMAGED_FILE,
                      f"file breaks off at byte {offset} (decompressed): {why}",
                      lost_bytes=len(partial))


def _oversized(path: str, offset: int, max_record_bytes: int) -> DeadLetter:
    with open_stream(path) as stream:
        remaining = offset
        while remaining > 0:  # compressed streams cannot seek: read up to the record
            chunk = stream.read(min(remaining, READ_CHUNK_BYTES))
            if not chunk:
                break
            remaining -= len(chunk)
        excerpt = stream.read(OVERSIZED_EXCERPT_BYTES)
    return DeadLetter(path, excerpt, "too_large",
                      f"record at byte {offset} is over --max-record-bytes "
                      f"{max_record_bytes}; `line` holds its first bytes only")


def _parquet(path: str) -> Iterator[tuple[str, Any] | DeadLetter]:
    try:
        with storage.open_read(path) as raw:
            parquet = pq.ParquetFile(raw)
            for group in range(parquet.num_row_groups):
                try:
                    rows = parquet.read_row_group(group).to_pylist()
                except (OSError, ValueError, pa.ArrowException) as err:
                    yield DeadLetter(path, b"", DAMAGED_FILE,
                                     f"row group {group} of {parquet.num_row_groups} "
                                     f"unreadable: {err}",
                                     lost_bytes=parquet.metadata.row_group(group).total_byte_size)
                    continue
                for row in rows:
                    yield path, row
    except (OSError, ValueError, pa.ArrowException) as err:
        yield DeadLetter(path, b"", DAMAGED_FILE, f"not a readable Parquet file: {err}")


def parse_one(source: str, record: Any, options: ParseOptions) -> Request | DeadLetter:
    """A record (JSONL line bytes or Parquet row) as a Request, or the reason it is not one."""
    is_line = isinstance(record, bytes)
    try:
        line = record if is_line else json.dumps(record, default=str, ensure_ascii=False).encode(
            "utf-8", errors="backslashreplace")
    except RecursionError:
        return DeadLetter(source, b"", "too_deep", "row nested too deep to serialize")
    try:
        if is_line:
            return parse_record(line, source, options)
        if not isinstance(record, dict):
            raise Rejected("not_an_object", f"a {type(record).__name__}, not an object")
        return request_from_object(record, line, source, options)
    except Rejected as err:
        return DeadLetter(source, line, err.reason, err.message)
    except UNANTICIPATED as err:
        failed = unanticipated(err)
        return DeadLetter(source, line, failed.reason, failed.message)
