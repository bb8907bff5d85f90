"""The private measured file: written and read in one form; anything else is one line naming
where."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace.transforms.errors import ConfigError
from kvtrace.transforms.read.measured import (
    NOT_MEASURED,
    check_totals,
    measured_bytes,
    read_measured,
    trace_manifest,
)

TRACE = "ab" * 32  # the sha256 of the manifest of the trace read
HEADER = b'{"manifest_sha256": "' + TRACE.encode() + b'"}\n'


def test_rows_read_back_by_shard_and_row_and_absent_rows_are_not_measured(tmp_path):
    path = tmp_path / "m.jsonl"
    first = measured_bytes(0, np.array([NOT_MEASURED, 48]))
    second = measured_bytes(1, np.array([0, NOT_MEASURED, 16]))
    assert measured_bytes(2, np.array([NOT_MEASURED])) is None
    path.write_bytes(HEADER + first + second)
    assert read_measured(str(path), [2, 3], TRACE).tolist() == [
        NOT_MEASURED,
        48,
        0,
        NOT_MEASURED,
        16,
    ]


@pytest.mark.parametrize(
    "text, said",
    [
        (b'{"shard": 0, "row": 9, "cached_tokens": 1}\n', "not a row of these 1 trace file"),
        (b'{"shard": 1, "row": 0, "cached_tokens": 1}\n', "not a row of these 1 trace file"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1}\n' * 2, "given twice"),
        (b'{"shard": 0, "row": 1, "cached_tokens": "1"}\n', "cached_tokens is not a count"),
        (b'{"shard": 0, "row": 1.0, "cached_tokens": 1}\n', "row is not an index"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1, "t": "x"}\n', "exactly shard, row, cached"),
        (b"[1, 2]\n", "exactly shard, row, cached_tokens"),
        (b"{nope\n", "not JSON"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1' + b" " * 100 + b"}\n", "longer than"),
    ],
)
def test_anything_else_is_refused_naming_its_line(tmp_path, text, said):
    path = tmp_path / "m.jsonl"
    path.write_bytes(HEADER + text)
    with pytest.raises(ConfigError, match=said) as refused:
        read_measured(str(path), [3], TRACE)
    assert "line" in str(refused.value) and "\n" not in str(refused.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        read_measured(str(tmp_path / "none.jsonl"), [1], TRACE)


@pytest.mark.parametrize(
    "header, said",
    [
        (b'{"manifest_sha256": "' + b"cd" * 32 + b'"}\n', "another output .* cdcdcdcdcdcd"),
        (b'{"shard": 0, "row": 1, "cached_tokens": 1}\n', "not the header"),  # none
        (b'{"manifest_sha256": "' + b"AB" * 32 + b'"}\n', "not the header"),
        (HEADER[:-2] + b', "x": 1}\n', "not the header"),
        (b"{nope\n", "not JSON"),
    ],
)
def test_a_file_of_another_output_or_without_its_header_is_refused(tmp_path, header, said):
    """The first line names the output the rows are of: another output's file (the same shard
    and row counts or not) is refused in one line."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(header + b'{"shard": 0, "row": 1, "cached_tokens": 1}\n')
    with pytest.raises(ConfigError, match=said) as refused:
        read_measured(str(path), [3], TRACE)
    assert "\n" not in str(refused.value)


def test_the_trace_is_one_whole_output_in_shard_order(tmp_path):
    """Rows are keyed by shard: only the shards of one pinned output, every one, in order."""
    from kvtrace.transforms.read.trace_inputs import PinnedPath, PublishedFolder

    out, other = (PublishedFolder(f, {}, 0, manifest_sha256=f * 32) for f in ("ab", "cd"))
    first, second = (f"out/trace-0000{i}-of-00002.jsonl" for i in (0, 1))
    assert trace_manifest("m", [PinnedPath(first, out), PinnedPath(second, out)]) == TRACE
    for files in (
        [PinnedPath(first, out)],  # a shard missing
        [PinnedPath(second, out), PinnedPath(first, out)],  # out of order
        [PinnedPath(first, out), PinnedPath(second, other)],  # of two outputs
        [first, second],  # not an output's (no manifest pinned)
        [PinnedPath("out/t.jsonl", out)],
        [],
    ):
        with pytest.raises(ConfigError, match="give that folder"):
            trace_manifest("m", files)


def test_a_file_holds_the_totals_its_output_published():
    """Cut at a line's end, a line dropped or a count altered, a file still reads; its totals
    are then not stats.json's. Without a published aggregate nothing is held against."""
    measured = np.array([8, NOT_MEASURED, 4, 0])
    inputs = np.array([16, 9, 8, 4])
    check_totals("m", measured, inputs, (3, 12, 28))
    check_totals("m", measured, inputs, None)
    for cut in (np.array([8, NOT_MEASURED, 4, NOT_MEASURED]), np.array([8, NOT_MEASURED, 5, 0])):
        with pytest.raises(ConfigError, match="m holds .* stats.json 3 requests with 12 of 28"):
            check_totals("m", cut, inputs, (3, 12, 28))
