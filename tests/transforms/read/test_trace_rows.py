"""trace_io's line-by-line reading keeps a row's trace fields, never the rest of the row, and
parses no line holding more containers than a row does, on either of its paths."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from kvtrace.transforms.read.trace_io import MAX_ROW_CONTAINERS, _columns_from_rows, read_trace


def _lines(extra: str) -> list[tuple[int, bytes]]:
    return [
        (
            number,
            (
                f'{{"timestamp": {number}, "input_length": 4, "output_length": 1, '
                f'"hash_ids": [{number}], "session_id": "s", "junk": {extra}}}'
            ).encode(),
        )
        for number in range(1, 11)
    ]


def test_rows_read_one_by_one_keep_only_their_trace_fields():
    """Each row may carry any other field of a row's kinds (here a 1 MB name): memory follows
    one row's parse, not the file's rows."""
    junk = json.dumps("x" * 1_000_000)
    lines = _lines(junk)
    tracemalloc.start()
    columns = _columns_from_rows(iter(lines), "trace.jsonl")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert columns["ids"] == list(range(1, 11)) and columns["line"] == list(range(1, 11))
    assert list(columns["session"]) == ["s"] * 10 and not columns["malformed"]
    assert peak < 5 * len(junk), peak  # a line, as text and parsed; all ten kept: ~12 x


def test_a_row_of_more_containers_than_a_row_holds_is_malformed_unparsed():
    """50,000 empty lists (200 KB of text, ~3 MB of Python objects parsed) beyond a row's own
    containers make each line malformed, found before it is parsed."""
    lines = _lines(json.dumps([[]] * 50_000))
    tracemalloc.start()
    columns = _columns_from_rows(iter(lines), "trace.jsonl")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not columns["line"] and [m["line"] for m in columns["malformed"]] == list(range(1, 11))
    assert columns["malformed"][0]["error"] == (
        f"50003 JSON objects and lists, over the {MAX_ROW_CONTAINERS} a trace row holds "
        "(the row, hash_ids and output_hash_ids): not parsed"
    )
    assert peak < 64 * 50_000 // 4, peak  # a line and a copy at most, never its parse


ROW = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1, 2]}


@pytest.mark.parametrize("whole", [True, False], ids=["streamed", "line by line"])
@pytest.mark.parametrize(
    "extra, kept",
    [
        ({"output_hash_ids": [3]}, True),  # a row kvtrace writes (--emit-output-hashes)
        ({"session_id": "[a] {b}"}, True),  # brackets in a name are text, not containers
        ({"meta": {"k": [1]}}, False),
        ({"output_hash_ids": [3], "tags": [1]}, False),
        ({"output_hash_ids": [[3]]}, False),
        ({"tags": []}, True),  # a count of containers, whatever their names: three
    ],
)
def test_a_row_reads_alike_whichever_path_its_file_takes(tmp_path, whole, extra, kept):
    """pyarrow reads a file whole when every line is a well-typed row, else it is read line by
    line: a row is kept or malformed alike on either path, whatever the file's other lines."""
    rows = [json.dumps({**ROW, **extra})] * 3 + ([] if whole else ["not json"])
    path = tmp_path / "t.jsonl"
    path.write_text("".join(row + "\n" for row in rows))
    trace = read_trace([str(path)])
    assert len(trace) == (3 if kept else 0)
    assert trace.malformed_count == (0 if kept else 3) + (0 if whole else 1)
