"""The calibration's numbers: what they say of an aggregate smaller than anonymize publishes."""

from __future__ import annotations

from kvtrace.pipelines.calibrate import below_floor_note
from kvtrace.transforms.trace_format import MIN_MEASURED_REQUESTS


def test_an_aggregate_below_the_publication_floor_says_so_and_one_at_it_does_not():
    note = below_floor_note(MIN_MEASURED_REQUESTS - 1)
    assert note and f"fewer than {MIN_MEASURED_REQUESTS} requests" in note and "private" in note
    assert below_floor_note(MIN_MEASURED_REQUESTS) is None
