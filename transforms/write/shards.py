"""Write trace rows as sorted, deterministically named JSONL and Parquet shards.

Rows go to shards by time bucket (consecutive buckets per shard, see buckets.plan_shards), so
shards are sorted across file names and their boundaries depend on the data alone.
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms import storage
from transforms.combiners import BucketTotals
from transforms.ids.buckets import plan_shards
from transforms.write.coarsen import Coarsening, coarsen
from transforms.read.trace_fields import (NO_RESPONSE_MS, OUTPUT_IDS_FIELD, RESPONSE_FIELD,
                                          SESSION_FIELD)
from transforms.write.rows import NO_SESSION, RowBatch, bucket_sizes

# A shard is sorted in one worker's memory: 8M ids are ~64 MB as int64 and ~70 MB of JSONL.
MAX_BLOCKS_PER_SHARD = 8_000_000
TRACE_FILE_PREFIX = "trace-"


def shard_plan() -> BucketTotals:
    """A combiner: HashedBatches in, the output shard plan out (each time bucket's room summed
    over the batches, then consecutive buckets grouped into shards)."""
    return BucketTotals(bucket_sizes,
                        functools.partial(plan_shards, max_per_shard=MAX_BLOCKS_PER_SHARD))


TRACE_SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("input_length", pa.int64(), nullable=False),
        pa.field("output_length", pa.int64(), nullable=False),
        pa.field("hash_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        pa.field(SESSION_FIELD, pa.int64(), nullable=True),
    ],
    metadata={"format": "mooncake-trace", "timestamp_unit": "ms"},
)


BLOCK_HASHES_PREFIX = "block-hashes-"
BLOCK_HASHES_SCHEMA = pa.schema(
    [pa.field("row", pa.int64(), nullable=False), pa.field("position", pa.int32(), nullable=False),
     pa.field("id", pa.int64(), nullable=False), pa.field("hash", pa.uint64(), nullable=False)],
    metadata={"private": "unkeyed engine block hashes: whoever holds the tokenizer can confirm "
                         "a guessed prompt from them; never publish"},
)


def shard_name(shard: int, shards: int, suffix: str) -> str:
    return f"{TRACE_FILE_PREFIX}{shard:05d}-of-{shards:05d}{suffix}"


def jsonl_bytes(batch: RowBatch, origin_ms: int) -> bytes:
    """The rows as JSONL, exactly as json.dumps writes each row's dict (tests compare the two);
    formatted directly because dumping a dict per row costs 1.5x as long, on one core."""
    rows = batch.rows
    ids = batch.ids.tolist()
    ends = np.cumsum(rows["num_ids"]).tolist()
    outputs = _output_lists(batch)
    columns = zip((rows["timestamp_ms"] - origin_ms).tolist(), rows["input_length"].tolist(),
                  rows["output_length"].tolist(), rows["session_id"].tolist(),
                  rows["response_ms"].tolist(), ends)
    lines, start = [], 0
    for row, (timestamp, input_length, output_length, session, response, end) in enumerate(columns):
        tail = "]}" if session == NO_SESSION else f'], "{SESSION_FIELD}": {session}}}'
        if response != NO_RESPONSE_MS:
            tail = f'], "{RESPONSE_FIELD}": {response}' + tail[1:]
        if outputs is not None:
            tail = f'], "{OUTPUT_IDS_FIELD}": [{outputs[row]}' + tail
        lines.append(f'{{"timestamp": {timestamp}, "input_length": {input_length}, '
                     f'"output_length": {output_length}, "hash_ids": ['
                     f'{", ".join(map(str, ids[start:end]))}{tail}\n')
        start = end
    return "".join(lines).encode()


def _output_lists(batch: RowBatch) -> list[str] | None:
    """Each row's output ids as JSON list items (--emit-output-hashes), or None."""
    if batch.output_ids is None:
        return None
    ids, ends = batch.output_ids.tolist(), np.cumsum(batch.rows["num_output_ids"]).tolist()
    return [", ".join(map(str, ids[a:b])) for a, b in zip([0] + ends[:-1], ends)]


def arrow_array(values: np.ndarray, type: pa.DataType = pa.int64(),
                valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow int64 or int32 array over values' memory. pa.array(values) would do, but it
    probes for pandas and imports it (0.3 s of every run's start-up)."""
    values = np.ascontiguousarray(values, dtype="<i8" if type == pa.int64() else "<i4")
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(values)], nulls)


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
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def list_array(counts: np.ndarray, values: np.ndarray, type: pa.DataType) -> pa.Array:
    """Lists of values, counts[i] in row i, built in their schema type (a cast would import
    pyarrow.compute: 0.1 s of start-up)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(arrow_array(offsets, pa.int32()), arrow_array(values),
                                    type=type)


def parquet_bytes(batch: RowBatch, origin_ms: int) -> bytes:
    rows = batch.rows
    columns = [
        arrow_array(rows["timestamp_ms"] - origin_ms),
        arrow_array(rows["input_length"]),
        arrow_array(rows["output_length"]),
        list_array(rows["num_ids"], batch.ids, TRACE_SCHEMA.field("hash_ids").type),
        arrow_array(rows["session_id"], valid=rows["session_id"] != NO_SESSION),
    ]
    schema = TRACE_SCHEMA
    if batch.output_ids is not None:
        schema = schema.append(pa.field(OUTPUT_IDS_FIELD, schema.field("hash_ids").type, nullable=False))
        columns.append(list_array(rows["num_output_ids"], batch.output_ids,
                                  schema.field(OUTPUT_IDS_FIELD).type))
    known = rows["response_ms"] != NO_RESPONSE_MS
    if known.any():
        schema = schema.append(pa.field(RESPONSE_FIELD, pa.int64(), nullable=True))
        columns.append(arrow_array(rows["response_ms"], valid=known))
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), sink, compression="zstd")
    return sink.getvalue()


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
    written = []
    for suffix, payload in ((".jsonl", jsonl_bytes(ordered, origin_ms)),
                            (".parquet", parquet_bytes(ordered, origin_ms))):
        path = storage.join(directory, shard_name(shard, shards, suffix))
        with storage.create(path) as handle:
            handle.write(payload)
        written.append((path, hashlib.sha256(payload).hexdigest()))
    return written
