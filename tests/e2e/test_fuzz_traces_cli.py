"""Fuzz harness for the trace readers: every trace command (validate, analyze, simulate, report,
synthesize, audit) on JSONL and Parquet traces of hostile rows (slow: a fixed budget in CI). Invariant: an exit code and at
most one error line, never a traceback; malformed rows counted, good ones kept; nothing sized
by a value from the file (a timestamp of 1e18 must not ask for petabytes).

The whole CLI runs; the unit tests are in tests/transforms/read/test_fuzz_traces.py."""

from __future__ import annotations

import contextlib
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.cli import main
from kvtrace.transforms.read.trace_io import MAX_READ_TIMESTAMP_MS, read_trace

GOOD = [
    {"timestamp": 1000 * i, "input_length": 40, "output_length": 3, "hash_ids": [0, 1, i + 2]}
    for i in range(6)
]


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=4),
    st.lists(st.integers(-(2**65), 2**65), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([10**18, -(10**18), 2**63, 2**64 - 1, 1e308, float("nan")]),
)


FIELDS = ["timestamp", "input_length", "output_length", "hash_ids", "session"]


ROWS = st.lists(
    st.tuples(st.integers(0, len(GOOD) - 1), st.sampled_from(FIELDS), HOSTILE), max_size=4
)


COMMANDS = [
    ["validate"],
    ["analyze"],
    ["simulate", "--capacity", "1K"],
    ["synthesize", "-o"],
    ["audit"],
    ["report", "-o"],
]


def _hostile_rows(changes) -> list[dict]:
    rows = [dict(row) for row in GOOD]
    for index, name, value in changes:
        rows[index][name] = value
    return rows


def _run(args: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(args)
    return code, err.getvalue()


def _check_every_command(path, folder) -> None:
    for command in COMMANDS:
        args = [command[0], str(path), *command[1:]]
        if args[-1] == "-o":
            args.append(str(folder / f"{command[0]}.out"))
        code, err = _run(args + ["--block-size", "16"] if command[0] not in ("audit",) else args)
        assert code in (0, 1, 2), (command, code)
        assert "Traceback" not in err, (command, err)
        errors = [line for line in err.splitlines() if line.startswith("error")]
        assert len(errors) <= 1, (command, err)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(ROWS)
def test_any_jsonl_trace_gets_an_answer_from_every_command(tmp_path_factory, changes):
    folder = tmp_path_factory.mktemp("jsonl")
    path = folder / "trace.jsonl"
    rows = _hostile_rows(changes)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = read_trace([str(path)])
    assert len(trace) + trace.malformed_count == len(rows)
    untouched = len(GOOD) - len({index for index, _, _ in changes})
    assert len(trace) >= untouched
    _check_every_command(path, folder)


def _parquet_table(changes) -> pa.Table | None:
    rows = _hostile_rows(changes)
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None  # not representable in Parquet: nothing to read


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(ROWS)
def test_any_parquet_trace_gets_the_checks_a_jsonl_one_gets(tmp_path_factory, changes):
    table = _parquet_table(changes)
    if table is None:
        return
    folder = tmp_path_factory.mktemp("parquet")
    path = folder / "trace.parquet"
    try:
        pq.write_table(table, path)
    except pa.ArrowException:  # Arrow holds it, Parquet cannot (a struct of no fields)
        return
    trace = read_trace([str(path)])
    assert len(trace) + trace.malformed_count == table.num_rows
    assert (trace.input_length >= 0).all() and (trace.output_length >= 0).all()
    assert (abs(trace.timestamp) <= MAX_READ_TIMESTAMP_MS).all()
    _check_every_command(path, folder)
