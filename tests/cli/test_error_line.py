"""A failure is said in one line of at most cli.MAX_ERROR_CHARS characters, its advice kept:
a long message loses its middle (long paths), never its end (what to do)."""

from __future__ import annotations

from kvtrace.cli import MAX_ERROR_CHARS, TRACEBACK, _one_line


def test_a_long_message_keeps_its_start_and_its_advice():
    err = ValueError(f"the id map /{'deep/' * 200}map was moved: run `kvtrace id-map rebind`\nmore")
    line = _one_line(err)
    assert len(line) == MAX_ERROR_CHARS
    assert line.startswith("the id map /deep/") and line.endswith("run `kvtrace id-map rebind`")


def test_a_short_message_is_its_first_line():
    assert _one_line(ValueError("bad\nsecond")) == "bad"
    assert _one_line(ValueError("")) == "ValueError"


def test_a_message_that_is_a_traceback_is_its_last_line():
    """A worker's error as Beam passes it on: its text is the worker's traceback."""
    text = f'{TRACEBACK}\n  File "x.py", line 1, in f\n    g()\nOSError: [Errno 5] EIO\n\n'
    assert _one_line(RuntimeError(text)) == "OSError: [Errno 5] EIO"
