"""A stream's cumulative.json, declared in trace_format.py and audited with the stream's folder:
only the figures the windows' rows prove, in the bytes the streaming driver writes; anything
else flagged, in one line, and the stream refused.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_stream_totals_cli.py."""

from __future__ import annotations

import pytest

from kvtrace.transforms.trace_format import (
    MANIFEST_SCHEMA,
    STREAM_TOTALS_SCHEMA,
    schema_problems,
    window_index,
    window_name,
)

MINUTE = 60_000


def test_the_schema_is_closed_and_takes_what_the_driver_writes():
    good = {
        "windows": 1,
        "rows": 6,
        "unique_blocks": 9,
        "sessions": 2,
        "window_ms": MINUTE,
        "published_until_ms": 0,
    }
    assert schema_problems(good, STREAM_TOTALS_SCHEMA) == []
    assert schema_problems({**good, "published_until_ms": None}, STREAM_TOTALS_SCHEMA) == []
    for bad in (
        {**good, "rejected": 0},
        {**good, "rows": -1},
        {**good, "rows": 2**40},
        {**good, "sessions": True},
        {**good, "window_ms": 0},
        {k: v for k, v in good.items() if k != "windows"},
    ):
        assert schema_problems(bad, STREAM_TOTALS_SCHEMA), bad


def test_window_names_round_trip_and_nothing_else_is_a_window():
    for index in (0, 7, 999_999, 1_000_000, 12_345_678):
        assert window_index(window_name(index)) == index
    for name in (
        "window-00001",
        "window-~000001",
        "window-1000000",
        "window-000001 ",
        "window-\u0660\u0660\u0660\u0660\u0660\u0660",
        "window--00001",
    ):
        assert window_index(name) is None, name


@pytest.mark.parametrize(
    "document, schema",
    [({"\n": 0.0}, STREAM_TOTALS_SCHEMA), ({"sha256": {"a\nb": "x"}}, MANIFEST_SCHEMA)],
)
def test_a_key_with_a_line_break_is_named_on_one_line(document, schema):
    """Found by the fuzz above: a problem's place named the document's own key as it was."""
    problems = schema_problems(document, schema)
    assert problems and all("\n" not in problem for problem in problems), problems
