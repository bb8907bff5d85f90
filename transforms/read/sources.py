"""Read request logs: JSONL (plain, .gz, .zst, .bz2) and Parquet, local or on Beam filesystems.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.dead_letters import DAMAGED_FILE, DEAD_LETTER_TAG, dead_letter
from transforms.errors import Rejected
from transforms.read.paths import PARQUET_SUFFIXES, compression_of
from transforms.read.records import ParseOptions, parse_record, request_from_object

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
    """A seekable raw stream for a plain file, or a decompressing one for a compressed file."""
    codec = compression_of(path)
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if not codec:
        return raw
    # pyarrow's decoders report a truncated stream (Python's zstandard reader does not).
    decoded = pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec)
    return io.BufferedReader(decoded, READ_CHUNK_BYTES)


class ReadFileRange(beam.DoFn):
    """A FileRange in; (source, line bytes) out, and a dead letter for each oversized record and
    each file that breaks off (the records before the break still go out)."""

    def __init__(self, max_record_bytes: int, total_bytes: int):
        self._max_record_bytes = max_record_bytes
        self._total_bytes = total_bytes

    def setup(self) -> None:
        self._progress = ReadProgress(self._total_bytes)

    def process(self, piece: FileRange) -> Iterator[Any]:
        if piece.path.lower().endswith(PARQUET_SUFFIXES):
            yield from self._parquet(piece.path)
            return
        offset = piece.start
        try:
            with open_range_stream(piece.path) as stream:
                for offset, line in read_lines(stream, piece.start, piece.end,
                                               self._max_record_bytes):
                    if offset == 0 and line and line.startswith(BOM):
                        line = line[len(BOM):]
                    if line is None:
                        yield self._oversized(piece.path, offset)
                    elif line.strip():
                        yield piece.path, line
                self._progress.add(offset - piece.start)
        except (OSError, ValueError, EOFError) as err:
            yield dead_letter(piece.path, b"", DAMAGED_FILE,
                              f"file breaks off after byte {offset} (decompressed): {err}")

    def _oversized(self, path: str, offset: int) -> Any:
        with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as handle:
            handle.seek(offset)
            excerpt = handle.read(OVERSIZED_EXCERPT_BYTES)
        return dead_letter(path, excerpt, "too_large",
                           f"record at byte {offset} is over --max-record-bytes "
                           f"{self._max_record_bytes}; `line` holds its first bytes only")

    def _parquet(self, path: str) -> Iterator[Any]:
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
                parquet = pq.ParquetFile(raw)
                for group in range(parquet.num_row_groups):
                    try:
                        rows = parquet.read_row_group(group).to_pylist()
                    except (OSError, ValueError, pa.ArrowException) as err:
                        yield dead_letter(path, b"", DAMAGED_FILE,
                                          f"row group {group} of {parquet.num_row_groups} "
                                          f"unreadable: {err}")
                        continue
                    for row in rows:
                        yield path, row
        except (OSError, ValueError, pa.ArrowException) as err:
            yield dead_letter(path, b"", DAMAGED_FILE, f"not a readable Parquet file: {err}")


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


class ReadRecords(beam.PTransform):
    """(path, size) of every input file in; (source file, record) out, a record being a JSONL
    line's bytes or a Parquet row's dict; dead letters for oversized records and damaged
    files under DEAD_LETTER_TAG. Blank lines are not records."""

    def __init__(self, files: Sequence[tuple[str, int]], max_record_bytes: int):
        super().__init__()
        self._files = list(files)
        self._max_record_bytes = max_record_bytes

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        total = sum(size for _, size in self._files)
        ranges = [r for path, size in self._files for r in file_ranges(path, size)]
        return (
            pipeline
            | "Ranges" >> beam.Create(ranges)
            | "SpreadRanges" >> beam.Reshuffle()
            | "ReadRanges" >> beam.ParDo(ReadFileRange(self._max_record_bytes, total))
            .with_outputs(DEAD_LETTER_TAG, main="records")
        )


class ParseRecords(beam.DoFn):
    """(source, record) in; Requests out, and dead letters for records that are not requests."""

    def __init__(self, options: ParseOptions):
        self._options = options

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        source, record = element
        is_line = isinstance(record, bytes)
        line = record if is_line else json.dumps(record, default=str, ensure_ascii=False).encode(
            "utf-8", errors="backslashreplace")
        try:
            if is_line:
                yield parse_record(line, source, self._options)
            else:
                yield request_from_object(record, line, source, self._options)
        except Rejected as err:
            yield dead_letter(source, line, err.reason, err.message)


def parse_records(records: beam.PCollection, options: ParseOptions) -> beam.pvalue.DoOutputsTuple:
    return records | "Parse" >> beam.ParDo(ParseRecords(options)).with_outputs(
        DEAD_LETTER_TAG, main="requests"
    )
