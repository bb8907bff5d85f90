"""The audit never decodes a Parquet shard: it compares its bytes whole with parquet_bytes of
its JSONL twin's rows (columns_of_jsonl). So every schema kvtrace writes is those bytes, and a
file of any other schema (names in order and each once, types, nullability, metadata) is not."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.trace_format import (
    TraceColumns,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
    table_bytes,
)


def _columns(with_outputs: bool, with_response: bool) -> TraceColumns:
    one = np.array([0])
    return TraceColumns(
        one,
        np.array([4]),
        np.array([1]),
        np.array([1]),
        one,
        np.array([-1]),
        np.array([7 if with_response else -1]),
        *((np.array([0]), np.array([], dtype=np.int64)) if with_outputs else (None, None)),
    )


def _table(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))


def _with_schema(table: pa.Table, fields: list[pa.Field], arrays: list, metadata) -> bytes:
    return table_bytes(pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata)))


@pytest.mark.parametrize("with_outputs", [False, True])
@pytest.mark.parametrize("with_response", [False, True])
def test_every_schema_kvtrace_writes_reads_back(with_outputs, with_response):
    columns = _columns(with_outputs, with_response)
    assert parquet_bytes(columns_of_jsonl(jsonl_bytes(columns))) == parquet_bytes(columns)


def _repeated(table: pa.Table) -> bytes:
    fields, arrays = [*table.schema], [*table.columns]
    return _with_schema(table, [*fields, fields[0]], [*arrays, arrays[0]], table.schema.metadata)


def _swapped(table: pa.Table) -> bytes:
    order = [1, 0, *range(2, table.num_columns)]
    fields = [table.schema.field(i) for i in order]
    return _with_schema(table, fields, [table.column(i) for i in order], table.schema.metadata)


def _nullable(table: pa.Table) -> bytes:
    fields = [table.schema.field(0).with_nullable(True), *list(table.schema)[1:]]
    return _with_schema(table, fields, table.columns, table.schema.metadata)


def _schema_metadata(table: pa.Table) -> bytes:
    metadata = {**table.schema.metadata, b"note": b"patient jane doe"}
    return _with_schema(table, list(table.schema), table.columns, metadata)


def _field_metadata(table: pa.Table) -> bytes:
    fields = [table.schema.field(0).with_metadata({"note": "x"}), *list(table.schema)[1:]]
    return _with_schema(table, fields, table.columns, table.schema.metadata)


@pytest.mark.parametrize(
    "change", [_repeated, _swapped, _nullable, _schema_metadata, _field_metadata]
)
def test_any_other_schema_is_not_the_bytes_kvtrace_writes(change):
    columns = _columns(with_outputs=True, with_response=True)
    other = change(_table(parquet_bytes(columns)))
    assert other != parquet_bytes(columns_of_jsonl(jsonl_bytes(columns)))
