"""Input paths: local files directly, URLs (gs://, s3://, ...) through Beam's filesystems; and
reading them within bounds (docs/BOUNDS.md): only regular files, lines and decoded steps of
bounded size, Parquet footers and pages checked before they are decoded.

Local reads skip importing Beam, which costs ~1 s of start-up that `kvtrace analyze` does not
otherwise need.
"""

from __future__ import annotations

import functools
import glob
import io
import itertools
import logging
import os
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.transforms import storage
from kvtrace.transforms.batching import batches_by_weight
from kvtrace.transforms.read.arrow_sizes import (
    column_json_bytes,
    fixed_value_bytes,
    largest_value_bytes,
)
from kvtrace.transforms.read.bloom_filter import bitset, plain_hashes
from kvtrace.transforms.read.decompress import DecodedStream, form_name
from kvtrace.transforms.read.json_tree import MAX_NESTING_DEPTH
from kvtrace.transforms.read.numbers import Reader, json_reader
from kvtrace.transforms.read.parquet_frame import PARQUET_MAGIC, TAIL_BYTES, footer_length
from kvtrace.transforms.read.parquet_payload import (
    DECODED_ENCODINGS,
    PLAIN,
    RLE,
    byte_array_ends,
    decompressed,
    hybrid_end,
    unpacked,
    values_end,
    varint,
)
from kvtrace.transforms.storage import is_url

_LOG = logging.getLogger("kvtrace")
PARQUET_SUFFIXES = (".parquet", ".pq")
# Compressed JSONL by suffix, as pyarrow names the codecs.
CODECS = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".bz2": "bz2",
    ".xz": "xz",
    ".lzma": "xz",
}
READ_CHUNK_BYTES = 1 << 20  # decompressed bytes buffered per read, and per step of a skip
# A Parquet page read may be this many times the bound of one value: pyarrow's writer fills a
# page with 1024 values before checking its size, so pages of large values are far larger than
# any one of them.
PAGE_BOUND_MULTIPLE = 2
# Parquet's Encoding enum: data pages that index the dictionary page.
DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
MAX_PAGE_HEADER_BYTES = 1 << 20  # headers are tens of bytes; statistics may add a few KiB
# What of an oversized line is kept: enough to find it, not the whole thing.
OVERSIZED_EXCERPT_BYTES = 4096


@dataclass(frozen=True)
class Oversized:
    """A line over the bound, skipped: its first bytes and its whole size (newline included)."""

    excerpt: bytes
    size: int


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Every file the patterns name, sorted, each once. A local pattern naming a path that
    exists is that path, whatever its characters (`x[1].jsonl`); else it is a glob. One file
    named twice (two spellings, a link, a glob and a name) is read once, under the first of its
    names in sorted order, and the run says so. A pattern that matches nothing, or a local file
    that is not a regular file with a trustworthy size, is an error."""
    files: dict[Any, set[str]] = {}
    for pattern in patterns:
        if is_url(pattern):
            from apache_beam.io.filesystems import FileSystems

            matched = [m.path for r in FileSystems.match([pattern]) for m in r.metadata_list]
        elif os.path.lexists(pattern) and not os.path.isdir(pattern):
            matched = [pattern]
        else:
            matched = [p for p in glob.glob(pattern) if not os.path.isdir(p)]
        if not matched:
            hint = (
                " (a folder: give a glob of its files, e.g. DIR/*.jsonl)"
                if (not is_url(pattern) and os.path.isdir(pattern))
                else ""
            )
            raise FileNotFoundError(f"{pattern!r} matches no file{hint}")
        for path in matched:
            files.setdefault(file_identity(path), set()).add(path)
    for names in files.values():
        if len(names) > 1:
            _LOG.warning(
                "one file named %d ways, read once as %s: %s",
                len(names),
                min(names),
                ", ".join(sorted(names)),
            )
    return sorted(min(names) for names in files.values())


def file_identity(path: str) -> Any:
    """What makes two names one file: a local file's device and inode, once checked to be a
    regular file whose size can be trusted (refused here, before any work, if not). A name
    that cannot be looked at (a dangling link) is itself, its read then a dead letter."""
    if is_url(path):
        return path
    try:
        handle, _ = storage.open_regular(path, follow_links=True)
    except storage.UnfitFile as err:
        raise ValueError(f"input {err}") from None
    except OSError:
        return os.path.abspath(path)
    with handle:
        status = os.fstat(handle.fileno())
    return status.st_dev, status.st_ino


def compression_of(path: str) -> str | None:
    """The codec a file's suffix names (standard input's spool: its form's), or None for a plain
    file."""
    path = form_name(path)
    suffix = path[path.rfind(".") :].lower() if "." in path.rsplit("/", 1)[-1] else ""
    return CODECS.get(suffix)


def is_parquet(path: str) -> bool:
    """Whether a file is read as Parquet: by its suffix (standard input's spool: its form's)."""
    return form_name(path).lower().endswith(PARQUET_SUFFIXES)


def file_sizes(files: Sequence[str]) -> list[tuple[str, int]]:
    """(path, size in bytes) of each file, for splitting and progress totals."""
    local = [f for f in files if not is_url(f)]
    sizes = {f: _size(f) for f in local}
    remote = [f for f in files if is_url(f)]
    if remote:
        from apache_beam.io.filesystems import FileSystems

        for result in FileSystems.match(remote):
            for metadata in result.metadata_list:
                sizes[metadata.path] = metadata.size_in_bytes
    return [(f, sizes[f]) for f in files]


def _size(path: str) -> int:
    """A local file's size; 0 for one that cannot be looked at (a dangling link), which its
    read then turns into a dead letter."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def open_raw(path: str) -> IO[bytes]:
    """A file's bytes as stored. A local path must be a regular file whose size is its length
    (storage.open_regular): a FIFO, device, socket or /proc file that took a file's name is
    refused, not read."""
    if is_url(path):
        return storage.open_read(path)
    return storage.open_regular(path, follow_links=True)[0]


def open_stream(path: str) -> IO[bytes]:
    """The file's decompressed bytes (by its suffix), decoded in bounded steps: a seekable
    raw stream for a plain file, a buffered DecodedStream (`broken_off` tells whether it ended
    early) for a compressed one."""
    codec = compression_of(path)
    raw = open_raw(path)
    if not codec:
        return raw
    return _Decoded(raw, codec)


class _Decoded(io.BufferedReader):
    """A compressed file's decoded bytes, keeping the file as stored (`stored`), whose position
    is how much of it the decoding has consumed (stored_position)."""

    def __init__(self, stored: IO[bytes], codec: str):
        super().__init__(DecodedStream(stored, codec), READ_CHUNK_BYTES)
        self.stored = stored


def stored_position(stream: IO[bytes], offset: int) -> int:
    """How far into its file as stored a stream from open_stream has read, at decoded byte
    offset: the offset itself for a plain file; for a compressed one the compressed bytes
    consumed (read ahead of offset by at most a chunk), 0 where the store cannot tell: progress
    only, never a reason for a read to fail."""
    if not isinstance(stream, _Decoded):
        return offset
    try:
        return stream.stored.tell()
    except (OSError, ValueError):
        return 0


def stored_share(stream: IO[bytes]) -> float:
    """The bytes as stored a decoded byte of a stream from open_stream stands for, so far: 1 for
    a plain file; for a compressed one the compressed bytes read over those they decoded to (read
    ahead alike, so the share is exact for a file read in one chunk, and over by at most a
    chunk's in a longer one: a loss weighs more, never less), at most 1."""
    decoded = getattr(stream, "raw", None)
    if not isinstance(stream, _Decoded) or not isinstance(decoded, DecodedStream):
        return 1.0
    return min(1.0, stored_position(stream, 0) / max(decoded.decoded, 1))


def broken_off(stream: IO[bytes]) -> str | None:
    """Why a stream from open_stream ended before its file's end, or None if it did not."""
    decoded = getattr(stream, "raw", None)
    return decoded.broken if isinstance(decoded, DecodedStream) else None


def read_lines(
    stream: IO[bytes], start: int, end: int | None, max_bytes: int
) -> Iterator[tuple[int, bytes | Oversized]]:
    """(offset, line) for every line starting in [start, end) of a positioned stream, without
    its newline; a line over max_bytes comes as (offset, Oversized) and is skipped: no more
    than max_bytes + 1 of it is ever held.

    The line straddling `start` belongs to the previous range, the one straddling `end` to this
    one: every line is read exactly once however the file is split. Skipping the straddling
    line stops at `end` (no line of this range starts past it), so however long a line runs,
    only the range it starts in reads it whole: reading all ranges is O(file size)."""
    offset = start
    if start > 0:  # skip to the first line that starts inside this range
        stream.seek(start - 1)
        skipped = _skip_line(stream, None if end is None else end - start + 1)
        offset = start - 1 + skipped
    while end is None or offset < end:
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        size = len(line)
        if not line.endswith(b"\n") and size > max_bytes:
            size += _skip_line(stream)
            yield offset, Oversized(line[:OVERSIZED_EXCERPT_BYTES], size)
        else:
            yield offset, line.rstrip(b"\r\n")
        offset += size


def _skip_line(stream: IO[bytes], limit: int | None = None) -> int:
    """Read past the next newline, a chunk at a time, or stop after limit bytes; returns the
    bytes consumed."""
    consumed = 0
    while limit is None or consumed < limit:
        step = READ_CHUNK_BYTES if limit is None else min(READ_CHUNK_BYTES, limit - consumed)
        chunk = stream.readline(step)
        consumed += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            break
    return consumed


class NumberedLines:
    """(1-based line number, line) of a whole (decompressed) file, a line over max_line_bytes
    as (number, Oversized), never held. Once iterated, `broken` says why a compressed file ended
    early (None when it did not)."""

    def __init__(self, path: str, max_line_bytes: int):
        self._path = path
        self._max_line_bytes = max_line_bytes
        self.broken: str | None = None
        self.lines_read = 0

    def __iter__(self) -> Iterator[tuple[int, bytes | Oversized]]:
        with open_stream(self._path) as stream:
            for _, line in read_lines(stream, 0, None, self._max_line_bytes):
                self.lines_read += 1
                yield self.lines_read, line
            self.broken = broken_off(stream)


def lines_within(path: str, max_line_bytes: int) -> Iterator[bytes]:
    """Every line of a file that must be whole: a line over max_line_bytes or a compressed
    file that breaks off is a ValueError saying where."""
    lines = NumberedLines(path, max_line_bytes)
    for number, line in lines:
        if isinstance(line, Oversized):
            raise ValueError(f"{path}: line {number} is over {max_line_bytes} bytes")
        yield line
    if lines.broken:
        raise ValueError(f"{path}: {lines.broken}")


def read_bytes(path: str, max_bytes: int) -> bytes:
    """A small file's whole content, decompressed by its suffix; over max_bytes (decompressed)
    is a ValueError, found before more than max_bytes + 1 are held."""
    with open_stream(path) as stream:
        content = stream.read(max_bytes + 1)
        broken = broken_off(stream)
    if len(content) > max_bytes:
        raise ValueError(f"{path}: over {max_bytes} bytes decompressed")
    if broken:
        raise ValueError(f"{path}: {broken}")
    return content


def count_lines(path: str, chunk_bytes: int = 16 << 20) -> int:
    """Lines in the (decompressed) file, a last line without a newline included."""
    lines, last = 0, b"\n"
    with open_stream(path) as stream:
        while chunk := stream.read(chunk_bytes):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


class FooterOverBound(ValueError):
    """A Parquet footer over the bound it is read within: a file too large to read, not a
    damaged one."""


class StrayBytes(NamedTuple):
    """Bytes of a Parquet file's body that no part its footer lists holds (_stray_bytes)."""

    at: int  # the first of them
    size: int  # all of them
    where: str = "in no part of the file its footer lists (a row group left out of it?)"

    def __str__(self) -> str:
        return f"{self.size} bytes from byte {self.at} on lie {self.where}"


