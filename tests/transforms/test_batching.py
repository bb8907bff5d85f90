"""BatchByWeight: bounded by weight and count, never an empty batch, nothing lost."""

import pytest

pytestmark = pytest.mark.beam  # imports Beam: its tests share one worker


def test_batches_respect_weight_and_count_and_a_heavy_element_is_alone():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from kvtrace.transforms.steps import BatchByWeight

    elements = [300, 5, 5, 5, 1000, 1, 1, 1, 1, 1]

    def check(batches):
        assert all(batches), "an empty batch"
        assert sorted(x for b in batches for x in b) == sorted(elements)
        for batch in batches:
            assert len(batch) <= 3
            assert len(batch) == 1 or sum(batch) <= 100

    with TestPipeline() as pipeline:
        batches = (
            pipeline
            | beam.Create(elements, reshuffle=False)
            | beam.ParDo(BatchByWeight(100, lambda x: x, max_count=3))
        )
        assert_that(batches, check)
