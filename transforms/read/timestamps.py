"""Request timestamps in the shapes logs carry them, as integer epoch (or log-relative) ms, and
the kind of timestamp (epoch dates or relative times) a whole input holds.

Numbers: the unit is detected from magnitude unless given. Epoch values of any plausible date
(2001 to 5138) fall in disjoint ranges per unit: seconds in [1e9, 1e11), ms in [1e11, 1e14), us
in [1e14, 1e17), ns from 1e17. Smaller values are relative ms (a replay log's offsets, up to 11
days). Strings: ISO-8601, parsed by one regular expression rather than datetime.fromisoformat,
whose accepted forms change between Python versions (3.11 added "Z" and more).
"""

from __future__ import annotations

import datetime as dt
import math
import re

from transforms.errors import Rejected

UNIT_MS = {"s": 1000, "ms": 1, "us": 1e-3, "ns": 1e-6}
TIMESTAMP_UNITS = ("auto", *UNIT_MS)
# Lower bounds of each unit's range of epoch values (see the module docstring).
_EPOCH_UNIT_FLOORS = ((1e17, "ns"), (1e14, "us"), (1e11, "ms"), (1e9, "s"))
# The calendar range of a request log's dates: 2000-01-01 to 2100-01-01 (ms). Later values are
# no log's (a unit read wrong, an int64 overflow, a time-zone shift past year 9999) and would put
# a row centuries after the rest; numbers below the floor are relative times (a replay log's
# offsets), never epoch dates.
EPOCH_FLOOR_MS = 946_684_800_000
EPOCH_CEILING_MS = 4_102_444_800_000
RELATIVE, EPOCH = "relative", "epoch"
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?)?"
    r"(Z|[+-]\d{2}:?\d{2})?",
    re.IGNORECASE,
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
    raise Rejected("wrong_type", f"timestamp is a {type(value).__name__}, not a number or string")


def _number_ms(value: int | float, unit: str) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise Rejected("bad_timestamp", f"timestamp {value!r} is not finite")
    if value < 0:
        raise Rejected("negative_timestamp", f"timestamp {value!r} is negative")
    if unit == "auto":
        unit = detect_unit(value)
    # Compare before converting: a huge value times 1000 would overflow a float or int64.
    if value >= EPOCH_CEILING_MS / UNIT_MS[unit]:
        raise Rejected("implausible_timestamp",
                       f"timestamp {str(value)[:32]} ({unit}) is after 2100: no log's date")
    if isinstance(value, int):
        scale = UNIT_MS[unit]
        return value * scale if scale >= 1 else value // round(1 / scale)
    return math.floor(value * UNIT_MS[unit])


def _iso_ms(text: str) -> int:
    match = _ISO.fullmatch(text.strip())
    if not match:
        raise Rejected("bad_timestamp", f"timestamp {text[:64]!r} is not ISO-8601")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                             int(second or 0), tzinfo=_zone(zone))
    except ValueError as err:
        raise Rejected("bad_timestamp", f"timestamp {text[:64]!r}: {err}") from None
    delta = moment - _EPOCH
    ms = delta.days * 86_400_000 + delta.seconds * 1000 + int((fraction or "0")[:3].ljust(3, "0"))
    if ms < 0:
        raise Rejected("negative_timestamp", f"timestamp {text[:64]!r} is before 1970")
    if not EPOCH_FLOOR_MS <= ms < EPOCH_CEILING_MS:
        raise Rejected("implausible_timestamp",
                       f"timestamp {text[:64]!r} is outside 2000-2100: no log's date")
    return ms


def input_kind(relative: int, epoch: int) -> str:
    """The kind of timestamp an input holds, decided by the majority of its records (epoch on a
    tie): the records of the other kind are dead letters, so that one relative time among epoch
    dates (or the reverse) never becomes the origin and shifts every other row by decades."""
    return RELATIVE if relative > epoch else EPOCH


def _zone(zone: str | None) -> dt.timezone:
    """UTC when the string has no zone, so a run never depends on the worker's time zone."""
    if zone is None or zone.upper() == "Z":
        return dt.timezone.utc
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"zone {zone} out of range")
    return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