@contextmanager
def parquet_file(
    path: str,
    max_footer_bytes: int,
    opened: IO[bytes] | None = None,
    stray: list[StrayBytes] | None = None,
) -> Iterator[tuple[IO[bytes], pq.ParquetFile]]:
    """The file (opened: read from it, not opened by path) and a Parquet reader over it
    (arrow_reader), once its footer is known to be within max_footer_bytes (the footer is read
    whole before any row, and it can claim any size), in bytes and in what Arrow makes of it
    (check_footer), and to account for the file's body (_stray_bytes); ValueError if not.
    Body bytes the footer does not account for are rows no reader would see: given `stray`,
    they are appended to it (a log's reader letters them and reads the rest), else they refuse
    the file. The file itself is for oversized_pages' look at page headers."""
    with open_raw(path) if opened is None else nullcontext(opened) as raw:
        footer_bytes = footer_length(raw, path)
        if footer_bytes > max_footer_bytes:
            raise FooterOverBound(
                f"{path}: Parquet footer of {footer_bytes} bytes, over the bound "
                f"of {max_footer_bytes}"
            )
        body_end = raw.seek(-TAIL_BYTES - footer_bytes, os.SEEK_END)
        footer = check_footer(path, raw.read(footer_bytes), max_footer_bytes)
        raw.seek(0)
        parquet = arrow_reader(
            raw,
            thrift_string_size_limit=max_footer_bytes,
            thrift_container_size_limit=max_footer_bytes,
        )
        _check_schema(path, parquet.schema_arrow)
        max_page_bytes = PAGE_BOUND_MULTIPLE * max_footer_bytes
        _check_chunks(path, raw, parquet.metadata, max_page_bytes)
        outside = _stray_bytes(path, raw, footer, parquet.metadata, body_end, max_page_bytes)
        found = [] if outside is None else [outside]
        if found and stray is None:
            raise ValueError(f"{path}: {found[0]}")
        if stray is not None:
            stray.extend(found)
        yield raw, parquet


def arrow_reader(raw: IO[bytes], **options: Any) -> pq.ParquetFile:
    """Arrow's reader of a Parquet input or trace, as every one is opened: rows read a page at a
    time (no pre-buffering of column chunks), and each page that carries a CRC of its bytes
    checked against it before it is decoded, so a page damaged after it was written fails its
    row group (a damaged_file letter), never reads as records. An INT96 timestamp (Spark's and
    Hive's legacy form) is read as milliseconds: Arrow scales its day count (up to 2^32 days)
    without an overflow check, which wraps in nanoseconds past 2262 and in microseconds past
    year 294,000, never in milliseconds; every time is floored to ms (timestamps.py), and the
    cast to microseconds (without_views) is checked, so a moment too late fails its row."""
    return pq.ParquetFile(
        raw,
        pre_buffer=False,
        buffer_size=READ_CHUNK_BYTES,
        page_checksum_verification=True,
        coerce_int96_timestamp_unit="ms",
        **options,
    )


# What Arrow holds of a parsed footer follows its Thrift structs (a row group, a column chunk
# and its metadata, statistics, a key-value pair, ...: measured ~0.2 KB each), where a struct
# may take 1 byte of the footer, and what a reader spends follows its schema's elements (~8 KB
# each all told: Arrow's schema, a column reader per row group, the rows' sizing; docs/BOUNDS.md).
# A footer is held to its bound as if each struct were FOOTER_STRUCT_BYTES and each schema
# element SCHEMA_ELEMENT_BYTES more, and may weigh FOOTER_WEIGHT_FLOOR whatever the bound (a
# small bound still reads a file of a few columns).
FOOTER_STRUCT_BYTES = 64
SCHEMA_ELEMENT_BYTES = 1024
FOOTER_WEIGHT_FLOOR = 1 << 20


class Footer(NamedTuple):
    """A Parquet footer decoded (FileMetaData's fields), with the bytes each struct of it was
    decoded from."""

    fields: dict[int, Any]
    data: bytes
    spans: dict[int, tuple[int, int]]  # a decoded struct's id -> its bytes [start, end) in data

    def encoded(self, struct: dict[int, Any]) -> bytes:
        """The bytes of the footer one of its decoded structs was read from."""
        start, end = self.spans[id(struct)]
        return self.data[start:end]


def check_footer(path: str, footer: bytes, max_footer_bytes: int) -> Footer:
    """The footer's checks made on its bytes by kvtrace's own Thrift reader, before Arrow parses
    it: FooterOverBound when it weighs more than max_footer_bytes (FOOTER_WEIGHT_FLOOR at
    least) in the units Arrow spends memory on (_FooterWalk.weight), not its bytes;
    ValueError when it is not Thrift, or not of the shape Arrow builds safely
    (_check_footer_shape). The footer as decoded (_CompactReader)."""
    most = max(max_footer_bytes, FOOTER_WEIGHT_FLOOR)
    try:
        _FooterWalk(footer).weight(most)
    except _OverWeight:
        raise FooterOverBound(
            f"{path}: Parquet footer of too many schema elements and column chunks for the "
            f"bound of {most} bytes (each struct weighed as {FOOTER_STRUCT_BYTES} bytes, each "
            f"schema element {SCHEMA_ELEMENT_BYTES} more: what Arrow holds follows them)"
        ) from None
    except IndexError:
        raise ValueError(f"{path}: the Parquet footer ends inside a value") from None
    return _check_footer_shape(path, footer)  # within its weight: decoded whole


def _check_footer_shape(path: str, footer: bytes) -> Footer:
    """The footer (FileMetaData), decoded by kvtrace's own Thrift reader before Arrow builds any
    column's metadata from it, holds each row group's column chunks as its schema's leaves are,
    one each in order, and each chunk's level histograms (its size statistics) one count per
    level of its column, or none; ValueError if not. Arrow throws past every handler on a
    histogram of another length (the process aborts), and fails on a row group short of a
    chunk with errors of its own. Returns the footer decoded."""
    reader = _CompactReader(footer, spans={})
    try:
        metadata = reader.struct()
    except IndexError:
        raise ValueError(f"{path}: a Parquet footer that breaks off") from None
    leaves = _leaf_levels(path, metadata.get(2))
    groups = metadata.get(4) or []
    if not isinstance(groups, list):
        raise ValueError(f"{path}: a Parquet footer whose row groups are not a list")
    for group in groups:
        chunks = group.get(1) if isinstance(group, dict) else None
        if not isinstance(chunks, list) or len(chunks) != len(leaves):
            raise ValueError(
                f"{path}: a Parquet row group whose column chunks are not its schema's "
                f"{len(leaves)} columns"
            )
        for chunk, levels in zip(chunks, leaves):
            column = chunk.get(3) if isinstance(chunk, dict) else None
            sizes = column.get(16) if isinstance(column, dict) else None
            for field, most in zip((2, 3), levels):  # repetition, definition histograms
                counts = sizes.get(field) if isinstance(sizes, dict) else None
                if counts is not None and (
                    not isinstance(counts, list) or len(counts) not in (0, most + 1)
                ):
                    raise ValueError(
                        f"{path}: Parquet size statistics counting {len(counts)} levels of a "
                        f"column that has {most + 1}"
                    )
    return Footer(metadata, footer, reader.spans)


def _leaf_levels(path: str, elements: Any) -> list[tuple[int, int]]:
    """Each leaf column's highest (repetition, definition) level, in column order, from the
    footer's schema: a tree flattened depth first, each element naming its children's count
    (field 5) and its repetition (field 3: required 0, optional 1, repeated 2)."""
    if not isinstance(elements, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(f, 0), int) for f in (3, 5)) for e in elements
    ):
        raise ValueError(f"{path}: a Parquet footer without a schema of elements")
    leaves: list[tuple[int, int]] = []
    pending = [[elements[0].get(5, 0), 0, 0]] if elements else []  # [children left, levels]
    for element in elements[1:]:
        if not pending:
            raise ValueError(f"{path}: a Parquet schema of more elements than its tree holds")
        parent = pending[-1]
        parent[0] -= 1
        kind = element.get(3, 0)
        levels = parent[1] + (kind == 2), parent[2] + (kind != 0)
        if element.get(5, 0) > 0:
            pending.append([element[5], *levels])
        else:
            leaves.append(levels)
        while pending and pending[-1][0] <= 0:
            pending.pop()
    return leaves


def _check_chunks(
    path: str, raw: IO[bytes], metadata: pq.FileMetaData, max_page_bytes: int
) -> None:
    """Every column chunk the footer lists, read or not, walked page by page (the walk the
    readers share: chunk_pages, checked_levels): its pages fill exactly the bytes it claims,
    each page's payload decodes to its end (_check_payload), and it holds as many rows as
    every other chunk of its group (the footer's count is held to them group by group as it
    is read: _check_group_rows); ValueError if not. _stray_bytes counts a chunk's bytes as
    accounted for, which holds only of bytes a decoder consumed: a chunk grown over a row
    group left out of the footer tiles it with that group's pages and counts their rows too,
    a page grown over it holds bytes past its values. A page over max_page_bytes (the
    readers' ceiling: over_ceiling) is not read here, to stay within it: its payload goes
    unchecked but for its header's sizes (_check_unread_sizes), and a repeated chunk holding
    one goes uncounted (its group is refused unread by every reader, whatever columns it
    reads: oversized_pages). A dictionary entry no index names is accepted unread: writers keep
    unused categories (docs/BOUNDS.md)."""
    schema = metadata.schema
    try:
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            counted: tuple[int, str] | None = None  # the rows of the group's first chunk
            for index in range(row_group.num_columns):
                column = row_group.column(index)
                descriptor = schema.column(index)
                repeats = descriptor.max_repetition_level
                pages = chunk_pages(raw, column)
                if any(over_ceiling(page, max_page_bytes) for page in pages):
                    for page in pages:
                        _check_unread_sizes(column, page)
                    if repeats:
                        continue
                else:
                    for page in pages:
                        _check_payload(raw, column, descriptor, page)
                rows = checked_levels(raw, column, repeats).rows
                counted = counted or (rows, column.path_in_schema)
                if rows != counted[0]:
                    raise ValueError(
                        f"row group {group}'s pages hold {counted[0]} rows of {counted[1]}, "
                        f"{rows} of {column.path_in_schema}"
                    )
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def over_ceiling(page: Page, max_page_bytes: int) -> bool:
    """Whether a page is over the readers' ceiling (max_page_bytes), by the larger of its
    stored and its decompressed sizes: either is what reading it costs. The one rule of every
    check that leaves such a page unread and every reader that refuses its group for it
    (oversized_pages)."""
    return max(page.size, page.stored) > max_page_bytes


def _check_unread_sizes(column: pq.ColumnChunkMetaData, page: Page) -> None:
    """What a page left unread (over the ceiling) is held to from its header alone: stored
    uncompressed, its stored bytes are its data, as many as its size (as _check_payload holds
    a page it reads: decompressed), so none lie behind its values; ValueError if not."""
    codec = column.compression if page.compressed else "UNCOMPRESSED"
    if codec == "UNCOMPRESSED" and page.stored != page.size:
        raise ValueError(
            f"an uncompressed page of {column.path_in_schema} stores {page.stored} bytes, its "
            f"header's size {page.size}"
        )


def _check_payload(
    raw: IO[bytes], column: pq.ColumnChunkMetaData, descriptor: pq.ColumnSchema, page: Page
) -> None:
    """A page's payload decodes to its end (ValueError if not), as Arrow decodes it: its codec
    consumes exactly its stored bytes to exactly its header's size (decompressed), its levels
    (RLE, their length stated) end where stated and count its non-null values, and its values
    (parquet_payload.values_end) end at its end, or before zeros alone. Arrow stops once it
    has the values the header counts, so bytes past them would be accounted for unread. A
    page in an encoding not decoded here (DELTA_*) is held to its codec alone; uncompressed,
    to nothing: refused (no common writer makes one by default: docs/BOUNDS.md)."""
    name = column.path_in_schema
    raw.seek(page.start)
    stored = raw.read(page.stored)
    if len(stored) != page.stored:
        raise ValueError(f"a page of {name} ends past its file")
    codec = column.compression if page.compressed else "UNCOMPRESSED"
    levels = page.repetition + page.definition if page.version == 2 else 0
    if levels > min(len(stored), page.size):
        raise ValueError(f"a page of {name} whose levels overrun it")
    data = stored[:levels] + decompressed(stored[levels:], codec, page.size - levels)
    count, at = page.values, 0
    if page.version:  # a data page: its levels, each a value or a null
        at, count, repetition = _page_levels(data, descriptor, page)
        if descriptor.max_repetition_level:  # for the row count (_repetition_levels)
            _WALKED.setdefault(raw, {})[("repetition", page.start)] = repetition
    encoding = page.encoding if page.version else 0  # a dictionary page's entries are PLAIN
    if encoding not in DECODED_ENCODINGS:
        if codec == "UNCOMPRESSED":
            raise ValueError(f"an uncompressed page of {name} in encoding {encoding}, not read")
        return
    kind = column.physical_type  # PLAIN booleans take a bit each: width 0
    width = 0 if kind == "BOOLEAN" else fixed_value_bytes(kind, descriptor.length)
    end = values_end(data, at, encoding, width, count)
    # fastparquet ends its pages with 8 zeros: zeros hold nothing, as between parts
    if end > len(data) or data.count(0, end) != len(data) - end:
        raise ValueError(f"a page of {name} holds other than its values' bytes")


