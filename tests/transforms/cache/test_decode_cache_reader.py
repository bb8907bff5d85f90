"""The decode cache's output-id reader on files the trace reader refuses."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.transforms.cache.decode_cache import _output_ids


def test_a_parquet_trace_the_trace_reader_refuses_gives_no_output_ids(tmp_path):
    """A Parquet trace with a column nested past a record's depth is refused whole by the
    trace reader (its rows are not in the trace): the output-id reader reads none of it either,
    rather than failing the run."""
    kind = pa.int64()
    for _ in range(1000):
        kind = pa.list_(kind)
    path = tmp_path / "deep.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array([0], pa.int64()),
                "input_length": pa.array([4], pa.int64()),
                "output_length": pa.array([1], pa.int64()),
                "hash_ids": pa.array([[1]], pa.list_(pa.int64())),
                "output_hash_ids": pa.array([[2]], pa.list_(pa.int64())),
                "junk": pa.nulls(1, kind),
            }
        ),
        path,
        store_schema=False,
    )
    assert list(_output_ids(str(path))) == []


def test_a_line_nested_thousands_deep_is_skipped_not_a_recursion_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1], '
        f'"output_hash_ids": [2], "junk": {"[" * 5000}{"]" * 5000}}}\n'
        '{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], '
        '"output_hash_ids": [3]}\n'
    )
    assert list(_output_ids(str(path))) == [(2, [3])]
