"""trace_format.columns_of_parquet compares a shard's whole footer schema with the one kvtrace
writes (names in order and each once, types, nullability, metadata): any other schema is a
FormatError before a value is decoded, never another exception."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.trace_format import (
    FormatError,
    TraceColumns,
    columns_of_parquet,
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
    assert parquet_bytes(columns_of_parquet(parquet_bytes(columns))) == parquet_bytes(columns)


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
    "change, why",
    [
        (_repeated, "columns repeated: timestamp"),
        (_swapped, "column order, nullability or metadata"),
        (_nullable, "column order, nullability or metadata"),
        (_schema_metadata, "column order, nullability or metadata"),
        (_field_metadata, "column order, nullability or metadata"),
    ],
)
def test_any_other_schema_is_a_format_error(change, why):
    table = _table(parquet_bytes(_columns(with_outputs=True, with_response=True)))
    with pytest.raises(FormatError) as refused:
        columns_of_parquet(change(table))
    assert why in str(refused.value)
