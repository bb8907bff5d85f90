"""trace_io's line-by-line reading keeps a row's trace fields, never the rest of the row."""

from __future__ import annotations

import json
import tracemalloc

from kvtrace.transforms.read.trace_io import _columns_from_rows


def test_rows_read_one_by_one_keep_only_their_trace_fields():
    """Each row may carry any other field (here 50,000 empty lists, ~3 MB of Python objects):
    memory follows one row's parse, not the file's rows."""
    junk = json.dumps([[]] * 50_000)
    lines = (
        (
            number,
            (
                f'{{"timestamp": {number}, "input_length": 4, "output_length": 1, '
                f'"hash_ids": [{number}], "session_id": "s", "junk": {junk}}}'
            ).encode(),
        )
        for number in range(1, 11)
    )
    tracemalloc.start()
    columns = _columns_from_rows(lines, "trace.jsonl")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert columns["ids"] == list(range(1, 11)) and columns["line"] == list(range(1, 11))
    assert list(columns["session"]) == ["s"] * 10 and not columns["malformed"]
    one_row = 64 * 50_000  # an empty list and its slot, per item of junk
    assert peak < 3 * one_row, peak  # all ten rows kept whole: ~10 x
