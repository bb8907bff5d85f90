"""The rejected-share gate on its own: off for a stream's window, refusing a night that rejected
more than its bound or everything or read nothing, its message one line with the commonest
reasons first."""

from __future__ import annotations

import pytest

from kvtrace.transforms.errors import JobStopped
from kvtrace.transforms.write.manifest import RecordCounts, check_rejected_fraction


def test_no_bound_lets_anything_through():  # a stream's window: the stream must not stop
    counts = RecordCounts(read=4, rejected=4)
    assert check_rejected_fraction(counts, None, {"invalid_json": 4}) is counts


@pytest.mark.parametrize(
    "counts", [RecordCounts(4, 2), RecordCounts(4, 0, lost_bytes=5, input_bytes=10)]
)
def test_up_to_the_bound_passes(counts):
    assert check_rejected_fraction(counts, 0.5) is counts


def test_every_record_rejected_is_refused_under_any_bound():
    with pytest.raises(JobStopped, match="every record rejected: nothing to publish"):
        check_rejected_fraction(RecordCounts(2, 2), 1.0, {"no_input": 2})


@pytest.mark.parametrize("bound", [0.0, 1.0])
def test_no_record_read_is_refused_under_any_bound_naming_the_inputs(bound):
    # A night of no record exports none, as one of every record rejected: nothing to publish.
    with pytest.raises(JobStopped) as stopped:
        check_rejected_fraction(RecordCounts(0, 0, input_bytes=2, input_files=3), bound)
    assert JobStopped.message_in(stopped.value) == (
        "no records read from --input (3 files, 2 bytes): nothing to publish"
    )


def test_a_rejection_with_no_record_read_is_still_nothing_to_publish():
    with pytest.raises(JobStopped, match="every record rejected: nothing to publish"):
        check_rejected_fraction(RecordCounts(0, 1), 1.0, {"damaged_file": 1})


def test_the_message_is_one_line_with_reasons_by_count_then_name():
    reasons = {"wrong_type": 2, "invalid_json": 5, "bad_timestamp": 2, "too_large": 1}
    with pytest.raises(JobStopped) as stopped:
        check_rejected_fraction(RecordCounts(11, 10, 0, 100), 0.5, reasons)
    message = JobStopped.message_in(stopped.value)
    assert "\n" not in str(stopped.value)
    assert "10 of 11 records (90.9% > --max-rejected-fraction 0.5)" in message
    assert "top reasons: invalid_json 5, bad_timestamp 2, wrong_type 2; " in message
    assert "one JSON object per line" in message  # the commonest reason picks the hint


def test_lost_bytes_are_said_when_a_damaged_file_is_what_tipped_it():
    with pytest.raises(JobStopped, match="1 of 3 records, 80 of 100 input bytes became no record"):
        check_rejected_fraction(RecordCounts(3, 1, 80, 100), 0.5, {"damaged_file": 1})


def test_records_the_engine_never_served_are_not_held_against_the_bound():
    """A gateway's cache hits are counted, not judged: the bound weighs what the engine served
    (half of it rejected here, 9 of 10 records rejected in all) and the bytes it read."""
    hits = (("gateway_cache_hit", 8), ("invalid_json", 1))
    counts = RecordCounts(10, 9, 90, 100, hits, unserved_bytes=80)
    assert counts.rejected_fraction() == 0.5
    assert check_rejected_fraction(counts, 0.5, dict(hits)) is counts
    with pytest.raises(JobStopped, match="50.0% > --max-rejected-fraction 0.4"):
        check_rejected_fraction(counts, 0.4, dict(hits))
    # A night of nothing but cache hits still publishes nothing: no record to export.
    with pytest.raises(JobStopped, match="every record rejected"):
        check_rejected_fraction(RecordCounts(2, 2, reasons=(("gateway_cache_hit", 2),)), 1.0)
