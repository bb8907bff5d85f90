"""write/coarsen.py: the rounding that lowers what published times and output lengths reveal,
pinned as properties (order survives, rounding twice is rounding once) and at its bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.trace_format import (
    MAX_BLOCK_SIZE,
    MAX_OUTPUT_LENGTH,
    MAX_PUBLISHED_INT,
    MAX_RESPONSE_MS,
    NO_RESPONSE_MS,
    NO_SESSION,
)
from kvtrace.transforms.write.coarsen import (
    SLOWEST_TOKEN_MS,
    Coarsening,
    coarse_output_lengths,
    coarse_response_ms,
    coarsen,
    granularity_problem,
    published_requests,
    round_to,
    timestamp_floor,
    timing_problem,
)
from kvtrace.transforms.write.rows import ROW, RowBatch

HIGHEST = MAX_PUBLISHED_INT - 1  # what every published integer is held to
VALUES = st.lists(st.integers(0, HIGHEST), min_size=1, max_size=40).map(
    lambda v: np.array(v, dtype=np.int64)
)
STEPS = st.integers(1, 10**6)


@settings(max_examples=50, deadline=None)
@given(VALUES, STEPS)
def test_rounding_lands_on_the_nearest_multiple_half_up(values, step):
    rounded = round_to(values, step)
    assert (rounded % step == 0).all()
    # The nearest, or at the range's top the largest multiple within it (below the value).
    top = HIGHEST // step * step
    assert ((np.abs(rounded - values) <= step // 2) | ((rounded == top) & (values > top))).all()
    # Half up: a value exactly between two multiples goes to the higher one.
    assert round_to(np.array([step // 2]), step).tolist() == [step if step % 2 == 0 else 0]


@settings(max_examples=50, deadline=None)
@given(VALUES, STEPS)
def test_rounding_is_idempotent_and_monotone(values, step):
    rounded = round_to(values, step)
    assert (round_to(rounded, step) == rounded).all()
    ordered = np.sort(values)
    assert (np.diff(round_to(ordered, step)) >= 0).all()  # time order survives


@settings(max_examples=50, deadline=None)
@given(VALUES, STEPS)
def test_a_positive_output_length_never_publishes_as_zero(lengths, step):
    coarse = coarse_output_lengths(lengths, step)
    assert ((coarse > 0) == (lengths > 0)).all()
    assert (coarse % step == 0).all()
    assert (coarse_output_lengths(coarse, step) == coarse).all()
    assert (np.diff(coarse_output_lengths(np.sort(lengths), step)) >= 0).all()


def test_a_step_of_one_changes_nothing():
    values = np.array([0, 1, 7, MAX_OUTPUT_LENGTH, HIGHEST], dtype=np.int64)
    assert round_to(values, 1).tolist() == values.tolist()
    assert coarse_output_lengths(values[:-1], 1).tolist() == values[:-1].tolist()


@pytest.mark.parametrize(
    "values, step, highest, expected",
    [
        ([MAX_OUTPUT_LENGTH], 1000, MAX_OUTPUT_LENGTH, [2_147_483_000]),  # not 2,147,484,000
        ([MAX_OUTPUT_LENGTH - 1], 2, MAX_OUTPUT_LENGTH, [MAX_OUTPUT_LENGTH - 1]),
        ([MAX_OUTPUT_LENGTH], MAX_OUTPUT_LENGTH, MAX_OUTPUT_LENGTH, [MAX_OUTPUT_LENGTH]),
        ([1 << 30], 1 << 32, MAX_OUTPUT_LENGTH, [0]),  # no positive multiple within the range
        ([HIGHEST], 1000, HIGHEST, [HIGHEST // 1000 * 1000]),
        ([(1 << 39) + 1], HIGHEST, HIGHEST, [HIGHEST]),
    ],
)
def test_rounding_at_the_top_of_the_range_takes_the_largest_multiple_within_it(
    values, step, highest, expected
):
    assert round_to(np.array(values, dtype=np.int64), step, highest).tolist() == expected


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, MAX_OUTPUT_LENGTH), min_size=1, max_size=20),
    st.integers(1, HIGHEST),
    st.integers(1, HIGHEST),
)
def test_every_coarse_value_stays_within_its_published_range(values, time_step, length_step):
    """Whatever step the CLI takes (up to the manifest schema's largest), the values published
    are within trace_format's ranges (the ones the audit holds rows to), multiples of the step,
    and rounding them again changes nothing."""
    values = np.array(values, dtype=np.int64)
    lengths = coarse_output_lengths(values, length_step)
    assert ((lengths >= 0) & (lengths <= MAX_OUTPUT_LENGTH) & (lengths % length_step == 0)).all()
    assert (coarse_output_lengths(lengths, length_step) == lengths).all()
    if length_step <= MAX_OUTPUT_LENGTH:  # a positive multiple lies within the range
        assert ((lengths > 0) == (values > 0)).all()
    responses = coarse_response_ms(values, Coarsening(time_step))
    assert ((responses >= 0) & (responses <= MAX_RESPONSE_MS)).all()
    assert (responses % time_step == 0).all()
    times = round_to(values << 9, time_step)  # times span up to 2^40 ms
    assert ((times >= 0) & (times <= HIGHEST) & (times % time_step == 0)).all()


def test_the_default_coarsening_is_the_identity():
    assert Coarsening().is_identity and not Coarsening(2, 1).is_identity


def _rows(timestamps: list[int], outputs: list[int], responses: list[int]) -> RowBatch:
    rows = np.zeros(len(timestamps), dtype=ROW)
    rows["timestamp_ms"], rows["output_length"] = timestamps, outputs
    rows["response_ms"] = responses
    rows["input_length"], rows["num_ids"], rows["session_id"] = 33, 1, NO_SESSION
    return RowBatch(rows, np.arange(len(timestamps), dtype=np.int64))


def test_the_identity_returns_the_batch_itself():
    batch = _rows([5], [3], [NO_RESPONSE_MS])
    assert coarsen(batch, 0, Coarsening()) is batch


def test_times_round_relative_to_the_origin_and_unknown_responses_stay_unknown():
    origin = 1_000_003  # not a multiple of the step: rounding is from the origin, not from 0
    batch = _rows([origin, origin + 149, origin + 150], [0, 1, 250], [NO_RESPONSE_MS, 149, 150])
    coarse = coarsen(batch, origin, Coarsening(timestamp_ms=300, output_length=100))
    assert (coarse.rows["timestamp_ms"] - origin).tolist() == [0, 0, 300]
    assert coarse.rows["output_length"].tolist() == [0, 100, 300]
    assert coarse.rows["response_ms"].tolist() == [NO_RESPONSE_MS] * 3  # beside coarse lengths
    timed = coarsen(batch, origin, Coarsening(timestamp_ms=300))
    assert timed.rows["response_ms"].tolist() == [NO_RESPONSE_MS, 0, 300]
    # What must stay exact (input_length matches hash_ids) and the input batch stay untouched.
    assert coarse.rows["input_length"].tolist() == [33] * 3
    assert coarse.ids is batch.ids
    assert batch.rows["timestamp_ms"].tolist() == [origin, origin + 149, origin + 150]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)), min_size=1, max_size=20),
    st.integers(0, 10**9),
    st.integers(1, 10**5),
    st.integers(1, 10**4),
)
def test_requests_and_their_rows_are_coarsened_alike(requests, origin, time_step, length_step):
    """Ids are numbered on published_requests' values and rows published with coarsen's: the
    two must agree, or the rows would be ordered by values nobody sees."""
    coarsening = Coarsening(time_step, length_step)
    timestamps = [origin + ms for ms, _ in requests]
    batch = HashedBatch.pack(
        [HashedRequest(ms, 0, 1, osl, b"", None) for ms, (_, osl) in zip(timestamps, requests)]
    )
    published = published_requests(batch, origin, coarsening).requests
    lengths, unknown = [osl for _, osl in requests], [NO_RESPONSE_MS] * len(requests)
    rows = coarsen(_rows(timestamps, lengths, unknown), origin, coarsening).rows
    assert published["timestamp_ms"].tolist() == rows["timestamp_ms"].tolist()
    assert published["output_length"].tolist() == rows["output_length"].tolist()
    assert batch.requests["timestamp_ms"].tolist() == timestamps  # the input is not changed
    assert published_requests(batch, origin, Coarsening()) is batch


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=8),
    st.integers(1, 10**4),
    st.integers(2, 10**4),
)
def test_no_response_time_is_published_beside_coarse_lengths(responses, time_step, length_step):
    """A response time is TTFT + tokens x TPOT, both fitted from the trace: beside lengths
    rounded to length_step it would give each length back to the token (red team round 6), so
    none is published; with exact lengths they round to the timestamp granularity."""
    values = np.array(responses + [NO_RESPONSE_MS], dtype=np.int64)
    dropped = coarse_response_ms(values, Coarsening(time_step, length_step))
    assert (dropped == NO_RESPONSE_MS).all()
    kept = coarse_response_ms(values, Coarsening(time_step))
    assert kept.tolist() == [*round_to(values[:-1], time_step).tolist(), NO_RESPONSE_MS]


@given(st.integers(1, MAX_OUTPUT_LENGTH), st.integers(1, HIGHEST))
def test_timestamps_pass_only_as_coarse_as_the_lengths_need(length_step, time_step):
    """One rule for the run and the gate: exact lengths take any timestamps; lengths rounded to
    N take timestamps of N x SLOWEST_TOKEN_MS at least, and a refusal names that floor. Every
    floor is a granularity a manifest may hold (the run's default is one)."""
    floor = timestamp_floor(length_step)
    assert floor == (1 if length_step == 1 else length_step * SLOWEST_TOKEN_MS) <= HIGHEST
    problem = timing_problem(time_step, length_step)
    assert (problem is None) == (time_step >= floor)
    assert problem is None or f"{floor} ms" in problem
    assert timing_problem(floor, length_step) is None


@given(st.integers(1, MAX_BLOCK_SIZE), st.integers(1, MAX_OUTPUT_LENGTH))
def test_lengths_pass_only_as_coarse_as_a_block(block_size, length_step):
    """One rule for the run and the gate: a next turn's prompt keeps its full blocks, so a step
    above the block size is refused, naming the block size; any step up to it passes."""
    problem = granularity_problem(block_size, length_step)
    assert (problem is None) == (length_step <= block_size)
    assert problem is None or f"at most {block_size}" in problem
    assert granularity_problem(block_size, block_size) is None


@settings(max_examples=200, deadline=None)
@given(
    length_step=st.integers(2, 16),
    per_token_ms=st.integers(1, SLOWEST_TOKEN_MS),
    tokens=st.integers(0, 10_000),
    apart=st.integers(0, 15),
    offset=st.integers(0, 10**9),
)
def test_the_floor_hides_a_length_inside_a_granule_and_narrows_it_at_a_boundary(
    length_step, per_token_ms, tokens, apart, offset
):
    """The claim of coarsen.SLOWEST_TOKEN_MS, every phase of the next arrival swept: replies
    fewer than N tokens apart publish the next arrival equal or one granule apart, and apart
    at exactly (tokens apart x per-token ms) of the granule's phases."""
    apart %= length_step
    granule = timestamp_floor(length_step)
    phases = offset + np.arange(granule, dtype=np.int64)
    one = round_to(phases + tokens * per_token_ms, granule)
    other = round_to(phases + (tokens + apart) * per_token_ms, granule)
    assert set(np.unique(other - one)) <= {0, granule}
    assert np.count_nonzero(other != one) == apart * per_token_ms
