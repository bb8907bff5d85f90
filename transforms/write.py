"""Write trace rows as sorted, deterministically named JSONL and Parquet shards.

Rows go to shards by time bucket (consecutive buckets per shard, see buckets.plan_shards), so
shards are sorted across file names and their boundaries depend on the data alone.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from kvtrace.transforms.buckets import bucket_of, plan_shards
from kvtrace.transforms.rows import TraceRow

# A shard is sorted in one worker's memory: ~4M ids is ~150 MB of Python rows and ~35 MB of JSONL.
MAX_BLOCKS_PER_SHARD = 4_000_000
TRACE_FILE_PREFIX = "trace-"

TRACE_SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("input_length", pa.int64(), nullable=False),
        pa.field("output_length", pa.int64(), nullable=False),
        pa.field("hash_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        pa.field("session_id", pa.int64(), nullable=True),
    ],
    metadata={"format": "mooncake-trace", "timestamp_unit": "ms"},
)


def shard_name(shard: int, shards: int, suffix: str) -> str:
    return f"{TRACE_FILE_PREFIX}{shard:05d}-of-{shards:05d}{suffix}"


def jsonl_line(row: TraceRow, origin_ms: int) -> str:
    record = {
        "timestamp": row.timestamp_ms - origin_ms,
        "input_length": row.input_length,
        "output_length": row.output_length,
        "hash_ids": row.hash_ids.tolist(),
    }
    if row.session_id is not None:
        record["session_id"] = row.session_id
    return json.dumps(record)


def parquet_bytes(rows: list[TraceRow], origin_ms: int) -> bytes:
    lengths = np.fromiter((len(r.hash_ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([r.hash_ids for r in rows]) if rows else np.zeros(0, np.int64)
    columns = [
        pa.array([r.timestamp_ms - origin_ms for r in rows], pa.int64()),
        pa.array([r.input_length for r in rows], pa.int64()),
        pa.array([r.output_length for r in rows], pa.int64()),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.astype(np.int64))).cast(
            TRACE_SCHEMA.field("hash_ids").type
        ),
        pa.array([r.session_id for r in rows], pa.int64()),
    ]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(columns, schema=TRACE_SCHEMA), sink, compression="zstd")
    return sink.getvalue()


def write_shard(
    directory: str, shard: int, shards: int, rows: Iterable[TraceRow], origin_ms: int
) -> list[str]:
    """Sort one shard's rows and write them as JSONL and Parquet; returns the two paths."""
    ordered = sorted(rows, key=TraceRow.sort_key)
    jsonl = "".join(jsonl_line(r, origin_ms) + "\n" for r in ordered).encode()
    paths = []
    for suffix, payload in ((".jsonl", jsonl), (".parquet", parquet_bytes(ordered, origin_ms))):
        path = FileSystems.join(directory, shard_name(shard, shards, suffix))
        with FileSystems.create(path) as handle:
            handle.write(payload)
        paths.append(path)
    return paths


class WriteShard(beam.DoFn):
    def __init__(self, directory: str):
        self._directory = directory

    def process(
        self, element: tuple[int, Iterable[TraceRow | None]], plan: dict[int, int], origin: int,
        gate: object,
    ) -> Iterator[str]:
        shard, rows = element
        shards = max(plan.values(), default=0) + 1
        # None marks shard 0, which always exists so that an empty trace still has its files.
        yield from write_shard(self._directory, shard, shards, (r for r in rows if r), origin)


class WriteTrace(beam.PTransform):
    """Rows in; the written file paths out. `gate` is a side input that must be computed (and
    may fail the job) before any file is written."""

    def __init__(self, directory: str, gate: beam.PCollection,
                 max_blocks_per_shard: int = MAX_BLOCKS_PER_SHARD):
        super().__init__()
        self._directory = directory
        self._gate = gate
        self._max_blocks = max_blocks_per_shard

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        max_blocks = self._max_blocks
        plan = (
            rows
            # +1: a row with no blocks still takes room in its shard
            | "BucketSize" >> beam.Map(lambda r: (bucket_of(r.timestamp_ms), len(r.hash_ids) + 1))
            | "SumPerBucket" >> beam.CombinePerKey(sum)
            | "AllSizes" >> beam.combiners.ToDict()
            | "PlanShards" >> beam.Map(plan_shards, max_blocks)
        )
        origin = (
            rows
            | "Timestamps" >> beam.Map(lambda r: r.timestamp_ms)
            | "Origin" >> beam.CombineGlobally(min).without_defaults()
        )
        keyed = rows | "ToShard" >> beam.Map(
            lambda r, plan: (plan[bucket_of(r.timestamp_ms)], r), beam.pvalue.AsSingleton(plan)
        )
        first_shard = rows.pipeline | "FirstShard" >> beam.Create([(0, None)])
        return (
            (keyed, first_shard)
            | "WithFirstShard" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(
                WriteShard(self._directory),
                beam.pvalue.AsSingleton(plan),
                beam.pvalue.AsSingleton(origin, default_value=0),
                beam.pvalue.AsSingleton(self._gate),
            )
        )
