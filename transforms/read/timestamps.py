"""Request timestamps in the shapes logs carry them, as integer epoch (or log-relative) ms."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from transforms.errors import Rejected


def timestamp_ms(value: object, unit_ms: float) -> int:
    """A number in units of unit_ms ms, an ISO-8601 string or a datetime, floored to whole ms.

    Naive ISO strings and datetimes are taken as UTC, so a run never depends on the worker's zone.
    """
    if isinstance(value, bool):
        raise Rejected("wrong_type", "timestamp is a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise Rejected("bad_timestamp", f"timestamp {value!r} is not finite")
        return math.floor(value * unit_ms)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise Rejected("bad_timestamp", f"timestamp {value[:64]!r} is not ISO-8601") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    raise Rejected("wrong_type", f"timestamp is a {type(value).__name__}, not a number or string")
