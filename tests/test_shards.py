"""Trace shard encodings: JSONL exactly as json.dumps writes each row, Parquet with the same rows."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.write.rows import NO_SESSION, ROW, RowBatch
from transforms.write.shards import SESSION_FIELD, jsonl_bytes, parquet_bytes

ROWS = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**31), st.integers(0, 2**31),
                          st.one_of(st.just(NO_SESSION), st.integers(0, 2**40)),
                          st.lists(st.integers(0, 2**40), max_size=12)), max_size=30)


def batch_of(rows: list) -> RowBatch:
    table = np.zeros(len(rows), dtype=ROW)
    for i, (ts, isl, osl, session, ids) in enumerate(rows):
        table[i] = (ts, 0, isl, osl, session, 0, len(ids))
    ids = np.array([i for *_, row_ids in rows for i in row_ids], dtype=np.int64)
    return RowBatch(table, ids)


def expected(rows: list, origin: int) -> list[dict]:
    out = []
    for ts, isl, osl, session, ids in rows:
        record = {"timestamp": ts - origin, "input_length": isl, "output_length": osl,
                  "hash_ids": ids}
        if session != NO_SESSION:
            record[SESSION_FIELD] = session
        out.append(record)
    return out


@settings(max_examples=200, deadline=None)
@given(ROWS, st.integers(0, 2**20))
def test_jsonl_is_byte_for_byte_what_json_dumps_writes(rows, origin):
    text = "".join(json.dumps(r) + "\n" for r in expected(rows, origin))
    assert jsonl_bytes(batch_of(rows), origin) == text.encode()


@settings(max_examples=50, deadline=None)
@given(ROWS)
def test_parquet_holds_the_same_rows_with_missing_sessions_as_nulls(rows):
    table = pq.read_table(io.BytesIO(parquet_bytes(batch_of(rows), 0))).to_pylist()
    assert table == [{SESSION_FIELD: None, **r} for r in expected(rows, 0)]