def _page_levels(data: bytes, descriptor: pq.ColumnSchema, page: Page) -> tuple[int, int, bytes]:
    """Where a data page's (decompressed) levels end and its values start, how many values it
    holds (its definition levels at the most), and its repetition levels' bytes; ValueError
    when its levels do not end where they state."""
    at, count, repetition = 0, page.values, b""
    tops = descriptor.max_repetition_level, descriptor.max_definition_level
    for field, (most, stated) in enumerate(zip(tops, (page.repetition, page.definition))):
        if page.version == 2:  # stated: their bytes
            size, start = stated, at
        elif most:  # stated: their encoding; their bytes before them
            if stated != RLE:
                raise ValueError("a page's levels are stored other than as RLE")
            size, start = int.from_bytes(data[at : at + 4], "little"), at + 4
        else:
            continue
        end, found = start, 0
        if most:
            window = data[: start + size]
            end, found = hybrid_end(window, start, most.bit_length(), page.values, most)
        if end != start + size:
            raise ValueError("a page's levels do not end where they state")
        repetition = repetition if field else data[start:end]
        at = end
        count = found if field and most else count
    return at, count, repetition


def _stray_bytes(
    path: str,
    raw: IO[bytes],
    footer: Footer,
    metadata: pq.FileMetaData,
    body_end: int,
    max_page_bytes: int,
) -> StrayBytes | None:
    """The bytes of the body, between the opening magic and the footer (body_end), that no
    part the footer lists holds, or None: the parts are each column chunk (as Arrow reads it:
    _chunk_range) and the column index, offset index and bloom filter a chunk points to
    (_chunk_extras); a gap between them holds only what writers leave there (_stray_gap).
    Parts that overlap (a chunk named twice, whose rows would be read twice and its own left
    unread) or lie outside the body are a layout no writer makes: ValueError. A group's parts
    are the bytes it owns (group_bytes). Costs a sort of the footer's parts and a read of the
    gaps, each up to its first stray byte."""
    # a chunk's with the copies of its footer entry a writer may leave behind it (_stray_gap)
    parts: list[tuple[int, int, Callable[[], tuple[bytes, ...]]]] = []
    owned = _OWNED[raw] = []
    for index, group in enumerate(footer.fields.get(4) or []):
        row_group = metadata.row_group(index)
        sizes = []  # each chunk's parts' bytes: what a letter of it weighs (group_bytes)
        for column, chunk in enumerate(group.get(1) or []):
            meta = row_group.column(column)
            pages = chunk_pages(raw, meta)  # walked: _check_chunks
            values = _ChunkValues(raw, meta, metadata.schema.column(column), pages, max_page_bytes)
            owns = [(*_chunk_range(meta), functools.partial(_copied, footer, chunk, values))]
            owns += [(*extra, tuple) for extra in _chunk_extras(raw, chunk, values, body_end)]
            values.release()  # held below for a copy's check: a file's chunks never at once
            parts.extend(owns)
            sizes.append(sum(end - start for start, end, _ in owns))
        owned.append(sizes)
    parts.sort(key=lambda part: part[:2])
    at, first, size, copies = len(PARQUET_MAGIC), None, 0, tuple
    for start, end, entries in [*parts, (body_end, body_end, tuple)]:
        if start == end < body_end:  # no bytes
            continue
        if start < len(PARQUET_MAGIC) or end < start or end > body_end:
            raise ValueError(
                f"{path}: the Parquet footer lists bytes {start} to {end}, outside the "
                f"file's body (bytes {len(PARQUET_MAGIC)} to {body_end})"
            )
        if start < at:
            raise ValueError(
                f"{path}: parts of a Parquet file its footer lists overlap at byte {start} "
                "(a column chunk named twice?): a layout no writer makes"
            )
        if _stray_gap(raw, at, start, copies):
            first, size = at if first is None else first, size + start - at
        at, copies = end, entries
    return None if first is None else StrayBytes(first, size)


# The bytes each row group of an open Parquet file owns (_stray_bytes), for group_bytes.
_OWNED: weakref.WeakKeyDictionary[IO[bytes], list[list[int]]] = weakref.WeakKeyDictionary()


def group_bytes(raw: IO[bytes], group: int) -> int:
    """The bytes a row group of a file parquet_file opened (raw) owns: its column chunks and
    the column index, offset index and bloom filter each points to, the parts _stray_bytes
    accounts for. What a letter refusing or breaking the group weighs, so a part no check
    reads (a chunk over the ceiling: its statistics and bloom filter held to nothing) is
    accounted for only as weighed by its group's letter, the group refused in every reader
    (oversized_pages)."""
    return sum(_OWNED[raw][group])


def column_bytes(raw: IO[bytes], parquet: pq.ParquetFile, group: int) -> list[int] | None:
    """The bytes a row group owns (group_bytes) per top-level column of the file's Arrow
    schema: its leaves' chunks and their indexes and bloom filters (a file's leaves are its
    columns' in schema order). None when the leaves do not map onto the columns so."""
    leaves = _OWNED[raw][group]
    counts = [_leaf_count(field.type) for field in parquet.schema_arrow]
    if sum(counts) != len(leaves):
        return None
    ends = itertools.accumulate(counts)
    return [sum(leaves[end - count : end]) for end, count in zip(ends, counts, strict=True)]


def _leaf_count(kind: pa.DataType) -> int:
    """The Parquet leaf columns a value of an Arrow type is stored in (_check_schema bounded
    its depth)."""
    if isinstance(kind, pa.BaseExtensionType):
        return _leaf_count(kind.storage_type)
    children = [] if pa.types.is_dictionary(kind) else child_fields(kind)
    return sum(_leaf_count(child.type) for child in children) if children else 1


def _copied(footer: Footer, chunk: dict[int, Any], values: _ChunkValues) -> tuple[bytes, ...]:
    """The bytes of the structs of a column chunk's footer entry (the entry, its metadata) whose
    copy a writer may leave behind its pages (_stray_gap), as the footer encodes them: each
    read closed (COLUMN_CHUNK, COLUMN_METADATA: no field the format does not define, nor
    key-value metadata, strings no reader needs of a copy), its path its column's and its
    statistics' strings bytes the chunk's values hold (_ChunkValues.holds, as a page's), so a
    copy repeats what a decoder consumed. Costs, when a gap follows the chunk, one more pass
    over its data pages while a statistic is unheld."""
    metadata = chunk.get(3)
    if not isinstance(metadata, dict):
        return ()
    encoded = footer.encoded(metadata)
    read = closed_struct(encoded, COLUMN_METADATA)
    # joined, as a name may hold a dot (the descriptor's path joins names so)
    if read is None or b".".join(read.get(3, [])) != values._descriptor.path.encode():
        return ()
    statistics = read.get(12, {})
    unheld = {statistics[field] for field in STATISTICS_BOUNDS if field in statistics}
    for page in values.pages:
        if not unheld:
            break
        if page.version:
            unheld = {value for value in unheld if not values.holds(page, value)}
    values.release()
    if unheld:
        return ()
    entry = footer.encoded(chunk)
    return (entry, encoded) if closed_struct(entry, COLUMN_CHUNK) is not None else (encoded,)


def _stray_gap(
    raw: IO[bytes], start: int, end: int, copies: Callable[[], tuple[bytes, ...]]
) -> bool:
    """Whether the gap [start, end) between the parts of a file holds other than what writers
    leave there: zeros (parquet-mr pads row groups so), after the copy of the metadata of the
    column chunk before it that some write behind its pages (the spec's first layout: polars,
    parquet-cpp 1.x): one of `copies()` (_copied), its footer entry's or its metadata's bytes
    as the footer encodes them, byte for byte (a copy decoding alike could hide bytes in what
    the decoder skips: strings). Reads the gap a chunk at a time up to its first stray
    byte."""
    for copy in copies() if start < end else ():
        raw.seek(start)
        if len(copy) <= end - start and raw.read(len(copy)) == copy:
            start += len(copy)
            break
    raw.seek(start)
    while start < end:
        data = raw.read(min(READ_CHUNK_BYTES, end - start))
        if not data or data.count(0) != len(data):
            return True
        start += len(data)
    return False


# ColumnChunk's fields: the offset index's offset and length, the column index's; then
# ColumnMetaData's (field 3) bloom filter offset and length (the length is newer: without it,
# the filter's header tells its size).
_INDEX_FIELDS = ((4, 5), (6, 7))
_BLOOM_FIELDS = (14, 15)


def _chunk_extras(
    raw: IO[bytes], chunk: dict[int, Any], values: _ChunkValues, body_end: int
) -> Iterator[tuple[int, int]]:
    """The bytes [start, end) of what a column chunk's footer entry points to besides its
    pages (`values`: its walked pages): its offset index, column index and bloom filter, as
    far as it names them, each decoded as what it claims to be and ending where the claim
    ends (ValueError if not): a byte counts as accounted for only when a decoder consumed it,
    a statistic's bytes only when they are bytes the chunk's values hold (_ChunkValues.holds),
    a bloom filter's only when they are the filter its values set (bloom_filter.bitset). Its
    pages' statistics are held so too. A region outside the body is yielded unread
    (_stray_bytes refuses it)."""
    data = [page for page in values.pages if page.version]
    bounds = [list(page.bounds) for page in data]  # and the column index's, each page's
    extras = []
    for offset_field, length_field in _INDEX_FIELDS:
        offset, length = chunk.get(offset_field), chunk.get(length_field)
        if offset is None and length is None:
            continue
        if not isinstance(offset, int) or not isinstance(length, int):
            raise ValueError(f"a page index at {offset} of no length {length}")
        if len(PARQUET_MAGIC) <= offset and offset + length <= body_end:
            # an index is a few varints a page, a column index two values a page at most
            if length > values.max_page_bytes + 64 * (len(data) + 1):
                raise ValueError(f"a page index at byte {offset} of {length} bytes, over its bound")
            raw.seek(offset)
            offsets = offset_field == _INDEX_FIELDS[0][0]
            index = closed_struct(raw.read(length), OFFSET_INDEX if offsets else COLUMN_INDEX)
            if index is None:
                raise ValueError(
                    f"the {'offset' if offsets else 'column'} index at byte {offset} is not one "
                    "of its chunk's pages: not of its length, or a field not the format's"
                )
            if offsets:
                _check_offset_index(offset, index, data)
            else:
                column = values._descriptor  # its max levels: its histograms' widths
                levels = column.max_repetition_level, column.max_definition_level
                found = _check_column_index(offset, index, data, levels)
                for page_bounds, found_bounds in zip(bounds, found):
                    page_bounds.extend(found_bounds)
        extras.append((offset, offset + length))
    column = chunk.get(3) if isinstance(chunk.get(3), dict) else {}
    offset, length = column.get(_BLOOM_FIELDS[0]), column.get(_BLOOM_FIELDS[1])
    size = None
    if isinstance(offset, int) and len(PARQUET_MAGIC) <= offset < body_end:
        try:
            header, header_bytes = _page_header(raw, offset, BLOOM_FILTER_HEADER)
        except ValueError:
            header, header_bytes = {}, 0
        size = header.get(1)
        # the one filter the spec defines; its bitset, of whole 32-byte blocks, follows
        if header != {1: size, 2: {1: {}}, 3: {1: {}}, 4: {1: {}}} or not (
            isinstance(size, int) and 0 < size <= values.max_page_bytes and size % 32 == 0
        ):
            raise ValueError(f"a bloom filter at byte {offset} of a header not the spec's")
        if length is not None and length != header_bytes + size:
            raise ValueError(
                f"a bloom filter at byte {offset} of {header_bytes + size} bytes, its footer "
                f"entry claims {length}"
            )
        length = header_bytes + size
    hashes = values.walk(bounds, size is not None)
    if size is not None and not values.oversized:
        raw.seek(offset + length - size)
        if raw.read(size) != bitset(hashes, size):
            raise ValueError(
                f"a bloom filter at byte {offset} whose bitset is not the one its chunk's "
                "values set"
            )
    yield from extras
    if isinstance(offset, int):  # past the body: refused
        yield offset, offset + (length if isinstance(length, int) else 1)


