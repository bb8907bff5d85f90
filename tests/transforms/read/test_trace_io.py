"""trace_io's streamed reader: pyarrow sees only blocks of whole lines each within the line
reader's pre-parse rule, is asked for the trace fields only, and reads every row it keeps as the
line reader would."""

from __future__ import annotations

import io
import json
import re
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvtrace.transforms.read import trace_io
from kvtrace.transforms.read.json_tree import containers_over
from kvtrace.transforms.read.trace_io import (
    _READ_SCHEMAS,
    MAX_ROW_CONTAINERS,
    READ_FIELDS,
    _digit_run_over,
    _lines_within_rule,
    _parsed_block,
    _read_jsonl_lines,
    _read_jsonl_streamed,
    _screened_blocks,
    _Tally,
    read_trace,
)

# Bytes as JSON's structure: brackets, quotes, escapes, newlines (and a letter).
SYNTAX = bytes(b'[]{}"\\\na'[i % 8] for i in range(256))
ROW = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]'


def _nested(depth: int) -> str:
    return f'{ROW}, "junk": {"[" * depth}{"]" * depth}}}\n'


def _blocks(data: bytes) -> list[bytes | None]:
    return list(_screened_blocks(_Tally(io.BytesIO(data), hashed=False)))


def test_a_line_nested_past_a_row_never_reaches_pyarrow(tmp_path):
    """20,000 levels (a 40 KB line) overflowed pyarrow's native stack: the process died of
    SIGSEGV. The block holding it is refused before pyarrow sees it, and the line reader
    reports the line by its number, the rows around it kept."""
    data = (ROW + "}\n" + _nested(20_000) + ROW + "}\n").encode()
    assert _blocks(data) == [None]
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    trace = read_trace([str(path)])
    assert list(trace.line) == [1, 3] and [m["line"] for m in trace.malformed] == [2]
    assert trace.malformed[0]["error"].startswith(
        f"20002 JSON objects and lists, over the {MAX_ROW_CONTAINERS} a trace row holds"
    )


def test_a_nested_line_costs_time_linear_in_its_bytes(tmp_path):
    """5,000 levels (10 KB) took pyarrow 13 s, quadratic in the depth; refused unparsed, a
    nested line costs its bytes: 20 such lines in well under a second."""
    path = tmp_path / "t.jsonl"
    path.write_text(_nested(5_000) * 20)
    start = time.process_time()
    trace = read_trace([str(path)])
    assert time.process_time() - start < 1.0
    assert len(trace) == 0 and trace.malformed_count == 20


@given(st.binary().map(lambda b: b.translate(SYNTAX)))
def test_a_block_is_screened_as_containers_over_screens_each_of_its_lines(block):
    """The block-wide count hands containers_over every line it could refuse: the rule is
    the line reader's, line for line."""
    assert _lines_within_rule(block) == all(
        containers_over(line, MAX_ROW_CONTAINERS) is None for line in block.split(b"\n")
    )


def test_blocks_hold_whole_lines_and_a_line_longer_than_a_block_is_refused(monkeypatch):
    monkeypatch.setattr(trace_io, "READ_BLOCK_BYTES", 8)
    assert _blocks(b'{"a":1}\n{"b":22}\n{"c":3}') == [b'{"a":1}\n', b'{"b":22}\n', b'{"c":3}']
    assert _blocks(b'{"a":1}\n{"long":"123456789"}\n') == [b'{"a":1}\n', None]


def test_a_file_of_no_rows_is_read_line_by_line_as_one_empty_part(tmp_path):
    """As before blocks: a published shard of no rows is still counted (0 rows) against its
    manifest."""
    assert _read_jsonl_streamed(io.BytesIO(b""), "t.jsonl") is None
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"")
    assert len(read_trace([str(path)])) == 0


