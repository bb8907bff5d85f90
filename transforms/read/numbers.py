"""JSON numbers read exactly as their text wrote them, whatever form held them.

A float from a JSON line holds the binary fraction nearest its text, not the text: 1.001 is
1.000999999999999889..., so seconds times 1000 in binary floating point floor to 1000 ms where
the text (and the same time as a Parquet duration, or as `latency_ms: 1001`) says 1001.
floor_scaled scales the number the text wrote: a float's shortest repr, which is its JSON text
whenever that text had 17 significant digits or fewer (what every logger writes), times a power
of ten, exactly, in decimal.

A Parquet decimal (what SQL exports write for a number of fixed decimals) is read as the JSON
value of its text (json_value): one of scale 0 as an int, any other as the float the JSON
parser reads from its digits, so a Parquet log reads as the JSONL log of the same numbers.
"""

from __future__ import annotations

import decimal
import math
from typing import Any


def floor_scaled(value: int | float, exponent: int) -> int:
    """floor(value * 10**exponent) for the number value's text wrote; value finite."""
    if isinstance(value, int):
        return value * 10**exponent if exponent >= 0 else value // 10**-exponent
    # repr has 17 significant digits at most: within the context's 28, so scaleb is exact.
    return math.floor(decimal.Decimal(repr(value)).scaleb(exponent))


def json_value(value: Any) -> Any:
    """A Parquet row's value with every decimal in it (nested ones too) as the JSON value of
    its text: scale 0 an int, else a float (float(Decimal) is correctly rounded from the
    decimal's digits, as a JSON parser's reading of them is)."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value.as_tuple().exponent == 0 else float(value)
    if isinstance(value, dict):
        return {name: json_value(item) for name, item in value.items()}
    if isinstance(value, list):
        return [json_value(item) for item in value]
    return value
