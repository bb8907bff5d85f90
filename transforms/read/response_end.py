"""When a request's response ended, as ms after the request arrived: what a replayer needs to
wait, after the previous turn's response, before it sends a conversation's next turn.

Logs say it in one of three ways, tried in this order:
- an end time beside the request's timestamp (same clock and unit rules as `timestamp`;
  the Responses API's `completed_at` is epoch seconds, like `created`);
- a duration: a `_ms` or `_s` suffix names its unit; a bare `latency`, `duration` or
  `response_time` is seconds, as the gateways that log one write it;
- streamed chunks logged with their arrival times: the last chunk's time.
A response that ends before its request arrived is a damaged record.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.numbers import floor_scaled
from kvtrace.transforms.read.timestamps import timestamp_ms
from kvtrace.transforms.trace_format import MAX_RESPONSE_MS

END_TIME_FIELDS = ("end_timestamp", "response_timestamp", "end_time", "endTime", "finished_at")
EPOCH_SECONDS_END_FIELDS = ("completed_at",)
DURATION_FIELDS_MS = (
    "latency_ms",
    "e2e_latency_ms",
    "duration_ms",
    "response_time_ms",
    "elapsed_ms",
    "total_time_ms",
)
DURATION_FIELDS_S = (
    "latency_s",
    "e2e_latency_s",
    "duration_s",
    "response_time_s",
    "elapsed_s",
    "latency",
    "duration",
    "response_time",
)
CHUNK_TIME_FIELDS = ("timestamp", "received_at", "arrival_time")


def response_ms(
    record: dict,
    body: dict,
    response: dict | list | None,
    arrival_ms: int,
    timestamp_unit: str = "auto",
) -> int | None:
    """ms from the request's arrival to its response's end, or None when the record says not."""
    holders = [record, body] + ([response] if isinstance(response, dict) else [])
    end, resolution = _end_time(holders, timestamp_unit)
    if end is None:
        duration = _duration(holders)
        if duration is None:
            end = _last_chunk_time(response, timestamp_unit)
            if end is None:
                return None
        else:
            end = arrival_ms + duration
    elapsed = end - arrival_ms
    if -resolution < elapsed < 0:  # an end in whole seconds, floored, within the arrival's second
        elapsed = 0
    if elapsed < 0:
        raise Rejected(
            "response_before_request",
            f"the response ended {-elapsed} ms before the request arrived",
        )
    if elapsed > MAX_RESPONSE_MS:
        raise Rejected("out_of_range", f"a response of {elapsed} ms (over 24 days)")
    return elapsed


def _end_time(holders: list[dict], unit: str) -> tuple[int | None, int]:
    """(the end in ms, the resolution it was given in), or (None, 1)."""
    for holder in holders:
        for name in END_TIME_FIELDS:
            if holder.get(name) is not None:
                return timestamp_ms(holder[name], unit), 1
        for name in EPOCH_SECONDS_END_FIELDS:
            if holder.get(name) is not None:
                return timestamp_ms(holder[name], "s"), 1000
    return None, 1


def _duration(holders: list[dict]) -> int | None:
    for holder in holders:
        for names, exponent in ((DURATION_FIELDS_MS, 0), (DURATION_FIELDS_S, 3)):
            for name in names:
                value = holder.get(name)
                if value is not None:
                    return _duration_ms(value, name, exponent)
    return None


def _duration_ms(value: Any, name: str, exponent: int) -> int:
    """The duration in ms, floored: a number in 10**-exponent s, or an Arrow duration."""
    if isinstance(value, dt.timedelta):  # an Arrow duration column: its unit is its own
        value, exponent = value // dt.timedelta(microseconds=1), -3
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Rejected("wrong_type", f"{name} is a {type(value).__name__}, not a number")
    ms = floor_scaled(value, exponent) if math.isfinite(value) else -1
    if not 0 <= ms <= MAX_RESPONSE_MS:
        raise Rejected("out_of_range", f"{name} {str(value)[:32]} is not a response time")
    return ms


def _last_chunk_time(response: dict | list | None, unit: str) -> int | None:
    if not isinstance(response, list):
        return None
    for chunk in reversed(response):
        if isinstance(chunk, dict):
            for name in CHUNK_TIME_FIELDS:
                if chunk.get(name) is not None:
                    return timestamp_ms(chunk[name], unit)
    return None
