"""Input lengths beside --length-granularity (write/coarsen.coarse_input_lengths): a session's
next prompt holds the reply, so its input_length is coarsened as the reply's output_length is,
within its last block so that hash_ids still match it."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.trace_format import MAX_INPUT_LENGTH
from kvtrace.transforms.write.coarsen import Coarsening, coarse_input_lengths, published_requests
from kvtrace.transforms.write.totals import ExportTotals

LENGTHS = st.lists(st.integers(0, 1 << 20), min_size=1, max_size=50)
BLOCK_SIZES = st.sampled_from([1, 2, 4, 16, 64, 512])
# A step at most the block size: above it the run and the gate refuse (granularity_problem).
BLOCKS_AND_STEPS = BLOCK_SIZES.flatmap(
    lambda block: st.tuples(st.just(block), st.integers(1, block))
)


@given(LENGTHS, BLOCKS_AND_STEPS)
def test_every_row_keeps_its_block_count_and_loses_under_one_step(lengths, block_and_step):
    block_size, step = block_and_step
    raw = np.array(lengths, np.int64)
    coarse = coarse_input_lengths(raw, block_size, step)
    assert (-(-coarse // block_size) == -(-raw // block_size)).all()
    assert ((coarse >= raw) & (coarse - raw < step)).all()
    assert (coarse_input_lengths(coarse, block_size, step) == coarse).all()  # the gate's test


@given(st.integers(MAX_INPUT_LENGTH - (1 << 20), MAX_INPUT_LENGTH), BLOCKS_AND_STEPS)
def test_a_length_at_the_top_of_the_range_stays_within_it(length, block_and_step):
    """Rounding the last block's fill up may pass MAX_INPUT_LENGTH (the range the audit holds
    rows to): the cap lies past the length's full blocks, so the block count holds."""
    block_size, step = block_and_step
    raw = np.array([length], np.int64)
    coarse = coarse_input_lengths(raw, block_size, step)
    assert coarse[0] <= MAX_INPUT_LENGTH and coarse[0] >= length
    assert -(-coarse[0] // block_size) == -(-length // block_size)
    assert (coarse_input_lengths(coarse, block_size, step) == coarse).all()


def test_the_largest_input_length_is_published_as_it_is():
    assert coarse_input_lengths(np.array([MAX_INPUT_LENGTH]), 1024, 1000).tolist() == [
        MAX_INPUT_LENGTH
    ]


@given(st.integers(1, 1 << 20), BLOCKS_AND_STEPS)
def test_lengths_of_one_granule_of_the_last_block_publish_alike(length, block_and_step):
    """What the round 5 red team read back: two replies a token apart (two next prompts a token
    apart) publish the same input_length when they round to one multiple of the step."""
    block_size, step = block_and_step
    full = (length - 1) // block_size * block_size
    fill = length - full
    granule = -(-fill // step)
    alike = np.arange(full + (granule - 1) * step + 1, full + min(block_size, granule * step) + 1)
    published = coarse_input_lengths(alike, block_size, step)
    assert len(set(published.tolist())) == 1


def test_a_step_of_one_or_no_block_size_keeps_lengths_exact():
    raw = np.array([0, 1, 5, 17], np.int64)
    assert coarse_input_lengths(raw, 4, 1) is raw
    assert coarse_input_lengths(raw, 0, 16) is raw
    assert coarse_input_lengths(raw, 4, 3).tolist() == [0, 3, 7, 19]
    assert coarse_input_lengths(raw, 4, 16).tolist() == [0, 4, 8, 20]


def test_requests_and_their_totals_publish_the_coarse_input_lengths():
    """Numbering's token weights and stats.json's sums read the published requests: none of
    them may sum the exact lengths back."""
    batch = HashedBatch.pack(
        [
            HashedRequest(
                timestamp_ms=1000,
                fingerprint=i,
                input_length=n,
                output_length=3,
                block_hashes=b"",
                session_key=None,
            )
            for i, n in enumerate((5, 6, 9))
        ]
    )
    coarsening = Coarsening(timestamp_ms=1, output_length=4, block_size=4)
    published = published_requests(batch, 1000, coarsening)
    assert published.requests["input_length"].tolist() == [8, 8, 12]
    assert ExportTotals.of_batch(published, coarsening).input_tokens == 28
    assert ExportTotals.of_batch(batch, coarsening).input_tokens == 28
