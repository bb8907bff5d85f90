"""kvtrace audit: a real output folder is publishable; doctored ones are flagged; the
granularity options coarsen what is published.

The unit tests; the whole CLI runs are in tests/e2e/test_audit_cli.py."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


ROW = st.fixed_dictionaries(
    {},
    optional={
        "timestamp": JSON,
        "input_length": JSON,
        "output_length": JSON,
        "hash_ids": JSON,
        "session": JSON,
        "extra": JSON,
    },
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(ROW, JSON), max_size=8))
def test_hostile_rows_get_a_report_never_an_exception(rows):
    import tempfile
    from pathlib import Path

    from kvtrace.transforms.stats.audit import audit as measure

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace-00000-of-00001.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        report = measure(str(path))
    assert report["rows"] <= len(rows)
    assert report["publishable"] == (not report["flags"])
    assert report["publishable"] <= (report["rows"] == len(rows) > 0)


def test_largest_integers_name_only_fields_some_row_holds():
    """An absent session or response time is -1 in the columns: never a field's largest value
    (the report said "response_ms 1" of a trace with no response time)."""
    import numpy as np

    from kvtrace.transforms.stats.audit import _Rows
    from kvtrace.transforms.trace_format import NO_RESPONSE_MS, NO_SESSION, TraceColumns

    def rows(response_ms: list[int]) -> TraceColumns:
        n = len(response_ms)
        return TraceColumns(
            np.arange(n),
            np.full(n, 4),
            np.full(n, 2),
            np.full(n, 1),
            np.arange(n),
            np.full(n, NO_SESSION),
            np.array(response_ms),
        )

    seen = _Rows()
    seen.add(rows([NO_RESPONSE_MS] * 3), None)
    assert seen.largest == {"timestamp": 2, "input_length": 4, "output_length": 2, "hash_ids": 2}
    seen.add(rows([NO_RESPONSE_MS, 7]), None)
    assert seen.largest["response_ms"] == 7 and "session" not in seen.largest
