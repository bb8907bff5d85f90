"""Id map segment files: one hash shard's numbered keys, sorted by hash, with an index that lets
a night read only the row groups that can hold its keys.

    blocks-00012.parquet      hi, lo, id; sorted by (hi, lo); row groups of ROW_GROUP_ROWS
    blocks-00012.index.npz    a Bloom filter of the file's keys; each row group's first and last
                              hi, and the sha256 of its column chunks' bytes

Every file's sha256 and size are recorded in the map version that lists it (SegmentFile), whose
MAC binds them to the salt; a read checks them: the index against its sha256, a segment file,
read whole or in part, unit by unit: its size and its footer against the record, each row group
read against its sha256 in the (verified) index before Parquet decodes it, and Parquet decodes
only those verified bytes (page CRCs, which anyone can recompute, prove nothing). A file whose
index predates the digests is checked against its whole sha256. Every row read is checked too
(RowBounds): its key belongs to the file's hash shard and its id is one the version gave out. A
damaged, truncated, swapped or edited file stops the run naming the file, never gives wrong ids.

A night probes the filter with its own keys of the shard; a possible key falls in the one row
group whose hi range holds it, and only those row groups are read. What a night reads is then
the index (2 bytes per map row) plus ~24 KB per key the map holds and per false positive
(~0.05% of tonight's keys): it grows with the night, not with the map. Row-group statistics
alone cannot do it: tonight's keys are uniform over the hash space, so every row group's range
holds some of them; the filter tells which ones the map has.
"""

from __future__ import annotations

import hashlib
import io
import mmap
from collections.abc import Iterator
from typing import IO, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.transforms import storage
from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.ids import bloom
from kvtrace.transforms.ids.dense_ids import NUMBERED, lookup, shard_of, split_by
from kvtrace.transforms.ids.map_files import open_map_file

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("hi", pa.uint64(), False),
        pa.field("lo", pa.uint64(), False),
        pa.field("id", pa.int64(), False),
    ]
)
# The unit of a read: a key the map holds costs one row group, ~24 KB. Smaller groups cost more
# footer (~300 bytes each) than they save.
ROW_GROUP_ROWS = 1024
# Rows per Arrow batch when streaming a whole segment (re-sharding): ~24 MB at a time.
READ_BATCH_ROWS = 1_000_000
# Rows per run held while folding runs into one file: 64 runs x 64k rows x 24 B ~ 100 MB.
MERGE_BATCH_ROWS = 65_536
VERIFY_CHUNK_BYTES = 8 << 20


class RowBounds(NamedTuple):
    """What every row of a map version's segment file must be: its key in the file's hash shard
    of the version's `shards`, its id below the version's next_id."""

    shard: int
    shards: int
    next_id: int


class SegmentFile(NamedTuple):
    """A segment file as a map version lists it: where, and the checksums of it and its index
    ({"sha256": hex digest, "bytes": size}), which every read verifies."""

    path: str
    data: dict
    index: dict
    rows: int = 0  # known when just written
    bounds: RowBounds | None = None  # a listed file's (MapVersion.segment_files); None: written


