"""trace_format.columns_of_parquet checks a shard's schema from its footer, before any value is
decoded: a column kvtrace does not write, or of a type it does not write, is never read."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.trace_format import TRACE_SCHEMA, FormatError, columns_of_parquet


def _shard(extra: dict, undecodable: str) -> bytes:
    """A shard whose column `undecodable` has its pages overwritten: reading them would fail."""
    table = pa.table(
        {
            "timestamp": pa.array([0], pa.int64()),
            "input_length": pa.array([4], pa.int64()),
            "output_length": pa.array([1], pa.int64()),
            "hash_ids": pa.array([[0]], TRACE_SCHEMA.field("hash_ids").type),
            **extra,
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=False)
    data = bytearray(sink.getvalue())
    metadata = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    chunk = metadata.row_group(0).column(table.schema.names.index(undecodable))
    start = chunk.data_page_offset
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    return bytes(data)


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"session_id": ["z" * 100_000]}, "fields beyond the trace's own: session_id"),
        ({"session": ["z" * 100_000]}, "columns of other types than kvtrace writes (session)"),
    ],
)
def test_a_column_kvtrace_does_not_write_is_refused_undecoded(extra, why):
    with pytest.raises(FormatError) as refused:
        columns_of_parquet(_shard(extra, next(iter(extra))))
    assert why in str(refused.value)  # not "not a readable Parquet file": never decoded