class _ChunkValues:
    """A column chunk's walked pages, each decompressed at most once on demand, for what its
    statistics and bloom filter are held to. A chunk holding a page over max_page_bytes is not
    decompressed (as _check_chunks does not: read, its group is refused unread), nor are its
    statistics held to anything (docs/BOUNDS.md)."""

    def __init__(
        self,
        raw: IO[bytes],
        column: pq.ColumnChunkMetaData,
        descriptor: pq.ColumnSchema,
        pages: tuple[Page, ...],
        max_page_bytes: int,
    ):
        self._raw, self._column, self._descriptor = raw, column, descriptor
        self.pages, self.max_page_bytes = pages, max_page_bytes
        self.oversized = any(over_ceiling(page, max_page_bytes) for page in pages)
        self._data: dict[int, bytes] = {}
        self._width = fixed_value_bytes(column.physical_type, descriptor.length)
        # the chunk's one dictionary page, its first (_pages refuses any other)
        self._dictionary = next((page for page in pages if not page.version), None)
        # the annotations writers truncate as UTF-8 text (parquet-mr: strings, enums, JSON)
        self._text = descriptor.converted_type in ("UTF8", "ENUM", "JSON")
        self._entries: _Named | None = None  # the dictionary's entries, found once
        self._named: tuple[int, np.ndarray] | None = None  # the last page's named entries

    def data(self, page: Page) -> bytes:
        """The page's data, its codec undone (v2: its levels stored plain before it). The
        dictionary's and the last data page's are kept: a chunk is never held whole."""
        if page.start not in self._data:
            if page.version:
                kept = self._dictionary.start if self._dictionary else -1
                self._data = {k: v for k, v in self._data.items() if k == kept}
            self._raw.seek(page.start)
            stored = self._raw.read(page.stored)
            codec = self._column.compression if page.compressed else "UNCOMPRESSED"
            levels = page.repetition + page.definition if page.version == 2 else 0
            self._data[page.start] = stored[:levels] + decompressed(
                stored[levels:], codec, page.size - levels
            )
        return self._data[page.start]

    def release(self) -> None:
        """Drop what was decompressed and found (built again if asked again)."""
        self._data, self._entries, self._named = {}, None, None

    def holds(self, page: Page, value: bytes) -> bool:
        """Whether a min or max value of a data page's statistics is one fixed-width value's
        bytes at most, or (BYTE_ARRAY) the page's own values' bytes: of a dictionary-encoded
        page, the start of an entry its indices name (_names_a_bound); of any other, bytes
        the page holds; either maybe truncated as writers truncate a max (_unraised). Bytes
        a decoder consumed, whatever they are, each page held to its own values alone, so a
        chunk's bounds cost its pages' bytes once and its dictionary's once, however many.
        DELTA_BYTE_ARRAY values, stored as suffixes, hold no such bytes."""
        if self._width is not None:  # one value's bytes at most (a boolean's: one)
            return len(value) <= max(self._width, 1)
        if self.oversized or not value:
            return True
        forms = _unraised(value, self._text)
        if page.encoding in DICTIONARY_ENCODINGS:
            return self._names_a_bound(page, forms)
        data = self.data(page)
        return any(form in data for form in forms)

    def _names_a_bound(self, page: Page, forms: tuple[bytes, ...]) -> bool:
        """Whether one of a bound's forms starts an entry of the chunk's dictionary that the
        page's indices name: the entries' ends found in one pass over the dictionary a chunk,
        the page's indices decoded once, then each named entry compared over the form's
        length alone (no entry copied), so a bound costs its page's values, not the
        dictionary's bytes."""
        if self._dictionary is None:
            return False
        dictionary = self.data(self._dictionary)
        if self._entries is None:
            self._entries = _Named(byte_array_ends(dictionary, 0, self._dictionary.values))
        entries = self._entries
        if self._named is None or self._named[0] != page.start:
            data = self.data(page)
            at, count, _ = _page_levels(data, self._descriptor, page)
            values_end(data, at, page.encoding, self._width, count, entries.next_page())
            self._named = page.start, entries.found()
        return any(entries.starts_one(dictionary, self._named[1], form) for form in forms)

    def walk(self, bounds: list[list[bytes]], hashing: bool) -> list[np.ndarray]:
        """One pass over the chunk's pages, each decompressed once: each data page's statistics
        (`bounds`, in page order) held (holds; ValueError if not), and when `hashing`, the
        xxhash64 of the chunk's values, PLAIN-encoded, each once at least (of a dictionary's
        entries, those its data pages' indices name: what a writer inserts), for its bloom
        filter; ValueError for a page stored otherwise (no common writer writes a bloom filter
        over one: docs/BOUNDS.md). A chunk over the bound (oversized) is hashed to nothing."""
        if hashing and self._column.physical_type == "BOOLEAN":
            raise ValueError("a bloom filter over booleans, which the format does not define")
        hashing = hashing and not self.oversized
        hashes, held = [], iter(bounds)
        dictionaries: list[tuple[np.ndarray, np.ndarray]] = []  # entries' hashes, named
        for page in self.pages:
            if page.version and not all(self.holds(page, bound) for bound in set(next(held))):
                raise ValueError(
                    f"a page at byte {page.at} whose statistics (its header's or the column "
                    "index's) are bytes its values do not hold"
                )
            if not hashing:
                continue
            if not page.version:
                entries = plain_hashes(self.data(page), 0, page.values, self._width)
                dictionaries.append((entries, np.zeros(len(entries), dtype=bool)))
            elif page.encoding == PLAIN:
                at, count, _ = _page_levels(self.data(page), self._descriptor, page)
                hashes.append(plain_hashes(self.data(page), at, count, self._width))
            elif page.encoding in DICTIONARY_ENCODINGS:
                if dictionaries:
                    at, count, _ = _page_levels(self.data(page), self._descriptor, page)
                    named = dictionaries[-1][1]
                    values_end(self.data(page), at, page.encoding, self._width, count, named)
            else:
                raise ValueError(f"a bloom filter over a page in encoding {page.encoding}")
        return hashes + [entries[named] for entries, named in dictionaries]