def checksum(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def parquet_checksum(data: bytes) -> dict:
    """A Parquet file's checksum, and its footer's: a file read in part is checked by its size,
    its footer (which fixes every row group's place and size) and its pages' own CRCs."""
    return checksum(data) | {"footer_sha256": hashlib.sha256(_footer(data)).hexdigest()}


def _footer(data: bytes) -> bytes:
    """The footer and its length and magic, from the end of a Parquet file's bytes."""
    if len(data) < 8:
        return data
    length = int.from_bytes(data[-8:-4], "little")
    return data[-min(len(data), length + 8) :]


class DamagedFile(JobStopped):
    """A map file unlike what lists it. Its path and why are kept apart, so a staged night's
    file, which no version lists, is refused without the map's advice (restore a backup)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"id map file {path} is damaged ({why}). Restore the id map from a backup; "
            f"the map was not extended and no trace was published"
        )
        self.path, self.why = path, why

    def __reduce__(self) -> tuple:  # pickled whole from a Beam child
        return DamagedFile, (self.path, self.why)


def damaged(path: str, why: str) -> JobStopped:
    return DamagedFile(path, why)


# At most what write_segment writes for a file of n rows, in bytes (measured: a footer is
# ~700 bytes plus ~190 per row group, the data ~23 bytes a row, an index its Bloom filter,
# 48 bytes per row group and ~1 KB of archive headers), with room to spare: a staged file of
# more is refused by its size, unread.
def most_bytes(rows: int) -> tuple[int, int, int]:
    """(data file, its footer, its index) bytes at most, for a segment file of rows rows."""
    groups = -(-rows // ROW_GROUP_ROWS)
    footer = 4096 + 1024 * groups
    return footer + 32 * rows, footer, 4096 + bloom.bloom_bits(rows) // 8 + 64 * groups


def _check(path: str, found: dict, expected: dict) -> None:
    if any(found[key] != expected.get(key) for key in found):
        raise damaged(path, "its sha256 or size differs from what the map version recorded")


def check_rows(segment: SegmentFile, rows: np.ndarray) -> np.ndarray:
    """The rows, once each is found within the file's bounds (vectorized: a modulo and two
    comparisons per row read)."""
    bounds = segment.bounds
    if bounds is None:
        return rows
    if (shard_of(rows, bounds.shards) != bounds.shard).any():
        raise damaged(
            segment.path,
            f"it holds keys of another hash shard than {bounds.shard} of {bounds.shards}",
        )
    if len(rows) and not (0 <= rows["id"].min() and rows["id"].max() < bounds.next_id):
        raise damaged(
            segment.path,
            f"it holds ids outside [0, {bounds.next_id}), the ids its map version gave out",
        )
    return rows


def _opened(path: str) -> IO[bytes]:
    """A file of the map opened to read (map_files.open_map_file); anything but a regular file
    in its place is told as damage to it, in one line."""
    try:
        return open_map_file(path)
    except storage.UnfitFile as err:
        raise damaged(path, str(err)) from None


def _read_whole(path: str, expected: dict) -> bytes:
    try:
        with _opened(path) as handle:
            data = handle.read(expected["bytes"] + 1)
    except OSError as err:
        raise damaged(path, f"unreadable: {err.strerror or err}") from None
    _check(path, checksum(data), expected)
    return data


def _read_footer(handle: IO[bytes], size: int, path: str, limit: int | None = None) -> bytes:
    """The footer, its length and magic, read from the end of an open file of `size` bytes;
    a length past the file's data or over limit (most_bytes' footer) is damage, told unread."""
    handle.seek(max(0, size - 8))
    length = int.from_bytes(handle.read(8)[:4], "little")
    if length > max(0, size - 12) or (limit is not None and length > limit):
        raise damaged(path, f"a footer of {length} bytes")
    handle.seek(max(0, size - 8 - length))
    return handle.read()


class Index(NamedTuple):
    filter: np.ndarray  # packed Bloom bits over the file's keys
    first_hi: np.ndarray  # per row group
    last_hi: np.ndarray
    size: int  # bytes of the index file
    # Per row group, the sha256 of its column chunks' bytes (row_group_digests); None in
    # indexes written before it was recorded, whose files are then read whole.
    group_sha256: np.ndarray | None = None


class MatchedRows(NamedTuple):
    rows: np.ndarray  # NUMBERED: the segment's rows whose keys were asked for
    bytes_read: int  # index, footer and the row groups read
    row_groups_read: int
    row_groups: int


def index_path(path: str) -> str:
    return path.removesuffix(".parquet") + ".index.npz"


# The sha256 of a segment file's rows (NUMBERED, in file order), in its footer's key-value
# metadata: a footer otherwise describes only the file's layout, so two files of one row count
# and size would share it and a swap of them would pass check_listed. Files written before it
# lack it and keep that window (docs/BOUNDS.md).
ROWS_SHA256 = "kvtrace.rows_sha256"


def write_segment(path: str, tables: list[np.ndarray]) -> SegmentFile:
    """One shard's numbered keys as a segment file and its index."""
    table = np.concatenate(tables) if tables else np.empty(0, dtype=NUMBERED)
    table = table[np.lexsort((table["lo"], table["hi"]))]
    sink = io.BytesIO()
    with _writer(sink) as writer:
        writer.write_table(_arrow(table), row_group_size=ROW_GROUP_ROWS)
        writer.add_key_value_metadata({ROWS_SHA256: hashlib.sha256(table.tobytes()).hexdigest()})
    group_ends = (
        np.minimum(
            np.arange(ROW_GROUP_ROWS, len(table) + ROW_GROUP_ROWS, ROW_GROUP_ROWS), len(table)
        )
        - 1
    )
    data = sink.getvalue()
    index = _write_index(
        path,
        bloom.build(table["hi"], table["lo"], bloom.bloom_bits(len(table))),
        table["hi"][::ROW_GROUP_ROWS],
        table["hi"][group_ends],
        row_group_digests(data),
    )
    return SegmentFile(path, _store_parquet(path, data), index, len(table))


