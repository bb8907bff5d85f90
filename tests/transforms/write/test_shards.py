"""Trace shard encodings: JSONL exactly as json.dumps writes each row, Parquet with the same rows."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.combiners import fold
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.ids.buckets import BUCKET_MS
from kvtrace.transforms.trace_format import (
    NO_RESPONSE_MS,
    OUTPUT_IDS_FIELD,
    RESPONSE_FIELD,
    SESSION_FIELD,
    jsonl_bytes,
    parquet_bytes,
)
from kvtrace.transforms.write import shards
from kvtrace.transforms.write.manifest import trace_origin_ms
from kvtrace.transforms.write.rows import (
    NO_SESSION,
    ROW,
    RowBatch,
    published_room,
    request_room,
    rows_by_shard,
    shard_count,
)
from kvtrace.transforms.write.shards import cuts_unlike_plan, published_columns, shard_plan

ROWS = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.integers(0, 2**31),
        st.integers(0, 2**31),
        st.one_of(st.just(NO_SESSION), st.integers(0, 2**40)),
        st.one_of(st.just(NO_RESPONSE_MS), st.integers(0, 2**31 - 1)),
        st.lists(st.integers(0, 2**40), max_size=12),
    ),
    max_size=30,
)


def outputs_of(rows: list) -> list[list[int]]:
    """Output ids for each row, made from its ids (any values do)."""
    return [[i + 7 for i in row[-1][:3]] for row in rows]


def batch_of(rows: list, with_outputs: bool = False) -> RowBatch:
    table = np.zeros(len(rows), dtype=ROW)
    outputs = outputs_of(rows)
    for i, (ts, isl, osl, session, response, ids) in enumerate(rows):
        table[i] = (
            ts,
            0,
            isl,
            osl,
            session,
            0,
            len(ids),
            len(outputs[i]) if with_outputs else 0,
            response,
            -1,  # no measured cached tokens
            0,  # no links
            0,  # no parent
            0,  # continues nothing
            0,  # named by nothing
        )
    ids = np.array([i for *_, row_ids in rows for i in row_ids], dtype=np.int64)
    flat = np.array([i for out in outputs for i in out], dtype=np.int64)
    return RowBatch(table, ids, None, flat if with_outputs else None)


def expected(rows: list, origin: int, with_outputs: bool = False) -> list[dict]:
    out = []
    for (ts, isl, osl, session, response, ids), outputs in zip(rows, outputs_of(rows)):
        record = {
            "timestamp": ts - origin,
            "input_length": isl,
            "output_length": osl,
            "hash_ids": ids,
        }
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


def request(ms: int, blocks: int) -> HashedRequest:
    return HashedRequest(ms, ms, blocks * 16, 1, b"\0" * 16 * blocks, None)


def plan_of_batches(batches: list[HashedBatch], origin: int) -> np.ndarray:
    return fold(
        shard_plan(),
        [request_room(b.requests["timestamp_ms"], b.blocks_per_request(), origin) for b in batches],
    )


def test_the_shard_plan_of_several_batches_is_the_plan_of_their_summed_room(monkeypatch):
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 8)
    batches = [
        HashedBatch.pack([request(0, 3), request(2 * BUCKET_MS, 1)]),
        HashedBatch.pack([request(5, 2)]),
        HashedBatch.pack([request(3 * BUCKET_MS, 0)]),
    ]
    # Minute 0 takes 3 + 1 + 2 + 1 = 7, minute 2 takes 2: over 8 together; minute 3 takes 1.
    assert plan_of_batches(batches, 0).tolist() == [0, 2]
    assert plan_of_batches([], 0).tolist() == []


def test_shards_are_cut_at_published_minutes_whatever_the_absolute_time(monkeypatch):
    """The same night at another absolute time (its origin moved with it) is cut alike: the
    minutes are the published ones, which the gate sees."""
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 4)
    night = [(0, 3), (30_000, 2), (BUCKET_MS + 1, 1)]
    plans = [
        plan_of_batches(
            [HashedBatch.pack([request(start + ms, blocks) for ms, blocks in night])], start
        ).tolist()
        for start in (0, 45_000, 1_700_000_012_345)
    ]
    assert plans == [[0, 1]] * 3


def test_rows_by_shard_puts_every_row_in_its_minutes_shard_once():
    origin = 17
    rows = [
        (origin + minute * BUCKET_MS, 1, 1, NO_SESSION, NO_RESPONSE_MS, [minute])
        for minute in (3, 0, 1, 3)
    ]
    plan = np.array([0, 1])
    parts = dict(rows_by_shard(batch_of(rows), plan, origin))
    assert sorted(parts) == [0, 1]
    assert parts[0].rows["timestamp_ms"].tolist() == [origin]
    assert sorted(parts[1].rows["timestamp_ms"].tolist()) == [
        origin + BUCKET_MS,
        origin + 3 * BUCKET_MS,
        origin + 3 * BUCKET_MS,
    ]
    assert shard_count(plan) == 2 and shard_count(np.array([], np.int64)) == 1


def shard_rooms(parts: list[RowBatch], origin: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """What the gate reads of each shard: its published minutes and their room."""
    return [
        published_room(
            p.rows["timestamp_ms"] - origin, p.rows["num_ids"] + p.rows["num_output_ids"]
        )
        for p in parts
    ]


NIGHTS = st.lists(
    st.tuples(st.integers(0, 10 * BUCKET_MS), st.integers(0, 5), st.integers(0, 3)), max_size=30
)


@settings(max_examples=100, deadline=None)
@given(NIGHTS, st.integers(0, 2**40), st.integers(1, 12))
def test_the_gate_recomputes_the_writers_cuts(night, origin, max_blocks):
    """Whatever the rows and the shard size: the cuts the writer makes are the ones
    cuts_unlike_plan recomputes from the published rows."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards, "MAX_BLOCKS_PER_SHARD", max_blocks)
        table = np.zeros(len(night), dtype=ROW)
        table["timestamp_ms"] = [origin + ms for ms, _, _ in night]
        table["num_ids"] = [blocks for _, blocks, _ in night]
        table["num_output_ids"] = [outputs for *_, outputs in night]
        batch = RowBatch(table, np.zeros(int(table["num_ids"].sum()), np.int64))
        plan = fold(
            shard_plan(),
            [
                request_room(
                    table["timestamp_ms"], table["num_ids"] + table["num_output_ids"], origin
                )
            ],
        )
        by_shard = dict(rows_by_shard(batch, plan, origin))
        parts = [by_shard.get(shard, RowBatch.concat([])) for shard in range(shard_count(plan))]
        assert cuts_unlike_plan(shard_rooms(parts, origin)) is None
        if len(night) > 1:  # every other cut of the rows is refused
            moved = [RowBatch.concat(parts)] + [RowBatch.concat([])] * (len(parts) - 1)
            assert (cuts_unlike_plan(shard_rooms(moved, origin)) is None) == (len(parts) == 1)
            alone = [
                batch.select(np.array([row]))
                for row in np.argsort(table["timestamp_ms"], kind="stable")
            ]
            assert (cuts_unlike_plan(shard_rooms(alone, origin)) is None) == (
                len(parts) == len(night) and all(len(p.rows) == 1 for p in parts)
            )


