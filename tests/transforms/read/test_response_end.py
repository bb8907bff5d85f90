"""When a logged response ended: end times, durations, streamed chunk times; damaged values."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import parse_record
from kvtrace.transforms.read.response_end import response_ms

ARRIVAL = 1_700_000_000_000  # epoch ms


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"end_timestamp": ARRIVAL + 2_500}, 2_500),
        ({"end_time": "2023-11-14T22:13:22.500Z"}, 2_500),  # ARRIVAL is 22:13:20.000Z
        ({"latency_ms": 840}, 840),
        ({"e2e_latency_ms": 12.9}, 12),
        ({"response_time": 1.25}, 1_250),  # a bare name is seconds
        ({"latency_s": 3}, 3_000),
        ({"latency": 1.001}, 1_001),  # the text's ms, not the binary fraction's 1000.99...
        ({"latency": dt.timedelta(microseconds=1_001_999)}, 1_001),  # an Arrow duration
        ({"total_time_ms": 0}, 0),
        ({}, None),
    ],
)
def test_each_way_logs_give_the_end(record, expected):
    assert response_ms(record, record, None, ARRIVAL) == expected


def test_the_responses_api_completed_at_is_whole_seconds_and_may_floor_below_the_arrival():
    response = {"created_at": 1_700_000_000, "completed_at": 1_700_000_000}
    assert response_ms({}, {}, response, ARRIVAL + 400) == 0
    assert response_ms({}, {}, {"completed_at": 1_700_000_003}, ARRIVAL + 400) == 2_600


def test_streamed_chunks_end_at_the_last_chunk_that_says_when():
    chunks = [
        {"received_at": ARRIVAL + 90, "choices": []},
        {"received_at": ARRIVAL + 1_400, "choices": []},
        {"choices": []},
    ]
    assert response_ms({}, {}, chunks, ARRIVAL) == 1_400


def test_an_end_time_wins_over_a_duration_and_both_over_chunks():
    record = {"end_timestamp": ARRIVAL + 10, "latency_ms": 999}
    assert response_ms(record, record, [{"timestamp": ARRIVAL + 5}], ARRIVAL) == 10


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"end_timestamp": ARRIVAL - 1}, "response_before_request"),
        ({"latency_ms": -5}, "out_of_range"),
        ({"latency_ms": float("nan")}, "out_of_range"),
        ({"latency": 1e12}, "out_of_range"),
        ({"latency_ms": "fast"}, "wrong_type"),
        ({"latency_ms": True}, "wrong_type"),
        ({"end_time": "yesterday"}, "bad_timestamp"),
    ],
)
def test_damaged_ends_are_dead_letters_with_a_reason(record, reason):
    with pytest.raises(Rejected) as caught:
        response_ms(record, record, None, ARRIVAL)
    assert caught.value.reason == reason


def test_a_parsed_record_carries_it():
    line = json.dumps({"timestamp": ARRIVAL, "prompt": "hi", "latency_ms": 75}).encode()
    assert parse_record(line, "f").response_ms == 75
    line = json.dumps({"timestamp": ARRIVAL, "prompt": "hi"}).encode()
    assert parse_record(line, "f").response_ms is None


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
NAMES = st.sampled_from(
    [
        "end_timestamp",
        "end_time",
        "completed_at",
        "latency_ms",
        "latency",
        "duration_s",
        "timestamp",
        "received_at",
    ]
)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(NAMES, VALUES, max_size=3), st.lists(st.dictionaries(NAMES, VALUES), max_size=3)
)
def test_any_value_gives_an_end_or_a_dead_letter(record, chunks):
    try:
        elapsed = response_ms(record, record, chunks, ARRIVAL)
    except Rejected:
        return
    assert elapsed is None or 0 <= elapsed < 2**31
