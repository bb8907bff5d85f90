"""The plausibility rule (the bulk of an input's own timestamps, never a calendar window alone)
and the ISO-8601 reader's digits (ASCII only)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.paths import without_views
from kvtrace.transforms.read.timestamps import (
    DAY_MS,
    MAX_GAP_DAYS,
    anchored_days,
    day_runs,
    plausible_days,
    timestamp_ms,
)

NIGHT_START = 1_700_000_000_000
RESET = 946_684_800_000  # 2000-01-01: inside the calendar range of log dates


def days_of(timestamps: list[int]) -> Counter[int]:
    return Counter(ts // DAY_MS for ts in timestamps)


def plausible(timestamps: list[int], ts: int) -> bool:
    first, last = plausible_days(days_of(timestamps))
    return first <= ts // DAY_MS <= last


@settings(max_examples=100, deadline=None)
@given(
    night=st.lists(st.integers(0, 3 * DAY_MS), min_size=2, max_size=40),
    strays=st.lists(
        st.sampled_from(
            [
                5,
                250,
                RESET,
                RESET + 7 * DAY_MS,
                NIGHT_START - (MAX_GAP_DAYS + 2) * DAY_MS,
                NIGHT_START + 400 * DAY_MS,
            ]
        ),
        max_size=1,
    ),
)
def test_a_night_keeps_its_own_requests_and_nothing_years_away(night, strays):
    night = [NIGHT_START + offset for offset in night]
    everything = night + strays
    assert all(plausible(everything, ts) for ts in night)
    assert not any(plausible(everything, ts) for ts in strays)


def test_days_of_logs_without_a_week_long_gap_are_one_bulk():
    month = [NIGHT_START + day * DAY_MS for day in range(0, 30, 3)]
    assert plausible_days(days_of(month)) == (month[0] // DAY_MS, month[-1] // DAY_MS)


def test_the_run_with_most_requests_wins_and_the_later_on_a_tie():
    early, late = [RESET, RESET + 1], [NIGHT_START, NIGHT_START + 1]
    assert plausible_days(days_of(early + late[:1])) == (RESET // DAY_MS,) * 2
    assert plausible_days(days_of(early + late)) == (NIGHT_START // DAY_MS,) * 2
    assert plausible_days({}) == (0, -1)  # an empty input: no day is plausible


@pytest.mark.parametrize(
    "text",
    [
        "２０２５-01-01T00:00:00Z",  # fullwidth digits
        "2025-01-0١T00:00:00Z",  # an Arabic-Indic one
        "2025-01-01T00:00:00+0١:00",
        "2025-01-01T00:00:00+1_00",
        "2025-01-01T00:00:00++100",
        "2025-01-01T0_:00:00Z",
    ],
)
def test_only_ascii_digits_parse(text):
    with pytest.raises(Rejected) as caught:
        timestamp_ms(text)
    assert caught.value.reason == "bad_timestamp"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 18), st.sampled_from("٠١٢٣٤٥٦٧٨٩０１２３４５６７８９߀"))
def test_any_non_ascii_digit_in_a_valid_timestamp_is_refused(position, digit):
    text = "2025-06-15T12:30:45.123+02:00"
    digits = [i for i, char in enumerate(text) if char.isdigit()]
    at = digits[position % len(digits)]
    assert timestamp_ms(text) == 1_749_983_445_123
    with pytest.raises(Rejected):
        timestamp_ms(text[:at] + digit + text[at + 1 :])


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("zone", [None, "UTC", "+05:30", "America/New_York"])
def test_an_arrow_timestamp_reads_as_the_same_moment_as_its_iso_string(unit, zone):
    """A Parquet timestamp column, whatever its unit and zone, gives the ms its ISO string
    gives (floored); a column without a zone is UTC, as a string without one is."""
    import pyarrow as pa

    epoch_ns = 1_763_700_061_007_654_321  # 2025-11-21T04:41:01.007654321Z
    per_unit = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[unit]
    column = pa.table({"t": pa.array([epoch_ns // per_unit], pa.timestamp(unit, tz=zone))})
    # as the Parquet reader converts it (ns floored to us: no pandas needed)
    [moment] = column.cast(without_views(column.schema), safe=False)["t"].to_pylist()
    expected = epoch_ns // per_unit * per_unit // 10**6
    assert timestamp_ms(moment) == expected
    assert timestamp_ms(moment, "s") == expected  # a number's unit is no datetime's
    text = dt.datetime.fromtimestamp(expected / 1000, dt.timezone.utc).isoformat()
    assert timestamp_ms(text) == expected


def test_an_arrow_timestamp_outside_the_logs_dates_is_refused_alike():
    with pytest.raises(Rejected) as caught:
        timestamp_ms(dt.datetime(1999, 12, 31, 23, 59))
    assert caught.value.reason == "implausible_timestamp"
    with pytest.raises(Rejected) as caught:
        timestamp_ms(dt.datetime(1969, 12, 31, tzinfo=dt.timezone.utc))
    assert caught.value.reason == "negative_timestamp"


@pytest.mark.parametrize(
    "value, unit, expected",
    [
        (1.001, "s", 1_001),  # 1.001 * 1000 is 1000.9999999999999 in binary floating point
        (1_763_703_600.123, "auto", 1_763_703_600_123),
        (1_763_703_600_123_456.0, "us", 1_763_703_600_123),
        (1_763_703_600_123_456_789, "ns", 1_763_703_600_123),
    ],
)
def test_a_number_is_scaled_as_its_text_wrote_it(value, unit, expected):
    assert timestamp_ms(value, unit) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-11-21 04:40:02.123+00", "2025-11-21T04:40:02.123+00:00"),
        ("2025-11-21 04:40:02-05", "2025-11-21T04:40:02-05:00"),
        ("2025-11-21T04:40:02+0530", "2025-11-21T04:40:02+05:30"),
    ],
)
def test_an_hour_only_zone_reads_as_its_hours(text, expected):
    """ISO-8601's ±hh, as PostgreSQL writes a timestamptz as text: minutes 0."""
    moment = dt.datetime.fromisoformat(expected)
    assert timestamp_ms(text) == int(moment.timestamp() * 1000)