class _Named:
    """A dictionary's entries (`ends`: where each ends, its 4-byte length before it) and which
    of them a page's indices name, as parquet_payload.hybrid_end sets its `named` flags, but
    collected: each entry stamped with the page that named it, so a page's are found in its
    own indices (their distinct entries, a slice at a time) without a pass over the
    dictionary's length. Holds 12 bytes an entry, and an entry takes 4 bytes at least."""

    def __init__(self, ends: list[int]):
        self._ends = np.asarray(ends, dtype=np.int64)
        self._stamps = np.zeros(len(ends), dtype=np.int32)  # 0: no page yet; pages from 1
        self._page, self._found = 0, [np.zeros(0, dtype=np.int64)]

    def __len__(self) -> int:
        return len(self._ends)

    def __setitem__(self, index: int | np.ndarray, _flag: bool) -> None:
        index = np.atleast_1d(index)  # an RLE run names one entry, a bit-packed slice many
        fresh = np.unique(index[self._stamps[index] != self._page])
        self._stamps[fresh] = self._page
        self._found.append(fresh)

    def next_page(self) -> _Named:
        """Ready to collect the entries the next page names."""
        self._page, self._found = self._page + 1, [np.zeros(0, dtype=np.int64)]
        return self

    def found(self) -> np.ndarray:
        """The entries the page names, each once."""
        return np.concatenate(self._found)

    def starts_one(self, dictionary: bytes, named: np.ndarray, form: bytes) -> bool:
        """Whether `form` starts one of the `named` entries of the dictionary's data: the
        entries narrowed all at once by windows of the form twice as long each pass (a few
        numpy passes over the page's named entries' bytes, at most _WINDOW_BYTES a pass, no
        entry copied), the last few compared whole."""
        ends = self._ends[named]
        starts = np.where(named > 0, self._ends[named - 1], 0) + 4  # past each one's length
        fits = ends - starts >= len(form)
        starts, ends = starts[fits], ends[fits]
        data = np.frombuffer(dictionary, dtype=np.uint8)
        at, window = 0, 8
        while len(starts) > _FEW_ENTRIES and at < len(form):
            size = min(window, len(form) - at, max(1, _WINDOW_BYTES // len(starts)))
            held = data[(starts + at)[:, None] + np.arange(size)]
            same = (held == np.frombuffer(form, np.uint8, size, at)).all(axis=1)
            starts, ends, at, window = starts[same], ends[same], at + size, window * 2
        return any(dictionary.startswith(form, int(a), int(b)) for a, b in zip(starts, ends))


# Entries left when a bound is compared to each whole (_Named.starts_one): fewer Python calls
# than numpy passes.
_FEW_ENTRIES = 16
_WINDOW_BYTES = 1 << 20  # the bytes one pass gathers (8 bytes of index each)


def _unraised(value: bytes, text: bool) -> tuple[bytes, ...]:
    """A bound's forms before a writer may have truncated it, each fully determined by the
    bound (at most 10): itself (a min, or a max cut to bytes the page holds); a max with one
    byte of its last two characters (8 bytes at most) raised by one, that byte lowered and those
    after it kept (parquet-mr raises the last byte that leaves valid UTF-8, so an earlier one
    when the last cannot rise: U+4E3F's E4 B8 BF to E4 B9 BF, `z` + DEL to `{` + DEL); one
    carried (parquet-mr, arrow-rs over bytes: trailing 0xFF become 0x00 and the byte before
    them rises), its last nonzero byte lowered and the zeros after it 0xFF again; of a UTF-8
    column (`text`), one whose last character was raised by one code point (arrow-rs: a max
    cut at a character), that character lowered (past the surrogates, which UTF-8 does not
    encode)."""
    forms = [value]
    window = _character_start(value, _character_start(value, len(value)))
    forms += [
        value[:at] + bytes([value[at] - 1]) + value[at + 1 :]
        for at in range(len(value) - 1, window - 1, -1)
        if value[at]
    ]
    carried = len(value.rstrip(b"\x00"))
    if 0 < carried < len(value):
        forms.append(
            value[: carried - 1]
            + bytes([value[carried - 1] - 1])
            + b"\xff" * (len(value) - carried)
        )
    if text:
        start = _character_start(value, len(value))
        try:
            point = ord(value[start:].decode("utf-8")) - 1
        except (UnicodeDecodeError, TypeError):  # not one character
            point = -1
        if point >= 0:
            point = 0xD7FF if 0xD800 <= point < 0xE000 else point
            forms.append(value[:start] + chr(point).encode("utf-8"))
    return tuple(dict.fromkeys(forms))


def _character_start(value: bytes, end: int) -> int:
    """Where the UTF-8 character ending before `end` starts: back over continuation bytes, 3
    at most (of any bytes, a position 1 to 4 bytes back, never below 0)."""
    start = max(end - 1, 0)
    while start > 0 and end - start < 4 and 0x80 <= value[start] < 0xC0:
        start -= 1
    return start


def _check_offset_index(offset: int, index: dict[int, Any], pages: list[Page]) -> None:
    """An OffsetIndex (read closed: OFFSET_INDEX) locates exactly the chunk's data pages, as
    walked, each at a row no earlier than the page before's."""
    locations = index.get(1) or []
    rows = [location.get(3) for location in locations]
    if (
        [(location.get(1), location.get(2)) for location in locations]
        != [page.location for page in pages]
        or None in rows
        or rows[:1] not in ([], [0])
        or any(b < a for a, b in zip(rows, rows[1:]))
        or (2 in index and len(index[2]) != len(pages))
    ):
        raise ValueError(f"the offset index at byte {offset} does not locate its chunk's pages")


def _check_column_index(
    offset: int, index: dict[int, Any], pages: list[Page], levels: tuple[int, int]
) -> list[tuple[bytes, bytes]]:
    """A ColumnIndex (read closed: COLUMN_INDEX) holds an entry for each data page (ValueError
    if not): its repetition and definition level histograms (fields 6, 7; `levels`: the
    column's max levels) max level + 1 counts a page, as many as the page's levels. Each
    page's min and max values, for _chunk_extras to hold to the bytes its values hold
    (_ChunkValues.holds)."""
    count = len(pages)
    bounds = [index.get(2), index.get(3)]
    histograms = [(index[field], most + 1) for field, most in zip((6, 7), levels) if field in index]
    if (
        any(
            not isinstance(index.get(field), list) or len(index[field]) != count
            for field in (1, 2, 3)
        )
        or 4 not in index
        or (5 in index and len(index[5]) != count)
        or any(
            len(histogram) != width * count
            or any(
                sum(histogram[width * at : width * (at + 1)]) != page.values
                for at, page in enumerate(pages)
            )
            for histogram, width in histograms
        )
    ):
        raise ValueError(f"the column index at byte {offset} is not one of its chunk's pages")
    return list(zip(*bounds))


def _check_schema(path: str, schema: pa.Schema) -> None:
    """The file's columns as a whole are ones a record can be read from, or ValueError: each
    name one column's (columns are found by name, and Arrow's lookups by a repeated name fail),
    no type nested deeper than a record may be (every walk of a type is then shallow)."""
    twice = sorted(name for name, count in Counter(schema.names).items() if count > 1)
    if twice:
        raise ValueError(f"{path}: a Parquet file naming a column twice ({', '.join(twice)[:80]})")
    if deep := _nested_over(schema, MAX_NESTING_DEPTH):
        raise ValueError(
            f"{path}: Parquet column {deep} nests its rows deeper than {MAX_NESTING_DEPTH} levels"
        )
    for field in schema:
        if (kind := _unread_type(field.type)) is not None:
            raise ValueError(f"{path}: Parquet column {field.name} holds {kind}, a type not read")


# The types a file's columns may hold, nested in any of _CONTAINERS (or a dictionary of one):
# each turned into Python values from its storage (times as without_views makes them; an
# extension type, which a package may register, as the type it stores), never through the
# worker's packages; any other (a union, run-end encoding, an interval) is refused with the
# file, rather than read one way where pandas imports and another where it does not.
_LEAVES = (
    pa.types.is_null,
    pa.types.is_boolean,
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_decimal,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_string_view,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_binary_view,
    pa.types.is_fixed_size_binary,
    pa.types.is_date,
    pa.types.is_time,
    pa.types.is_timestamp,
    pa.types.is_duration,
)
_CONTAINERS = (
    pa.types.is_struct,
    pa.types.is_map,
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
    pa.types.is_fixed_size_list,
)


def _unread_type(kind: pa.DataType) -> pa.DataType | None:
    """The first type in kind outside _LEAVES and _CONTAINERS, or None (a shallow walk:
    _nested_over bounded the depth first)."""
    stack = [kind]
    while stack:
        kind = stack.pop()
        if pa.types.is_dictionary(kind):
            stack.append(kind.value_type)
        elif isinstance(kind, pa.BaseExtensionType):  # read as what it stores (without_views)
            stack.append(kind.storage_type)
        elif any(is_kind(kind) for is_kind in _CONTAINERS):
            stack.extend(field.type for field in child_fields(kind))
        elif not any(is_kind(kind) for is_kind in _LEAVES):
            return kind
    return None


def _nested_over(schema: pa.Schema, most: int) -> str | None:
    """The first column whose rows nest containers more than `most` levels deep (the row
    itself one level, as a record's object is), or None; walked with a stack of its own, so
    however deep a type is, Python's recursion limit is never met."""
    for field in schema:
        stack = [(field.type, 2)]  # a column's value is inside its row
        while stack:
            kind, depth = stack.pop()
            if kind.num_fields and depth > most:  # only containers nest
                return field.name
            stack.extend((kind.field(i).type, depth + 1) for i in range(kind.num_fields))
    return None


class GroupReader(NamedTuple):
    """A reader of one row group, and the most bytes one row's values can take once Arrow
    decodes them from a dictionary into a dense column, before the row can be sized."""

    reader: pq.ParquetFile
    dense_row_bytes: int


def group_reader(
    raw: IO[bytes], parquet: pq.ParquetFile, group: int, columns: Collection[str] | None = None
) -> GroupReader:
    """A reader of the file for one row group (of its top-level columns named, all when None)
    whose string columns stored as a dictionary (every data page of the group's chunk indexes
    its dictionary page) are read as Arrow dictionaries: an entry many rows reference is held
    once, not once per row, until a row is decoded (rows are sized first: arrow_sizes.py).
    Every other dictionary chunk is read dense: a fixed-width one (Arrow reads only strings as
    dictionaries) decodes each value to its type's width; a string chunk that fell back to
    plain pages (as a dictionary, Arrow would grow one over the whole chunk and copy it into
    every batch) to at most the dictionary's largest entry. dense_row_bytes bounds what a row
    of them decodes to before it can be sized, so that the caller reads few enough rows at
    once."""
    metadata = parquet.metadata
    row_group = metadata.row_group(group)
    strings, dense_row_bytes = [], 0
    for index in _read_columns(parquet, columns):
        chunk = row_group.column(index)
        if not chunk.has_dictionary_page:
            continue
        pages = chunk_pages(raw, chunk)
        # a list column's rows hold its values on average (docs/BOUNDS.md), as its pages
        # count them (the footer's counts are claims)
        levels = checked_levels(raw, chunk, parquet.schema.column(index).max_repetition_level)
        values_per_row = -(-levels.values // max(levels.rows, 1))
        width = fixed_value_bytes(chunk.physical_type, parquet.schema.column(index).length)
        if width is not None:
            dense_row_bytes += width * values_per_row
            continue
        if all(
            page.encoding in DICTIONARY_ENCODINGS for page in pages if page.encoding is not None
        ):
            strings.append(chunk.path_in_schema)
        else:
            dictionary_bytes = sum(page.size for page in pages if page.encoding is None)
            largest = _largest_entry_bytes(raw, metadata, group, chunk.path_in_schema)
            dense_row_bytes += min(largest, dictionary_bytes) * values_per_row
    reader = arrow_reader(raw, metadata=metadata, read_dictionary=strings or None)
    return GroupReader(reader, dense_row_bytes)


def _read_columns(parquet: pq.ParquetFile, columns: Collection[str] | None) -> list[int]:
    """The indices of the leaf columns under the top-level columns named (all when None)."""
    schema = parquet.schema
    return [
        index
        for index in range(len(schema))
        if columns is None or schema.column(index).path.split(".")[0] in columns
    ]


class SizedRows(NamedTuple):
    """Rows of a batch read as Arrow: first is the row's number in its row group."""

    first: int
    rows: pa.RecordBatch | None  # rows within the bound, together within it; None: one over it
    size: int  # the rows' size as JSON, at least (arrow_sizes.py)
    sizes: np.ndarray  # each row's, as size sums them (what its letter weighs: sources.RowShare)
    columns: np.ndarray  # each row's per top-level column (rows x columns), summed in sizes


def sized_rows(
    raw: IO[bytes],
    parquet: pq.ParquetFile,
    group: int,
    max_row_bytes: int,
    batch_rows: int,
    columns: Collection[str] | None = None,
) -> Iterator[SizedRows]:
    """A row group's rows (its columns named, all when None), batch_rows at a time, fewer
    when rows indexing a dictionary are decoded dense (as many as max_row_bytes holds at their
    most, one at least), each sized before it is decoded (arrow_sizes.py): a row over
    max_row_bytes as JSON comes alone with no rows, the others in runs of at most
    max_row_bytes together, their dictionaries still undecoded (a lone row larger as JSON
    than counted may go over). The one way every reader reads Parquet rows: ValueError for a
    group whose pages hold other than the rows its footer claims (_check_group_rows), and no
    row read past those its pages hold."""
    counted = _check_group_rows(raw, parquet, group, columns)
    group_read = group_reader(raw, parquet, group, columns)
    rows = max(1, min(batch_rows, max_row_bytes // max(group_read.dense_row_bytes, 1)))
    names = None if columns is None else [n for n in parquet.schema_arrow.names if n in columns]
    read = 0
    # the rows counted are read, never past them to the footer's claim, which Arrow reads to
    batches = group_read.reader.iter_batches(rows, row_groups=[group], columns=names)
    while read < counted and (batch := next(batches, None)) is not None:
        batch = batch.slice(0, counted - read)
        columns = column_json_bytes(batch)
        sizes = columns.sum(axis=1)
        for run in batches_by_weight(range(batch.num_rows), max_row_bytes, sizes.__getitem__):
            size = int(sizes[run].sum())
            within = size <= max_row_bytes  # over the weight: a run alone
            rows = batch.slice(run[0], len(run)) if within else None
            at = slice(run[0], run[0] + len(run))
            yield SizedRows(read + run[0], rows, size, sizes[at], columns[at])
        read += batch.num_rows


def _check_group_rows(
    raw: IO[bytes], parquet: pq.ParquetFile, group: int, columns: Collection[str] | None
) -> int:
    """The rows the row group's pages hold, which its footer claims too (ValueError if not),
    counted from one column chunk whether read or not (_counted_column): a group of no chunk
    holds none. Arrow reads a group up to its footer's count: rows past the pages would be lost
    unseen (read = exported + rejected), and a count no page confirms would be read as rows
    of nothing, for as long as it claims."""
    row_group = parquet.metadata.row_group(group)
    index = _counted_column(parquet, columns)
    rows, counted = 0, "no column"
    if index is not None:
        column = row_group.column(index)
        repeats = parquet.schema.column(index).max_repetition_level
        rows, counted = checked_levels(raw, column, repeats).rows, column.path_in_schema
    if rows != row_group.num_rows:
        raise ValueError(
            f"row group {group}'s pages hold {rows} rows of {counted}, its footer claims "
            f"{row_group.num_rows}"
        )
    return rows


def _counted_column(parquet: pq.ParquetFile, columns: Collection[str] | None) -> int | None:
    """The leaf column a row group's rows are counted from, None when the file has none: one
    read before one not (the page checks walked its pages already), one that does not repeat
    before one that does (its page headers alone count its rows)."""
    schema, read = parquet.schema, set(_read_columns(parquet, columns))
    return min(
        range(len(schema)),
        key=lambda i: (i not in read, schema.column(i).max_repetition_level > 0),
        default=None,
    )


def _largest_entry_bytes(raw: IO[bytes], metadata: pq.FileMetaData, group: int, column: str) -> int:
    """The largest entry of a column chunk's dictionary page (its bytes as JSON), read as an
    Arrow dictionary with the chunk's first row: the page is decoded once, within the page
    ceiling that oversized_pages checked. Unbounded (the page's size is then the bound) when
    no dictionary comes back."""
    probe = arrow_reader(raw, metadata=metadata, read_dictionary=[column])
    batch = next(probe.iter_batches(1, row_groups=[group], columns=[column]), None)
    arrays = [] if batch is None else _dictionaries(batch.column(0))
    return max((largest_value_bytes(array) for array in arrays), default=sys.maxsize)


def _dictionaries(array: pa.Array) -> Iterator[pa.Array]:
    """The dictionaries (their entries) held anywhere in a nested array."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        yield array.dictionary
    elif pa.types.is_struct(kind):
        for index in range(kind.num_fields):
            yield from _dictionaries(array.field(index))
    elif isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        yield from _dictionaries(array.values)


def oversized_pages(
    raw: IO[bytes],
    metadata: pq.FileMetaData,
    group: int,
    max_cell_bytes: int,
    columns: Collection[str] | None = None,
) -> str | None:
    """Why a row group cannot be read within the bounds, or None when it can, known before any
    of it is decoded. A page is decoded whole and holds whole values, so a page is refused
    when it is over PAGE_BOUND_MULTIPLE times max_cell_bytes (the reader's ceiling), or when
    its values average over it (one at least is). Every chunk's page headers are read (bytes
    each, seeking past the pages): they are what Arrow decodes by, while the footer's sizes,
    value and row counts are claims nothing checks. A list cell may span pages, and Arrow
    decodes a row's levels whole before it can be sized: a group whose rows may hold more
    levels than max_cell_bytes takes as JSON, the most in one row of each column summed,
    counted from the repetition levels (chunk_levels), is refused. A level is a value, a null
    or an empty list: a byte at least, and a comma parts it from the next (a cell of L levels
    is 2 L - 1 bytes at least). A page over the ceiling refuses its group whatever columns
    are read: parquet_file's checks leave such a page unread, trusting its group is never
    read. The rest looks at the top-level columns named alone (all when None)."""
    row_group = metadata.row_group(group)
    most = 0  # the most levels a row holds, column by column, summed
    try:
        chunks = [row_group.column(index) for index in range(row_group.num_columns)]
        for column in chunks:
            _check_ceiling(chunk_pages(raw, column), group, column, max_cell_bytes)
        for index, column in enumerate(chunks):
            if columns is not None and column.path_in_schema.split(".")[0] not in columns:
                continue
            _check_average(chunk_pages(raw, column), group, column, max_cell_bytes)
            repeats = metadata.schema.column(index).max_repetition_level
            most += checked_levels(raw, column, repeats).most
    except _OverCeiling as err:
        return str(err)
    if 2 * most - 1 > max_cell_bytes:
        return (
            f"row group {group} has rows of up to {most} values (each column's largest row, "
            f"from its repetition levels; as JSON, each a byte and a comma at least): over "
            f"{max_cell_bytes} bytes"
        )
    return None


class _OverCeiling(Exception):
    """A page that cannot be decoded within the bound: why."""


def _check_ceiling(
    pages: Iterable[Page], group: int, column: pq.ColumnChunkMetaData, max_cell_bytes: int
) -> None:
    """Each page checked against the reader's ceiling (over_ceiling: _OverCeiling), from its
    header alone: before any is read."""
    for page in pages:
        if over_ceiling(page, PAGE_BOUND_MULTIPLE * max_cell_bytes):
            raise _OverCeiling(
                f"row group {group}'s column {column.path_in_schema} has a page of "
                f"{max(page.size, page.stored)} bytes, over the reader's ceiling of "
                f"{PAGE_BOUND_MULTIPLE} x {max_cell_bytes}"
            )


def _check_average(
    pages: Iterable[Page], group: int, column: pq.ColumnChunkMetaData, max_cell_bytes: int
) -> None:
    """Each page of a column read checked for values averaging over max_cell_bytes
    (_OverCeiling: one at least is), from its header alone."""
    for page in pages:
        if page.size > max_cell_bytes * max(page.values, 1):
            raise _OverCeiling(
                f"row group {group}'s column {column.path_in_schema} has a page of "
                f"{page.size} bytes for {page.values} value(s): one at least is over "
                f"{max_cell_bytes}"
            )


class Page(NamedTuple):
    size: int  # uncompressed
    values: int
    encoding: int | None  # a data page's (Parquet's Encoding enum); None for the dictionary
    start: int  # its data's first byte in the file, past its header
    stored: int  # its data's bytes in the file (compressed)
    version: int  # a data page's format, 1 or 2; 0 for any other page (the dictionary)
    repetition: int  # v1: its repetition levels' encoding; v2: their bytes (stored plain)
    at: int = 0  # its header's first byte in the file
    definition: int = 0  # v1: its definition levels' encoding; v2: their bytes (stored plain)
    compressed: bool = True  # v2: whether its values are (a v1 page's data always is)
    bounds: tuple[bytes, ...] = ()  # its header's statistics' min and max values

    @property
    def location(self) -> tuple[int, int]:
        """The page as an offset index locates it: its header's offset, its bytes in all."""
        return self.at, self.start + self.stored - self.at


# What the page walks of an open Parquet file found, by the bytes walked: the page checks, the
# row count and the reader's sizing of a chunk share one walk of its pages (docs/BOUNDS.md).
_WALKED: weakref.WeakKeyDictionary[IO[bytes], dict[tuple, Any]] = weakref.WeakKeyDictionary()


def chunk_pages(raw: IO[bytes], column: pq.ColumnChunkMetaData) -> tuple[Page, ...]:
    """Each page of a column chunk (_pages), its bytes walked once per open file. Arrow reads a
    chunk's pages until they hold the values its footer entry claims, past the chunk's stated
    end if need be (by up to 100 bytes when it takes the footer's writer for an old parquet-mr:
    PARQUET-816), where this walk never looks: pages holding fewer are refused (ValueError),
    so Arrow stops inside the pages walked, whatever the footer says of its writer."""
    walked = _WALKED.setdefault(raw, {})
    key = _chunk_range(column)
    if key not in walked:
        pages = tuple(_pages(raw, column))
        walked[key] = pages, sum(page.values for page in pages if page.version)
    pages, values = walked[key]
    if values < column.num_values:
        raise ValueError(
            f"the pages of {column.path_in_schema} hold {values} values, its footer "
            f"{column.num_values}: Arrow would read on past the chunk's end"
        )
    return pages


def checked_levels(raw: IO[bytes], column: pq.ColumnChunkMetaData, max_repetition: int) -> Levels:
    """A column chunk's rows and levels (chunk_levels), its pages read once per open file."""
    walked = _WALKED.setdefault(raw, {})
    key = (*_chunk_range(column), column.compression, max_repetition)
    if key not in walked:
        walked[key] = chunk_levels(raw, column, max_repetition, chunk_pages(raw, column))
    return walked[key]


def _chunk_range(column: pq.ColumnChunkMetaData) -> tuple[int, int]:
    """The bytes a column chunk claims, [start, end): its first page (the dictionary's, if
    any) on, as Arrow reads it; a chunk of no data page (pyarrow's of an empty table: its data
    page offset 0, inside the magic) from its dictionary, where Arrow reads no page at all
    (chunk_pages refuses such a chunk claiming values)."""
    start = column.data_page_offset
    dictionary = column.dictionary_page_offset if column.has_dictionary_page else None
    if (
        dictionary is not None
        and 0 < dictionary
        and (dictionary < start or start < len(PARQUET_MAGIC))
    ):
        start = dictionary
    return start, start + column.total_compressed_size


# Parquet's PageType enum -> the PageHeader field holding that type's header.
_PAGE_HEADERS = {0: 5, 3: 8, 2: 7}  # DATA_PAGE, DATA_PAGE_V2, DICTIONARY_PAGE


def _pages(raw: IO[bytes], column: pq.ColumnChunkMetaData) -> Iterator[Page]:
    """Each page of a column chunk, from its page headers. A dictionary page only as the
    chunk's first page (ValueError at its header if not): a chunk has one dictionary, which
    Arrow reads before its data pages and refuses a second of, so at most one is ever held."""
    first, end = _chunk_range(column)
    offset = first
    while offset < end:
        header, header_bytes = _page_header(raw, offset)
        uncompressed, compressed = header.get(2), header.get(3)
        # The page's type (field 1) names its header, as Arrow reads it: a data page (v1: field
        # 5, v2: 8) or the dictionary page (7), whose first field counts the values; a data
        # page's encoding is its field 2 (v1) or 4 (v2), its repetition levels' encoding field
        # 4 (v1) or their length field 6 (v2).
        field = _PAGE_HEADERS.get(header.get(1), 0)
        if set(header) & {5, 6, 7, 8} != {field}:  # only the struct its type names
            raise ValueError(
                f"damaged page header at byte {offset} of {column.path_in_schema}: a page "
                "header holding other than the one struct its type names"
            )
        if field == 7 and offset != first:
            raise ValueError(
                f"a dictionary page at byte {offset} of {column.path_in_schema}, not its "
                "chunk's first page: a chunk holds one dictionary, before its data pages"
            )
        kind = header[field]
        statistics = kind.get({5: 5, 8: 8}.get(field, 0), {})
        values, encoding = kind.get(1), kind.get({5: 2, 8: 4}.get(field, 0))
        repetition = kind.get({5: 4, 8: 6}.get(field, 0), 0)
        definition = kind.get({5: 3, 8: 5}.get(field, 0), 0)
        # Thrift i32s (Arrow's int): a value Arrow would read otherwise is damage
        if not all(
            isinstance(n, int) and 0 <= n < 1 << 31
            for n in (uncompressed, compressed, values, repetition, definition)
        ):
            raise ValueError(f"damaged page header at byte {offset} of {column.path_in_schema}")
        version = {5: 1, 8: 2}.get(field, 0)
        yield Page(
            uncompressed,
            values,
            encoding if field != 7 else None,
            offset + header_bytes,
            compressed,
            version,
            repetition,
            offset,
            definition,
            kind.get(7, True) if field == 8 else True,
            tuple(statistics[f] for f in STATISTICS_BOUNDS if f in statistics),
        )
        offset += header_bytes + compressed
    if offset != end:
        raise ValueError(f"the pages of {column.path_in_schema} overrun its column chunk")


class Levels(NamedTuple):
    """What a column chunk's data pages hold, counted from their headers and repetition
    levels (what Arrow decodes by), not from the footer."""

    rows: int  # the rows its levels start
    values: int  # its levels: a value, or a null or empty list where one would be
    most: int  # the most levels one row holds


def chunk_levels(
    raw: IO[bytes], column: pq.ColumnChunkMetaData, max_repetition: int, pages: Iterable[Page]
) -> Levels:
    """A column chunk's rows and levels, from its pages (_pages), taken one at a time. A
    column that does not repeat holds one level a row; one that does starts a row at each
    repetition level of 0, read from its pages' RLE runs without decoding a value (a page is
    read, and decompressed, once more: its size is checked first)."""
    rows, values = _RowCounter(), 0
    width = max_repetition.bit_length()
    for page in pages:
        if not page.version:  # the dictionary: entries, not levels
            continue
        values += page.values
        if max_repetition:
            rows.add(_repetition_levels(raw, column, page), width, page.values)
    if not max_repetition:
        return Levels(values, values, min(values, 1))
    return Levels(rows.rows, values, rows.most_levels())


def _repetition_levels(raw: IO[bytes], column: pq.ColumnChunkMetaData, page: Page) -> bytes:
    """A data page's repetition levels as stored (the RLE / bit-packed hybrid, no length
    prefix): a v2 page keeps them plain ahead of its values; a v1 page opens its (decompressed)
    data with them and their length. Those the payload check decoded (_check_payload) are
    taken from it, once: the page is not decompressed twice."""
    if (checked := _WALKED.get(raw, {}).pop(("repetition", page.start), None)) is not None:
        return checked
    stored = page.repetition if page.version == 2 else page.stored
    # sizes are the header's claims: none is read past the page, nor the file
    if stored > page.stored or page.start + stored > raw.seek(0, os.SEEK_END):
        raise ValueError(f"a page of {column.path_in_schema} ends past its file")
    raw.seek(page.start)
    if page.version == 2:
        return raw.read(stored)
    if page.repetition != RLE:
        raise ValueError(
            f"a page of {column.path_in_schema} stores repetition levels as encoding "
            f"{page.repetition}, not RLE"
        )
    data = decompressed(raw.read(page.stored), column.compression, page.size)
    length = int.from_bytes(data[:4], "little")
    if len(data) < 4 + length:
        raise ValueError(f"a page of {column.path_in_schema} ends inside its levels")
    return data[4 : 4 + length]


class _RowCounter:
    """Rows a column's repetition levels start (a level of 0 starts one) and the most levels
    one holds, counted as its pages go by from where its rows start: an RLE run of 0s is two
    positions however many rows it starts, bit-packed runs are unpacked together a slice at a
    time, so the only Python work per run is reading its header."""

    _SLICE_LEVELS = 1 << 20  # bit-packed levels unpacked at once
    _SLICE_RUNS = 1 << 16

    def __init__(self) -> None:
        self.rows = 0
        self._levels = 0  # of every page so far
        self._row_start = 0  # the level the row not yet ended starts at
        self._most = 0

    def most_levels(self) -> int:
        return max(self._most, self._levels - self._row_start)

    def add(self, levels: bytes, width: int, count: int) -> None:
        """A page's `count` levels, `width` bits each, as the RLE / bit-packed hybrid."""
        runs: list[_Run] = []
        packed = 0
        for run in _hybrid_runs(levels, width, count):
            runs.append(run)
            packed += run.levels if run.packed >= 0 else 0
            if packed >= self._SLICE_LEVELS or len(runs) >= self._SLICE_RUNS:
                self._starts(levels, width, runs, count)
                runs, packed = [], 0
        self._starts(levels, width, runs, count)
        self._levels += count

    def _starts(self, levels: bytes, width: int, runs: list[_Run], count: int) -> None:
        """Count the rows the runs (in order, of one page) start."""
        starts: list[np.ndarray] = []
        interior: list[np.ndarray] = []  # whether the gap before a start lies inside a run
        if bits := [run for run in runs if run.packed >= 0]:
            found = _packed_zeros(levels, width, bits)
            found = found[found < count]  # past the page's levels: its last group's padding
            starts.append(found)
            interior.append(np.zeros(len(found), dtype=bool))
            self.rows += len(found)
        for run in runs:
            if run.packed < 0:  # an RLE run of 0s: run.levels rows of one level each
                starts.append(np.array([run.first, run.first + run.levels - 1]))
                interior.append(np.array([False, True]))
                self.rows += run.levels
        at = np.concatenate(starts or [np.zeros(0, dtype=np.int64)]) + self._levels
        if not len(at):
            return
        order = np.argsort(at, kind="stable")
        at, inside = at[order], np.concatenate(interior)[order]
        gaps = np.diff(at, prepend=self._row_start)
        self._most = max(self._most, int(np.where(inside, 1, gaps).max()))
        self._row_start = int(at[-1])


def _packed_zeros(levels: bytes, width: int, runs: list[_Run]) -> np.ndarray:
    """Where in their page bit-packed runs hold a level of 0, the runs unpacked together."""
    groups = np.array([-(-run.levels // 8) for run in runs])
    found = unpacked(
        b"".join(
            levels[run.packed : run.packed + int(size) * width] for run, size in zip(runs, groups)
        ),
        width,
    )
    ends = np.cumsum(groups) * 8  # each run's end among the unpacked levels
    zeros = np.flatnonzero(found == 0)
    shift = np.array([run.first for run in runs]) - (ends - groups * 8)
    return zeros + shift[np.searchsorted(ends, zeros, side="right")]


class _Run(NamedTuple):
    """A run of the RLE / bit-packed hybrid that may start rows."""

    first: int  # its first level's place in the page
    levels: int
    packed: int  # where its bit-packed bytes start; -1 for an RLE run of 0s


# Bit-packed groups of 8 levels taken as one run at most: a run's header may claim any.
_GROUPS_PER_RUN = 1 << 14


def _hybrid_runs(levels: bytes, width: int, count: int) -> Iterator[_Run]:
    """The runs of `count` levels, `width` bits each, in the RLE / bit-packed hybrid that may
    start a row: bit-packed ones (long ones in pieces) and RLE runs of 0s. ValueError when the
    bytes end first; an RLE run of another level only moves on."""
    at = position = 0
    value_bytes = (width + 7) // 8
    size = len(levels)
    while position < count:
        if at >= size:
            raise ValueError("a page's repetition levels end before its values")
        header = levels[at]  # most headers are one byte
        header, at = (header, at + 1) if header < 0x80 else varint(levels, at)
        length = header >> 1
        if header & 1:  # bit-packed: `length` groups of 8 levels
            if length * width > size - at:
                raise ValueError("a page's repetition levels end inside a bit-packed run")
            if length <= _GROUPS_PER_RUN:
                yield _Run(position, min(length * 8, count - position), at)
                position += length * 8
            else:
                for group in range(0, length, _GROUPS_PER_RUN):
                    if position >= count:
                        break
                    groups = min(_GROUPS_PER_RUN, length - group)
                    yield _Run(position, min(groups * 8, count - position), at + group * width)
                    position += groups * 8
            at += length * width
        else:  # an RLE run: `length` levels of one value
            zero = not any(levels[at : at + value_bytes])
            at += value_bytes
            length = min(length, count - position)
            if zero and length:
                yield _Run(position, length, -1)
            position += length


def _page_header(
    raw: IO[bytes], offset: int, shape: dict[int, Any] | None = None
) -> tuple[dict[int, Any], int]:
    """The fields of the Parquet page header (or of another struct of the body of that `shape`:
    a bloom filter's header) at offset (Thrift compact protocol), and its size: read in
    growing slices, up to MAX_PAGE_HEADER_BYTES, by a closed reader (_ClosedReader), so every
    byte of it is a field the format defines, consumed for what it is."""
    size = 1 << 10
    while True:
        raw.seek(offset)
        data = raw.read(size)
        reader = _ClosedReader(data, PAGE_HEADER if shape is None else shape)
        try:
            return reader.struct(), reader.position
        except IndexError:  # the header goes on past the slice read
            if size >= MAX_PAGE_HEADER_BYTES or len(data) < size:
                raise ValueError(
                    f"Parquet page header at byte {offset} is damaged or over "
                    f"{MAX_PAGE_HEADER_BYTES} bytes"
                ) from None
            size *= 4
        except ValueError as err:
            raise ValueError(f"Parquet page header at byte {offset}: {err}") from None


# The Thrift structs of a page header, as the format defines them: field id -> its compact
# types (a bool's value is its type: 1 true, 2 false), or a nested struct's own shape.
_BOOL, _I32, _I64, _BINARY = (1, 2), (5,), (6,), (8,)
_STATISTICS = {
    **{field: _BINARY for field in (1, 2, 5, 6)},  # max, min (deprecated), max_value, min_value
    **{field: _I64 for field in (3, 4)},  # null_count, distinct_count
    **{field: _BOOL for field in (7, 8)},  # is_max_value_exact, is_min_value_exact
}
STATISTICS_BOUNDS = (1, 2, 5, 6)
PAGE_HEADER: dict[int, Any] = {
    **{field: _I32 for field in (1, 2, 3, 4)},  # type, sizes, crc
    5: {1: _I32, 2: _I32, 3: _I32, 4: _I32, 5: _STATISTICS},  # DataPageHeader
    6: {},  # IndexPageHeader
    7: {1: _I32, 2: _I32, 3: _BOOL},  # DictionaryPageHeader
    8: {**{field: _I32 for field in range(1, 7)}, 7: _BOOL, 8: _STATISTICS},  # DataPageHeaderV2
}
# split-block, xxhash, uncompressed: the one filter the spec defines, each an empty struct
# inside its union
BLOOM_FILTER_HEADER: dict[int, Any] = {1: _I32, 2: {1: {}}, 3: {1: {}}, 4: {1: {}}}


class _CompactReader:
    """Thrift's compact protocol over bytes, as far as a Parquet page header and footer need:
    integers, lists and nested structs kept by field id, everything else skipped. Reading past the end is an
    IndexError; nesting of every container (struct, list, set, map) is bounded, so a header
    fails as a ValueError, never as Python's recursion limit."""

    _MAX_DEPTH = 8

    def __init__(self, data: bytes, spans: dict[int, tuple[int, int]] | None = None):
        self._data = data
        self.position = 0
        self.spans = spans  # kept when given: each struct's bytes, by its id (Footer.spans)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        self._nest(depth)
        fields: dict[int, Any] = {}
        field_id, start = 0, self.position
        while (head := self._byte()) != 0:  # 0: the struct's end
            kind, delta = head & 0x0F, head >> 4
            field_id = field_id + delta if delta else self._zigzag()
            fields[field_id] = (kind == 1) if kind in (1, 2) else self._value(kind, depth)
        if self.spans is not None:
            self.spans[id(fields)] = start, self.position
        return fields

    def _value(self, kind: int, depth: int) -> Any:
        if kind in (1, 2, 3):  # a bool inside a list, or a byte
            return self._byte()
        if kind in (4, 5, 6):
            return self._zigzag()
        if kind == 7:  # a double
            return self._skip(8)
        if kind == 8:  # binary
            return self._skip(self._varint())
        if kind in (9, 10):  # list, set: kept (a footer's schema, row groups and histograms)
            self._nest(depth)
            head = self._byte()
            size = self._varint() if head >> 4 == 15 else head >> 4
            if size > len(self._data) - self.position:  # an item takes a byte at least
                raise IndexError("past the end")
            return [self._value(head & 0x0F, depth + 1) for _ in range(size)]
        if kind == 11:  # map
            self._nest(depth)
            size = self._varint()
            types = self._byte() if size else 0
            for _ in range(size):
                self._value(types >> 4, depth + 1)
                self._value(types & 0x0F, depth + 1)
            return None
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"Parquet page header holds an unknown Thrift type {kind}")

    def _nest(self, depth: int) -> None:
        if depth > self._MAX_DEPTH:
            raise ValueError("Parquet page header nested too deep")

    def _byte(self) -> int:
        value = self._data[self.position]
        self.position += 1
        return value

    def _skip(self, size: int) -> None:
        if self.position + size > len(self._data):
            raise IndexError("past the end")
        self.position += size

    def _varint(self) -> int:
        value = shift = 0
        while shift < 64:
            byte = self._byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        raise ValueError("Parquet page header holds an over-long integer")

    def _zigzag(self) -> int:
        value = self._varint()
        return (value >> 1) ^ -(value & 1)


class _ClosedReader(_CompactReader):
    """A struct of a known shape (Thrift's compact protocol): each field one its shape names,
    once, of its type; strings kept as bytes. Any other field, type or repeat is a ValueError:
    a field a reader skips is where bytes could hide."""

    def __init__(self, data: bytes, shape: dict[int, Any]):
        super().__init__(data)
        self._shape = shape

    def struct(self, depth: int = 0, shape: dict[int, Any] | None = None) -> dict[int, Any]:
        shape = self._shape if shape is None else shape
        fields: dict[int, Any] = {}
        field_id = 0
        while (head := self._byte()) != 0:  # 0: the struct's end
            kind, delta = head & 0x0F, head >> 4
            field_id = field_id + delta if delta else self._zigzag()
            expected = shape.get(field_id)
            if field_id in fields or kind not in _types(expected):
                raise ValueError(f"field {field_id} of Thrift type {kind}, not the format's")
            fields[field_id] = self._typed(kind, expected, depth)
        return fields

    def _typed(self, kind: int, expected: Any, depth: int, listed: bool = False) -> Any:
        """A value of Thrift type `kind` (one `expected` allows) read as the shape says (listed:
        a list's element, where a bool is a byte of its own: 1 true, 2 false)."""
        if isinstance(expected, dict):
            return self.struct(depth + 1, expected)
        if isinstance(expected, _List):
            head = self._byte()
            size = self._varint() if head >> 4 == 15 else head >> 4
            element = head & 0x0F
            if element not in _types(expected.element):
                raise ValueError(f"a list of Thrift type {element}, not the format's")
            if size > len(self._data) - self.position:  # an item takes a byte at least
                raise IndexError("past the end")
            return [self._typed(element, expected.element, depth, True) for _ in range(size)]
        if kind in (1, 2):
            if listed:
                value = self._byte()
                if value not in (1, 2):
                    raise ValueError(f"a bool of value {value}, not the format's")
                return value == 1
            return kind == 1
        if kind == 8:
            size = self._varint()
            self._skip(size)
            return self._data[self.position - size : self.position]
        return self._zigzag()


class _List(NamedTuple):
    """A list field of a _ClosedReader's shape: its elements' shape (types, or a struct's)."""

    element: Any


def _types(expected: Any) -> tuple[int, ...]:
    """The Thrift compact types a field of a _ClosedReader's shape may take."""
    if isinstance(expected, dict):
        return (12,)
    return (9,) if isinstance(expected, _List) else expected or ()


# The page indexes and a chunk's metadata, as the format defines them (_ClosedReader).
_PAGE_LOCATION = {1: _I64, 2: _I32, 3: _I64}  # offset, compressed size, first row
OFFSET_INDEX: dict[int, Any] = {1: _List(_PAGE_LOCATION), 2: _List(_I64)}
COLUMN_INDEX: dict[int, Any] = {
    1: _List(_BOOL),  # null_pages
    **{field: _List(_BINARY) for field in (2, 3)},  # min_values, max_values
    4: _I32,  # boundary_order
    **{field: _List(_I64) for field in (5, 6, 7)},  # null counts, level histograms
}
_SIZE_STATISTICS = {1: _I64, 2: _List(_I64), 3: _List(_I64)}
_GEOSPATIAL_STATISTICS = {1: {field: (7,) for field in range(1, 9)}, 2: _List(_I32)}
# ColumnMetaData, but for key-value metadata (field 8): strings no reader needs of a copy
COLUMN_METADATA: dict[int, Any] = {
    1: _I32,  # type
    2: _List(_I32),  # encodings
    3: _List(_BINARY),  # path_in_schema
    4: _I32,  # codec
    **{field: _I64 for field in (5, 6, 7, 9, 10, 11, 14)},  # counts, sizes, offsets
    12: _STATISTICS,
    13: _List({1: _I32, 2: _I32, 3: _I32}),  # encoding_stats
    15: _I32,  # bloom_filter_length
    16: _SIZE_STATISTICS,
    17: _GEOSPATIAL_STATISTICS,
}
# ColumnChunk, but for file_path and encryption (fields 1, 8, 9): a chunk read is in this file
COLUMN_CHUNK: dict[int, Any] = {
    2: _I64,  # file_offset
    3: COLUMN_METADATA,
    **{field: _I64 for field in (4, 6)},  # offset index's, column index's offset
    **{field: _I32 for field in (5, 7)},  # their lengths
}


def closed_struct(data: bytes, shape: dict[int, Any]) -> dict[int, Any] | None:
    """The struct of `shape` that `data` holds whole, ending at its end, or None."""
    reader = _ClosedReader(data, shape)
    try:
        fields = reader.struct()
    except (IndexError, ValueError):
        return None
    return fields if reader.position == len(data) else None


class _OverWeight(Exception):
    """A footer weighing more than its bound."""


class _FooterWalk(_CompactReader):
    """A Parquet footer (Thrift's compact protocol) walked, nothing of it kept: its structs
    counted at any depth, with a stack of its own (no recursion however deep), as deep as
    Thrift's own reader allows Arrow (64 levels). Lists of numbers are skipped at C speed, so
    the walk's Python steps are a struct's fields and a list's structs and strings, each at
    least a byte of the footer."""

    _MAX_DEPTH = 64
    _FIXED_BYTES = {1: 1, 2: 1, 3: 1, 7: 8}  # in a list: bools, bytes, doubles
    _VARINTS = (4, 5, 6)
    _SCHEMA_FIELD = 2  # FileMetaData's list of schema elements

    def weight(self, most: int) -> int:
        """The footer's weight: FOOTER_STRUCT_BYTES for each struct in it, itself included, and
        SCHEMA_ELEMENT_BYTES more for each schema element; _OverWeight as soon as it is over
        `most`."""
        weight = FOOTER_STRUCT_BYTES
        # a struct as [None, last field id]; a list, set or map as [element types, left]
        stack: list[list[Any]] = [[None, 0]]
        while stack:
            frame = stack[-1]
            schema = False
            if frame[0] is None:
                head = self._byte()
                if not head:  # the struct's end
                    stack.pop()
                    continue
                kind = head & 0x0F
                frame[1] = frame[1] + (head >> 4) if head >> 4 else self._zigzag()
                if kind in (1, 2):  # a bool field: its value is its type
                    continue
                schema = len(stack) == 1 and frame[1] == self._SCHEMA_FIELD
            else:
                if not frame[1]:
                    stack.pop()
                    continue
                frame[1] -= 1
                kind = frame[0][frame[1] % len(frame[0])]
            if kind == 12:
                weight += FOOTER_STRUCT_BYTES
                stack.append([None, 0])
            elif kind in (9, 10, 11):
                stack.append(self._collection(kind))
                weight += stack[-1][1] * SCHEMA_ELEMENT_BYTES if schema else 0
            else:
                self._scalar(kind)
            if weight > most:
                raise _OverWeight
            if len(stack) > self._MAX_DEPTH:
                raise ValueError("Parquet footer nested too deep")
        return weight

    def _collection(self, kind: int) -> list[Any]:
        """A list's, set's or map's header read, and its values too when they are numbers; what
        is left to walk as [element types, count]."""
        if kind == 11:
            size = self._varint()
            types = self._byte() if size else 0
            return [(types & 0x0F, types >> 4), 2 * size]  # taken from the end: key first
        head = self._byte()
        size = self._varint() if head >> 4 == 15 else head >> 4
        element = head & 0x0F
        if element in self._FIXED_BYTES:
            self._skip(size * self._FIXED_BYTES[element])
            size = 0
        elif element in self._VARINTS:
            # each varint ends at a byte under 0x80, at most 10 bytes on
            window = self._data[self.position : self.position + 10 * size]
            ends = np.flatnonzero(np.frombuffer(window, np.uint8) < 0x80)
            if len(ends) < size:
                raise IndexError("past the end")
            self.position += int(ends[size - 1]) + 1 if size else 0
            size = 0
        return [(element,), size]

    def _scalar(self, kind: int) -> None:
        if kind in self._FIXED_BYTES:
            self._skip(self._FIXED_BYTES[kind])
        elif kind in self._VARINTS:
            self._varint()
        elif kind == 8:
            self._skip(self._varint())
        else:
            raise ValueError(f"Parquet footer holds an unknown Thrift type {kind}")


class ParquetRows(NamedTuple):
    """The rows of a Parquet file read within a bound, and those not read."""

    table: pa.Table  # the rows within the bound; string columns stored as dictionaries kept so
    numbers: np.ndarray  # int64: each row's 1-based number in the file
    oversized: list[tuple[int, str]]  # (1-based row number, why) of each row over the bound


# Rows a trace reader reads at once: a batch of trace rows is small; its dictionary-decoded
# rows are bounded by sized_rows all the same.
TRACE_BATCH_ROWS = 1 << 16


def read_parquet_within(
    path: str,
    max_row_bytes: int,
    columns: Collection[str],
    opened: IO[bytes] | None = None,
    required: Collection[str] = (),
) -> ParquetRows:
    """The named columns of a Parquet file (a trace's; opened: read from it), read as every
    reader reads Parquet (sized_rows): the footer bounded, the columns `required` present and
    each row group's pages checked first (ValueError saying why not), then each row sized
    before it is decoded, a row over max_row_bytes as JSON left unread and reported. A string
    column stored as a dictionary stays one (an entry is held once however many rows
    reference it: python_values converts it once too); the rest is decoded a bounded run at a
    time."""
    runs, numbers, oversized, first = [], [], [], 1
    with parquet_file(path, max_row_bytes, opened) as (raw, parquet):
        # a file without them holds no row the caller can read, however many it holds
        if missing := [name for name in required if name not in parquet.schema_arrow.names]:
            raise ValueError(f"{path}: no {', '.join(missing)} column")
        for group in range(parquet.num_row_groups):
            if why := oversized_pages(raw, parquet.metadata, group, max_row_bytes, columns):
                raise ValueError(why)
            for run in sized_rows(raw, parquet, group, max_row_bytes, TRACE_BATCH_ROWS, columns):
                if run.rows is None:
                    oversized.append(
                        (
                            first + run.first,
                            f"row of {run.size} bytes as JSON at "
                            f"least, over {max_row_bytes}: not read",
                        )
                    )
                    continue
                runs.append(run.rows)
                numbers.append(np.arange(first + run.first, first + run.first + run.rows.num_rows))
            first += parquet.metadata.row_group(group).num_rows
        schema = _read_schema(parquet.schema_arrow, columns, runs)
    return ParquetRows(
        pa.Table.from_batches([run.cast(schema) for run in runs], schema),
        np.concatenate(numbers) if numbers else np.zeros(0, np.int64),
        oversized,
    )


def _read_schema(
    schema: pa.Schema, columns: Collection[str], runs: list[pa.RecordBatch]
) -> pa.Schema:
    """One type per column for every run: the file's (views as their plain twins), a
    dictionary of it where any row group's chunk was read as a dictionary (a dense chunk is
    then encoded, not the dictionary decoded)."""
    fields = []
    for field in schema:
        if field.name not in columns:
            continue
        kind = _plain_type(field.type)
        if any(pa.types.is_dictionary(run.schema.field(field.name).type) for run in runs):
            kind = pa.dictionary(pa.int32(), kind)
        fields.append(field.with_type(kind))
    return pa.schema(fields)


def decoded_type(kind: pa.DataType) -> pa.DataType:
    """The type of a column's values once decoded: a dictionary's entries' type."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def python_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as Python values, each the JSON value of its text (numbers.json_reader;
    maps as dicts, a key twice a KeyError); a dictionary's entries are converted once and
    shared by every row that references them (DictionaryArray.to_pylist copies an entry per
    row), batches that share a dictionary sharing its conversion."""
    converted: dict[tuple[int, ...], list[Any]] = {}
    values: list[Any] = []
    read = json_reader(column.type)
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if not pa.types.is_dictionary(chunk.type):
            values.extend(_json_values(chunk, read))
            continue
        dictionary = chunk.dictionary
        key = (
            dictionary.offset,
            len(dictionary),
            *(buffer.address for buffer in dictionary.buffers() if buffer is not None),
        )
        if key not in converted:
            converted[key] = _json_values(dictionary, read)
        entries = converted[key]
        values.extend(
            None if index is None else entries[index] for index in chunk.indices.to_pylist()
        )
    return values


def _json_values(array: pa.Array, read: Reader | None) -> list[Any]:
    values = array.to_pylist(maps_as_pydicts="strict")
    return values if read is None else [read(value) for value in values]


UTC_LABEL = "+00:00"  # a fixed offset: Python's own timezone.utc, no zone database asked


def without_views(schema: pa.Schema) -> pa.Schema:
    """The file's Arrow schema with view types (string_view, binary_view, list_view: what newer
    Arrow writers keep in a file) as their plain twins: the values are the same, and Arrow
    casts dictionary chunks to the plain types only; dictionaries decoded and extension types
    as what they store, in any container (child_fields). Times are read from their storage, never
    through the worker's packages: a timestamp, whatever its unit and zone, as UTC microseconds
    (an Arrow timestamp holds a UTC instant; its zone is a display label the worker's zone
    database may lack, and "+00:00" is looked up in none); nanoseconds floored to microseconds
    (cast with safe=False), which without pandas Arrow refuses to convert at all. A field of
    Arrow's `null` type (what pyarrow writes of a field null in every row: `"name": null` on
    every message) is left out, as a column or a struct's field at any depth: it holds only
    nulls, which records.without_nulls drops anyway, and Arrow may read it shorter than its
    struct (a list of structs), which fails any cast that keeps it."""
    return pa.schema([field.with_type(_plain_type(field.type)) for field in valued(schema)])


def valued(fields: Iterable[pa.Field]) -> list[pa.Field]:
    """The fields that can hold a value: every one but those of Arrow's `null` type once read
    as without_views reads them (a dictionary or extension type of nulls too)."""
    return [field for field in fields if not pa.types.is_null(_plain_type(field.type))]


def _plain_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", UTC_LABEL)
    if pa.types.is_duration(kind) and kind.unit == "ns":
        return pa.duration("us")
    if pa.types.is_time64(kind) and kind.unit == "ns":
        return pa.time64("us")
    if pa.types.is_string_view(kind):
        return pa.large_string()
    if pa.types.is_binary_view(kind):
        return pa.large_binary()
    if pa.types.is_dictionary(kind):  # decoded: the reader encodes a dictionary run again
        return _plain_type(kind.value_type)
    if isinstance(kind, pa.BaseExtensionType):  # what it stores: the same wherever it is read
        return _plain_type(kind.storage_type)
    children = valued(child_fields(kind)) if pa.types.is_struct(kind) else child_fields(kind)
    fields = [field.with_type(_plain_type(field.type)) for field in children]
    if pa.types.is_struct(kind):
        return pa.struct(fields)  # with_children would keep a struct whose fields all went
    if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        return pa.large_list(fields[0])
    return with_children(kind, fields)


def child_fields(kind: pa.DataType) -> list[pa.Field]:
    """The fields a nested type holds its values in (a map's key and item, not its entries'
    struct), [] for any other type: with with_children, the one walk over every container a
    file may hold (_check_schema refuses any other)."""
    if pa.types.is_map(kind):
        return [kind.key_field, kind.item_field]
    return [kind.field(i) for i in range(kind.num_fields)]


def with_children(kind: pa.DataType, fields: list[pa.Field]) -> pa.DataType:
    """kind's container holding fields in the place of child_fields(kind); kind itself if it
    holds none."""
    if not fields:
        return kind
    if pa.types.is_struct(kind):
        return pa.struct(fields)
    if pa.types.is_map(kind):
        return pa.map_(fields[0], fields[1], kind.keys_sorted)
    build = {
        pa.ListType: pa.list_,
        pa.LargeListType: pa.large_list,
        pa.ListViewType: pa.list_view,
        pa.LargeListViewType: pa.large_list_view,
    }
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(fields[0], kind.list_size)
    return build[type(kind)](fields[0])
