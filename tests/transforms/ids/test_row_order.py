"""The published order of rows (ids/row_order.py): one key, used by the numbering, the writer
and the gate, that depends only on what the rows publish (then a private tie-break)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.blocks import chain_hashes, chain_seed, token_bytes
from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.ids.dense_ids import block_keys, dense_ids, session_keys
from kvtrace.transforms.ids.row_order import in_published_order, published_order, tie_key
from kvtrace.transforms.trace_format import NO_SESSION
from kvtrace.transforms.write.coarsen import Coarsening, published_requests
from kvtrace.transforms.write.rows import row_batch
from kvtrace.transforms.write.shards import published_columns

SEED = chain_seed(b"row order test salt.............")
LENGTH = st.integers(0, 2**31 - 1)
START = 1_700_000_000_000


@given(st.tuples(LENGTH, LENGTH), st.tuples(LENGTH, LENGTH))
def test_tie_key_orders_rows_as_the_pair_of_lengths(a, b):
    keys = tie_key(np.array([a[0], b[0]]), np.array([a[1], b[1]]))
    assert (keys[0] < keys[1]) == (a < b) and (keys[0] == keys[1]) == (a == b)


def test_tie_key_saturates_what_kvtrace_never_writes():
    """Negative or beyond-32-bit lengths (only a forged folder holds them) still give a key,
    never a wrap-around that would put them among small ones."""
    keys = tie_key(np.array([-5, 2**40, 7]), np.array([3, 2**40, -1]))
    assert keys.tolist() == [3, 2**64 - 1, 7 << 32]


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 4), st.integers(0, 9)),
        max_size=30,
    )
)
def test_published_order_is_time_then_lengths_then_the_private_column(rows):
    ts, isl, osl, private = (np.array([row[k] for row in rows], np.int64) for k in range(4))
    order = published_order(ts, isl, osl, private)
    assert [rows[i] for i in order] == sorted(rows)
    assert in_published_order(ts[order], isl[order], osl[order])


def test_the_gate_refuses_a_tied_pair_out_of_key_order_and_passes_a_fully_tied_one():
    """Two rows of one published time in the wrong (input, output) order are refused; rows
    equal in every length pass in either order (the residual the docs describe)."""
    ts = np.array([0, 0, 1000])
    assert in_published_order(ts, np.array([4, 5, 1]), np.array([9, 0, 0]))
    assert not in_published_order(ts, np.array([5, 4, 1]), np.array([0, 9, 0]))
    assert not in_published_order(ts, np.array([5, 5, 1]), np.array([9, 0, 0]))
    assert in_published_order(ts, np.array([5, 5, 1]), np.array([9, 9, 0]))
    assert not in_published_order(np.array([1000, 0]), np.array([1, 2]), np.array([0, 0]))


def _requests(rng: random.Random, count: int, start: int, jitter: int) -> list[HashedRequest]:
    """Requests with shared prefixes, many lengths alike, four granules of 1000 ms: each
    request's raw time somewhere inside its granule (jitter ms either side of its centre)."""
    requests = []
    for i in range(count):
        granule = 0 if i == 0 else rng.randrange(4)
        offset = (
            0 if i == 0 else rng.randint(-jitter, jitter) if granule else rng.randint(0, jitter)
        )
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
        session = rng.choice([None, b"s" * 16, b"t" * 16, b"u" * 16])
        requests.append(
            HashedRequest(
                timestamp_ms=start + 1000 * granule + offset,
                fingerprint=rng.getrandbits(64),
                input_length=len(tokens),
                output_length=rng.choice([0, 3, 40, 260]),
                block_hashes=chain_hashes(token_bytes(tokens), 2, SEED),
                session_key=session,
            )
        )
    return requests


def _moved(request: HashedRequest, rng: random.Random) -> HashedRequest:
    """The request elsewhere in its granule (after the origin, in the first one)."""
    granule = (request.timestamp_ms - START + 500) // 1000
    offset = rng.randint(-499, 499) if granule else rng.randint(0, 499)
    return dataclasses.replace(request, timestamp_ms=START + 1000 * granule + offset)


def _published(requests: list[HashedRequest], coarsening: Coarsening):
    """The local engine's path from hashed requests to published columns, the origin at the
    earliest request: published times, ids numbered, rows built and sorted."""
    origin = min(r.timestamp_ms for r in requests)
    whole = published_requests(HashedBatch.pack(requests), origin, coarsening)
    blocks = dense_ids(block_keys(whole, 2))
    sessions = dense_ids(session_keys(whole))
    rows = row_batch(whole.requests, blocks.ids, sessions.ids).sorted()
    return published_columns(rows, origin)


def _first_appearances(values: np.ndarray) -> list[int]:
    seen: dict[int, None] = {}
    for value in values.tolist():
        seen.setdefault(value, None)
    return list(seen)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 40))
def test_rows_and_their_ids_follow_the_published_order_whatever_the_finer_times(seed, count):
    """Numbering (dense_ids) and the writer's sort agree on one order: ids and sessions first
    appear as 0, 1, 2, ... in row order, which the gate's check accepts; and requests moved
    within their granule, in any input order, give the same published columns."""
    rng = random.Random(seed)
    coarsening = Coarsening(timestamp_ms=1000, output_length=50)
    requests = _requests(rng, count, START, 400)
    columns = _published(requests, coarsening)
    assert in_published_order(columns.timestamp, columns.input_length, columns.output_length)
    assert _first_appearances(columns.ids) == list(range(len(set(columns.ids.tolist()))))
    sessions = columns.session[columns.session != NO_SESSION]
    assert _first_appearances(sessions) == list(range(len(set(sessions.tolist()))))

    moved = [requests[0]] + [_moved(r, rng) for r in requests[1:]]  # the earliest is the origin
    rng.shuffle(moved)
    other = _published(moved, coarsening)
    for name in ("timestamp", "input_length", "output_length", "num_ids", "ids", "session"):
        assert getattr(other, name).tolist() == getattr(columns, name).tolist(), name


def test_published_requests_round_as_the_rows_do_and_leave_nothing_finer():
    """Times and output lengths as coarsen() publishes them, so that coarsening the rows again
    at write changes nothing; a granularity of 1 leaves the batch as it is."""
    batch = HashedBatch.pack(
        [
            HashedRequest(
                timestamp_ms=t,
                fingerprint=0,
                input_length=1,
                output_length=o,
                block_hashes=b"",
                session_key=None,
            )
            for t, o in ((1000, 0), (1499, 1), (1500, 26), (2600, 75))
        ]
    )
    published = published_requests(batch, 1000, Coarsening(timestamp_ms=1000, output_length=50))
    assert published.requests["timestamp_ms"].tolist() == [1000, 1000, 2000, 3000]
    assert published.requests["output_length"].tolist() == [0, 50, 50, 100]
    assert published_requests(batch, 1000, Coarsening()) is batch
