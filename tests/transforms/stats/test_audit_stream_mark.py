"""The one attribute the gate keeps on a stream's folder, its output mark: only byte for byte
a mark the stream writes on the folder as it stands (publish.is_stream_mark), so a claim names
the last window or the one after it and carries no chosen number.

The whole stream, written by the streaming pipeline: tests/e2e/test_redteam_publish_round24.py."""

from __future__ import annotations

import os

import pytest

from kvtrace.transforms.stats import audit
from kvtrace.transforms.trace_format import window_name
from kvtrace.transforms.write.publish import OUTPUT_MARK, STREAM_WRITER, mark_output

FOREIGN = f"the stream's folder: extended attributes kvtrace does not set ({OUTPUT_MARK})"


@pytest.fixture
def stream(tmp_path):
    """A stream's folder of two windows (empty: their own flags are not these tests')."""
    folder = tmp_path / "stream"
    for index in (0, 1):
        (folder / window_name(index)).mkdir(parents=True)
    return folder


@pytest.mark.parametrize("claimed, kept", [(0, False), (1, True), (2, True), (3, False)])
def test_a_claim_passes_only_of_the_last_window_or_the_next(stream, claimed, kept):
    assert mark_output(str(stream), STREAM_WRITER, claimed=window_name(claimed))
    flags = audit.audit(str(stream), "x")["flags"]
    assert (FOREIGN not in flags) is kept, flags


def test_a_claim_of_a_number_chosen_past_a_million_windows_is_refused(stream):
    secret = int.from_bytes(b"card 4111 1111 1111 1111", "big")
    assert mark_output(str(stream), STREAM_WRITER, claimed=window_name(secret))
    assert FOREIGN in audit.audit(str(stream), "x")["flags"]


def test_the_mark_a_restarted_stream_gives_its_folder_passes(stream):
    """make_stream_folder marks the folder listing what stands until the stream's next claim."""
    assert mark_output(str(stream), STREAM_WRITER)
    assert FOREIGN not in audit.audit(str(stream), "x")["flags"]
    os.setxattr(stream, OUTPUT_MARK, b"[" * 4000)  # not kvtrace's: flagged, never an error
    assert FOREIGN in audit.audit(str(stream), "x")["flags"]


def test_an_object_stores_stream_mark_passes_only_as_the_stream_writes_it(stream):
    """A copy of an object store's stream folder holds its mark as a file
    (publish.mark_stream_object): kept with exactly its bytes, any other is not the stream's."""
    from kvtrace.transforms.write.publish import OUTPUT_MARK_OBJECT, mark_stream_object

    mark_stream_object(str(stream))
    other = f"not a window of the stream: {OUTPUT_MARK_OBJECT}"
    assert other not in audit.audit(str(stream), "x")["flags"]
    (stream / OUTPUT_MARK_OBJECT).write_bytes(b'{"files": [], "writer": "anonymize"}')
    assert other in audit.audit(str(stream), "x")["flags"]