def _writer(sink: IO[bytes]) -> pq.ParquetWriter:
    # The index replaces column statistics: without them the footer stays small.
    return pq.ParquetWriter(
        sink, SEGMENT_SCHEMA, compression="zstd", write_statistics=False, write_page_checksum=True
    )


def _store(path: str, data: bytes) -> dict:
    """Write a map file (private, durable) and return its checksum."""
    with storage.create(path, private=True) as handle:
        handle.write(data)
    return checksum(data)


def _store_parquet(path: str, data: bytes) -> dict:
    _store(path, data)
    return parquet_checksum(data)


def _write_index(
    path: str,
    filter_: np.ndarray,
    first_hi: np.ndarray,
    last_hi: np.ndarray,
    group_sha256: np.ndarray,
) -> dict:
    index = io.BytesIO()
    np.savez(index, filter=filter_, first_hi=first_hi, last_hi=last_hi, group_sha256=group_sha256)
    return _store(index_path(path), index.getvalue())


def chunk_ranges(metadata: pq.FileMetaData, group: int) -> list[tuple[int, int]]:
    """(offset, length) of each column chunk of a row group: the bytes Parquet reads for it
    (from the dictionary page, when there is one, to the chunk's end)."""
    ranges = []
    for c in range(metadata.num_columns):
        chunk = metadata.row_group(group).column(c)
        start = (
            chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
        )
        ranges.append((start, chunk.total_compressed_size))
    return ranges


def _group_digest(chunks: list[bytes]) -> bytes:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.digest()


def row_group_digests(data: bytes) -> np.ndarray:
    """Per row group of a Parquet file's bytes, the sha256 of its column chunks in column order:
    (row groups, 32) uint8, kept in the index so that a row group can be checked on its own."""
    metadata = pq.read_metadata(pa.py_buffer(data))
    digests = [
        _group_digest([data[start : start + length] for start, length in chunk_ranges(metadata, g)])
        for g in range(metadata.num_row_groups)
    ]
    return np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)


def _arrow(table: np.ndarray) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array(table["hi"]), pa.array(table["lo"]), pa.array(table["id"])], schema=SEGMENT_SCHEMA
    )


