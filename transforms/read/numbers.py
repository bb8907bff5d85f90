"""JSON numbers read exactly as their text wrote them, whatever form held them.

A float from a JSON line holds the binary fraction nearest its text, not the text: 1.001 is
1.000999999999999889..., so seconds times 1000 in binary floating point floor to 1000 ms where
the text (and the same time as a Parquet duration, or as `latency_ms: 1001`) says 1001.
floor_scaled scales the number the text wrote: a float's shortest repr, which is its JSON text
whenever that text had 17 significant digits or fewer (what every logger writes), times a power
of ten, exactly, in decimal.

A Parquet value is read as the JSON value of its text, decided by its Arrow type (json_reader):
a decimal (what SQL exports write for a number of fixed decimals) of scale 0 as an int, any
other as the float the JSON parser reads from its digits; a 32- or 16-bit float (Spark's
FloatType, pandas' float32) as the float its own shortest text writes (1.3, not the
1.2999999523162842 its widening holds); a date (date32, date64) as its ISO text; bytes not
annotated as text as the UTF-8 text they hold (a JSON string), or the row's failure where they
are not UTF-8. So a Parquet log reads as
the JSONL log of the same values.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

Reader = Callable[[Any], Any]
_BINARIES = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_binary_view,
    pa.types.is_fixed_size_binary,
)
_LISTS = (
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_fixed_size_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
)


def floor_scaled(value: int | float, exponent: int) -> int:
    """floor(value * 10**exponent) for the number value's text wrote; value finite."""
    if isinstance(value, int):
        return value * 10**exponent if exponent >= 0 else value // 10**-exponent
    # repr has 17 significant digits at most: within the context's 28, so scaleb is exact.
    return math.floor(decimal.Decimal(repr(value)).scaleb(exponent))


def json_reader(kind: pa.DataType) -> Reader | None:
    """How a value of Arrow type kind, as to_pylist gives it (maps as dicts), becomes the JSON
    value of its text, or None where it already is one; nested values too."""
    if pa.types.is_dictionary(kind):
        return json_reader(kind.value_type)
    if pa.types.is_decimal(kind):
        return _nullable(_decimal)
    if pa.types.is_date(kind):  # as JSON writes a date: "2025-11-21"
        return _nullable(lambda value: value.isoformat())
    if pa.types.is_float32(kind):
        return _nullable(lambda value: float(str(np.float32(value))))
    if pa.types.is_float16(kind):
        return _nullable(lambda value: float(str(np.float16(value))))
    if any(is_kind(kind) for is_kind in _BINARIES):
        return _nullable(lambda value: value.decode("utf-8"))  # UnicodeDecodeError: the row's
    if pa.types.is_map(kind):
        key = json_reader(kind.key_type) or _same
        item = json_reader(kind.item_type) or _same
        if key is _same and item is _same:
            return None
        return _nullable(lambda value: {key(k): item(v) for k, v in value.items()})
    if pa.types.is_struct(kind):
        return row_reader(pa.schema(list(kind)))
    if any(is_kind(kind) for is_kind in _LISTS):
        item = json_reader(kind.field(0).type)
        return None if item is None else _nullable(lambda value: [item(v) for v in value])
    return None


def row_reader(schema: pa.Schema) -> Reader | None:
    """json_reader for a row (a dict) of schema's columns, or a struct's fields."""
    readers = {
        field.name: reader for field in schema if (reader := json_reader(field.type)) is not None
    }
    if not readers:
        return None

    def read(row: Any) -> Any:
        if row is None:
            return None
        return {
            name: readers[name](value) if name in readers else value for name, value in row.items()
        }

    return read


def _decimal(value: decimal.Decimal) -> int | float:
    """scale 0 an int, else a float (float(Decimal) is correctly rounded from the decimal's
    digits, as a JSON parser's reading of them is)."""
    return int(value) if value.as_tuple().exponent == 0 else float(value)


def _nullable(read: Reader) -> Reader:
    return lambda value: None if value is None else read(value)


def _same(value: Any) -> Any:
    return value
