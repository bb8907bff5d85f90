"""Fuzz harness for the trace readers: every trace command (validate, analyze, simulate, report,
synthesize, audit) on JSONL and Parquet traces of hostile rows (slow: a fixed budget in CI). Invariant: an exit code and at
most one error line, never a traceback; malformed rows counted, good ones kept; nothing sized
by a value from the file (a timestamp of 1e18 must not ask for petabytes)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.transforms.read.trace_io import HIGHEST, read_trace

GOOD = [
    {"timestamp": 1000 * i, "input_length": 40, "output_length": 3, "hash_ids": [0, 1, i + 2]}
    for i in range(6)
]


@pytest.mark.parametrize("value, reason", [(-5, "input_length"), (10**18, "timestamp")])
def test_parquet_values_out_of_range_are_malformed_as_in_jsonl(tmp_path, value, reason):
    field = "timestamp" if reason == "timestamp" else "input_length"
    rows = [dict(GOOD[0]), dict(GOOD[1], **{field: value})]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("t.parquet", "t.jsonl"):
        trace = read_trace([str(tmp_path / name)])
        assert (len(trace), trace.malformed_count) == (1, 1), name
        assert reason in trace.malformed[0]["error"]


BOUNDS = [(name, -high if name == "timestamp" else 0, high) for name, high in HIGHEST.items()]
INT64_MAX = (1 << 63) - 1


@pytest.mark.parametrize("field, low, high", BOUNDS)
def test_each_field_is_read_within_the_published_bounds_only(tmp_path, field, low, high):
    """Values kvtrace could not have written (trace_format's bounds) are malformed rows, in JSONL
    and Parquet alike; the bounds themselves are read."""
    values = [low, high, low - 1, high + 1]
    rows = [dict(GOOD[0], **{field: [v] if field == "hash_ids" else v}) for v in values]
    names = ["t.jsonl"]
    if high < INT64_MAX:  # a Parquet int64 column cannot hold 2^63: JSONL alone can say it
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
        names.append("t.parquet")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in names:
        trace = read_trace([str(tmp_path / name)])
        assert trace.line.tolist() == [1, 2], name
        assert [m["line"] for m in trace.malformed] == [3, 4], name
        assert all(m["error"].startswith(f"{field} is not") for m in trace.malformed), name


@pytest.mark.parametrize(
    "column",
    [
        pa.array([10**12] * 3, pa.timestamp("s")),  # past year 9999: Python has no such date
        pa.array([0] * 3, pa.date32()),
        pa.array([0] * 3, pa.decimal128(5, 0)),
        pa.array([0] * 3, pa.duration("ms")),
    ],
)
@pytest.mark.parametrize("field", ["timestamp", "input_length", "hash_ids", "session"])
def test_a_parquet_column_of_a_type_no_field_holds_is_malformed_rows(tmp_path, column, field):
    """Such a column is never converted to Python: its rows are malformed, saying which field;
    an unread column of the same type beside a good trace changes nothing."""
    table = pa.Table.from_pylist(GOOD[:3])
    good = table.append_column("extra", column)
    table = (
        table.set_column(table.schema.get_field_index(field), field, column)
        if field in table.schema.names
        else table.append_column(field, column)
    )
    pq.write_table(table, tmp_path / "bad.parquet")
    pq.write_table(good, tmp_path / "good.parquet")
    trace = read_trace([str(tmp_path / "bad.parquet")])
    assert len(trace) == 0 and trace.malformed_count == 3
    assert all(field in m["error"] for m in trace.malformed)
    assert len(read_trace([str(tmp_path / "good.parquet")])) == 3


def test_large_lists_and_strings_as_other_writers_use_are_read(tmp_path):
    table = pa.table(
        {
            "timestamp": [0, 1],
            "input_length": [40, 40],
            "hash_ids": pa.array([[0, 1], [0, 2]], pa.large_list(pa.int64())),
            "session_id": pa.array(["a", "b"], pa.large_string()),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    trace = read_trace([str(tmp_path / "t.parquet")])
    assert (len(trace), trace.session.tolist(), trace.ids.tolist()) == (2, ["a", "b"], [0, 1, 0, 2])


def test_nan_among_parquet_times_is_a_malformed_row(tmp_path):
    rows = [dict(GOOD[0], timestamp=0.5), dict(GOOD[1], timestamp=float("nan"))]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    trace = read_trace([str(tmp_path / "t.parquet")])
    assert trace.timestamp.tolist() == [0.5] and trace.malformed[0]["line"] == 2


def test_a_parquet_trace_without_an_input_length_column_is_refused_whole_unread(tmp_path):
    """Each of its rows would lack the one field a row needs: the file is one malformed entry
    saying so, its rows never read (a footer may claim any number of them)."""
    pq.write_table(pa.table({"note": ["x", "y"]}), tmp_path / "t.parquet")
    trace = read_trace([str(tmp_path / "t.parquet")])
    assert (len(trace), trace.malformed_count) == (0, 1)
    assert trace.malformed[0]["line"] == 0
    assert "no input_length column" in trace.malformed[0]["error"]
