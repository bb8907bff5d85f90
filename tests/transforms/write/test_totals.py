"""write/totals.py: the export's totals and hit rates, as stats.json publishes them."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode.hashed_batch import HashedBatch, HashedRequest
from kvtrace.transforms.trace_format import MIN_MEASURED_REQUESTS
from kvtrace.transforms.write.coarsen import Coarsening
from kvtrace.transforms.write.totals import ExportTotals, export_stats, hit_rate, sum_totals

TOTALS = st.builds(ExportTotals, *[st.integers(0, 10**9)] * 6)


def test_the_totals_of_nothing_are_zero():
    assert sum_totals([]) == ExportTotals()
    assert ExportTotals.of_batch(HashedBatch.pack([])) == ExportTotals()


@settings(max_examples=60, deadline=None)
@given(st.lists(TOTALS, max_size=6), st.lists(TOTALS, max_size=6))
def test_summing_is_field_by_field_and_splits_anywhere(left, right):
    """Beam combines partial sums in any grouping: the sum of sums is the sum."""
    whole = sum_totals(left + right)
    assert whole == sum_totals([sum_totals(left), sum_totals(right)])
    assert all(
        getattr(whole, f.name) == sum(getattr(t, f.name) for t in left + right)
        for f in fields(ExportTotals)
    )


def test_a_batchs_totals_count_what_its_published_rows_show():
    requests = [
        HashedRequest(0, 0, 40, 149, b"\0" * 32, None, defaulted=("output_length",)),
        HashedRequest(1, 1, 8, 0, b"\0" * 16, None, defaulted=("message_not_rendered",)),
        HashedRequest(2, 2, 3, 1, b"", None),
    ]
    totals = ExportTotals.of_batch(HashedBatch.pack(requests), Coarsening(output_length=100))
    # Output lengths as published: 149 -> 100, 0 stays 0, 1 -> 100 (never 0 once positive).
    assert totals == ExportTotals(
        requests=3,
        input_tokens=51,
        output_tokens=200,
        blocks=3,
        requests_without_output_length=1,
        requests_with_unrendered_messages=1,
    )
    assert ExportTotals.of_batch(HashedBatch.pack(requests)).output_tokens == 150


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_a_hit_rate_is_a_share_and_zero_for_an_empty_trace(unique, extra):
    rate = hit_rate(unique, unique + extra)
    assert 0.0 <= rate <= 1.0
    assert hit_rate(0, 0) == 0.0
    assert (rate == 0.0) == (extra == 0 or unique + extra == 0)


def test_stats_say_the_totals_their_hit_rates_and_how_each_is_defined():
    totals = ExportTotals(requests=2, input_tokens=100, output_tokens=7, blocks=4)
    stats = export_stats(totals, unique_blocks=1, unique_tokens=25)
    assert stats["requests"] == 2 and stats["output_tokens"] == 7
    assert stats["hit_rates"] == {"token_weighted": 0.75, "block_weighted": 0.75}
    assert set(stats["definitions"]) == set(stats["hit_rates"])
    # Counts the run keeps for the operator (run-counts.json) are not published here.
    assert "requests_without_output_length" not in stats


def test_a_measured_aggregate_is_published_over_enough_requests_only():
    """Over fewer than MIN_MEASURED_REQUESTS requests the engine's measured aggregate is their
    private counts (one request's, exactly): stats.json leaves it out; from the minimum on it
    is published, its three counts and their rate."""
    for requests in (1, MIN_MEASURED_REQUESTS - 1, MIN_MEASURED_REQUESTS):
        totals = ExportTotals(
            requests=40,
            input_tokens=4_000,
            blocks=40,
            measured_requests=requests,
            measured_cached_tokens=7 * requests,
            measured_input_tokens=100 * requests,
        )
        stats = export_stats(totals, unique_blocks=40, unique_tokens=4_000)
        published = requests >= MIN_MEASURED_REQUESTS
        assert ("measured" in stats) == published == ("measured" in stats["definitions"])
        if published:
            assert stats["measured"] == {
                "requests": requests,
                "cached_tokens": 7 * requests,
                "input_tokens": 100 * requests,
                "hit_rate": 0.07,
            }