@pytest.mark.parametrize("zone", ["+\u0660\u0660", "+0", "+000", "+24", "+00:"])
def test_a_zone_of_other_than_two_ascii_hour_digits_is_refused(zone):
    with pytest.raises(Rejected, match="bad_timestamp|not ISO|out of range"):
        timestamp_ms("2025-11-21 04:40:02" + zone.encode().decode("unicode_escape"))


def test_bigquerys_exported_timestamp_reads_as_utc():
    """BigQuery's TIMESTAMP as `bq extract` writes it: its zone spelled ` UTC`."""
    assert timestamp_ms("2025-11-21 04:40:01.123000 UTC") == timestamp_ms(
        "2025-11-21T04:40:01.123Z"
    )


@pytest.mark.parametrize("zone", [" utc", "  UTC", "UTC", " GMT", " UTC+1"])
def test_a_zone_name_other_than_bigquerys_utc_is_refused(zone):
    with pytest.raises(Rejected, match="not ISO"):
        timestamp_ms("2025-11-21 04:40:01" + zone)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 60), st.integers(1, 5), max_size=12),
    st.dictionaries(st.integers(0, 60), st.integers(1, 5), min_size=1, max_size=12),
)
def test_what_was_published_is_never_outvoted(anchor_days, waiting):
    """anchored_days: the run (no gap over MAX_GAP_DAYS) holding the anchor's days, however
    many requests wait elsewhere; with no anchor, the batch rule's bulk."""
    start = min(anchor_days, default=0)  # the anchor is one run, as a stream publishes it
    anchor = {start + n: 1 for n in range(3)} if anchor_days else {}
    first, last = anchored_days(anchor, waiting)
    if not anchor:
        assert (first, last) == plausible_days(waiting)
        return
    assert first <= start and start + 2 <= last
    days = sorted({*anchor, *waiting})
    inside = [d for d in days if first <= d <= last]
    assert all(b - a <= MAX_GAP_DAYS for a, b in zip(inside, inside[1:]))
    # Maximal: the next day out on either side is beyond the gap.
    assert all(d < first - MAX_GAP_DAYS or d > last + MAX_GAP_DAYS for d in days if d not in inside)


def test_day_runs_split_at_gaps_over_the_rule():
    counts = {0: 2, MAX_GAP_DAYS: 1, 2 * MAX_GAP_DAYS + 1: 4}
    assert day_runs(counts) == [
        (3, 0, MAX_GAP_DAYS),
        (4, 2 * MAX_GAP_DAYS + 1, 2 * MAX_GAP_DAYS + 1),
    ]
    assert day_runs({}) == []
