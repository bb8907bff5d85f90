"""write/rows.py: rows held column-wise, each row's ids travelling with it through select,
concat, sort and the split into shards; and the rows built from a batch's requests."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.ids.buckets import BUCKET_MS
from kvtrace.transforms.trace_format import NO_SESSION
from kvtrace.transforms.write.rows import ROW, RowBatch, room_by_minute, row_batch, rows_by_shard

# (timestamp, input_length, output_length, session, ids, output ids)
ROWS = st.lists(
    st.tuples(
        st.integers(0, 5 * BUCKET_MS),
        st.integers(0, 3),
        st.integers(0, 3),
        st.sampled_from([NO_SESSION, 0, 1]),
        st.lists(st.integers(0, 99), max_size=4),
        st.lists(st.integers(100, 199), max_size=2),
    ),
    max_size=25,
)


def batch_of(rows: list, hashes: bool = True) -> RowBatch:
    table = np.zeros(len(rows), dtype=ROW)
    for i, (ts, isl, osl, session, ids, outputs) in enumerate(rows):
        table[i] = (ts, i, isl, osl, session, 0, len(ids), len(outputs), -1, -1, 0, 0, 0, 0)
    ids = np.array([i for row in rows for i in row[4]], dtype=np.int64)
    outputs = np.array([o for row in rows for o in row[5]], dtype=np.int64)
    return RowBatch(table, ids, ids.astype(np.uint64) * 3 if hashes else None, outputs)


def as_rows(batch: RowBatch) -> list[tuple]:
    """Each row with its own ids, output ids and hashes: what must stay together."""
    hashes = (
        np.split(batch.hashes, np.cumsum(batch.rows["num_ids"])[:-1])
        if batch.hashes is not None and len(batch.rows)
        else [None] * len(batch.rows)
    )
    return [
        (tuple(row.tolist()), ids.tolist(), outputs.tolist(), None if h is None else h.tolist())
        for row, ids, outputs, h in zip(batch.rows, batch.row_ids(), batch.row_output_ids(), hashes)
    ]


@settings(max_examples=30, deadline=None)
@given(ROWS, st.randoms(use_true_random=False))
def test_select_keeps_each_rows_ids_outputs_and_hashes_with_it(rows, random):
    batch = batch_of(rows)
    order = list(range(len(rows)))
    random.shuffle(order)
    order = order[: random.randint(0, len(order))]  # any subset, in any order
    picked = batch.select(np.array(order, dtype=np.int64))
    assert as_rows(picked) == [as_rows(batch)[i] for i in order]


@settings(max_examples=30, deadline=None)
@given(ROWS, st.randoms(use_true_random=False))
def test_the_sorted_rows_do_not_depend_on_the_order_they_came_in(rows, random):
    """Published order is a function of the rows alone: any arrival order sorts the same."""
    batch = batch_of(rows)
    shuffled = list(range(len(rows)))
    random.shuffle(shuffled)
    once = batch.sorted()
    assert as_rows(batch.select(np.array(shuffled, dtype=np.int64)).sorted()) == as_rows(once)
    assert as_rows(once.sorted()) == as_rows(once)
    assert np.all(np.diff(once.rows["timestamp_ms"]) >= 0)


@settings(max_examples=25, deadline=None)
@given(st.lists(ROWS, max_size=4))
def test_concat_is_the_rows_of_each_batch_in_turn(parts):
    joined = RowBatch.concat([batch_of(p) for p in parts])
    assert as_rows(joined) == [r for p in parts for r in as_rows(batch_of(p))]


def test_concat_of_nothing_is_an_empty_batch_without_optional_columns():
    empty = RowBatch.concat([])
    assert len(empty.rows) == 0 and empty.ids.dtype == np.int64
    assert empty.hashes is None and empty.output_ids is None
    assert empty.row_ids() == [] and empty.row_output_ids() == []


def test_concat_drops_a_column_one_batch_lacks():
    """Hashes are kept only when every batch has them: a partial column would misalign."""
    rows = [(0, 1, 1, NO_SESSION, [1, 2], [])]
    joined = RowBatch.concat([batch_of(rows), batch_of(rows, hashes=False)])
    assert joined.hashes is None and joined.ids.tolist() == [1, 2, 1, 2]


@settings(max_examples=30, deadline=None)
@given(
    ROWS,
    st.lists(st.integers(1, 5), max_size=3, unique=True).map(lambda p: [0, *sorted(p)]),
    st.integers(0, BUCKET_MS),
)
def test_rows_by_shard_partitions_the_rows_keeping_their_order(rows, plan, origin):
    batch = batch_of([(ts + origin, *rest) for ts, *rest in rows])
    plan = np.array(plan, dtype=np.int64)
    parts = list(rows_by_shard(batch, plan, origin))
    shards = [shard for shard, _ in parts]
    assert shards == sorted(set(shards))  # each shard once, ascending
    assert all(0 <= s < len(plan) for s in shards)
    # Each part is its rows in input order (fingerprints tell rows apart); together, every row once.
    every = as_rows(batch)
    places = [part.rows["fingerprint"].tolist() for _, part in parts]
    assert sorted(i for p in places for i in p) == list(range(len(rows)))
    for (shard, part), place in zip(parts, places):
        assert place == sorted(place) and as_rows(part) == [every[i] for i in place]
        minutes = (part.rows["timestamp_ms"] - origin) // BUCKET_MS
        assert (np.searchsorted(plan, minutes, side="right") - 1 == shard).all()


def test_room_by_minute_sums_each_minutes_room():
    minutes, rooms = room_by_minute(np.array([5, 0, 5, 2]), np.array([1, 2, 3, 4]))
    assert minutes.tolist() == [0, 2, 5] and rooms.tolist() == [2, 4, 4]
    assert rooms.dtype == np.int64
    minutes, rooms = room_by_minute(np.empty(0, np.int64), np.empty(0, np.int64))
    assert minutes.tolist() == [] and rooms.tolist() == []


def _request(ms: int, prompt: int, outputs: int, session: bytes | None) -> HashedRequest:
    return HashedRequest(
        ms,
        ms,
        4 * prompt,
        5,
        b"\1" * 16 * prompt,
        session,
        output_block_hashes=b"\2" * 16 * outputs,
    )


def test_row_batch_splits_each_requests_ids_into_prompt_and_output_blocks():
    batch = HashedBatch.pack(
        [_request(0, 2, 1, b"s" * 16), _request(1, 0, 2, None), _request(2, 1, 0, b"t" * 16)]
    )
    # Ids in request order: 2 prompt + 1 output, 0 + 2, 1 + 0.
    ids = np.array([10, 11, 90, 91, 92, 12], dtype=np.int64)
    rows = row_batch(batch.requests, ids, np.array([7, 8]), with_outputs=True)
    assert [i.tolist() for i in rows.row_ids()] == [[10, 11], [], [12]]
    assert [o.tolist() for o in rows.row_output_ids()] == [[90], [91, 92], []]
    assert rows.rows["session_id"].tolist() == [7, NO_SESSION, 8]
    assert row_batch(batch.requests, ids, np.array([7, 8])).output_ids is None


def test_rows_alike_but_for_their_output_ids_differ_in_their_sort_key():
    """Everything a row publishes is in its sort key: output ids too (ids_digest)."""
    batch = HashedBatch.pack([_request(0, 1, 1, None), _request(0, 1, 1, None)])
    rows = row_batch(
        batch.requests, np.array([1, 2, 1, 3]), np.empty(0, np.int64), with_outputs=True
    )
    assert rows.rows["ids_digest"][0] != rows.rows["ids_digest"][1]
    plain = row_batch(batch.requests, np.array([1, 2, 1, 3]), np.empty(0, np.int64))
    assert plain.rows["ids_digest"][0] == plain.rows["ids_digest"][1]