def test_extra_fields_never_become_columns():
    """A row of 20,000 extra fields (a 220 KB line) was 20,000 columns built by pyarrow before
    the trace fields were picked; now they are skipped as they are parsed."""
    extra = ", ".join(f'"k{i}": [{i}]' for i in range(20_000))
    block = f"{ROW}, {extra}}}\n".encode() * 3
    table = _parsed_block(block, list(_READ_SCHEMAS))
    assert table.column_names == ["timestamp", "input_length", "output_length", "hash_ids"]
    assert table.num_rows == 3 and set(table.column_names) <= set(READ_FIELDS)


@pytest.mark.parametrize(
    "sessions, kind",
    [([7, 8], pa.int64()), (["a", "b"], pa.string()), (["a", 8], None)],
    ids=["numbers", "names", "mixed"],
)
def test_sessions_are_read_as_numbers_or_as_names_never_as_both(sessions, kind):
    block = "".join(f'{ROW}, "session": {json.dumps(s)}}}\n' for s in sessions).encode()
    table = _parsed_block(block, list(_READ_SCHEMAS))
    assert (table["session"].type if table is not None else None) == kind


@pytest.mark.parametrize(
    "line, names",
    [
        ('{"input_length": 4}', {"input_length"}),
        ('{"input_length": 4, "output_length": null}', {"input_length", "output_length"}),
        ('{"input_length": 4, "output_length" :null}', {"input_length", "output_length"}),
        ('{"input_length": 4, "note": "session"}', {"input_length"}),
        ('{"input_length": 4, "output\\u005flength": null}', None),
    ],
    ids=["absent", "null", "spaced", "a value", "escaped"],
)
def test_a_field_no_row_names_is_no_column_and_a_null_one_is(line, names):
    """pyarrow gives every field of the schema a column; an absent field is not a null one
    (output_length: 0, or malformed), so a block keeps the columns its rows name."""
    table = _parsed_block(line.encode() + b"\n", list(_READ_SCHEMAS))
    assert (set(table.column_names) if table is not None else None) == names


def _as_rows(parts: list[dict]) -> tuple[list[tuple], bool]:
    rows = []
    for part in parts:
        offsets, session = part["offsets"], part["session"]
        for r in range(len(part["input_length"])):
            rows.append(
                (
                    float(part["timestamp"][r]),
                    int(part["input_length"][r]),
                    int(part["output_length"][r]),
                    [int(i) for i in part["ids"][offsets[r] : offsets[r + 1]]],
                    None if session is None else session[r],
                    int(part["response_ms"][r]),
                    int(part["line"][r]),
                )
            )
    return rows, any(part["session"] is not None for part in parts)


