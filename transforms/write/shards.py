"""Write trace rows as sorted, deterministically named JSONL and Parquet shards.

Rows go to shards by time bucket (consecutive buckets per shard, see buckets.plan_shards), so
shards are sorted across file names and their boundaries depend on the data alone.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from transforms import storage
from transforms.combiners import BucketTotals
from transforms.ids.buckets import plan_shards
from transforms.write.coarsen import Coarsening, coarsen
from transforms.trace_format import (TraceColumns, arrow_array, jsonl_bytes, parquet_bytes,
                                     shard_name, table_bytes)
from transforms.write.rows import RowBatch, bucket_sizes

# A shard is sorted in one worker's memory: 8M ids are ~64 MB as int64 and ~70 MB of JSONL.
MAX_BLOCKS_PER_SHARD = 8_000_000


def shard_plan() -> BucketTotals:
    """A combiner: HashedBatches in, the output shard plan out (each time bucket's room summed
    over the batches, then consecutive buckets grouped into shards)."""
    return BucketTotals(bucket_sizes,
                        functools.partial(plan_shards, max_per_shard=MAX_BLOCKS_PER_SHARD))


BLOCK_HASHES_PREFIX = "block-hashes-"
BLOCK_HASHES_SCHEMA = pa.schema(
    [pa.field("row", pa.int64(), nullable=False), pa.field("position", pa.int32(), nullable=False),
     pa.field("id", pa.int64(), nullable=False), pa.field("hash", pa.uint64(), nullable=False)],
    metadata={"private": "unkeyed engine block hashes: whoever holds the tokenizer can confirm "
                         "a guessed prompt from them; never publish"},
)


def published_columns(batch: RowBatch, origin_ms: int) -> TraceColumns:
    """A shard's sorted, coarsened rows as the format publishes them: ms from the origin."""
    rows = batch.rows
    return TraceColumns(rows["timestamp_ms"] - origin_ms, rows["input_length"],
                        rows["output_length"], rows["num_ids"], batch.ids, rows["session_id"],
                        rows["response_ms"],
                        None if batch.output_ids is None else rows["num_output_ids"],
                        batch.output_ids)


def block_hashes_bytes(batch: RowBatch) -> bytes:
    """One row per block of the shard's trace rows: the row (0-based, within the trace file of
    the same shard number), the block's position, its published id and its engine hash."""
    counts = batch.rows["num_ids"]
    row = np.repeat(np.arange(len(counts)), counts)
    position = np.arange(len(batch.ids)) - np.repeat(np.cumsum(counts) - counts, counts)
    table = pa.Table.from_arrays(
        [arrow_array(row), arrow_array(position, pa.int32()), arrow_array(batch.ids),
         pa.array(batch.hashes if batch.hashes is not None else np.empty(0, np.uint64),
                  pa.uint64())],
        schema=BLOCK_HASHES_SCHEMA)
    return table_bytes(table)


def write_shard(
    directory: str, shard: int, shards: int, batches: Iterable[RowBatch], origin_ms: int,
    coarsening: Coarsening = Coarsening(), hashes_directory: str | None = None,
) -> list[tuple[str, str]]:
    """Sort one shard's rows and write them as JSONL and Parquet; returns (path, sha256) of the
    two. With hashes_directory, the rows' engine block hashes go there too, owner-only
    (block_hashes_bytes)."""
    ordered = coarsen(RowBatch.concat(list(batches)).sorted(), origin_ms, coarsening)
    if hashes_directory is not None:
        path = storage.join(hashes_directory, f"{BLOCK_HASHES_PREFIX}{shard:05d}-of-{shards:05d}.parquet")
        with storage.create(path, private=True) as handle:
            handle.write(block_hashes_bytes(ordered))
    columns = published_columns(ordered, origin_ms)
    written = []
    for suffix, payload in ((".jsonl", jsonl_bytes(columns)), (".parquet", parquet_bytes(columns))):
        path = storage.join(directory, shard_name(shard, shards, suffix))
        with storage.create(path) as handle:
            handle.write(payload)
        written.append((path, hashlib.sha256(payload).hexdigest()))
    return written