def test_other_shard_counts_and_cuts_are_said_in_one_line(monkeypatch):
    monkeypatch.setattr(shards, "MAX_BLOCKS_PER_SHARD", 4)
    minute = lambda m, room: (np.array([m], np.int64), np.array([room], np.int64))  # noqa: E731
    assert cuts_unlike_plan([minute(0, 3), minute(1, 3)]) is None
    refused = "kvtrace cuts them into {} (consecutive published minutes up to 4 blocks each)"
    assert cuts_unlike_plan([(np.array([0, 1]), np.array([3, 3]))]) == (
        "the rows are in 1 trace shards, " + refused.format(2)
    )
    assert cuts_unlike_plan([]) == "the rows are in 0 trace shards, " + refused.format(1)
    # As many shards as planned, one cut a minute late: minute 1 belongs to shard 1.
    assert cuts_unlike_plan([(np.array([0, 1]), np.array([3, 3])), minute(2, 1)]) == (
        "trace shard 0 is not cut where kvtrace cuts the rows (consecutive published minutes "
        "up to 4 blocks each)"
    )


def test_the_trace_origin_is_the_maps_else_the_earliest_request():
    assert trace_origin_ms(None, 20) == 20
    assert trace_origin_ms(None, None) == 0
    assert trace_origin_ms(10, 50) == 10
