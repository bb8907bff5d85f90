"""Id map segment files: one hash shard's numbered keys, sorted by hash, with an index that lets
a night read only the row groups that can hold its keys.

    blocks-00012.parquet      hi, lo, id; sorted by (hi, lo); row groups of ROW_GROUP_ROWS
    blocks-00012.index.npz    a Bloom filter of the file's keys; each row group's first and last hi

A night probes the filter with its own keys of the shard; a possible key falls in the one row
group whose hi range holds it, and only those row groups are read. What a night reads is then
the index (2 bytes per map row) plus ~24 KB per key the map holds and per false positive
(~0.05% of tonight's keys): it grows with the night, not with the map. Row-group statistics
alone cannot do it: tonight's keys are uniform over the hash space, so every row group's range
holds some of them; the filter tells which ones the map has.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from transforms import storage
from transforms.ids import bloom
from transforms.ids.dense_ids import NUMBERED, lookup, shard_of, split_by

SEGMENT_SCHEMA = pa.schema(
    [pa.field("hi", pa.uint64(), False), pa.field("lo", pa.uint64(), False),
     pa.field("id", pa.int64(), False)]
)
# The unit of a read: a key the map holds costs one row group, ~24 KB. Smaller groups cost more
# footer (~300 bytes each) than they save.
ROW_GROUP_ROWS = 1024
# Rows per Arrow batch when streaming a whole segment (compaction): ~24 MB at a time.
READ_BATCH_ROWS = 1_000_000


class Index(NamedTuple):
    filter: np.ndarray  # packed Bloom bits over the file's keys
    first_hi: np.ndarray  # per row group
    last_hi: np.ndarray
    size: int  # bytes of the index file


class MatchedRows(NamedTuple):
    rows: np.ndarray  # NUMBERED: the segment's rows whose keys were asked for
    bytes_read: int  # index, footer and the row groups read
    row_groups_read: int
    row_groups: int


def index_path(path: str) -> str:
    return path.removesuffix(".parquet") + ".index.npz"


def write_segment(path: str, tables: list[np.ndarray]) -> int:
    """One shard's numbered keys as a segment file and its index; returns the row count."""
    table = np.concatenate(tables) if tables else np.empty(0, dtype=NUMBERED)
    table = table[np.lexsort((table["lo"], table["hi"]))]
    arrow = pa.Table.from_arrays(
        [pa.array(table["hi"]), pa.array(table["lo"]), pa.array(table["id"])], schema=SEGMENT_SCHEMA
    )
    sink = io.BytesIO()
    # The index replaces column statistics: without them the footer stays small.
    pq.write_table(arrow, sink, compression="zstd", row_group_size=ROW_GROUP_ROWS,
                   write_statistics=False)
    with storage.create(path) as handle:
        handle.write(sink.getvalue())
    index = io.BytesIO()
    group_ends = np.minimum(np.arange(ROW_GROUP_ROWS, len(table) + ROW_GROUP_ROWS,
                                      ROW_GROUP_ROWS), len(table)) - 1
    np.savez(index, filter=bloom.build(table["hi"], table["lo"], bloom.bloom_bits(len(table))),
             first_hi=table["hi"][::ROW_GROUP_ROWS], last_hi=table["hi"][group_ends])
    with storage.create(index_path(path)) as handle:
        handle.write(index.getvalue())
    return len(table)


def read_index(path: str) -> Index:
    with storage.open_read(index_path(path)) as handle:
        data = handle.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return Index(arrays["filter"], arrays["first_hi"], arrays["last_hi"], len(data))


def row_groups_holding(index: Index, hi: np.ndarray) -> np.ndarray:
    """The row groups whose hi range holds any of hi (sorted, distinct). A run of equal hi may
    span a boundary, so a key can fall in more than one."""
    start = np.searchsorted(index.last_hi, hi, side="left")
    stop = np.searchsorted(index.first_hi, hi, side="right")
    marks = np.zeros(len(index.first_hi) + 1, dtype=np.int64)
    np.add.at(marks, start, 1)
    np.add.at(marks, stop, -1)
    return np.flatnonzero(np.cumsum(marks[:-1]) > 0)


def read_matching(path: str, keys: np.ndarray) -> MatchedRows:
    """The rows of one segment file holding any of keys (a table with hi and lo fields, distinct
    keys), reading only the row groups the index points to."""
    index = read_index(path)
    possible = bloom.may_contain(index.filter, keys["hi"], keys["lo"])
    groups = row_groups_holding(index, keys["hi"][possible])
    if not len(groups):
        return MatchedRows(np.empty(0, dtype=NUMBERED), index.size, 0, len(index.first_hi))
    with storage.open_read(path) as handle:
        parquet = pq.ParquetFile(handle)
        rows = _numbered(parquet.read_row_groups(groups.tolist()))
        metadata = parquet.metadata
        read = index.size + metadata.serialized_size + sum(
            metadata.row_group(g).column(c).total_compressed_size
            for g in groups.tolist() for c in range(metadata.num_columns)
        )
    wanted = lookup(keys, rows) >= 0
    return MatchedRows(rows[wanted], read, len(groups), len(index.first_hi))


def read_segment(path: str, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    """(hash shard, NUMBERED rows) of a whole segment file, streamed in record batches: the map
    re-split into `shards` shards (compaction, or a run with another shard count)."""
    with storage.open_read(path) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=READ_BATCH_ROWS):
            table = _numbered(batch)
            yield from split_by(table, shard_of(table, shards))


def _numbered(arrow: pa.Table | pa.RecordBatch) -> np.ndarray:
    table = np.empty(arrow.num_rows, dtype=NUMBERED)
    for name in ("hi", "lo", "id"):
        table[name] = arrow.column(name).to_numpy()
    return table
