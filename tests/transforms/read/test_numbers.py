"""JSON numbers read as their text wrote them: scaled by a power of ten exactly, and a Parquet
decimal as the JSON value of its digits."""

from __future__ import annotations

import decimal
import json
import math

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.read.numbers import floor_scaled, json_value
from kvtrace.transforms.read.records import load_json_line

# Numbers as loggers write them: up to 15 significant digits, at most 9 after the point.
texts = st.builds(
    lambda digits, point: (
        f"{digits[:-point].lstrip('0') or '0'}.{digits[-point:]}" if point else str(int(digits))
    ),
    st.integers(1, 10**15 - 1).map(lambda n: str(n).rjust(10, "0")),
    st.integers(0, 9),
)


def test_seconds_written_to_the_ms_read_as_those_ms():
    assert 1.001 * 1000 < 1001  # the binary fraction json.loads holds
    assert floor_scaled(1.001, 3) == 1001
    assert floor_scaled(1_763_703_600.123, 3) == 1_763_703_600_123
    assert floor_scaled(1_763_703_600_123_999_999, -6) == 1_763_703_600_123  # int ns, floored
    assert floor_scaled(2.5e-4, 3) == 0 and floor_scaled(7, 3) == 7000


@given(texts, st.integers(-6, 3))
def test_a_json_number_scales_as_its_text(text, exponent):
    value = json.loads(text)
    assert floor_scaled(value, exponent) == math.floor(decimal.Decimal(text).scaleb(exponent))


@given(st.integers(-(10**18), 10**18), st.integers(1, 38).flatmap(lambda p: st.tuples(
    st.just(p), st.integers(-4, p))))  # fmt: skip
def test_a_parquet_decimal_is_the_json_value_of_its_text(unscaled, precision_scale):
    """One rule: a decimal of scale 0 an int, any other the float the JSON parser reads from
    its text (exponent notation too, for a negative scale), nested or not."""
    precision, scale = precision_scale
    digits = abs(unscaled) % 10**precision  # 18 digits at most: no context rounds them
    number = decimal.Decimal(digits if unscaled >= 0 else -digits).scaleb(-scale)
    kind = pa.decimal128(precision, scale)
    column = pa.array(
        [{"n": number, "l": [number]}], pa.struct([("n", kind), ("l", pa.list_(kind))])
    )
    [row] = column.to_pylist()
    text = str(row["n"])
    read, _ = load_json_line(f'{{"n": {text}, "l": [{text}]}}'.encode())
    converted = json_value(row)
    assert converted == read
    assert type(converted["n"]) is type(read["n"]) is type(converted["l"][0])
