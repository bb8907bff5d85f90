"""A folder's output mark as publish reads it: bounded in size and depth before it is parsed
(a mark that is not kvtrace's is no mark, never an error), and a stream's accepted only as the
bytes the stream writes on its folder as it stands."""

from __future__ import annotations

import json
import os

import pytest

from kvtrace.transforms.trace_format import window_name
from kvtrace.transforms.write.publish import (
    MAX_MARK_BYTES,
    OUTPUT_MARK,
    STREAM_WRITER,
    claimed_by,
    folder_writer,
    is_stream_mark,
    mark_output,
)


def _marked(tmp_path, mark: bytes):
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    os.setxattr(folder, OUTPUT_MARK, mark)
    return folder


@pytest.mark.parametrize(
    "mark",
    [
        b"[" * 4000,  # deeper than Python's parser goes: a RecursionError unbounded
        b'{"writer": "analyze", "writer": "analyze", "files": []}',
        b"\xff",
        b"[]",
    ],
)
def test_a_mark_kvtrace_did_not_write_is_no_mark(tmp_path, mark):
    folder = _marked(tmp_path, mark)
    assert folder_writer(str(folder)) == ""
    assert claimed_by(str(folder), STREAM_WRITER) == ""


def test_a_mark_longer_than_a_mark_holds_is_never_parsed(tmp_path, monkeypatch):
    """ext4 keeps no longer value; XFS keeps 64 KiB under one name, as its getxattr returns."""
    folder = _marked(tmp_path, b'{"files": [], "writer": "analyze"}')
    padded = {"writer": "analyze", "files": ["a" * MAX_MARK_BYTES]}
    monkeypatch.setattr(os, "getxattr", lambda *_, **__: json.dumps(padded).encode())
    assert folder_writer(str(folder)) == ""


def test_a_stream_mark_passes_only_as_the_stream_writes_it_on_the_folder_as_it_stands(tmp_path):
    """Two windows published: the claim of the last or of the next (its publish failed), or
    make_stream_folder's mark listing what stands; any other window, spelling or field not."""
    folder = tmp_path / "stream"
    folder.mkdir()
    for index in (0, 1):
        (folder / window_name(index)).mkdir()
    for claim in (window_name(1), window_name(2)):
        assert mark_output(str(folder), STREAM_WRITER, claimed=claim)
        assert is_stream_mark(str(folder), 2), claim
    assert mark_output(str(folder), STREAM_WRITER)  # a restart's mark, before its first claim
    assert is_stream_mark(str(folder), 2)
    (folder / "cumulative.json").write_text("{}")  # the listing moved on: that mark no longer
    assert not is_stream_mark(str(folder), 2)
    for claim in (window_name(0), window_name(3), window_name(10**900)):
        assert mark_output(str(folder), STREAM_WRITER, claimed=claim)
        assert not is_stream_mark(str(folder), 2), claim[:20]
    exact = {"writer": STREAM_WRITER, "files": [], "claimed": window_name(1)}
    for other in (
        json.dumps(exact).encode(),  # unsorted
        json.dumps(exact, sort_keys=True, indent=1).encode(),
        json.dumps({**exact, "note": "x"}, sort_keys=True).encode(),
        json.dumps({**exact, "writer": "analyze"}, sort_keys=True).encode(),
    ):
        os.setxattr(folder, OUTPUT_MARK, other)
        assert not is_stream_mark(str(folder), 2), other
    os.removexattr(folder, OUTPUT_MARK)
    assert not is_stream_mark(str(folder), 2)  # none: the caller keeps no attribute
