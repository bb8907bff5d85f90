"""Request timestamps in the shapes logs carry them, as integer epoch (or log-relative) ms; the
kind of timestamp (epoch dates or relative times) one holds; and which of an input's timestamps
are plausible: those of the bulk of its own requests.

Numbers: the unit is detected from magnitude unless given. Epoch values of any plausible date
(2001 to 5138) fall in disjoint ranges per unit: seconds in [1e9, 1e11), ms in [1e11, 1e14), us
in [1e14, 1e17), ns from 1e17. Smaller values are relative ms (a replay log's offsets, up to 11
days). Strings: ISO-8601, parsed by one regular expression rather than datetime.fromisoformat,
whose accepted forms change between Python versions (3.11 added "Z" and more), and whose digits
are ASCII only (int() also reads "\u0661" and "1_0"). Datetimes: a Parquet timestamp column
(what pandas, Spark and DuckDB write), read by its own unit and zone; one without a zone is
UTC, as an ISO string without one is.

A calendar range alone cannot tell a clock that reset to a plausible date (2000-01-01) from a
request: the input's own timestamps do (plausible_days). Requests come in runs of days (a night,
a week of logs); a timestamp more than MAX_GAP_DAYS from the run that holds most of the input's
requests is no request of it, whatever date it claims, and must not become the origin of the
published clock, which would shift every other row by years.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.numbers import floor_scaled

# Each unit as 10**exponent ms.
UNIT_MS_EXPONENT = {"s": 3, "ms": 0, "us": -3, "ns": -6}
TIMESTAMP_UNITS = ("auto", *UNIT_MS_EXPONENT)
# Lower bounds of each unit's range of epoch values (see the module docstring).
_EPOCH_UNIT_FLOORS = ((1e17, "ns"), (1e14, "us"), (1e11, "ms"), (1e9, "s"))
# The calendar range of a request log's dates: 2000-01-01 to 2100-01-01 (ms). Later values are
# no log's (a unit read wrong, an int64 overflow, a time-zone shift past year 9999) and would put
# a row centuries after the rest; numbers below the floor are relative times (a replay log's
# offsets), never epoch dates.
EPOCH_FLOOR_MS = 946_684_800_000
EPOCH_CEILING_MS = 4_102_444_800_000
RELATIVE, EPOCH = "relative", "epoch"
DAY_MS = 86_400_000
# Logs of consecutive nights leave no gap between their days; a gap of over a week is a clock
# (or a unit) gone wrong, not a quiet week: the records beyond it are dead letters.
MAX_GAP_DAYS = 7
UTC_SUFFIX = " UTC"
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?)?"
    # ±hh alone: ISO-8601's, PostgreSQL's timestamptz text; " UTC" (that spelling only):
    # BigQuery's TIMESTAMP as its exports write it.
    rf"(Z|[+-]\d{{2}}(?::?\d{{2}})?|(?-i:{UTC_SUFFIX}))?",
    re.IGNORECASE | re.ASCII,
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def detect_unit(value: float) -> str:
    """The unit of a non-negative epoch or relative number, from its magnitude."""
    for floor, unit in _EPOCH_UNIT_FLOORS:
        if value >= floor:
            return unit
    return "ms"


def timestamp_ms(value: object, unit: str = "auto") -> int:
    """A number (in `unit`, or detected), or an ISO-8601 string, as whole ms, floored."""
    if isinstance(value, bool):
        raise Rejected("wrong_type", "timestamp is a boolean")
    if isinstance(value, (int, float)):
        return _number_ms(value, unit)
    if isinstance(value, str):
        return _iso_ms(value)
    if isinstance(value, dt.datetime):  # also pandas' Timestamp, Arrow's for a ns column
        return _datetime_ms(value)
    raise Rejected(
        "wrong_type", f"timestamp is a {type(value).__name__}, not a number, string or datetime"
    )


def _datetime_ms(moment: dt.datetime) -> int:
    """An Arrow timestamp as Python holds it, floored to ms (finer digits, down to a ns
    column's, never round up); without a zone: UTC, so a run never depends on the worker's."""
    if moment.utcoffset() is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return _moment_ms(moment, 0, moment.isoformat())


def _number_ms(value: int | float, unit: str) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise Rejected("bad_timestamp", f"timestamp {value!r} is not finite")
    if value < 0:
        raise Rejected("negative_timestamp", f"timestamp {value!r} is negative")
    if unit == "auto":
        unit = detect_unit(value)
    # Compare before converting: a huge value times 1000 would overflow a float or int64.
    if value >= EPOCH_CEILING_MS / 10 ** UNIT_MS_EXPONENT[unit]:
        raise Rejected(
            "implausible_timestamp",
            f"timestamp {str(value)[:32]} ({unit}) is after 2100: no log's date",
        )
    return floor_scaled(value, UNIT_MS_EXPONENT[unit])


def _iso_ms(text: str) -> int:
    match = _ISO.fullmatch(text.strip())
    if not match:
        raise Rejected("bad_timestamp", f"timestamp {text[:64]!r} is not ISO-8601")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            tzinfo=_zone(zone),
        )
    except ValueError as err:
        raise Rejected("bad_timestamp", f"timestamp {text[:64]!r}: {err}") from None
    return _moment_ms(moment, int((fraction or "0")[:3].ljust(3, "0")), text)


def _moment_ms(moment: dt.datetime, fraction_ms: int, shown: str) -> int:
    """A zoned moment (and ms beyond its microseconds) as epoch ms, within the log's dates."""
    delta = moment - _EPOCH
    ms = delta.days * DAY_MS + delta.seconds * 1000 + delta.microseconds // 1000 + fraction_ms
    if ms < 0:
        raise Rejected("negative_timestamp", f"timestamp {shown[:64]!r} is before 1970")
    if not EPOCH_FLOOR_MS <= ms < EPOCH_CEILING_MS:
        raise Rejected(
            "implausible_timestamp", f"timestamp {shown[:64]!r} is outside 2000-2100: no log's date"
        )
    return ms


def timestamp_kind(ms: int) -> str:
    return RELATIVE if ms < EPOCH_FLOOR_MS else EPOCH


def day_runs(day_counts: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """(requests, first day, last day) of each run of days (ms // DAY_MS) that no gap of more
    than MAX_GAP_DAYS splits, oldest first."""
    days = sorted(day_counts)
    runs: list[tuple[int, int, int]] = []
    first, requests = (days[0], 0) if days else (0, 0)
    for day, following in zip(days, [*days[1:], None]):
        requests += day_counts[day]
        if following is None or following - day > MAX_GAP_DAYS:
            runs.append((requests, first, day))
            first, requests = following, 0
    return runs


def widest_kept_gap_ms(granule_ms: int = 1) -> int:
    """The widest gap two rows this module's rule keeps together can have once published with
    times rounded (half up, from a zero) to granule_ms: raw, a pair of days no more than
    MAX_GAP_DAYS apart lies at most (MAX_GAP_DAYS + 1) days - 1 ms apart, and rounding both
    widens a gap to at most the next multiple of the granule. The audit refuses a wider one."""
    raw = (MAX_GAP_DAYS + 1) * DAY_MS - 1
    return -(-raw // granule_ms) * granule_ms


def plausible_days(day_counts: Mapping[int, int]) -> tuple[int, int]:
    """(first, last) day (ms // DAY_MS) of the bulk of an input's timestamps, from the count of
    its requests on each day: of the runs of days that no gap of more than MAX_GAP_DAYS splits,
    the one holding the most requests (the latest on a tie, as recent dates outlive resets).
    Decided from the counts alone, so any order or split of the input decides alike."""
    runs = day_runs(day_counts)
    if not runs:
        return 0, -1
    _, first, last = max(runs)
    return first, last


def anchored_days(anchor: Mapping[int, int], day_counts: Mapping[int, int]) -> tuple[int, int]:
    """(first, last) day of the run (as plausible_days cuts them) of anchor's and day_counts'
    days together that holds anchor's days: what was published already (a stream's rows) is
    never outvoted, so nothing beyond a gap of more than MAX_GAP_DAYS from it is ever published
    beside it. With no anchor: the bulk (plausible_days). anchor's days are one run, as the
    rows this rule let out are."""
    if not anchor:
        return plausible_days(day_counts)
    counts = {**day_counts, **{day: 1 for day in anchor}}
    day = min(anchor)
    _, first, last = next(run for run in day_runs(counts) if run[1] <= day <= run[2])
    return first, last


def _zone(zone: str | None) -> dt.timezone:
    """UTC when the string has no zone, so a run never depends on the worker's time zone."""
    if zone is None or zone.upper() == "Z" or zone == UTC_SUFFIX:
        return dt.timezone.utc
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError(f"zone {zone} out of range")
    return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
