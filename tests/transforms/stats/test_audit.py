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