def merge_segment(path: str, runs: list[SegmentFile], new: np.ndarray) -> SegmentFile:
    """Fold a shard's segment files (sorted runs) and its new NUMBERED rows into one segment
    file, streaming: a batch per run in memory, never the shard. The bytes equal what
    write_segment gives for all the rows at once."""
    total = len(new) + sum(_row_count(run) for run in runs)
    readers = [_batches(run) for run in runs]
    readers.append(iter([new[np.lexsort((new["lo"], new["hi"]))]]))
    buffers = [_next_rows(reader) for reader in readers]
    filter_ = np.zeros(bloom.bloom_bits(total) // 8, dtype=np.uint8)
    first_hi, last_hi = [], []
    carry = np.empty(0, dtype=NUMBERED)  # sorted rows short of a whole row group
    sink = io.BytesIO()
    rows_sha256 = hashlib.sha256()
    with _writer(sink) as writer:
        while True:
            ready, buffers = _next_sorted(readers, buffers)
            rows = np.concatenate([carry, ready])
            rows = rows[np.lexsort((rows["lo"], rows["hi"]))]
            finished = all(b is None for b in buffers)
            whole = len(rows) if finished else len(rows) - len(rows) % ROW_GROUP_ROWS
            for start in range(0, whole, ROW_GROUP_ROWS):
                group = rows[start : start + ROW_GROUP_ROWS]
                writer.write_table(_arrow(group), row_group_size=ROW_GROUP_ROWS)
                rows_sha256.update(group.tobytes())
                first_hi.append(int(group["hi"][0]))
                last_hi.append(int(group["hi"][-1]))
            bloom.add(filter_, rows["hi"][:whole], rows["lo"][:whole])
            carry = rows[whole:]
            if finished:
                break
        if not total:
            writer.write_table(_arrow(carry))
        writer.add_key_value_metadata({ROWS_SHA256: rows_sha256.hexdigest()})
    data = sink.getvalue()
    index = _write_index(
        path,
        filter_,
        np.array(first_hi, dtype=np.uint64),
        np.array(last_hi, dtype=np.uint64),
        row_group_digests(data),
    )
    return SegmentFile(path, _store_parquet(path, data), index, total)


def _next_sorted(
    readers: list[Iterator[np.ndarray]], buffers: list[np.ndarray | None]
) -> tuple[np.ndarray, list]:
    """The buffered rows that sort before every row not yet read, and the buffers after.

    Keys are distinct across runs (a key is numbered once), so every unread row of a run sorts
    after the last row of its buffer: rows up to the smallest such last key are safe to write.
    The run holding that key is emptied and reads its next batch (None once exhausted)."""
    live = [b for b in buffers if b is not None]
    if not live:
        return np.empty(0, dtype=NUMBERED), buffers
    hi, lo = min((int(b["hi"][-1]), int(b["lo"][-1])) for b in live)
    ready, after = [], []
    for reader, buffer in zip(readers, buffers):
        if buffer is None:
            after.append(None)
            continue
        cut = int(
            np.count_nonzero((buffer["hi"] < hi) | ((buffer["hi"] == hi) & (buffer["lo"] <= lo)))
        )
        ready.append(buffer[:cut])
        after.append(buffer[cut:] if cut < len(buffer) else _next_rows(reader))
    return np.concatenate(ready), after


def _next_rows(reader: Iterator[np.ndarray]) -> np.ndarray | None:
    """The reader's next non-empty batch, None once it is exhausted."""
    for rows in reader:
        if len(rows):
            return rows
    return None


def _verify_whole(path: str, expected: dict) -> None:
    """The whole file against its checksum, read in chunks (a shard's file may be large) and
    no further than one byte past its recorded size (a file that grew is told so)."""
    digest, size = hashlib.sha256(), 0
    try:
        with _opened(path) as handle:
            while size <= expected["bytes"] and (chunk := handle.read(VERIFY_CHUNK_BYTES)):
                digest.update(chunk)
                size += len(chunk)
    except OSError as err:
        raise damaged(path, f"unreadable: {err.strerror or err}") from None
    _check(path, {"sha256": digest.hexdigest(), "bytes": size}, expected)


def _record_batches(segment: SegmentFile, rows: int) -> Iterator[np.ndarray]:
    """The whole file's rows, about `rows` at a time, each row group verified as it is read (a
    file whose index has no digests: the whole file verified first, then read)."""
    index = read_index(segment)
    if index.group_sha256 is None:
        _verify_whole(segment.path, segment.data)
        with _opened(segment.path) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=rows):
                yield check_rows(segment, _numbered(batch))
        return
    try:
        with _opened(segment.path) as handle:
            verified = _VerifiedFile(handle, segment, index)
            groups = list(range(verified.metadata.num_row_groups))
            step = max(1, rows // ROW_GROUP_ROWS)
            for start in range(0, len(groups), step):
                yield check_rows(
                    segment, _numbered(verified.row_groups(groups[start : start + step]))
                )
    except (OSError, pa.ArrowException) as err:
        raise damaged(segment.path, str(err)) from None


def _batches(segment: SegmentFile) -> Iterator[np.ndarray]:
    return _record_batches(segment, MERGE_BATCH_ROWS)


def _row_count(segment: SegmentFile) -> int:
    """The file's rows, from its footer only once verified (as any read of it verifies it)."""
    index = read_index(segment)
    try:
        if index.group_sha256 is None:
            _verify_whole(segment.path, segment.data)
            with _opened(segment.path) as handle:
                return pq.ParquetFile(handle).metadata.num_rows
        with _opened(segment.path) as handle:
            return _VerifiedFile(handle, segment, index).metadata.num_rows
    except (OSError, pa.ArrowException) as err:
        raise damaged(segment.path, str(err)) from None


def read_index(segment: SegmentFile) -> Index:
    path = index_path(segment.path)
    data = _read_whole(path, segment.index)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            digests = arrays["group_sha256"] if "group_sha256" in arrays.files else None
            index = Index(
                arrays["filter"], arrays["first_hi"], arrays["last_hi"], len(data), digests
            )
    except (OSError, ValueError, KeyError) as err:
        raise damaged(path, f"not a segment index: {err}") from None
    if digests is not None and (digests.ndim != 2 or digests.shape[1] != 32):
        raise damaged(path, "not a segment index: its row-group digests are not sha256s")
    return index


def row_groups_holding(index: Index, hi: np.ndarray) -> np.ndarray:
    """The row groups whose hi range holds any of hi (sorted, distinct). A run of equal hi may
    span a boundary, so a key can fall in more than one."""
    start = np.searchsorted(index.last_hi, hi, side="left")
    stop = np.searchsorted(index.first_hi, hi, side="right")
    marks = np.zeros(len(index.first_hi) + 1, dtype=np.int64)
    np.add.at(marks, start, 1)
    np.add.at(marks, stop, -1)
    return np.flatnonzero(np.cumsum(marks[:-1]) > 0)


def read_matching(segment: SegmentFile, keys: np.ndarray) -> MatchedRows:
    """The rows of one segment file holding any of keys (a table with hi and lo fields, distinct
    keys), reading only the row groups the index points to, each verified before it is decoded
    (a file whose index has no row-group digests is read whole and verified)."""
    index = read_index(segment)
    possible = bloom.may_contain(index.filter, keys["hi"], keys["lo"])
    groups = row_groups_holding(index, keys["hi"][possible]).tolist()
    if not groups:
        return MatchedRows(np.empty(0, dtype=NUMBERED), index.size, 0, len(index.first_hi))
    try:
        table, read = _row_groups_read(segment, index, groups)
        rows = check_rows(segment, _numbered(table))
    except (OSError, pa.ArrowException) as err:
        raise damaged(segment.path, str(err)) from None
    wanted = lookup(keys, rows) >= 0
    return MatchedRows(rows[wanted], index.size + read, len(groups), len(index.first_hi))


def _row_groups_read(segment: SegmentFile, index: Index, groups: list[int]) -> tuple[pa.Table, int]:
    """The given row groups, verified, and the bytes read for them."""
    if index.group_sha256 is None:
        data = _read_whole(segment.path, segment.data)
        parquet, read = pq.ParquetFile(pa.py_buffer(data)), len(data)
        _check_groups(segment, parquet.metadata, index)
        return parquet.read_row_groups(groups), read
    with _opened(segment.path) as handle:
        verified = _VerifiedFile(handle, segment, index)
        _check_groups(segment, verified.metadata, index)
        return verified.row_groups(groups), verified.read


def _check_groups(segment: SegmentFile, metadata: pq.FileMetaData, index: Index) -> None:
    if metadata.num_row_groups != len(index.first_hi):
        raise damaged(segment.path, "it does not match its index")


class _VerifiedFile:
    """An open segment file whose size and footer match what the map recorded, and which gives
    out row groups only once their bytes match the digests of its (verified) index: Parquet
    decodes those bytes alone, laid into an anonymous mapping the size of the file whose other
    bytes are zero (pages never written cost no memory)."""

    def __init__(self, handle: IO[bytes], segment: SegmentFile, index: Index):
        self._handle, self._path, self._digests = handle, segment.path, index.group_sha256
        self.size, self._footer = _checked_footer(handle, segment)
        self.metadata = pq.read_metadata(pa.py_buffer(self._footer))
        if self.metadata.num_row_groups != len(self._digests):
            raise damaged(self._path, "it does not match its index")
        self.read = len(self._footer)  # bytes read so far

    def row_groups(self, groups: list[int]) -> pa.Table:
        verified = mmap.mmap(-1, self.size)
        verified[self.size - len(self._footer) :] = self._footer
        for group in groups:
            ranges = chunk_ranges(self.metadata, group)
            chunks = [
                _read_range(self._handle, self._path, start, length, self.size - len(self._footer))
                for start, length in ranges
            ]
            if _group_digest(chunks) != self._digests[group].tobytes():
                raise damaged(
                    self._path, f"row group {group} differs from the digest its index recorded"
                )
            for (start, length), chunk in zip(ranges, chunks):
                verified[start : start + length] = chunk
            self.read += sum(length for _, length in ranges)
        parquet = pq.ParquetFile(pa.py_buffer(verified), metadata=self.metadata, pre_buffer=False)
        return parquet.read_row_groups(groups)


def _checked_footer(handle: IO[bytes], segment: SegmentFile) -> tuple[int, bytes]:
    """The size and footer of an open segment file, once they match what the map recorded."""
    size = handle.seek(0, io.SEEK_END)
    _check(segment.path, {"bytes": size}, segment.data)
    # A file just written (no version lists it yet) is bounded by the rows it says it holds.
    limit = most_bytes(segment.rows)[1] if segment.bounds is None else None
    footer = _read_footer(handle, size, segment.path, limit)
    _check(segment.path, {"footer_sha256": hashlib.sha256(footer).hexdigest()}, segment.data)
    return size, footer


def check_listed(segment: SegmentFile) -> int:
    """A listed file checked in small reads: its index by its sha256, its size and footer by
    the record's digests (the footer fixes every row group's place; the index holds each row
    group's digest, so a row group is verified whenever it is read, never here). Returns the
    rows its verified footer says it holds."""
    _verify_whole(index_path(segment.path), segment.index)  # in chunks: loaded once verified
    try:
        with _opened(segment.path) as handle:
            _, footer = _checked_footer(handle, segment)
        return pq.read_metadata(pa.py_buffer(footer)).num_rows
    except OSError as err:
        raise damaged(segment.path, f"unreadable: {err.strerror or err}") from None
    except pa.ArrowException as err:
        raise damaged(segment.path, str(err)) from None


def _read_range(handle: IO[bytes], path: str, start: int, length: int, end: int) -> bytes:
    """length bytes at start, which must lie before end (the footer)."""
    if not 0 <= start <= start + length <= end:
        raise damaged(path, "a column chunk lies outside the file's data")
    handle.seek(start)
    chunk = handle.read(length)
    if len(chunk) != length:
        raise damaged(path, "it is shorter than its footer says")
    return chunk


def read_segment(segment: SegmentFile, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    """(hash shard, NUMBERED rows) of a whole segment file, verified and streamed in record
    batches: the map re-split into `shards` shards (compaction, or another shard count)."""
    for table in _record_batches(segment, READ_BATCH_ROWS):
        yield from split_by(table, shard_of(table, shards))


def _numbered(arrow: pa.Table | pa.RecordBatch) -> np.ndarray:
    table = np.empty(arrow.num_rows, dtype=NUMBERED)
    for name in ("hi", "lo", "id"):
        table[name] = arrow.column(name).to_numpy()
    return table


def read_matching_files(segments: list[SegmentFile], keys: np.ndarray) -> MatchedRows:
    """read_matching over several files of one hash shard: their matching rows together, and
    what was read of them all."""
    parts = [read_matching(segment, keys) for segment in sorted(segments)]
    return MatchedRows(
        np.concatenate([p.rows for p in parts] + [np.empty(0, NUMBERED)]),
        sum(p.bytes_read for p in parts),
        sum(p.row_groups_read for p in parts),
        sum(p.row_groups for p in parts),
    )
