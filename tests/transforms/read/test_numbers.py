"""JSON numbers read as their text wrote them: scaled by a power of ten exactly, and a Parquet
value as the JSON value of its text: a decimal of its digits, a narrow float of its shortest
text, bytes of their UTF-8."""

from __future__ import annotations

import decimal
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.transforms.read.numbers import floor_scaled, json_reader, row_reader
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
    converted = json_reader(column.type)(row)
    assert converted == read
    assert type(converted["n"]) is type(read["n"]) is type(converted["l"][0])


@given(
    st.one_of(
        st.floats(width=32, allow_nan=False, allow_infinity=False).map(np.float32),
        st.floats(width=16, allow_nan=False, allow_infinity=False).map(np.float16),
    )
)
def test_a_narrow_float_is_the_json_value_of_its_shortest_text(narrow):
    """Nested too, and a dictionary's entries: the float its own width's shortest text writes
    (1.3 in 32 bits reads 1.3, not 1.2999999523162842), what the JSON parser reads from it."""
    kind = pa.float32() if isinstance(narrow, np.float32) else pa.float16()
    column = pa.array(
        [{"n": narrow, "l": [narrow]}], pa.struct([("n", kind), ("l", pa.list_(kind))])
    )
    text = str(narrow)  # its shortest text: 90526352 in 32 bits writes 90526350.0
    read, _ = load_json_line(f'{{"n": {text}, "l": [{text}]}}'.encode())
    assert json_reader(column.type)(column.to_pylist()[0]) == read
    assert json_reader(pa.dictionary(pa.int8(), kind))(float(narrow)) == read["n"]


def test_a_float32_latency_reads_as_the_text_written():
    values = pa.array([1.3, 0.7, 2.3, None], pa.float32()).to_pylist()
    assert [json_reader(pa.float32())(v) for v in values] == [1.3, 0.7, 2.3, None]


def test_bytes_read_as_their_utf8_text_and_a_map_as_its_object():
    kind = pa.map_(pa.binary(), pa.list_(pa.large_binary()))
    read = row_reader(pa.schema([("m", kind), ("s", pa.string()), ("f", pa.float64())]))
    row = {"m": {b"k": [b"caf\xc3\xa9", None]}, "s": "x", "f": 0.1}
    assert read(row) == {"m": {"k": ["café", None]}, "s": "x", "f": 0.1}
    with pytest.raises(UnicodeDecodeError):
        json_reader(pa.binary())(b"\xff")


def test_values_already_json_need_no_reader():
    plain = pa.struct([("s", pa.string()), ("l", pa.list_(pa.float64())), ("i", pa.int64())])
    assert json_reader(plain) is None and json_reader(pa.map_(pa.string(), pa.int32())) is None