def _maybe(value: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(value, value, value, st.none())  # null in a quarter of rows


def _rows(session: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {"input_length": st.integers(0, 9)},
        optional={
            "timestamp": _maybe(st.one_of(st.integers(0, 9), st.sampled_from([0.5, 2.25]))),
            "output_length": _maybe(st.integers(0, 9)),
            "hash_ids": _maybe(st.lists(st.integers(0, 9), max_size=3)),
            "response_ms": _maybe(st.integers(0, 9)),
            "session": _maybe(session),
            "session_id": _maybe(session),
            "note": st.sampled_from(["session", "output_length", "[x]"]),
            'x"session': st.just(1),  # a key that, escaped, holds "session":
        },
    )


# A file's sessions numbers, names (one escaped as JSON writes it), or a mix of both.
ROWS = st.sampled_from(
    [
        st.integers(0, 3),
        st.sampled_from(["a", "\u00e9"]),
        st.one_of(st.integers(0, 3), st.just("a")),
    ]
).flatmap(_rows)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(ROWS, st.booleans()), min_size=1, max_size=6),
    block_bytes=st.sampled_from([16, 128, 1 << 20]),
)
def test_a_file_the_streamed_reader_reads_is_read_alike_line_by_line(
    tmp_path, monkeypatch, rows, block_bytes
):
    """Any mix of absent, null, mistyped and escaped fields and sessions, in blocks of any
    size: what the streamed reader reads, the line reader reads alike, no line malformed."""
    monkeypatch.setattr(trace_io, "READ_BLOCK_BYTES", block_bytes)
    lines = [
        json.dumps(row).replace('"output_length"', '"output\\u005flength"')
        if escaped
        else json.dumps(row)
        for row, escaped in rows
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with open(path, "rb") as stream:
        streamed = _read_jsonl_streamed(stream, str(path))
    event("streamed" if streamed is not None else "line by line")
    if streamed is not None:
        by_line = _read_jsonl_lines(str(path))
        assert not by_line["malformed"]
        assert _as_rows(streamed) == _as_rows([by_line])


@given(
    st.binary().map(lambda b: b.translate(bytes(b"0123456789a"[i % 11] for i in range(256)))),
    st.integers(3, 40),
)
def test_a_digit_run_over_the_limit_is_found_wherever_it_lies(data, limit):
    """The chunked scan finds exactly the runs a plain scan finds, at any limit and offset."""
    longest = max((len(run) for run in re.findall(rb"[0-9]+", data)), default=0)
    assert _digit_run_over(np.frombuffer(data, np.uint8), limit) == (longest > limit)


# Bytes json.loads refuses and pyarrow's JSON parser skips in a field it is not asked for.
ODD = [
    b'"note": "caf\xe9"',
    b'"note": "\xc0\x80"',
    b'"note": "\xed\xa0\x80"',
    b'"n": ' + b"9" * 5000,
]


@pytest.mark.parametrize("odd", ODD, ids=["latin1", "overlong", "surrogate", "long-int"])
def test_a_line_json_loads_refuses_is_read_line_by_line_and_decided_there(tmp_path, odd):
    """pyarrow skips an unread field's bytes unchecked: a block holding invalid UTF-8 or an
    integer past Python's digit limit is never read by it, so the line reader decides that
    line, the rows beside it kept by both readers alike."""
    line = ROW.encode() + b", " + odd + b"}\n"
    data = (ROW + "}\n").encode() + line + (ROW + "}\n").encode()
    assert _blocks(data) == [None]
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    trace = read_trace([str(path)])
    try:
        json.loads(line)
        kept = [1, 2, 3]
    except ValueError:
        kept = [1, 3]
    assert list(trace.line) == kept and trace.malformed_count == 3 - len(kept)


def test_the_digit_limit_is_pythons_as_set(tmp_path):
    """An integer is refused past the limit Python holds now (sys.set_int_max_str_digits), not
    a copy of its default."""
    line = (ROW + ', "n": ' + "9" * 1000 + "}\n").encode()
    assert _blocks(line) == [line]
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(999)
    try:
        assert _blocks(line) == [None]
    finally:
        sys.set_int_max_str_digits(previous)


def test_a_session_of_invalid_utf8_is_one_malformed_line(tmp_path):
    """pyarrow kept the bytes as a string and converting them raised UnicodeDecodeError: the
    whole trace was refused. Now the line reader reports that line, the others kept."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        (ROW + ', "session_id": "s"}\n').encode() + ROW.encode() + b', "session_id": "\xe9"}\n'
    )
    trace = read_trace([str(path)])
    assert list(trace.session) == ["s"] and trace.malformed_count == 1
    assert trace.malformed[0]["line"] == 2
    assert trace.malformed[0]["error"].startswith("not JSON ('utf-8' codec can't decode")


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.binary(max_size=12).map(
            lambda b: b.replace(b'"', b"").replace(b"\\", b"").replace(b"\n", b"")
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_bytes_in_an_unread_field_are_read_as_the_line_reader_reads_them(tmp_path, notes):
    """Whatever bytes an unread string holds: a file the streamed reader reads, the line reader
    reads alike, no line malformed."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(ROW.encode() + b', "note": "' + note + b'"}\n' for note in notes))
    with open(path, "rb") as stream:
        streamed = _read_jsonl_streamed(stream, str(path))
    event("streamed" if streamed is not None else "line by line")
    if streamed is not None:
        by_line = _read_jsonl_lines(str(path))
        assert not by_line["malformed"]
        assert _as_rows(streamed) == _as_rows([by_line])
