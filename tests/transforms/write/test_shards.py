"""Trace shard encodings: JSONL exactly as json.dumps writes each row, Parquet with the same rows."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.combiners import fold
from transforms.encode.hashed_batch import HashedBatch, HashedRequest
from transforms.ids.buckets import BUCKET_MS, plan_shards
from transforms.trace_format import (NO_RESPONSE_MS, OUTPUT_IDS_FIELD, RESPONSE_FIELD,
                                     SESSION_FIELD, jsonl_bytes, parquet_bytes)
from transforms.write.manifest import trace_origin_ms
from transforms.write.rows import NO_SESSION, ROW, RowBatch, rows_by_shard, shard_count
from transforms.write.shards import MAX_BLOCKS_PER_SHARD, published_columns, shard_plan

ROWS = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**31), st.integers(0, 2**31),
                          st.one_of(st.just(NO_SESSION), st.integers(0, 2**40)),
                          st.one_of(st.just(NO_RESPONSE_MS), st.integers(0, 2**31 - 1)),
                          st.lists(st.integers(0, 2**40), max_size=12)), max_size=30)


def outputs_of(rows: list) -> list[list[int]]:
    """Output ids for each row, made from its ids (any values do)."""
    return [[i + 7 for i in row[-1][:3]] for row in rows]


def batch_of(rows: list, with_outputs: bool = False) -> RowBatch:
    table = np.zeros(len(rows), dtype=ROW)
    outputs = outputs_of(rows)
    for i, (ts, isl, osl, session, response, ids) in enumerate(rows):
        table[i] = (ts, 0, isl, osl, session, 0, len(ids), len(outputs[i]) if with_outputs else 0,
                    response)
    ids = np.array([i for *_, row_ids in rows for i in row_ids], dtype=np.int64)
    flat = np.array([i for out in outputs for i in out], dtype=np.int64)
    return RowBatch(table, ids, None, flat if with_outputs else None)


def expected(rows: list, origin: int, with_outputs: bool = False) -> list[dict]:
    out = []
    for (ts, isl, osl, session, response, ids), outputs in zip(rows, outputs_of(rows)):
        record = {"timestamp": ts - origin, "input_length": isl, "output_length": osl,
                  "hash_ids": ids}
        if with_outputs:
            record[OUTPUT_IDS_FIELD] = outputs
        if response != NO_RESPONSE_MS:
            record[RESPONSE_FIELD] = response
        if session != NO_SESSION:
            record[SESSION_FIELD] = session
        out.append(record)
    return out


@settings(max_examples=60, deadline=None)
@given(ROWS, st.integers(0, 2**20), st.booleans())
def test_jsonl_is_byte_for_byte_what_json_dumps_writes(rows, origin, with_outputs):
    text = "".join(json.dumps(r) + "\n" for r in expected(rows, origin, with_outputs))
    assert jsonl_bytes(published_columns(batch_of(rows, with_outputs), origin)) == text.encode()


@settings(max_examples=50, deadline=None)
@given(ROWS, st.booleans())
def test_parquet_holds_the_same_rows_with_missing_sessions_as_nulls(rows, with_outputs):
    columns = published_columns(batch_of(rows, with_outputs), 0)
    table = pq.read_table(io.BytesIO(parquet_bytes(columns))).to_pylist()
    any_response = any(row[4] != NO_RESPONSE_MS for row in rows)
    nulls = {SESSION_FIELD: None} | ({RESPONSE_FIELD: None} if any_response else {})
    assert table == [nulls | r for r in expected(rows, 0, with_outputs)]


def test_the_shard_plan_of_several_batches_is_the_plan_of_their_summed_room():
    def request(minute: int, blocks: int) -> HashedRequest:
        return HashedRequest(minute * BUCKET_MS, minute, blocks * 16, 1, b"\0" * 16 * blocks,
                             None)

    batches = [HashedBatch.pack([request(0, 3), request(2, 1)]), HashedBatch.pack([request(0, 2)])]
    assert fold(shard_plan(), batches) == plan_shards({0: 7, 2: 2}, MAX_BLOCKS_PER_SHARD)
    assert fold(shard_plan(), []) == {}


def test_rows_by_shard_puts_every_row_in_its_buckets_shard_once():
    rows = [(minute * BUCKET_MS, 1, 1, NO_SESSION, NO_RESPONSE_MS, [minute]) for minute in
            (3, 0, 1, 3)]
    plan = {0: 0, 1: 1, 3: 1}
    parts = dict(rows_by_shard(batch_of(rows), plan))
    assert sorted(parts) == [0, 1]
    assert parts[0].rows["timestamp_ms"].tolist() == [0]
    assert sorted(parts[1].rows["timestamp_ms"].tolist()) == [BUCKET_MS, 3 * BUCKET_MS,
                                                              3 * BUCKET_MS]
    assert shard_count(plan) == 2 and shard_count({}) == 1


def test_the_trace_origin_is_the_maps_else_the_earliest_request():
    assert trace_origin_ms(None, [50, 20]) == 20
    assert trace_origin_ms(None, []) == 0
    assert trace_origin_ms(10, [50]) == 10
