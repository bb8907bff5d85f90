"""Pure combiners: folded in one process and lifted into Beam, the same result."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.combiners import BucketTotals, fold

PAIRS = st.lists(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 100)), max_size=4), max_size=12
)


def expected_totals(elements: list[list[tuple[int, int]]]) -> dict[int, int]:
    totals: dict[int, int] = {}
    for pairs in elements:
        for bucket, amount in pairs:
            totals[bucket] = totals.get(bucket, 0) + amount
    return totals


@given(PAIRS, st.integers(1, 4))
def test_bucket_totals_merged_in_any_split_equal_one_fold(elements, parts):
    combiner = BucketTotals(lambda pairs: pairs)
    pieces = [elements[i::parts] for i in range(parts)]
    accumulators = []
    for piece in pieces:
        accumulator = combiner.create_accumulator()
        for element in piece:
            accumulator = combiner.add_input(accumulator, element)
        accumulators.append(accumulator)
    merged = combiner.extract_output(combiner.merge_accumulators(accumulators))
    assert merged == fold(combiner, elements) == expected_totals(elements)


def test_bucket_totals_finish_sees_the_totals():
    combiner = BucketTotals(lambda pairs: pairs, lambda totals: sorted(totals.items()))
    assert fold(combiner, [[(2, 1)], [(1, 4), (2, 3)]]) == [(1, 4), (2, 4)]
    assert fold(combiner, []) == []


@pytest.mark.beam
def test_combine_with_lifts_a_pure_combiner_into_beam():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from kvtrace.transforms.steps import CombineWith

    elements = [[(0, 3), (1, 1)], [(1, 2)], [(7, 5)]]
    with TestPipeline() as pipeline:
        combined = (
            pipeline
            | beam.Create(elements)
            | beam.CombineGlobally(CombineWith(BucketTotals(lambda pairs: pairs)))
        )
        assert_that(combined, equal_to([expected_totals(elements)]))
